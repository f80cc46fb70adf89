"""Deploy an Approved model package version to the real-time endpoint (AWS Lambda handler).

Runs in the python3.12 Lambda runtime: standard library and boto3 only, nothing from `pipeline/`.

One function, `deploy()`, three callers (see `lambda_handler`):
- the pipeline's Deploy LambdaStep: {"model_package_arn", "endpoint_name", "instance_type", "instance_count"};
- the EventBridge rule on "SageMaker Model Package State Change" (a version was approved);
- a direct invocation: {"model_package_arn": ...} (anything missing comes from the environment).

Environment of the function: ENDPOINT_NAME, INSTANCE_TYPE, INSTANCE_COUNT, DATA_CAPTURE_S3_URI,
SAGEMAKER_ROLE_ARN (execution role of the model), GUARDRAILS_ALARM (a CloudWatch alarm name: endpoint
updates become blue/green and roll back automatically when it fires).

Idempotent: the model, endpoint config and endpoint are named after the version (and the serving
settings), so a repeated or concurrent call finds them and changes nothing. It never waits for InService.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

APPROVED = "Approved"
MODEL_PACKAGE_EVENT = "SageMaker Model Package State Change"
MAX_NAME = 63
DEFAULT_INSTANCE_TYPE = "ml.c5.xlarge"


class NotApproved(ValueError):
    """The model package version is not Approved: nothing was deployed."""


class DeployError(RuntimeError):
    """Deployment cannot proceed (missing setting, endpoint busy); the message says what to do."""


def _name(base: str, suffix: str) -> str:
    """`base` + `suffix`, trimmed to SageMaker's 63 characters and its [a-zA-Z0-9-] alphabet."""
    base = re.sub(r"[^a-zA-Z0-9-]", "-", base)
    base = base[: MAX_NAME - len(suffix)].rstrip("-") or "model"
    return base + suffix


def model_name(group: str, version: int | str) -> str:
    """The SageMaker model made from a package version: `<group>-v<version>`."""
    return _name(group, f"-v{version}")


def endpoint_config_name(
    endpoint_name: str,
    version: int | str,
    instance_type: str,
    instance_count: int,
    data_capture_s3_uri: str | None = None,
) -> str:
    """`<endpoint>-v<version>-<hash of the serving settings>`: a settings change makes a new config."""
    settings = json.dumps([instance_type, int(instance_count), data_capture_s3_uri or ""])
    digest = hashlib.sha256(settings.encode()).hexdigest()[:8]
    return _name(endpoint_name, f"-v{version}-{digest}")


def _error_code(error: Exception) -> tuple[str, str]:
    response = getattr(error, "response", None) or {}
    err = response.get("Error", {})
    return err.get("Code", ""), err.get("Message", "")


def _missing(error: Exception) -> bool:
    """True for SageMaker's "Could not find ..." (a ValidationException) or a ResourceNotFound."""
    code, message = _error_code(error)
    return code in ("ResourceNotFound", "ResourceNotFoundException") or (
        code == "ValidationException" and ("could not find" in message.lower() or "does not exist" in message.lower())
    )


def _already_exists(error: Exception) -> bool:
    code, message = _error_code(error)
    return code in ("ResourceInUse", "ValidationException") and "already exist" in message.lower()


def _describe(call: Any, **kwargs: Any) -> dict | None:
    """The description, or None when the resource does not exist."""
    try:
        return call(**kwargs)
    except Exception as e:  # botocore.exceptions.ClientError, imported lazily by boto3
        if _missing(e):
            return None
        raise


def _create(call: Any, **kwargs: Any) -> bool:
    """Create; False when a concurrent caller created it first."""
    try:
        call(**kwargs)
        return True
    except Exception as e:
        if _already_exists(e):
            return False
        raise


def data_capture_config(uri: str) -> dict:
    return {
        "EnableCapture": True,
        "InitialSamplingPercentage": 100,
        "DestinationS3Uri": uri,
        "CaptureOptions": [{"CaptureMode": "Input"}, {"CaptureMode": "Output"}],
        "CaptureContentTypeHeader": {"JsonContentTypes": ["application/json", "application/jsonlines"]},
    }


def deployment_config(alarm: str) -> dict:
    """Blue/green, all traffic at once after the new fleet is healthy; roll back when `alarm` fires."""
    return {
        "BlueGreenUpdatePolicy": {
            "TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": 0},
            "TerminationWaitInSeconds": 300,
            "MaximumExecutionTimeoutInSeconds": 3600,
        },
        "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": alarm}]},
    }


def deploy(
    sagemaker_client: Any,
    model_package_arn: str,
    endpoint_name: str,
    instance_type: str = DEFAULT_INSTANCE_TYPE,
    instance_count: int = 1,
    role_arn: str | None = None,
    data_capture_s3_uri: str | None = None,
    guardrails_alarm: str | None = None,
) -> dict:
    """Serve model package version `model_package_arn` on `endpoint_name` (created or updated).

    Raises NotApproved for a version that is not Approved. Returns {"endpoint_config_name",
    "model_name", "action": "created" | "updated" | "unchanged" | "in-progress", "endpoint_name",
    "model_package_arn"}. "in-progress": the endpoint is already being created or updated to this very
    config, as when the pipeline's Deploy step and the approval rule both deploy a version registered
    Approved; both callers then succeed.
    """
    sm = sagemaker_client
    if not endpoint_name:
        raise DeployError("no endpoint name: pass endpoint_name or set ENDPOINT_NAME")
    instance_count = int(instance_count)
    if instance_count < 1:
        raise DeployError(f"instance_count={instance_count}: expected 1 or more")
    try:
        package = _describe(sm.describe_model_package, ModelPackageName=model_package_arn)
    except Exception as e:
        if _error_code(e)[0] != "ValidationException":
            raise
        raise DeployError(f"model package {model_package_arn}: {_error_code(e)[1]}") from e
    if package is None:
        raise DeployError(f"model package {model_package_arn} does not exist: nothing was deployed")
    status = package.get("ModelApprovalStatus", "PendingManualApproval")
    group = package.get("ModelPackageGroupName", "model")
    version = package.get("ModelPackageVersion", "0")
    if status != APPROVED:
        raise NotApproved(
            f"model package {group} version {version} is {status}, not Approved: approve it first "
            f"(trainium-pipeline models approve {version}); nothing was deployed"
        )
    arn = package.get("ModelPackageArn", model_package_arn)
    model = model_name(group, version)
    config = endpoint_config_name(endpoint_name, version, instance_type, instance_count, data_capture_s3_uri)
    result = {
        "endpoint_name": endpoint_name,
        "endpoint_config_name": config,
        "model_name": model,
        "model_package_arn": arn,
        "model_version": str(version),
    }

    endpoint = _describe(sm.describe_endpoint, EndpointName=endpoint_name)
    if endpoint is not None and target_config(endpoint) == config:
        return converged(result, endpoint)
    _check_ready(endpoint_name, endpoint)

    if _describe(sm.describe_model, ModelName=model) is None:
        role = role_arn or os.environ.get("SAGEMAKER_ROLE_ARN")
        if not role:
            raise DeployError("no execution role for the model: pass role_arn or set SAGEMAKER_ROLE_ARN")
        _create(
            sm.create_model,
            ModelName=model,
            Containers=[{"ModelPackageName": arn}],
            ExecutionRoleArn=role,
        )
    if _describe(sm.describe_endpoint_config, EndpointConfigName=config) is None:
        request: dict[str, Any] = {
            "EndpointConfigName": config,
            "ProductionVariants": [
                {
                    "VariantName": "AllTraffic",
                    "ModelName": model,
                    "InstanceType": instance_type,
                    "InitialInstanceCount": instance_count,
                    "InitialVariantWeight": 1.0,
                }
            ],
        }
        if data_capture_s3_uri:
            request["DataCaptureConfig"] = data_capture_config(data_capture_s3_uri)
        _create(sm.create_endpoint_config, **request)

    if endpoint is None:
        if not _create(sm.create_endpoint, EndpointName=endpoint_name, EndpointConfigName=config):
            return _after_race(sm, endpoint_name, result)  # a concurrent caller created it first
        return {**result, "action": "created", "previous_endpoint_config_name": ""}
    update: dict[str, Any] = {"EndpointName": endpoint_name, "EndpointConfigName": config}
    if guardrails_alarm:
        update["DeploymentConfig"] = deployment_config(guardrails_alarm)
    try:
        sm.update_endpoint(**update)
    except Exception as e:
        if _error_code(e)[0] != "ValidationException":
            raise
        return _after_race(sm, endpoint_name, result)  # e.g. "Cannot update in-progress endpoint"
    return {**result, "action": "updated", "previous_endpoint_config_name": endpoint.get("EndpointConfigName", "")}


def target_config(endpoint: dict) -> str:
    """The config the endpoint serves, or is being created or updated to."""
    pending = (endpoint.get("PendingDeploymentSummary") or {}).get("EndpointConfigName")
    return pending or endpoint.get("EndpointConfigName", "")


def converged(result: dict, endpoint: dict) -> dict:
    """The endpoint serves, or is already moving to, this config: the other caller's deploy is ours."""
    status = endpoint.get("EndpointStatus", "")
    action = "unchanged" if status == "InService" else "in-progress"
    return {**result, "action": action, "endpoint_status": status, "previous_endpoint_config_name": ""}


def _check_ready(endpoint_name: str, endpoint: dict | None) -> None:
    """Raise DeployError unless the endpoint is absent or can take an update now."""
    busy = endpoint.get("EndpointStatus") if endpoint is not None else None
    if busy in ("Creating", "Updating", "SystemUpdating", "RollingBack", "Deleting"):
        raise DeployError(
            f"endpoint {endpoint_name} is {busy} (to config {target_config(endpoint)}); retry when it is InService"
        )
    if busy == "Failed":
        raise DeployError(
            f"endpoint {endpoint_name} is Failed and cannot be updated: delete it "
            f"(aws sagemaker delete-endpoint --endpoint-name {endpoint_name}) and deploy again"
        )


def _after_race(sm: Any, endpoint_name: str, result: dict) -> dict:
    """Another caller changed the endpoint between our describe and our call: success if it went our way."""
    endpoint = _describe(sm.describe_endpoint, EndpointName=endpoint_name)
    if endpoint is not None and target_config(endpoint) == result["endpoint_config_name"]:
        return converged(result, endpoint)
    _check_ready(endpoint_name, endpoint)
    raise DeployError(f"endpoint {endpoint_name} changed while deploying; deploy again")


def _settings_from_env() -> dict[str, Any]:
    return {
        "endpoint_name": os.environ.get("ENDPOINT_NAME", ""),
        "instance_type": os.environ.get("INSTANCE_TYPE") or DEFAULT_INSTANCE_TYPE,
        "instance_count": int(os.environ.get("INSTANCE_COUNT") or 1),
        "data_capture_s3_uri": os.environ.get("DATA_CAPTURE_S3_URI") or None,
        "role_arn": os.environ.get("SAGEMAKER_ROLE_ARN") or None,
        "guardrails_alarm": os.environ.get("GUARDRAILS_ALARM") or None,
    }


def request_from_event(event: dict) -> dict[str, Any] | None:
    """deploy() arguments for one of the three event shapes; None for an event to ignore."""
    settings = _settings_from_env()
    if event.get("detail-type") == MODEL_PACKAGE_EVENT or "detail" in event:
        detail = event.get("detail") or {}
        if detail.get("ModelApprovalStatus") != APPROVED or not detail.get("ModelPackageArn"):
            return None
        return {**settings, "model_package_arn": detail["ModelPackageArn"]}
    if not event.get("model_package_arn"):
        raise DeployError(
            "unrecognised event: expected {'model_package_arn': ...} or a "
            f"'{MODEL_PACKAGE_EVENT}' EventBridge event; got keys {sorted(event)}"
        )
    # The LambdaStep inputs or a direct call: what the event names wins over the environment.
    for key in settings:
        if event.get(key) not in (None, ""):
            settings[key] = event[key]
    return {**settings, "model_package_arn": event["model_package_arn"]}


def lambda_handler(event: dict, context: Any = None) -> dict:
    """Entry point of the deploy Lambda. A refusal raises, so a LambdaStep fails with the message."""
    import boto3

    request = request_from_event(event or {})
    if request is None:
        detail = (event or {}).get("detail") or {}
        result = {
            "action": "ignored",
            "reason": f"status {detail.get('ModelApprovalStatus')!r} is not Approved",
            "model_package_arn": detail.get("ModelPackageArn", ""),
            "endpoint_config_name": "",
        }
    else:
        result = deploy(boto3.client("sagemaker"), **request)
    print(json.dumps(result))  # one line in CloudWatch Logs per invocation
    return result
