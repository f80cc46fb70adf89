"""Put the pipeline into an AWS account: upload content-hashed code, create or update the pipeline."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import zipfile

from pipeline.code import bundles
from pipeline.config import Config
from pipeline.dag.graph import changed_steps
from pipeline.dag.requests import check_job_steps
from pipeline.records import Upserted
from pipeline.sagemaker.aws import MAX_INLINE_DEFINITION, Aws, explained, split_s3_uri

LAMBDA_RUNTIME = "python3.12"
LAMBDA_HANDLER = "deploy.lambda_handler"


def deploy_lambda_zip() -> bytes:
    """`steps/deploy.py` as `deploy.py` in a reproducible zip (fixed time and mode)."""
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as archive:
        info = zipfile.ZipInfo("deploy.py", date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o644 << 16
        archive.writestr(info, bundles()["steps"].files["deploy.py"])
    return raw.getvalue()


def deploy_lambda_settings(cfg: Config) -> dict:
    """Configuration of the deploy Lambda: the handler reads the endpoint settings from its environment."""
    variables = {
        "ENDPOINT_NAME": cfg.deploy.endpoint_name,
        "INSTANCE_TYPE": cfg.deploy.instance_type,
        "INSTANCE_COUNT": str(cfg.deploy.instance_count),
        "SAGEMAKER_ROLE_ARN": cfg.aws.role_arn,
    }
    if cfg.deploy.data_capture_s3_uri:
        variables["DATA_CAPTURE_S3_URI"] = cfg.deploy.data_capture_s3_uri
    if cfg.deploy.guardrails_alarm:
        variables["GUARDRAILS_ALARM"] = cfg.deploy.guardrails_alarm
    return {
        "Role": cfg.deploy.lambda_role_arn,
        "Handler": LAMBDA_HANDLER,
        "Runtime": LAMBDA_RUNTIME,
        "Timeout": 300,
        "MemorySize": 256,
        "Environment": {"Variables": variables},
    }


def upsert_deploy_lambda(cfg: Config, aws: Aws) -> str:
    """Create the deploy Lambda from `steps/deploy.py`, or update its code and configuration where they differ."""
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
    return f"updated {' and '.join(actions)}" if actions else "unchanged"


def upload_code(cfg: Config, aws: Aws, report: Upserted) -> None:
    """Upload each code object unless its content-hashed key already exists."""
    for bundle in bundles().values():
        for uri, data in bundle.uploads(cfg.s3_root).items():
            with explained(f"upload {uri}"):
                if aws.object_exists(uri):
                    report.skipped.append(uri)
                else:
                    aws.put_object(uri, data, cfg.aws.kms_key_id)
                    report.uploaded.append(uri)


def upsert(cfg: Config, definition_json: str, aws: Aws) -> Upserted:
    """Check the job steps against SageMaker's API model, upload the step code, then create the pipeline or update
    it to `definition_json`."""
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
