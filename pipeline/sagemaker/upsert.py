"""Put the pipeline into an AWS account: upload content-hashed code, deploy the pipeline stack (the deploy Lambda
and its rules), create or update the pipeline."""

from __future__ import annotations

import hashlib
import json

from pipeline.code import job_bundles
from pipeline.config import Config
from pipeline.config.tracking import tracking_settings
from pipeline.dag.graph import changed_steps
from pipeline.dag.requests import check_job_steps
from pipeline.errors import ConfigError, UserError
from pipeline.records import Upserted
from pipeline.sagemaker import pipeline_stack
from pipeline.sagemaker.aws import MAX_INLINE_DEFINITION, Aws, explained, split_s3_uri
from steps.contract import source_kind


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
    stack = pipeline_stack.deploy(cfg, aws)
    report.deploy_function = (f"stack {stack.stack_name} {stack.action}" if pipeline_stack.managed(cfg) else
                              "not managed (set deploy.lambda_role_arn to let upsert create it)")
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
