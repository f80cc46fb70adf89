"""Put the pipeline into an AWS account: upload content-hashed code, create or update the pipeline."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from pipeline.aws import MAX_INLINE_DEFINITION, Aws, explained, split_s3_uri
from pipeline.code import bundles
from pipeline.config import Config


def flatten_steps(steps: list[dict]) -> dict[str, dict]:
    """Step name -> step, including the steps nested in condition branches."""
    found: dict[str, dict] = {}
    for step in steps:
        found[step["Name"]] = step
        if step.get("Type") == "Condition":
            args = step.get("Arguments", {})
            found.update(flatten_steps(args.get("IfSteps", []) + args.get("ElseSteps", [])))
    return found


def changed_steps(old: dict | None, new: dict) -> dict[str, list[str]]:
    """Steps added, removed and changed between two definitions (a condition counts its branches apart)."""

    def own(step: dict) -> str:
        if step.get("Type") != "Condition":
            return json.dumps(step, sort_keys=True)
        args = dict(step["Arguments"])
        args["IfSteps"] = [s["Name"] for s in args.get("IfSteps", [])]
        args["ElseSteps"] = [s["Name"] for s in args.get("ElseSteps", [])]
        return json.dumps({**step, "Arguments": args}, sort_keys=True)

    before = flatten_steps(old["Steps"]) if old else {}
    after = flatten_steps(new["Steps"])
    return {
        "added": sorted(after.keys() - before.keys()),
        "removed": sorted(before.keys() - after.keys()),
        "changed": sorted(n for n in after.keys() & before.keys() if own(after[n]) != own(before[n])),
    }


@dataclass
class UpsertReport:
    action: str = ""
    pipeline_arn: str = ""
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    steps: dict[str, list[str]] = field(default_factory=dict)


def upload_code(cfg: Config, aws: Aws, report: UpsertReport) -> None:
    """Upload each code object unless its content-hashed key already exists."""
    for bundle in bundles().values():
        for uri, data in bundle.uploads(cfg.s3_root).items():
            with explained(f"upload {uri}"):
                if aws.object_exists(uri):
                    report.skipped.append(uri)
                else:
                    aws.put_object(uri, data, cfg.aws.kms_key_id)
                    report.uploaded.append(uri)


def upsert(cfg: Config, definition_json: str, aws: Aws) -> UpsertReport:
    """Upload the step code, then create the pipeline or update it to `definition_json`."""
    report = UpsertReport()
    upload_code(cfg, aws, report)
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
