"""The lifecycle's EventBridge rules (pipeline/sagemaker/lifecycle_rules.py, in the pipeline stack) against moto:
their patterns, routed to SQS (moto delivers to SQS only), with events in the shapes SageMaker sends (endpoint
status in EventBridge's IN_SERVICE spelling), and the alerts rule's input transformer."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.sagemaker import pipeline_stack, triggers

ROOT = Path(__file__).resolve().parent.parent
REGION, ACCOUNT = "us-east-1", "123456789012"
TOPIC = f"arn:aws:sns:{REGION}:{ACCOUNT}:trainium-bert-alerts"
SERVER = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:mlflow-tracking-server/trainium-bert"


@pytest.fixture
def applied(moto_session):
    mock, aws = moto_session
    mock.reset()
    cfg = load_config(ROOT / "pipeline.yaml", [f"alerts.topic_arn={TOPIC}", f"tracking.server_arn={SERVER}"],
                      environ={})
    role = aws.client("iam").create_role(RoleName="deploy", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as archive:
        archive.writestr("deploy.py", "")
    aws.client("lambda").create_function(FunctionName=cfg.deploy.lambda_function_name, Runtime="python3.12",
                                         Role=role, Handler="deploy.lambda_handler", Code={"ZipFile": code.getvalue()})
    aws.client("sns").create_topic(Name="trainium-bert-alerts")
    assert pipeline_stack.deploy(cfg, aws, triggers=True).action == "created"
    return cfg, aws


def route_to_queues(aws, names: dict[str, str]) -> dict[str, str]:
    """Replace each rule's targets by an SQS queue (same input transformer): kind -> queue URL."""
    events, sqs, queues = aws.client("events"), aws.client("sqs"), {}
    for kind, name in names.items():
        targets = events.list_targets_by_rule(Rule=name)["Targets"]
        url = sqs.create_queue(QueueName=kind)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events.remove_targets(Rule=name, Ids=[t["Id"] for t in targets])
        extra = {"InputTransformer": targets[0]["InputTransformer"]} if "InputTransformer" in targets[0] else {}
        events.put_targets(Rule=name, Targets=[{"Id": "queue", "Arn": arn, **extra}])
        queues[kind] = url
    return queues


def received(aws, url: str) -> list[dict]:
    messages = aws.client("sqs").receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    return [json.loads(m["Body"]) for m in messages]


def event(detail_type: str, detail: dict) -> dict:
    return {"Source": "aws.sagemaker", "DetailType": detail_type, "Detail": json.dumps(detail)}


def test_rules_targets_and_permissions(applied):
    cfg, aws = applied
    names = triggers.rule_names(cfg)
    events = aws.client("events")
    made = {r["Name"] for r in events.list_rules()["Rules"]}
    assert made == {names[k] for k in ("deploy-on-approval", "rollback-on-reject", "endpoint-state",
                                       "execution-alerts", "execution-tracking")}
    for kind in ("rollback-on-reject", "endpoint-state", "execution-tracking"):
        (target,) = events.list_targets_by_rule(Rule=names[kind])["Targets"]
        assert target["Arn"] == cfg.deploy_lambda_arn
    (alert,) = events.list_targets_by_rule(Rule=names["execution-alerts"])["Targets"]
    assert alert["Arn"] == TOPIC and "<aws.events.event.json>" in alert["InputTransformer"]["InputTemplate"]
    policy = json.loads(aws.client("lambda").get_policy(FunctionName=cfg.deploy.lambda_function_name)["Policy"])
    sources = {s["Condition"]["ArnLike"]["AWS:SourceArn"].rsplit("/", 1)[-1] for s in policy["Statement"]}
    assert sources == {names["deploy-on-approval"], names["rollback-on-reject"], names["endpoint-state"],
                       names["execution-tracking"]}
    assert pipeline_stack.deploy(cfg, aws, triggers=True).action == "unchanged"  # idempotent
    without = load_config(ROOT / "pipeline.yaml", [], environ={})  # no alerts topic, no server: their rules go
    assert pipeline_stack.deploy(without, aws, triggers=True).action == "updated"
    assert {r["Name"] for r in events.list_rules()["Rules"]} == made - {names["execution-alerts"],
                                                                       names["execution-tracking"]}


def test_patterns_route_what_the_lifecycle_needs_and_nothing_else(applied):
    cfg, aws = applied
    names = {k: v for k, v in triggers.rule_names(cfg).items() if k not in ("schedule", "on-new-data")}
    queues = route_to_queues(aws, names)
    endpoint_event, package_event = "SageMaker Endpoint State Change", "SageMaker Model Package State Change"
    execution_event = "SageMaker Model Building Pipeline Execution Status Change"
    execution = f"{cfg.pipeline_arn}/execution/abc123"
    entries = [
        event(endpoint_event, {"EndpointName": "trainium-bert-staging", "EndpointStatus": "IN_SERVICE"}),
        event(endpoint_event, {"EndpointName": "trainium-bert", "EndpointStatus": "FAILED"}),
        event(endpoint_event, {"EndpointName": "trainium-bert-staging", "EndpointStatus": "UPDATING"}),
        event(endpoint_event, {"EndpointName": "someone-elses", "EndpointStatus": "IN_SERVICE"}),
        event(package_event, {"ModelPackageGroupName": "trainium-bert", "ModelApprovalStatus": "Rejected"}),
        event(package_event, {"ModelPackageGroupName": "trainium-bert", "ModelApprovalStatus": "Approved"}),
        event(package_event, {"ModelPackageGroupName": "another", "ModelApprovalStatus": "Rejected"}),
        event(execution_event, {"pipelineArn": cfg.pipeline_arn, "pipelineExecutionArn": execution,
                                "currentPipelineExecutionStatus": "Failed"}),
        event(execution_event, {"pipelineArn": cfg.pipeline_arn, "pipelineExecutionArn": execution,
                                "currentPipelineExecutionStatus": "Executing"}),
        event(execution_event, {"pipelineArn": f"{cfg.pipeline_arn}-other", "currentPipelineExecutionStatus": "Failed",
                                "pipelineExecutionArn": "x"}),
    ]
    assert aws.client("events").put_events(Entries=entries)["FailedEntryCount"] == 0
    endpoints = [(b["detail"]["EndpointName"], b["detail"]["EndpointStatus"])
                 for b in received(aws, queues["endpoint-state"])]
    assert sorted(endpoints) == [("trainium-bert", "FAILED"), ("trainium-bert-staging", "IN_SERVICE")]
    rejections = [b["detail"]["ModelApprovalStatus"] for b in received(aws, queues["rollback-on-reject"])]
    assert rejections == ["Rejected"]
    assert [b["detail"]["ModelApprovalStatus"] for b in received(aws, queues["deploy-on-approval"])] == ["Approved"]
    (alert,) = received(aws, queues["execution-alerts"])
    assert alert["line"] == f"pipeline trainium-bert execution {execution}: Failed"
    (ended,) = received(aws, queues["execution-tracking"])  # a failed execution of this pipeline: its run ends
    assert ended["detail"]["pipelineExecutionArn"] == execution
    assert alert["event"]["detail"]["currentPipelineExecutionStatus"] == "Failed"
