"""EventBridge triggers: deploy on approval, run on a schedule, run on new data, and the model lifecycle's rules
(rollback on reject, endpoint state changes to the deploy Lambda, execution alerts to the alerts topic), planned
from the config; the pipeline stack (pipeline_stack.py) holds them. Each rule has a deterministic name derived from
the pipeline name (the alerts topic's policy names one); an option turned off has no rule.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from botocore.exceptions import ClientError

from pipeline.config import Config, check_parameter_values
from pipeline.dag.parameters import ParameterError, resolve
from pipeline.errors import ConfigError
from pipeline.sagemaker.aws import Aws, explained, split_s3_uri
from pipeline.sagemaker.lifecycle_rules import DEPLOY_TARGET_ID, LIFECYCLE_KINDS, lifecycle_rules
from steps.contract import APPROVED, MODEL_PACKAGE_EVENT

PIPELINE_TARGET_ID = "start-pipeline"
MAX_RULE_NAME = 64
MAX_DESCRIPTION = 512  # PutRule.Description


def rule_name(pipeline_name: str, kind: str) -> str:
    """`<pipeline>-<kind>`, shortened with a hash to EventBridge's 64 characters when needed."""
    name = f"{pipeline_name}-{kind}"
    if len(name) <= MAX_RULE_NAME:
        return name
    digest = hashlib.sha256(pipeline_name.encode()).hexdigest()[:8]
    return f"{pipeline_name[: MAX_RULE_NAME - len(kind) - 10]}-{digest}-{kind}"


def rule_names(cfg: Config) -> dict[str, str]:
    """kind -> rule name, in the order apply creates them."""
    kinds = ("deploy-on-approval", "schedule", "on-new-data", *LIFECYCLE_KINDS)
    return {kind: rule_name(cfg.pipeline.name, kind) for kind in kinds}


def approval_pattern(cfg: Config) -> dict:
    return {
        "source": ["aws.sagemaker"],
        "detail-type": [MODEL_PACKAGE_EVENT],
        "detail": {
            "ModelPackageGroupName": [cfg.pipeline.model_package_group],
            "ModelApprovalStatus": [APPROVED],
        },
    }


def new_data_pattern(cfg: Config) -> dict:
    """S3's "Object Created" of the drop marker under data.source, not of every shard: one execution per drop."""
    if not cfg.data.is_s3:
        raise ValueError(f"data.source={cfg.data.source!r}: on-new-data triggers need an s3:// data source")
    bucket, prefix = split_s3_uri(cfg.data.source)
    return {
        "source": ["aws.s3"],
        "detail-type": ["Object Created"],
        "detail": {"bucket": {"name": [bucket]}, "object": {"key": marker_keys(prefix, cfg.triggers.new_data_marker)}},
    }


def marker_keys(prefix: str, marker: str) -> list[Any]:
    """EventBridge matchers of the keys named `marker` under `prefix` (an S3 prefix, as SageMaker stages it), at
    any depth: `<prefix><marker>` and the wildcard `<prefix>*/<marker>`."""
    nested = {"wildcard": f"{_literal(prefix)}*/{_literal(marker)}"}
    return [prefix + marker, nested] if prefix.endswith("/") or not prefix else [nested]


def _literal(text: str) -> str:
    """`text` as a literal inside an EventBridge wildcard: its `\\` and `*` escaped."""
    return text.replace("\\", "\\\\").replace("*", "\\*")


def _pipeline_target(cfg: Config, arn: str) -> dict:
    settings = cfg.triggers
    if not settings.events_role_arn:
        raise ValueError("a schedule or on-new-data trigger needs events_role_arn (a role EventBridge can assume)")
    return {
        "Id": PIPELINE_TARGET_ID,
        "Arn": arn,
        "RoleArn": settings.events_role_arn,
        "SageMakerPipelineParameters": {
            "PipelineParameterList": [
                {"Name": k, "Value": str(v)} for k, v in sorted(settings.schedule_parameters.items())
            ]
        },
    }


def check_parameters(cfg: Config) -> None:
    """triggers.schedule_parameters checked as `start` checks --param (declared names, types, the InputData form),
    against the definition of this config: EventBridge would only fail to start the execution, silently."""
    if not cfg.triggers.schedule_parameters:
        return
    from pipeline.definition import definition

    try:
        option, given = "triggers.schedule_parameters.", cfg.triggers.schedule_parameters
        check_parameter_values(cfg, resolve(json.loads(definition(cfg)), given, option), given, option)
    except ParameterError as e:
        raise ConfigError(str(e)) from None


def plan(cfg: Config) -> list[dict]:
    """The rules of cfg.triggers and the lifecycle: [{"Name", "Description", "EventPattern"|"ScheduleExpression",
    "Targets"}] (no calls)."""
    settings = cfg.triggers
    names = rule_names(cfg)
    arn = cfg.pipeline_arn
    rules: list[dict] = [
        {
            "Name": names["deploy-on-approval"],
            "Description": f"Deploy approved versions of {cfg.pipeline.model_package_group} to "
            f"{cfg.deploy.endpoint_name}",
            "EventPattern": approval_pattern(cfg),
            "Targets": [{"Id": DEPLOY_TARGET_ID, "Arn": cfg.deploy_lambda_arn}],
        }
    ]
    if settings.schedule:
        rules.append(
            {
                "Name": names["schedule"],
                "Description": f"Start pipeline {cfg.pipeline.name} on a schedule",
                "ScheduleExpression": settings.schedule,
                "Targets": [_pipeline_target(cfg, arn)],
            }
        )
    if settings.on_new_data:
        rules.append(
            {
                "Name": names["on-new-data"],
                "Description": f"Start pipeline {cfg.pipeline.name} once per data drop: when an object "
                f"{settings.new_data_marker} is created under {cfg.data.source}",
                "EventPattern": new_data_pattern(cfg),
                "Targets": [_pipeline_target(cfg, arn)],
            }
        )
    return rules + lifecycle_rules(cfg, names)


def _code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


def _describe_rule(aws: Aws, name: str) -> dict | None:
    try:
        return aws.client("events").describe_rule(Name=name)
    except ClientError as e:
        if _code(e) == "ResourceNotFoundException":
            return None
        raise


def list_(cfg: Config, aws: Aws) -> list[dict]:
    """The rules of the pipeline stack that exist now: name, state, pattern or schedule, targets."""
    found = []
    for kind, name in rule_names(cfg).items():
        with explained(f"describe rule {name}"):
            rule = _describe_rule(aws, name)
            if rule is None:
                continue
            targets = aws.client("events").list_targets_by_rule(Rule=name).get("Targets", [])
        found.append(
            {
                "kind": kind,
                "name": name,
                "state": rule.get("State", ""),
                "schedule": rule.get("ScheduleExpression"),
                "event_pattern": json.loads(rule["EventPattern"]) if rule.get("EventPattern") else None,
                "targets": [
                    {
                        "id": t["Id"],
                        "arn": t["Arn"],
                        "role_arn": t.get("RoleArn"),
                        "parameters": {
                            p["Name"]: p["Value"]
                            for p in t.get("SageMakerPipelineParameters", {}).get("PipelineParameterList", [])
                        },
                    }
                    for t in targets
                ],
            }
        )
    return found
