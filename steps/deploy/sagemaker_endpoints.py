"""SageMaker endpoints of the deploy Lambda: a model package version on an endpoint (created or updated), and the
production endpoint's autoscaling. Standard library and boto3 only (the caller passes the clients).

`deploy()` is idempotent: the model, endpoint config and endpoint are named after the version (and the serving
settings), so a repeated or concurrent call finds them and changes nothing. It never waits for InService.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from steps.contract import APPROVED
from steps.deploy import lifecycle
from steps.deploy.targets import STARTUP_HEALTH_CHECK_S, serving_target

MAX_NAME = 63
DEFAULT_INSTANCE_TYPE = "ml.c5.xlarge"
VARIANT = "AllTraffic"
DIMENSION = "sagemaker:variant:DesiredInstanceCount"
CONFIG_VERSION = re.compile(r"-v(\d+)-[0-9a-f]{8}$")


class NotApproved(lifecycle.Refused):
    """The model package version is not Approved: nothing was deployed."""


class DeployError(lifecycle.DeployError):
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
    serverless: dict[str, int] | None = None,
) -> str:
    """`<endpoint>-v<version>-<hash of the serving settings>`: a settings change makes a new config."""
    serving = [instance_type, int(instance_count)] if serverless is None else [sorted(serverless.items())]
    settings = json.dumps([*serving, data_capture_s3_uri or ""])
    digest = hashlib.sha256(settings.encode()).hexdigest()[:8]
    return _name(endpoint_name, f"-v{version}-{digest}")


def _error_code(error: Exception) -> tuple[str, str]:
    response = getattr(error, "response", None) or {}
    err = response.get("Error", {})
    return err.get("Code", ""), err.get("Message", "")


def missing(error: Exception) -> bool:
    """True for SageMaker's "Could not find ..." (a ValidationException) or a ResourceNotFound."""
    code, message = _error_code(error)
    return code in ("ResourceNotFound", "ResourceNotFoundException") or (
        code == "ValidationException" and ("could not find" in message.lower() or "does not exist" in message.lower())
    )


def _already_exists(error: Exception) -> bool:
    code, message = _error_code(error)
    return code in ("ResourceInUse", "ValidationException") and "already exist" in message.lower()


def describe(call: Any, **kwargs: Any) -> dict | None:
    """The description, or None when the resource does not exist."""
    try:
        return call(**kwargs)
    except Exception as e:  # botocore.exceptions.ClientError, imported lazily by boto3
        if missing(e):
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


def startup_health_check_s(instance_type: str) -> int | None:
    """The time an instance of `instance_type` may take to pass its first health check: long on Inferentia2, where the
    handler compiles the model when it starts (targets.STARTUP_HEALTH_CHECK_S); None: SageMaker's default."""
    try:
        return STARTUP_HEALTH_CHECK_S[serving_target(instance_type)]
    except ValueError:  # a family the config refuses, deployed by hand: SageMaker answers for it
        return None


def deploy(
    sagemaker_client: Any,
    model_package_arn: str,
    endpoint_name: str,
    instance_type: str = DEFAULT_INSTANCE_TYPE,
    instance_count: int = 1,
    role_arn: str | None = None,
    data_capture_s3_uri: str | None = None,
    guardrails_alarm: str | None = None,
    autoscaling: Any = None,
    serverless: dict[str, int] | None = None,
) -> dict:
    """Serve model package version `model_package_arn` on `endpoint_name` (created or updated).

    `serverless` (a ProductionVariantServerlessConfig: MemorySizeInMB, MaxConcurrency, ProvisionedConcurrency) serves
    it without instances: `instance_type` and `instance_count` are then unused, and an instance-based endpoint is
    refused, as SageMaker cannot update one to serverless.

    `autoscaling` (an application-autoscaling client) marks an autoscaled endpoint: an update keeps its instance
    count and weight (RetainAllVariantProperties), and a change of instance type removes the scaling policy and
    target first, as SageMaker requires (the next InService applies them again).

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
        package = describe(sm.describe_model_package, ModelPackageName=model_package_arn)
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
    if serverless and data_capture_s3_uri:
        raise DeployError("a serverless endpoint cannot capture data (Serverless Inference does not support it): "
                          "leave out the data capture URI")
    arn = package.get("ModelPackageArn", model_package_arn)
    model = model_name(group, version)
    config = endpoint_config_name(endpoint_name, version, instance_type, instance_count, data_capture_s3_uri,
                                  serverless)
    result = {
        "endpoint_name": endpoint_name,
        "endpoint_config_name": config,
        "model_name": model,
        "model_package_arn": arn,
        "model_version": str(version),
    }

    endpoint = describe(sm.describe_endpoint, EndpointName=endpoint_name)
    if endpoint is not None and target_config(endpoint) == config:
        return converged(result, endpoint)
    _check_ready(endpoint_name, endpoint)
    if serverless and endpoint is not None and _instance_type(sm, endpoint):
        raise DeployError(f"endpoint {endpoint_name} serves on instances, and SageMaker cannot update an "
                          f"instance-based endpoint to serverless: delete it (aws sagemaker delete-endpoint "
                          f"--endpoint-name {endpoint_name}) and deploy again; nothing was deployed")

    if describe(sm.describe_model, ModelName=model) is None:
        role = role_arn or os.environ.get("SAGEMAKER_ROLE_ARN")
        if not role:
            raise DeployError("no execution role for the model: pass role_arn or set SAGEMAKER_ROLE_ARN")
        _create(
            sm.create_model,
            ModelName=model,
            Containers=[{"ModelPackageName": arn}],
            ExecutionRoleArn=role,
        )
    if describe(sm.describe_endpoint_config, EndpointConfigName=config) is None:
        serving: dict[str, Any] = {"ServerlessConfig": dict(serverless)} if serverless else {
            "InstanceType": instance_type, "InitialInstanceCount": instance_count, "InitialVariantWeight": 1.0}
        request: dict[str, Any] = {
            "EndpointConfigName": config,
            "ProductionVariants": [{"VariantName": "AllTraffic", "ModelName": model, **serving}],
        }
        if not serverless and (startup := startup_health_check_s(instance_type)):
            request["ProductionVariants"][0]["ContainerStartupHealthCheckTimeoutInSeconds"] = startup
        if data_capture_s3_uri:
            request["DataCaptureConfig"] = data_capture_config(data_capture_s3_uri)
        _create(sm.create_endpoint_config, **request)

    if endpoint is None:
        if not _create(sm.create_endpoint, EndpointName=endpoint_name, EndpointConfigName=config):
            return _after_race(sm, endpoint_name, result)  # a concurrent caller created it first
        return {**result, "action": "created", "previous_endpoint_config_name": ""}
    update: dict[str, Any] = {"EndpointName": endpoint_name, "EndpointConfigName": config}
    if autoscaling is not None and not serverless:
        if _instance_type(sm, endpoint) == instance_type:
            update["RetainAllVariantProperties"] = True  # nothing excluded: DataCaptureConfig is not supported there
        else:
            remove_autoscaling(autoscaling, endpoint_name)
    if guardrails_alarm:
        update["DeploymentConfig"] = deployment_config(guardrails_alarm)
    try:
        sm.update_endpoint(**update)
    except Exception as e:
        if _error_code(e)[0] != "ValidationException":
            raise
        return _after_race(sm, endpoint_name, result, _error_code(e)[1])  # e.g. "Cannot update in-progress endpoint"
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


def _after_race(sm: Any, endpoint_name: str, result: dict, refusal: str = "") -> dict:
    """Another caller changed the endpoint between our describe and our call: success if it went our way. An
    UpdateEndpoint `refusal` of an endpoint that is neither ours nor busy was no race: its message is the error."""
    endpoint = describe(sm.describe_endpoint, EndpointName=endpoint_name)
    if endpoint is not None and target_config(endpoint) == result["endpoint_config_name"]:
        return converged(result, endpoint)
    _check_ready(endpoint_name, endpoint)
    if refusal:
        raise DeployError(f"endpoint {endpoint_name}: UpdateEndpoint to {result['endpoint_config_name']} refused: "
                          f"{' '.join(refusal.split())}")
    raise DeployError(f"endpoint {endpoint_name} changed while deploying; deploy again")


def _instance_type(sm: Any, endpoint: dict) -> str | None:
    config = describe(sm.describe_endpoint_config, EndpointConfigName=endpoint.get("EndpointConfigName", ""))
    variants = (config or {}).get("ProductionVariants") or [{}]
    return variants[0].get("InstanceType")


def config_version(config_name: str) -> int | None:
    """The model package version an endpoint config of deploy() serves (`<endpoint>-v<N>-<hash>`), or None."""
    match = CONFIG_VERSION.search(config_name or "")
    return int(match.group(1)) if match else None


def scaling_resource(endpoint_name: str) -> str:
    return f"endpoint/{endpoint_name}/variant/{VARIANT}"


def policy_name(endpoint_name: str) -> str:
    return f"{endpoint_name}-invocations-per-instance"


def apply_autoscaling(aas: Any, endpoint_name: str, low: int, high: int, target: float) -> dict:
    """Target tracking on invocations per instance (per minute), between `low` and `high` instances: registered and
    put again by every call (both calls update in place, so nothing is ever duplicated)."""
    if not 1 <= low <= high:
        raise DeployError(f"autoscaling {low}..{high} instances: expected 1 <= min <= max")
    resource = {"ServiceNamespace": "sagemaker", "ResourceId": scaling_resource(endpoint_name),
                "ScalableDimension": DIMENSION}
    aas.register_scalable_target(**resource, MinCapacity=low, MaxCapacity=high)
    aas.put_scaling_policy(
        PolicyName=policy_name(endpoint_name), PolicyType="TargetTrackingScaling", **resource,
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": float(target),
            "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
            "ScaleInCooldown": 300,
            "ScaleOutCooldown": 60,
        },
    )
    return {"min": low, "max": high, "target": float(target)}


def remove_autoscaling(aas: Any, endpoint_name: str) -> bool:
    """Delete the scaling policy, then deregister the target; False when there was none."""
    resource = {"ServiceNamespace": "sagemaker", "ResourceId": scaling_resource(endpoint_name),
                "ScalableDimension": DIMENSION}
    removed = False
    for call, extra in ((aas.delete_scaling_policy, {"PolicyName": policy_name(endpoint_name)}),
                        (aas.deregister_scalable_target, {})):
        try:
            call(**resource, **extra)
            removed = True
        except Exception as e:  # SageMaker says ObjectNotFoundException; moto a ValidationException "No ... found"
            code, message = _error_code(e)
            if code != "ObjectNotFoundException" and not (code == "ValidationException" and "No " in message):
                raise
    return removed
