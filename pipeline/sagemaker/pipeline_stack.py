"""The pipeline stack: the deploy Lambda (its code, settings, retries and one invocation at a time) and the
EventBridge rules of `triggers` and of the model lifecycle with their permissions to invoke it, as one CloudFormation
template generated from the config and deployed through `stacks` (change sets of CloudFormation, botocore's waiters).

`upsert` deploys it after uploading the Lambda's content-hashed zip and keeps the rules as they are (in the stack or
not); `triggers apply` puts them in and `triggers delete` takes them out. Drift, rollback and deletion are
CloudFormation's. The one thing no template can do is turn on EventBridge notifications of a data bucket that no
stack of ours owns (`triggers.on_new_data`): `apply` does it with one S3 call.
"""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError

from pipeline.code import LAMBDA, bundles
from pipeline.config import Config
from pipeline.config.deploy_settings import settings
from pipeline.sagemaker import stacks
from pipeline.sagemaker.aws import Aws, explained, split_s3_uri
from pipeline.sagemaker.lifecycle_rules import DEPLOY_TARGET_ID
from pipeline.sagemaker.stacks import StackError, StackResult
from pipeline.sagemaker.triggers import MAX_DESCRIPTION, check_parameters, list_, plan, rule_names
from steps.contract import DEPLOY_LAMBDA_TIMEOUT_S

LAMBDA_RUNTIME = "python3.12"
LAMBDA_HANDLER = "steps.deploy.handler.lambda_handler"
# A failed invocation (not a busy endpoint: that is "deferred", a success) is retried twice, then sent to the alerts
# topic; an event waits at most an hour.
EVENT_INVOKE = {"MaximumRetryAttempts": 2, "MaximumEventAgeInSeconds": 3600}
# One invocation at a time: events are handled in turn (no two endpoint tests on one staging endpoint, no interleaved
# registry writes); a throttled event waits in Lambda's queue, a throttled Deploy step is retried by Pipelines.
RESERVED_CONCURRENCY = 1


def stack_name(cfg: Config) -> str:
    return f"{cfg.pipeline.name}-pipeline"[:128]


def deploy_lambda_zip() -> bytes:
    """The deploy bundle (steps/deploy/ with the package's top-level modules) as a reproducible zip."""
    return bundles()[LAMBDA].zip()


def code_uri(cfg: Config) -> str:
    """Where the Lambda's zip goes: under the bundle's content hash, so a new key means new code."""
    return bundles()[LAMBDA].s3_prefix(cfg.s3_root) + "function.zip"


def lambda_environment(cfg: Config) -> dict[str, str]:
    """The deploy Lambda's environment: the config's lifecycle settings, which its handler reads back."""
    return settings(cfg).to_env()


def managed(cfg: Config) -> bool:
    """Whether the stack holds the deploy Lambda (deploy.lambda_role_arn set); else the rules target the function of
    that name, which the user made."""
    return bool(cfg.deploy.lambda_role_arn)


def _function(cfg: Config) -> dict[str, Any]:
    """The deploy Lambda. Its timeout leaves room for an endpoint test (deploy.test.rows requests, each allowed 70 s
    by its client, in practice tens of ms)."""
    bucket, key = split_s3_uri(code_uri(cfg))
    return {"Type": "AWS::Lambda::Function", "Properties": {
        "FunctionName": cfg.deploy.lambda_function_name,
        "Description": "Deploys approved model versions",
        "Code": {"S3Bucket": bucket, "S3Key": key},
        "Role": cfg.deploy.lambda_role_arn,
        "Handler": LAMBDA_HANDLER,
        "Runtime": LAMBDA_RUNTIME,
        "Timeout": DEPLOY_LAMBDA_TIMEOUT_S,
        "MemorySize": 512,
        "ReservedConcurrentExecutions": RESERVED_CONCURRENCY,
        "Environment": {"Variables": lambda_environment(cfg)},
    }}


def _retries(cfg: Config) -> dict[str, Any]:
    """Asynchronous invocations: retries, event age, failures to the alerts topic."""
    properties: dict[str, Any] = {"FunctionName": {"Ref": "DeployFunction"}, "Qualifier": "$LATEST", **EVENT_INVOKE}
    if cfg.alerts.topic_arn:
        properties["DestinationConfig"] = {"OnFailure": {"Destination": cfg.alerts.topic_arn}}
    return {"Type": "AWS::Lambda::EventInvokeConfig", "Properties": properties}


def _logical_id(kind: str) -> str:
    """`deploy-on-approval` -> `DeployOnApprovalRule`."""
    return "".join(word.capitalize() for word in kind.split("-")) + "Rule"


def template(cfg: Config, rules: bool = True) -> str:
    """The stack's template as JSON (with the rules or without), byte-identical for the same config (keys sorted)."""
    resources: dict[str, Any] = {}
    function: Any = cfg.deploy_lambda_arn
    if managed(cfg):
        resources["DeployFunction"] = _function(cfg)
        resources["DeployFunctionRetries"] = _retries(cfg)
        function = {"Fn::GetAtt": ["DeployFunction", "Arn"]}
    kinds = {name: kind for kind, name in rule_names(cfg).items()}
    for rule in plan(cfg) if rules else []:
        logical = _logical_id(kinds[rule["Name"]])
        to_lambda = rule["Targets"][0]["Id"] == DEPLOY_TARGET_ID
        properties = {
            "Name": rule["Name"],
            "Description": rule["Description"][:MAX_DESCRIPTION],
            "State": "ENABLED",
            **{key: rule[key] for key in ("EventPattern", "ScheduleExpression") if key in rule},
            "Targets": [{**target, "Arn": function} if to_lambda else target for target in rule["Targets"]],
        }
        resources[logical] = {"Type": "AWS::Events::Rule", "Properties": properties}
        if to_lambda:
            resources[f"{logical}Permission"] = {"Type": "AWS::Lambda::Permission",
                                                 "Properties": {"FunctionName": function,
                                                                "Action": "lambda:InvokeFunction",
                                                                "Principal": "events.amazonaws.com",
                                                                "SourceArn": {"Fn::GetAtt": [logical, "Arn"]}}}
    body = {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": f"Pipeline {cfg.pipeline.name}: its deploy Lambda and EventBridge rules (generated by "
                       f"pipeline/sagemaker/pipeline_stack.py; deployed by upsert and triggers apply)",
        "Resources": resources,
    }
    return json.dumps(body, indent=1, sort_keys=True)


def _function_exists(cfg: Config, aws: Aws) -> bool:
    with explained(f"look up Lambda {cfg.deploy.lambda_function_name}"):
        try:
            aws.client("lambda").get_function(FunctionName=cfg.deploy.lambda_function_name)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
            return False
    return True


def _made_outside(cfg: Config, aws: Aws) -> list[str]:
    """The Lambda and rules of this stack's names that exist outside it: made by boto3 calls of an earlier version
    of `upsert` and `triggers apply`, which CloudFormation would refuse to create again."""
    found = [f"rule {rule['name']}" for rule in list_(cfg, aws)]
    if managed(cfg) and _function_exists(cfg, aws):
        found.insert(0, f"Lambda function {cfg.deploy.lambda_function_name}")
    return found


def _holds_rules(cf: Any, name: str) -> bool:
    with explained(f"list the resources of stack {name}"):
        pages = cf.get_paginator("list_stack_resources").paginate(StackName=name)
        return any(r["ResourceType"] == "AWS::Events::Rule" for page in pages for r in page["StackResourceSummaries"])


def deploy(cfg: Config, aws: Aws, triggers: bool | None = None, waiting: stacks.Waiting = stacks.WAIT) -> StackResult:
    """Upload the Lambda's zip unless its key exists, then create or update the stack. `triggers`: True turns the
    rules on (their settings checked first), False off, None keeps them as deployed (off on create). With no
    Lambda to manage and no rules, the stack is deleted (or not made)."""
    name, cf = stack_name(cfg), aws.client("cloudformation")
    with explained(f"describe stack {name}"):
        stack = stacks.describe(cf, name)
    rules_on = triggers if triggers is not None else stack is not None and _holds_rules(cf, name)
    if not managed(cfg) and not rules_on:
        if stack is None:
            return StackResult("absent", name)
        stacks.delete(cf, stack, waiting)
        return StackResult("deleted", name)
    if rules_on:
        check_parameters(cfg)
        if not managed(cfg) and not _function_exists(cfg, aws):
            raise StackError(f"stack {name}: the deploy Lambda {cfg.deploy.lambda_function_name} does not exist: set "
                             "deploy.lambda_role_arn to let upsert create it, or create it from steps/deploy/ "
                             "(deploy.lambda_function_name)")
    if stack is None and (outside := _made_outside(cfg, aws)):
        raise StackError(f"stack {name}: {', '.join(outside)} exist(s) outside the stack (made by an earlier version "
                         "of upsert / triggers apply): delete them once (aws lambda delete-function, aws events "
                         "remove-targets and delete-rule), then run this again")
    if managed(cfg):
        uri = code_uri(cfg)
        with explained(f"upload {uri}"):
            if not aws.object_exists(uri):
                aws.put_object(uri, deploy_lambda_zip(), cfg.aws.kms_key_id)
    result = stacks.deploy(cf, name, template(cfg, rules_on), {}, dict(cfg.aws.tags), waiting=waiting)
    if rules_on and cfg.triggers.on_new_data:
        bucket, _ = split_s3_uri(cfg.data.source)
        with explained(f"turn on EventBridge notifications of bucket {bucket}"):
            _enable_s3_eventbridge(aws, bucket)
    return result


def _enable_s3_eventbridge(aws: Aws, bucket: str) -> None:
    """Turn on EventBridge notifications of `bucket`, keeping its other notifications."""
    current = aws.s3.get_bucket_notification_configuration(Bucket=bucket)
    current.pop("ResponseMetadata", None)
    if "EventBridgeConfiguration" not in current:
        aws.s3.put_bucket_notification_configuration(
            Bucket=bucket, NotificationConfiguration={**current, "EventBridgeConfiguration": {}})
