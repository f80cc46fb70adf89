"""`bootstrap`: the account's infrastructure as one CloudFormation stack (infra/template.yaml: bucket, the three
roles, model package group, alerts topic), and its outputs into pipeline.yaml. Logic only: the CLI renders."""

from __future__ import annotations

import re
from typing import Any

from botocore.exceptions import ClientError

from pipeline.code import PROJECT_ROOT
from pipeline.config import Config
from pipeline.sagemaker import stacks
from pipeline.sagemaker.aws import explain
from pipeline.sagemaker.stacks import StackError, StackResult, call, outputs
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
    "inference_gpu": "GpuInferenceImageRepository",
    "inference_neuron": "NeuronInferenceImageRepository",
}
IMAGE_URI = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/([^:@]+)[:@].+$")


def default_stack_name(cfg: Config) -> str:
    return f"{cfg.pipeline.name}-bootstrap"[:128]


def template_body() -> str:
    return TEMPLATE.read_text()


def tracking_parameters(cfg: Config) -> dict[str, str]:
    """tracking.create_server: the stack makes (and owns) the tracking server; else the configured one, if any, which
    must be of this account and region (the execution role is granted it by the resource part of its ARN)."""
    arn = "" if cfg.tracking.create_server else cfg.tracking.server_arn or ""
    if arn and arn.split(":")[3:5] != [cfg.aws.region, cfg.aws.account]:
        raise StackError(f"tracking.server_arn={arn!r}: expected a server of region {cfg.aws.region} and account "
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
            raise StackError(
                f"{key}={value!r}: expected lowercase and at most {most} characters (IAM matches the ARNs that "
                f"SageMaker spells in lowercase case-sensitively, and steps/deploy/handler.py trims names to 63)"
            )
    if not bucket and len(f"{cfg.pipeline.name}-123456789012-{cfg.aws.region}") > 63:
        raise StackError(
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
            raise StackError(
                f"images.{key}={uri!r}: expected an ECR image URI <account>.dkr.ecr.{cfg.aws.region}.amazonaws.com/"
                f"<repository>:<tag> (the execution role may pull from the registry of aws.region only)"
            )
        params[parameter.replace("Repository", "Account")] = match.group(1)  # a DLC, or an image of your own ECR
        params[parameter] = match.group(3)
    return params


def deploy_stack(cfg: Config, cf: Any, stack_name: str | None = None, parameters: dict[str, str] | None = None,
                 waiting: stacks.Waiting = stacks.WAIT) -> StackResult:
    """Create the account stack, or update it where template, parameters or tags differ (stacks.deploy)."""
    return stacks.deploy(cf, stack_name or default_stack_name(cfg), template_body(),
                         parameters or stack_parameters(cfg), dict(cfg.aws.tags), CAPABILITIES, waiting)


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
        raise StackError(explain(e, f"list objects of bucket {bucket}")) from None
    return found


def _group_versions(sm: Any, group: str) -> int:
    """How many versions the model package group holds (0 if it is gone)."""
    try:
        pages = sm.get_paginator("list_model_packages").paginate(ModelPackageGroupName=group)
        return sum(len(page["ModelPackageSummaryList"]) for page in pages)
    except ClientError as e:
        if "does not exist" in e.response.get("Error", {}).get("Message", ""):
            return 0
        raise StackError(explain(e, f"list the versions of model package group {group}")) from None


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
        raise StackError(explain(e, f"list the endpoints that use role {role}")) from None
    return found


def check_nothing_depends(stack: dict, sm: Any) -> None:
    """Refuse (one line, nothing deleted) while the stack's model package group holds versions (CloudFormation
    cannot delete the group: DELETE_FAILED) or endpoints run models as its execution role (DeleteEndpoint needs the
    role to release the endpoint's resources): both are the user's to delete, in that order, never this command's."""
    found, left = outputs(stack), []
    group, role = found.get("ModelPackageGroupName"), found.get("ExecutionRoleArn")
    versions = _group_versions(sm, group) if group else 0
    if versions:
        left.append(f"model package group {group} holds {versions} version(s) (delete them: aws sagemaker "
                    f"delete-model-package --model-package-name <arn>)")
    endpoints = _endpoints_using(sm, role) if role else []
    if endpoints:
        left.append(f"endpoint(s) {', '.join(endpoints)} run models as role {role} (delete them first: aws "
                    f"sagemaker delete-endpoint --endpoint-name NAME)")
    if left:
        raise StackError(f"stack {stack['StackName']}: nothing was deleted: {'; '.join(left)}")


def delete_stack(
    cfg: Config,
    cf: Any,
    s3: Any,
    sagemaker: Any,
    stack_name: str | None = None,
    force: bool = False,
    waiting: stacks.Waiting = stacks.WAIT,
) -> StackResult:
    """Delete the stack; refuse while anything depends on it (check_nothing_depends), and while its bucket holds
    any object version, unless `force` (then empty it first)."""
    name = stack_name or default_stack_name(cfg)
    stack = stacks.describe(cf, name)
    if stack is None:
        return StackResult("absent", name)
    if stack["StackStatus"].endswith("_IN_PROGRESS"):
        raise StackError(f"stack {name} is {stack['StackStatus']}: retry when it has finished")
    check_nothing_depends(stack, sagemaker)
    bucket = outputs(stack).get("BucketName")
    versions = _versions(s3, bucket) if bucket else []
    if versions and not force:
        raise StackError(
            f"bucket {bucket} holds {len(versions)} object version(s) (e.g. {versions[0]['Key']}): nothing was "
            f"deleted; empty it, or pass --force to delete them with the stack"
        )
    for start in range(0, len(versions), 1000):
        batch = versions[start : start + 1000]
        done = call(f"empty bucket {bucket}", s3.delete_objects, Bucket=bucket, Delete={"Objects": batch})
        if done.get("Errors"):
            e = done["Errors"][0]
            raise StackError(f"empty bucket {bucket}: {e.get('Key')}: {e.get('Code')}: {e.get('Message')}")
    stacks.delete(cf, stack, waiting)
    return StackResult("deleted", name, emptied=len(versions))
