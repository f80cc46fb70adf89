"""`bootstrap`: the account's infrastructure as one CloudFormation stack (infra/template.yaml: bucket, the three
roles, model package group, alerts topic), and its outputs into pipeline.yaml. Logic only: the CLI renders."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, WaiterError

from pipeline.code import PROJECT_ROOT
from pipeline.config import Config
from pipeline.errors import UserError
from pipeline.sagemaker.aws import explain
from pipeline.sagemaker.triggers import rule_name
from steps.deploy.sagemaker_endpoints import missing

TEMPLATE = PROJECT_ROOT / "infra" / "template.yaml"
CAPABILITIES = ["CAPABILITY_IAM"]  # the roles get generated names: no CAPABILITY_NAMED_IAM
# stack output -> config key (KmsKeyArn only exists with UseKmsKey=true)
OUTPUT_KEYS = {
    "BucketName": "aws.bucket",
    "ExecutionRoleArn": "aws.role_arn",
    "DeployLambdaRoleArn": "deploy.lambda_role_arn",
    "EventsRoleArn": "triggers.events_role_arn",
    "ModelPackageGroupName": "pipeline.model_package_group",
    "AlertsTopicArn": "alerts.topic_arn",
    "KmsKeyArn": "aws.kms_key_id",
    "TrackingServerArn": "tracking.server_arn",
}
# images.<key> -> template parameter naming its ECR repository
IMAGE_PARAMETERS = {
    "training": "TrainingImageRepository",
    "processing": "ProcessingImageRepository",
    "inference": "InferenceImageRepository",
    "evaluation": "EvaluationImageRepository",
    "training_cuda": "CudaTrainingImageRepository",
}
IMAGE_URI = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/([^:@]+)[:@].+$")
EventCallback = Callable[[dict], None]


class BootstrapError(UserError, RuntimeError):
    """The stack could not be deployed or deleted, or pipeline.yaml not updated: said in one line."""


@dataclass
class StackResult:
    """What deploy_stack / delete_stack did: action is created, updated, unchanged, deleted or absent."""

    action: str
    stack_name: str
    outputs: dict[str, str] = field(default_factory=dict)
    emptied: int = 0  # object versions deleted from the bucket (delete with force)


def default_stack_name(cfg: Config) -> str:
    return f"{cfg.pipeline.name}-bootstrap"[:128]


def template_body() -> str:
    return TEMPLATE.read_text()


def _call(action: str, call: Callable[..., Any], **kwargs: Any) -> Any:
    try:
        return call(**kwargs)
    except (BotoCoreError, ClientError) as e:
        raise BootstrapError(explain(e, action)) from None


def tracking_parameters(cfg: Config) -> dict[str, str]:
    """tracking.create_server: the stack makes (and owns) the tracking server; else the configured one, if any, which
    must be of this account and region (the execution role is granted it by the resource part of its ARN)."""
    arn = "" if cfg.tracking.create_server else cfg.tracking.server_arn or ""
    if arn and arn.split(":")[3:5] != [cfg.aws.region, cfg.aws.account]:
        raise BootstrapError(f"tracking.server_arn={arn!r}: expected a server of region {cfg.aws.region} and account "
                             f"{cfg.aws.account}, those of the execution role")
    return {"CreateTrackingServer": str(cfg.tracking.create_server).lower(),
            "TrackingServerResource": arn.split(":", 5)[5].removeprefix("mlflow-") if arn else ""}


def stack_parameters(cfg: Config, bucket: str | None = None, kms: bool | None = None) -> dict[str, str]:
    """The template parameters, from the config (checked here: a bad value fails before any call). bucket / kms
    None: BucketName / UseKmsKey are left out, i.e. the deployed value on update (a bucket is never replaced)."""
    checks = [
        ("pipeline.name", cfg.pipeline.name, 256),
        ("pipeline.model_package_group", cfg.pipeline.model_package_group, 50),
        ("deploy.endpoint_name", cfg.deploy.endpoint_name, 40),
        ("deploy.staging.endpoint_name", cfg.deploy.staging_endpoint_name, 40),
    ]
    for key, value, most in checks:
        if value != value.lower() or len(value) > most:
            raise BootstrapError(
                f"{key}={value!r}: expected lowercase and at most {most} characters (IAM matches the ARNs that "
                f"SageMaker spells in lowercase case-sensitively, and steps/deploy/handler.py trims names to 63)"
            )
    if not bucket and len(f"{cfg.pipeline.name}-123456789012-{cfg.aws.region}") > 63:
        raise BootstrapError(
            f"pipeline.name={cfg.pipeline.name!r}: too long for the default bucket name "
            f"<pipeline>-<account>-<region> (63 characters); pass a bucket name"
        )
    params = {
        "PipelineName": cfg.pipeline.name,
        "Prefix": cfg.aws.prefix,
        **({} if bucket is None else {"BucketName": bucket}),
        "ModelPackageGroupName": cfg.pipeline.model_package_group,
        "EndpointName": cfg.deploy.endpoint_name,
        "StagingEndpointName": cfg.deploy.staging_endpoint_name,
        "AlertEmail": cfg.alerts.email or "",
        "LambdaFunctionName": cfg.deploy.lambda_function_name,
        "AlertsRuleName": rule_name(cfg.pipeline.name, "execution-alerts"),  # the one rule the topic lets publish
        **({} if kms is None else {"UseKmsKey": "true" if kms else "false"}),
        "CheckpointExpirationDays": "30",
        "NoncurrentVersionExpirationDays": "30",
        **tracking_parameters(cfg),
    }
    for key, parameter in IMAGE_PARAMETERS.items():
        uri = cfg.image(key)  # type: ignore[arg-type]
        match = IMAGE_URI.match(uri)
        if not match or match.group(2) != cfg.aws.region:
            raise BootstrapError(
                f"images.{key}={uri!r}: expected an ECR image URI <account>.dkr.ecr.{cfg.aws.region}.amazonaws.com/"
                f"<repository>:<tag> (the execution role may pull from the registry of aws.region only)"
            )
        params[parameter.replace("Repository", "Account")] = match.group(1)  # a DLC, or an image of your own ECR
        params[parameter] = match.group(3)
    return params


def _tags(cfg: Config) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in sorted(cfg.aws.tags.items())]


def _describe(cf: Any, stack: str, deleted: bool = False) -> dict | None:
    """The stack's description, or None if it does not exist (or was deleted, unless `deleted`)."""
    try:
        found = cf.describe_stacks(StackName=stack)["Stacks"]
    except (BotoCoreError, ClientError) as e:
        if isinstance(e, ClientError) and "does not exist" in e.response.get("Error", {}).get("Message", ""):
            return None
        raise BootstrapError(explain(e, f"describe stack {stack}")) from None
    if not found or (found[0]["StackStatus"] == "DELETE_COMPLETE" and not deleted):
        return None
    return found[0]


def _outputs(stack: dict) -> dict[str, str]:
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def _new_events(cf: Any, stack: str, seen: set[str]) -> list[dict]:
    """Events not seen yet, oldest first (the API lists newest first, paginated)."""
    fresh: list[dict] = []
    token: str | None = None
    while True:
        request = {"StackName": stack, **({"NextToken": token} if token else {})}
        page = _call(f"read events of stack {stack}", cf.describe_stack_events, **request)
        for event in page.get("StackEvents", []):
            if event["EventId"] in seen:
                token = None
                break
            fresh.append(event)
        else:
            token = page.get("NextToken")
        if not token:
            break
    seen.update(e["EventId"] for e in fresh)
    return fresh[::-1]


def failure_reason(events: list[dict]) -> str:
    """The first resource that failed and why, as `Logical (Type) STATUS: reason`."""
    failed = [e for e in events if e.get("ResourceStatus", "").endswith("_FAILED")]
    causes = [e for e in failed if "cancelled" not in (e.get("ResourceStatusReason") or "").lower()] or failed
    if not causes:
        return "no failed resource reported"
    e = causes[0]
    reason = " ".join((e.get("ResourceStatusReason") or "no reason given").split())
    return f"{e['LogicalResourceId']} ({e.get('ResourceType', '')}) {e['ResourceStatus']}: {reason}"


def wait_stack(
    cf: Any,
    stack: str,
    operation: str,
    seen: set[str],
    on_event: EventCallback | None = None,
    poll: float = 5.0,
    timeout: float = 3600.0,
) -> dict | None:
    """Wait for `operation` (CREATE, UPDATE or DELETE) with botocore's waiter, then pass the stack's new events to
    on_event; the final description. Unless the operation completed, raise BootstrapError naming the failed
    resource and its reason."""
    config = {"Delay": max(0, round(poll)), "MaxAttempts": max(1, round(timeout / max(poll, 1.0)))}
    try:
        cf.get_waiter(f"stack_{operation.lower()}_complete").wait(StackName=stack, WaiterConfig=config)
    except WaiterError:
        pass  # said below, from the stack's status and events
    described = _describe(cf, stack, deleted=True)
    status = described["StackStatus"] if described else "DELETE_COMPLETE"
    events = _new_events(cf, stack, seen) if described else []
    for event in events:
        if on_event:
            on_event(event)
    if status.endswith("_IN_PROGRESS"):
        raise BootstrapError(f"stack {stack}: still {status} after {timeout:.0f} s; see the CloudFormation console")
    if status != f"{operation}_COMPLETE":
        raise BootstrapError(f"stack {stack}: {operation.lower()} failed ({status}): {failure_reason(events)}")
    return None if status == "DELETE_COMPLETE" else described


def _unchanged(cf: Any, stack: dict, body: str, params: dict[str, str], tags: list[dict]) -> bool:
    """True when the deployed template, parameters and tags are those we would send."""
    name = stack["StackName"]
    current = _call(f"read template of stack {name}", cf.get_template, StackName=name)["TemplateBody"]
    if not isinstance(current, str):
        current = json.dumps(current)
    deployed = {p["ParameterKey"]: p.get("ParameterValue", "") for p in stack.get("Parameters", [])}
    same_tags = sorted((t["Key"], t["Value"]) for t in stack.get("Tags", [])) == [(t["Key"], t["Value"]) for t in tags]
    return current == body and all(deployed.get(k) == v for k, v in params.items()) and same_tags


def deploy_stack(
    cfg: Config,
    cf: Any,
    stack_name: str | None = None,
    parameters: dict[str, str] | None = None,
    on_event: EventCallback | None = None,
    poll: float = 5.0,
    timeout: float = 3600.0,
) -> StackResult:
    """Create the stack, or update it where template, parameters or tags differ; wait; return its outputs. A stack
    left ROLLBACK_COMPLETE by a failed first create (it holds nothing) is deleted and created again."""
    name = stack_name or default_stack_name(cfg)
    body, params, tags = template_body(), parameters or stack_parameters(cfg), _tags(cfg)
    request = {"StackName": name, "TemplateBody": body, "Capabilities": CAPABILITIES, "Tags": tags,
               "Parameters": [{"ParameterKey": k, "ParameterValue": v} for k, v in params.items()]}
    wait = {"on_event": on_event, "poll": poll, "timeout": timeout}
    stack = _describe(cf, name)
    if stack is not None and stack["StackStatus"].endswith("_IN_PROGRESS"):
        raise BootstrapError(f"stack {name} is {stack['StackStatus']}: retry when it has finished")
    if stack is not None and stack["StackStatus"] == "ROLLBACK_COMPLETE":
        seen = {e["EventId"] for e in _new_events(cf, name, set())}
        _call(f"delete stack {name} (ROLLBACK_COMPLETE)", cf.delete_stack, StackName=stack["StackId"])
        wait_stack(cf, stack["StackId"], "DELETE", seen, **wait)
        stack = None
    if stack is None:
        _call(f"validate template {TEMPLATE.name}", cf.validate_template, TemplateBody=body)
        stack_id = _call(f"create stack {name}", cf.create_stack, **request)["StackId"]
        final = wait_stack(cf, stack_id, "CREATE", set(), **wait)
        return StackResult("created", name, _outputs(final or {}))
    if _unchanged(cf, stack, body, params, tags):
        return StackResult("unchanged", name, _outputs(stack))
    seen = {e["EventId"] for e in _new_events(cf, name, set())}
    kept = [{"ParameterKey": p["ParameterKey"], "ParameterValue": p.get("ParameterValue", "")}  # deployed values
            for p in stack.get("Parameters", []) if p["ParameterKey"] not in params]
    try:
        cf.update_stack(**{**request, "Parameters": request["Parameters"] + kept})
    except ClientError as e:
        if isinstance(e, ClientError) and "No updates are to" in e.response.get("Error", {}).get("Message", ""):
            return StackResult("unchanged", name, _outputs(stack))
        raise BootstrapError(explain(e, f"update stack {name}")) from None
    except BotoCoreError as e:
        raise BootstrapError(explain(e, f"update stack {name}")) from None
    final = wait_stack(cf, stack["StackId"], "UPDATE", seen, **wait)
    return StackResult("updated", name, _outputs(final or {}))


def config_updates(outputs: dict[str, str]) -> dict[str, str]:
    """config key -> value for the stack outputs (aws.kms_key_id only when the stack made a key)."""
    return {key: outputs[output] for output, key in OUTPUT_KEYS.items() if outputs.get(output)}


def _versions(s3: Any, bucket: str) -> list[dict[str, str]]:
    """Every object version and delete marker of `bucket` ({"Key", "VersionId"}); [] if it is gone."""
    found: list[dict[str, str]] = []
    try:
        for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
            for item in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
                found.append({"Key": item["Key"], "VersionId": item["VersionId"]})
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") == "NoSuchBucket":
            return []
        raise BootstrapError(explain(e, f"list objects of bucket {bucket}")) from None
    return found


def _group_versions(sm: Any, group: str) -> int:
    """How many versions the model package group holds (0 if it is gone)."""
    try:
        pages = sm.get_paginator("list_model_packages").paginate(ModelPackageGroupName=group)
        return sum(len(page["ModelPackageSummaryList"]) for page in pages)
    except ClientError as e:
        if "does not exist" in e.response.get("Error", {}).get("Message", ""):
            return 0
        raise BootstrapError(explain(e, f"list the versions of model package group {group}")) from None


def _endpoints_using(sm: Any, role: str) -> list[str]:
    """The endpoints of the region whose models run as `role` (an endpoint, config or model deleted meanwhile, or
    a model deleted under a running endpoint, cannot be told: passed over)."""
    found = []
    with_role: dict[str, bool] = {}

    def runs_as_role(model: str) -> bool:
        if model not in with_role:
            try:
                with_role[model] = sm.describe_model(ModelName=model).get("ExecutionRoleArn") == role
            except ClientError as e:
                if not missing(e):
                    raise
                with_role[model] = False
        return with_role[model]

    try:
        for page in sm.get_paginator("list_endpoints").paginate():
            for summary in page["Endpoints"]:
                name = summary["EndpointName"]
                try:
                    config = sm.describe_endpoint(EndpointName=name).get("EndpointConfigName", "")
                    variants = sm.describe_endpoint_config(EndpointConfigName=config).get("ProductionVariants", [])
                except ClientError as e:
                    if not missing(e):
                        raise
                    continue
                if any(runs_as_role(v["ModelName"]) for v in variants if v.get("ModelName")):
                    found.append(name)
    except ClientError as e:
        raise BootstrapError(explain(e, f"list the endpoints that use role {role}")) from None
    return found


def check_nothing_depends(stack: dict, sm: Any) -> None:
    """Refuse (one line, nothing deleted) while the stack's model package group holds versions (CloudFormation
    cannot delete the group: DELETE_FAILED) or endpoints run models as its execution role (DeleteEndpoint needs the
    role to release the endpoint's resources): both are the user's to delete, in that order, never this command's."""
    outputs, left = _outputs(stack), []
    group, role = outputs.get("ModelPackageGroupName"), outputs.get("ExecutionRoleArn")
    versions = _group_versions(sm, group) if group else 0
    if versions:
        left.append(f"model package group {group} holds {versions} version(s) (delete them: aws sagemaker "
                    f"delete-model-package --model-package-name <arn>)")
    endpoints = _endpoints_using(sm, role) if role else []
    if endpoints:
        left.append(f"endpoint(s) {', '.join(endpoints)} run models as role {role} (delete them first: aws "
                    f"sagemaker delete-endpoint --endpoint-name NAME)")
    if left:
        raise BootstrapError(f"stack {stack['StackName']}: nothing was deleted: {'; '.join(left)}")


def delete_stack(
    cfg: Config,
    cf: Any,
    s3: Any,
    sagemaker: Any,
    stack_name: str | None = None,
    force: bool = False,
    on_event: EventCallback | None = None,
    poll: float = 5.0,
    timeout: float = 3600.0,
) -> StackResult:
    """Delete the stack; refuse while anything depends on it (check_nothing_depends), and while its bucket holds
    any object version, unless `force` (then empty it first)."""
    name = stack_name or default_stack_name(cfg)
    stack = _describe(cf, name)
    if stack is None:
        return StackResult("absent", name)
    if stack["StackStatus"].endswith("_IN_PROGRESS"):
        raise BootstrapError(f"stack {name} is {stack['StackStatus']}: retry when it has finished")
    check_nothing_depends(stack, sagemaker)
    bucket = _outputs(stack).get("BucketName")
    versions = _versions(s3, bucket) if bucket else []
    if versions and not force:
        raise BootstrapError(
            f"bucket {bucket} holds {len(versions)} object version(s) (e.g. {versions[0]['Key']}): nothing was "
            f"deleted; empty it, or pass --force to delete them with the stack"
        )
    for start in range(0, len(versions), 1000):
        batch = versions[start : start + 1000]
        done = _call(f"empty bucket {bucket}", s3.delete_objects, Bucket=bucket, Delete={"Objects": batch})
        if done.get("Errors"):
            e = done["Errors"][0]
            raise BootstrapError(f"empty bucket {bucket}: {e.get('Key')}: {e.get('Code')}: {e.get('Message')}")
    seen = {e["EventId"] for e in _new_events(cf, name, set())}
    _call(f"delete stack {name}", cf.delete_stack, StackName=stack["StackId"])
    wait_stack(cf, stack["StackId"], "DELETE", seen, on_event, poll, timeout)
    return StackResult("deleted", name, emptied=len(versions))
