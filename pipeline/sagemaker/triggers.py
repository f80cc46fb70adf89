"""EventBridge triggers: deploy on approval, run on a schedule, run on new data, and the model lifecycle's rules
(rollback on reject, endpoint state changes to the deploy Lambda, execution alerts to the alerts topic).

Each rule has a deterministic name derived from the pipeline name, so `apply` is idempotent (put_rule
and put_targets overwrite), and `delete` removes exactly what `apply` made. An option that is turned
off has its rule removed by the next `apply`: the settings are the truth.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from botocore.exceptions import ClientError

from pipeline.config import Config, check_parameter_values
from pipeline.dag.parameters import ParameterError, resolve
from pipeline.errors import ConfigError
from pipeline.sagemaker.aws import Aws, AwsError, explained, split_s3_uri
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


def plan(cfg: Config, pipeline: str | None = None) -> list[dict]:
    """The rules apply puts for cfg.triggers: [{"Name", "EventPattern"|"ScheduleExpression", "Targets"}] (no calls)."""
    settings = cfg.triggers
    names = rule_names(cfg)
    arn = pipeline or cfg.pipeline_arn
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


def _same_rule(old: dict | None, new: dict) -> bool:
    if old is None:
        return False
    if "EventPattern" in new:
        return json.loads(old.get("EventPattern") or "null") == new["EventPattern"] and old.get("State") == "ENABLED"
    return old.get("ScheduleExpression") == new["ScheduleExpression"] and old.get("State") == "ENABLED"


def _existing_pipeline_arn(cfg: Config, aws: Aws) -> str:
    """The deployed pipeline's ARN as SageMaker spells it; the computed one if it is not deployed yet."""
    try:
        return aws.sagemaker.describe_pipeline(PipelineName=cfg.pipeline.name)["PipelineArn"]
    except ClientError as e:
        if _code(e) in ("ResourceNotFound", "ValidationException"):
            return cfg.pipeline_arn
        raise


def _allow_events_to_invoke(cfg: Config, aws: Aws, rule_arn: str) -> None:
    """Let EventBridge invoke the deploy Lambda from this rule (an existing statement is fine)."""
    lam = aws.client("lambda")
    sid = _statement_id(cfg, rule_arn.rsplit("/", 1)[-1])
    try:
        policy = json.loads(lam.get_policy(FunctionName=cfg.deploy.lambda_function_name)["Policy"])
        if any(s.get("Sid") == sid for s in policy.get("Statement", [])):
            return
    except ClientError as e:
        if _code(e) != "ResourceNotFoundException":  # no policy yet, or no function (add_permission says)
            raise
    try:
        lam.add_permission(
            FunctionName=cfg.deploy.lambda_function_name,
            StatementId=sid,
            Action="lambda:InvokeFunction",
            Principal="events.amazonaws.com",
            SourceArn=rule_arn,
        )
    except ClientError as e:
        if _code(e) == "ResourceConflictException":
            return
        if _code(e) == "ResourceNotFoundException":
            raise AwsError(
                f"allow EventBridge to invoke {cfg.deploy.lambda_function_name}: the deploy Lambda does not exist "
                f"(create it from steps/deploy/handler.py first; deploy.lambda_function_name)"
            ) from None
        raise


def _statement_id(cfg: Config, rule: str | None = None) -> str:
    """The Lambda permission statement of a rule (the approval rule's by default)."""
    return (rule or rule_names(cfg)["deploy-on-approval"])[:100]


def _enable_s3_eventbridge(aws: Aws, bucket: str) -> bool:
    """Turn on EventBridge notifications of `bucket`, keeping its other notifications; True if changed."""
    s3 = aws.s3
    current = s3.get_bucket_notification_configuration(Bucket=bucket)
    current.pop("ResponseMetadata", None)
    if "EventBridgeConfiguration" in current:
        return False
    s3.put_bucket_notification_configuration(
        Bucket=bucket, NotificationConfiguration={**current, "EventBridgeConfiguration": {}}
    )
    return True


def apply(cfg: Config, aws: Aws | None, print_only: bool = False) -> list[dict]:
    """Create or update the rules of cfg.triggers and their targets; remove rules whose option is off.

    triggers.schedule_parameters are checked first (ConfigError: nothing is created). Returns one entry per rule:
    {"name", "action": "created"|"updated"|"unchanged"|"deleted"|"planned", "rule": the planned rule}. With
    print_only nothing is called (aws may be None).
    """
    settings = cfg.triggers
    check_parameters(cfg)
    if print_only:
        return [{"name": r["Name"], "action": "planned", "rule": r} for r in plan(cfg)]
    assert aws is not None
    events = aws.client("events")
    with explained(f"describe pipeline {cfg.pipeline.name}"):
        arn = _existing_pipeline_arn(cfg, aws) if (settings.schedule or settings.on_new_data) else None
    rules = plan(cfg, arn)
    report: list[dict] = []
    for rule in rules:
        name = rule["Name"]
        with explained(f"put rule {name}"):
            old = _describe_rule(aws, name)
            request: dict[str, Any] = {"Name": name, "State": "ENABLED",
                                       "Description": rule["Description"][:MAX_DESCRIPTION]}
            if "EventPattern" in rule:
                request["EventPattern"] = json.dumps(rule["EventPattern"])
            else:
                request["ScheduleExpression"] = rule["ScheduleExpression"]
            tags = [{"Key": k, "Value": v} for k, v in sorted(cfg.aws.tags.items())]
            if old is None and tags:
                request["Tags"] = tags
            rule_arn = events.put_rule(**request)["RuleArn"]
        with explained(f"put targets of rule {name}"):
            before = {t["Id"]: t for t in events.list_targets_by_rule(Rule=name).get("Targets", [])}
            same_targets = all(_same_target(before.get(t["Id"]), t) for t in rule["Targets"])
            response = events.put_targets(Rule=name, Targets=rule["Targets"])
            if response.get("FailedEntryCount"):
                failed = response["FailedEntries"][0]
                raise AwsError(f"put targets of rule {name}: {failed.get('ErrorCode')}: {failed.get('ErrorMessage')}")
        if rule["Targets"][0]["Id"] == DEPLOY_TARGET_ID:
            with explained(f"allow rule {name} to invoke {cfg.deploy.lambda_function_name}"):
                _allow_events_to_invoke(cfg, aws, rule_arn)
        if "on-new-data" in name:
            bucket, _ = split_s3_uri(cfg.data.source)
            with explained(f"turn on EventBridge notifications of bucket {bucket}"):
                _enable_s3_eventbridge(aws, bucket)
        action = "created" if old is None else ("unchanged" if _same_rule(old, rule) and same_targets else "updated")
        report.append({"name": name, "action": action, "rule": rule, "arn": rule_arn})
    wanted = {r["Name"] for r in rules}
    for name in rule_names(cfg).values():
        if name not in wanted and _delete_rule(cfg, aws, name):
            report.append({"name": name, "action": "deleted", "rule": None})
    return report


def _same_target(old: dict | None, new: dict) -> bool:
    return old is not None and all(old.get(k) == v for k, v in new.items())


def list_(cfg: Config, aws: Aws) -> list[dict]:
    """The rules apply made that exist now: name, state, pattern or schedule, targets."""
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


def _delete_rule(cfg: Config, aws: Aws, name: str) -> bool:
    """Remove the rule's targets, then the rule, and the deploy Lambda's permission for it (apply gave one to each
    rule that targets the Lambda; none is fine); False if the rule does not exist."""
    events = aws.client("events")
    with explained(f"delete rule {name}"):
        if _describe_rule(aws, name) is None:
            existed = False
        else:
            ids = [t["Id"] for t in events.list_targets_by_rule(Rule=name).get("Targets", [])]
            if ids:
                events.remove_targets(Rule=name, Ids=ids, Force=False)
            events.delete_rule(Name=name)
            existed = True
    try:
        aws.client("lambda").remove_permission(FunctionName=cfg.deploy.lambda_function_name,
                                               StatementId=_statement_id(cfg, name))
    except ClientError as e:
        if _code(e) != "ResourceNotFoundException":
            raise AwsError(f"remove permission {_statement_id(cfg, name)} of {cfg.deploy.lambda_function_name}: "
                           f"{e}") from None
    return existed


def delete(cfg: Config, aws: Aws) -> list[str]:
    """Delete every rule apply made (targets first) and the Lambda's permissions for them; the names deleted."""
    return [name for name in rule_names(cfg).values() if _delete_rule(cfg, aws, name)]
