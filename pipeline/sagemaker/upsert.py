"""Put the pipeline into an AWS account: upload content-hashed code, create or update the pipeline."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from pipeline.code import LAMBDA, bundles, job_bundles
from pipeline.config import Config
from pipeline.config.deploy_settings import settings
from pipeline.config.tracking import tracking_settings
from pipeline.dag.graph import changed_steps
from pipeline.dag.requests import check_job_steps
from pipeline.errors import ConfigError, UserError
from pipeline.records import Upserted
from pipeline.sagemaker.aws import MAX_INLINE_DEFINITION, Aws, explained, split_s3_uri
from steps.contract import DEPLOY_LAMBDA_TIMEOUT_S, source_kind

LAMBDA_RUNTIME = "python3.12"
LAMBDA_HANDLER = "steps.deploy.handler.lambda_handler"
# A failed invocation (not a busy endpoint: that is "deferred", a success) is retried twice, then sent to the alerts
# topic; an event waits at most an hour.
EVENT_INVOKE = {"MaximumRetryAttempts": 2, "MaximumEventAgeInSeconds": 3600}
# One invocation at a time: events are handled in turn (no two endpoint tests on one staging endpoint, no interleaved
# registry writes); a throttled event waits in Lambda's queue, a throttled Deploy step is retried by Pipelines.
RESERVED_CONCURRENCY = 1


def deploy_lambda_zip() -> bytes:
    """The deploy bundle (steps/deploy/ with the package's top-level modules) as a reproducible zip."""
    return bundles()[LAMBDA].zip()


def lambda_environment(cfg: Config) -> dict[str, str]:
    """The deploy Lambda's environment: the config's lifecycle settings, which its handler reads back."""
    return settings(cfg).to_env()


def deploy_lambda_settings(cfg: Config) -> dict:
    """Configuration of the deploy Lambda: the handler reads its settings from its environment. Its timeout leaves
    room for an endpoint test (deploy.test.rows requests, each allowed 70 s by its client, in practice tens of ms)."""
    return {
        "Role": cfg.deploy.lambda_role_arn,
        "Handler": LAMBDA_HANDLER,
        "Runtime": LAMBDA_RUNTIME,
        "Timeout": DEPLOY_LAMBDA_TIMEOUT_S,
        "MemorySize": 512,
        "Environment": {"Variables": lambda_environment(cfg)},
    }


def event_invoke_config(cfg: Config) -> dict:
    """PutFunctionEventInvokeConfig of the deploy Lambda: retries, event age, failures to the alerts topic."""
    config: dict = {"FunctionName": cfg.deploy.lambda_function_name, **EVENT_INVOKE}
    if cfg.alerts.topic_arn:
        config["DestinationConfig"] = {"OnFailure": {"Destination": cfg.alerts.topic_arn}}
    return config


def upsert_deploy_lambda(cfg: Config, aws: Aws) -> str:
    """Create the deploy Lambda from `steps/deploy/`, or update its code and configuration where they differ."""
    if not cfg.deploy.lambda_role_arn:
        return "not managed (set deploy.lambda_role_arn to let upsert create it)"
    lam, name = aws.client("lambda"), cfg.deploy.lambda_function_name
    code, settings = deploy_lambda_zip(), deploy_lambda_settings(cfg)
    with explained(f"look up Lambda {name}"):
        try:
            current = lam.get_function(FunctionName=name)["Configuration"]
        except lam.exceptions.ResourceNotFoundException:
            current = None
    if current is None:
        with explained(f"create Lambda {name}"):
            lam.create_function(
                FunctionName=name,
                Code={"ZipFile": code},
                Description="Deploys approved model versions",
                Tags=dict(cfg.aws.tags),
                **settings,
            )
            lam.get_waiter("function_active_v2").wait(FunctionName=name)
        _put_event_invoke_config(cfg, lam)
        _reserve_concurrency(lam, name)
        return "created"
    actions = []
    if current.get("CodeSha256") != base64.b64encode(hashlib.sha256(code).digest()).decode():
        with explained(f"update code of Lambda {name}"):
            lam.update_function_code(FunctionName=name, ZipFile=code)
            lam.get_waiter("function_updated_v2").wait(FunctionName=name)
        actions.append("code")
    if any(current.get(key) != value for key, value in settings.items()):
        with explained(f"update configuration of Lambda {name}"):
            lam.update_function_configuration(FunctionName=name, **settings)
        actions.append("configuration")
    if _put_event_invoke_config(cfg, lam):
        actions.append("retries")
    if _reserve_concurrency(lam, name):
        actions.append("concurrency")
    return f"updated {' and '.join(actions)}" if actions else "unchanged"


def _reserve_concurrency(lam: Any, name: str) -> bool:
    """Reserve RESERVED_CONCURRENCY for the Lambda where it has another; True if changed."""
    with explained(f"reserve concurrency {RESERVED_CONCURRENCY} for Lambda {name}"):
        if lam.get_function_concurrency(FunctionName=name).get("ReservedConcurrentExecutions") == RESERVED_CONCURRENCY:
            return False
        lam.put_function_concurrency(FunctionName=name, ReservedConcurrentExecutions=RESERVED_CONCURRENCY)
    return True


def _put_event_invoke_config(cfg: Config, lam: Any) -> bool:
    """Put the Lambda's asynchronous invocation settings (a full overwrite) where they differ; True if changed."""
    wanted = event_invoke_config(cfg)
    name = wanted["FunctionName"]
    with explained(f"read the asynchronous invocation settings of Lambda {name}"):
        try:
            current = lam.get_function_event_invoke_config(FunctionName=name)
        except lam.exceptions.ResourceNotFoundException:
            current = {}
    if all(current.get(key) == value for key, value in wanted.items() if key != "FunctionName") and (
            "DestinationConfig" in wanted or not (current.get("DestinationConfig") or {}).get("OnFailure")):
        return False
    with explained(f"put the asynchronous invocation settings of Lambda {name}"):
        lam.put_function_event_invoke_config(**wanted)
    return True


def upload_code(cfg: Config, aws: Aws, report: Upserted) -> None:
    """Upload each code object unless its content-hashed key already exists, and the tracking file (always: its key
    is fixed)."""
    uri, settings = tracking_settings(cfg)
    with explained(f"upload {uri}"):
        aws.put_object(uri, settings, cfg.aws.kms_key_id)
    for bundle in job_bundles():
        for uri, data in bundle.uploads(cfg.s3_root).items():
            with explained(f"upload {uri}"):
                if aws.object_exists(uri):
                    report.skipped.append(uri)
                else:
                    aws.put_object(uri, data, cfg.aws.kms_key_id)
                    report.uploaded.append(uri)


def check_model_reachable(cfg: Config) -> None:
    """Refuse a training.model_id that is a folder on this machine (`package:NAME` included): the AWS jobs
    cannot read it, and would fail at model load after Tokenize ran."""
    if source_kind(cfg.training.model_id) == "folder":
        raise ConfigError(f"training.model_id={cfg.training.model_id!r} is a folder on this machine, which the AWS "
                          "jobs cannot read: expected a Hub model id or an s3:// URI (upload the folder with aws s3 "
                          "sync)")


def check_data_reachable(source: str, where: str = "data.source", error: type[UserError] = ConfigError) -> None:
    """Refuse a data source (data.source, or an execution's InputData) that is a folder on this machine: the
    Tokenize job cannot read it."""
    if source_kind(source) == "folder":
        raise error(f"{where}={source!r} is a folder on this machine, which the AWS jobs cannot read: expected a Hub "
                    "dataset name, sample[:N] or an s3:// URI (upload the folder with aws s3 sync)")


def upsert(cfg: Config, definition_json: str, aws: Aws) -> Upserted:
    """Check the model's source and the job steps against SageMaker's API model, upload the step code, then create
    the pipeline or update it to `definition_json`."""
    check_model_reachable(cfg)
    check_data_reachable(cfg.data.source)
    check_job_steps(json.loads(definition_json))
    report = Upserted(action="", pipeline_arn="")
    upload_code(cfg, aws, report)
    report.deploy_function = upsert_deploy_lambda(cfg, aws)
    name = cfg.pipeline.name
    with explained(f"describe pipeline {name}"):
        old = aws.pipeline_definition(name)
    report.steps = changed_steps(old, json.loads(definition_json))
    request: dict = {"PipelineName": name, "RoleArn": cfg.aws.role_arn}
    if len(definition_json.encode()) <= MAX_INLINE_DEFINITION:
        request["PipelineDefinition"] = definition_json
    else:
        digest = hashlib.sha256(definition_json.encode()).hexdigest()
        uri = f"{cfg.s3_root}/definitions/{digest}.json"
        with explained(f"upload {uri}"):
            aws.put_object(uri, definition_json.encode(), cfg.aws.kms_key_id)
        bucket, key = split_s3_uri(uri)
        request["PipelineDefinitionS3Location"] = {"Bucket": bucket, "ObjectKey": key}
    with explained(f"{'update' if old else 'create'} pipeline {name}"):
        if old is None:
            tags = [{"Key": k, "Value": v} for k, v in sorted(cfg.aws.tags.items())]
            response = aws.sagemaker.create_pipeline(
                **request,
                PipelineDescription="Fine-tune BERT on AWS Trainium",
                Tags=tags,
            )
            report.action = "created"
        else:
            response = aws.sagemaker.update_pipeline(**request)
            report.action = "updated"
    report.pipeline_arn = response["PipelineArn"]
    return report
