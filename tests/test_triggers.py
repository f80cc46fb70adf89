"""EventBridge triggers (pipeline/sagemaker/triggers.py) against moto, in-process.

moto delivers put_events to SQS with real pattern matching, but raises for a Lambda or SageMaker pipeline
target. So event routing is tested by an SQS queue added as an extra target of the approval rule, with
moto's delivery to the Lambda target recorded instead of attempted (`lambda_deliveries`); the recorded
event is then given to the deploy handler by hand. Schedule and pipeline targets are read back, never fired.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from pipeline.code import step_module
from pipeline.config import Triggers, load_config
from pipeline.sagemaker import triggers
from pipeline.sagemaker.aws import AwsError
from pipeline.sagemaker.policies import policies
from pipeline.sagemaker.upsert import lambda_environment

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
BUCKET = "test-data-bucket"
EVENTS_ROLE = "arn:aws:iam::123456789012:role/EventBridgeStartPipeline"
EVENT = "SageMaker Model Package State Change"

deploy_step = step_module("deploy")


def with_triggers(cfg, **values):
    """`cfg` with these `triggers` settings."""
    return cfg.model_copy(update={"triggers": Triggers(**values)})


def config(**sets: str):
    overrides = [f"{k}={v}" for k, v in {"data.source": f"s3://{BUCKET}/reviews/", **sets}.items()]
    return load_config(ROOT / "pipeline.yaml", overrides=overrides, environ={})


@pytest.fixture
def aws(moto_session):
    mock, aws = moto_session
    mock.reset()
    cfg = config()
    iam = aws.client("iam")
    role = iam.create_role(
        RoleName="deploy-lambda",
        AssumeRolePolicyDocument=json.dumps(policies(cfg)["deploy-lambda-trust"]),
    )["Role"]["Arn"]
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as z:
        z.write(ROOT / "steps" / "deploy.py", "deploy.py")
    aws.client("lambda").create_function(
        FunctionName=cfg.deploy.lambda_function_name,
        Runtime="python3.12",
        Role=role,
        Handler="deploy.lambda_handler",
        Code={"ZipFile": code.getvalue()},
    )
    aws.s3.create_bucket(Bucket=BUCKET)
    return aws


@pytest.fixture
def lambda_deliveries(monkeypatch):
    """Events moto would hand to a Lambda target (it cannot invoke one): recorded, other targets served."""
    from moto.events.models import Rule

    delivered: list[dict] = []
    send = Rule.send_to_targets

    def send_to_targets(self, original_event, transform_input=True):
        if not self.event_pattern.matches_event(original_event):
            return
        targets = self.targets
        delivered.extend(dict(original_event) for t in targets if ":lambda:" in t["Arn"])
        self.targets = [t for t in targets if ":lambda:" not in t["Arn"]]
        try:
            send(self, original_event, transform_input)
        finally:
            self.targets = targets

    monkeypatch.setattr(Rule, "send_to_targets", send_to_targets)
    return delivered


def rules(aws) -> list[str]:
    return sorted(r["Name"] for r in aws.client("events").list_rules()["Rules"])


def targets(aws, rule: str) -> list[dict]:
    return aws.client("events").list_targets_by_rule(Rule=rule)["Targets"]


def model_package_event(group: str, version: int, status: str) -> dict:
    arn = f"arn:aws:sagemaker:{REGION}:123456789012:model-package/{group}/{version}"
    detail = {
        "ModelPackageGroupName": group,
        "ModelPackageVersion": version,
        "ModelPackageArn": arn,
        "ModelPackageName": group,
        "CreationTime": 1767225600000,
        "ModelApprovalStatus": status,
        "ModelPackageStatus": "Completed",
    }
    return {"Source": "aws.sagemaker", "DetailType": EVENT, "Detail": json.dumps(detail), "Resources": [arn]}


def test_apply_twice_leaves_one_copy_of_each_rule_and_target(aws):
    cfg = config()
    cfg = with_triggers(
        cfg,
        schedule="cron(0 3 ? * MON *)",
        schedule_parameters={"Epochs": "1"},
        on_new_data=True,
        events_role_arn=EVENTS_ROLE,
    )
    first = triggers.apply(cfg, aws)
    assert [r["action"] for r in first] == ["created"] * 5  # with the lifecycle's rejection and endpoint rules
    second = triggers.apply(cfg, aws)
    assert [r["action"] for r in second] == ["unchanged"] * 5
    names = triggers.rule_names(cfg)
    assert rules(aws) == sorted(n for kind, n in names.items() if kind != "execution-alerts")
    assert [t["Id"] for t in targets(aws, names["deploy-on-approval"])] == ["deploy-lambda"]
    assert [t["Id"] for t in targets(aws, names["schedule"])] == ["start-pipeline"]
    assert [t["Id"] for t in targets(aws, names["on-new-data"])] == ["start-pipeline"]
    assert targets(aws, names["deploy-on-approval"])[0]["Arn"] == cfg.deploy_lambda_arn
    policy = json.loads(aws.client("lambda").get_policy(FunctionName=cfg.deploy.lambda_function_name)["Policy"])
    statement = {s["Sid"]: s for s in policy["Statement"]}[names["deploy-on-approval"]]
    assert len(policy["Statement"]) == 3  # one per rule that invokes the deploy Lambda
    assert statement["Principal"] == {"Service": "events.amazonaws.com"}
    assert statement["Condition"]["ArnLike"]["AWS:SourceArn"].endswith(f"rule/{names['deploy-on-approval']}")
    # An option turned off loses its rule on the next apply.
    third = triggers.apply(with_triggers(cfg), aws)
    assert {r["name"]: r["action"] for r in third} == {
        names["deploy-on-approval"]: "unchanged",
        names["schedule"]: "deleted",
        names["on-new-data"]: "deleted",
        names["rollback-on-reject"]: "unchanged",
        names["endpoint-state"]: "unchanged",
    }
    assert rules(aws) == sorted([names["deploy-on-approval"], names["rollback-on-reject"], names["endpoint-state"]])


def test_approval_rule_matches_approved_versions_of_our_group_only(aws, lambda_deliveries, monkeypatch):
    cfg = config()
    triggers.apply(cfg, aws)
    rule = triggers.rule_names(cfg)["deploy-on-approval"]
    sqs = aws.client("sqs")
    queue = sqs.create_queue(QueueName="approvals")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    aws.client("events").put_targets(Rule=rule, Targets=[{"Id": "test-queue", "Arn": queue_arn}])

    group = cfg.pipeline.model_package_group
    sm = aws.sagemaker
    sm.create_model_package_group(ModelPackageGroupName=group)
    spec = {
        "Containers": [
            {"Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/hf:cpu", "ModelDataUrl": "s3://b/m.tar.gz"}
        ],
        "SupportedContentTypes": ["application/json"],
        "SupportedResponseMIMETypes": ["application/json"],
    }
    sm.create_model_package(ModelPackageGroupName=group, InferenceSpecification=spec, ModelApprovalStatus="Approved")

    entries = [
        model_package_event("another-group", 1, "Approved"),
        model_package_event(group, 1, "Rejected"),
        model_package_event(group, 1, "PendingManualApproval"),
        model_package_event(group, 1, "Approved"),
    ]
    assert aws.client("events").put_events(Entries=entries)["FailedEntryCount"] == 0

    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
    bodies = [json.loads(m["Body"]) for m in messages]
    assert [(b["detail"]["ModelPackageGroupName"], b["detail"]["ModelApprovalStatus"]) for b in bodies] == [
        (group, "Approved")
    ]
    assert bodies[0]["detail-type"] == EVENT and bodies[0]["source"] == "aws.sagemaker"
    assert len(lambda_deliveries) == 3  # Approved (this rule), Rejected and PendingManualApproval (rollback-on-reject)

    # The deploy handler, given the delivered event, deploys the version it names to staging.
    for key, value in lambda_environment(cfg).items():
        monkeypatch.setenv(key, value)
    result = deploy_step.lambda_handler(bodies[0], None)
    assert result["action"] == "created" and result["endpoint_name"] == cfg.deploy.staging_endpoint_name
    assert (
        sm.describe_endpoint(EndpointName=cfg.deploy.staging_endpoint_name)["EndpointConfigName"]
        == result["endpoint_config_name"]
    )


def test_schedule_rule_starts_the_pipeline_with_parameters_and_role(aws):
    # Read back only: a pipeline target on the bus would break every put_events in moto.
    cfg = config()
    aws.sagemaker.create_pipeline(
        PipelineName=cfg.pipeline.name,
        PipelineDefinition=json.dumps({"Version": "2020-12-01", "Steps": []}),
        RoleArn=cfg.aws.role_arn,
    )
    cfg = with_triggers(
        cfg,
        schedule="rate(7 days)",
        schedule_parameters={"Epochs": "1", "InputData": "s3://b/new/"},
        events_role_arn=EVENTS_ROLE,
    )
    triggers.apply(cfg, aws)
    name = triggers.rule_names(cfg)["schedule"]
    assert aws.client("events").describe_rule(Name=name)["ScheduleExpression"] == "rate(7 days)"
    (target,) = targets(aws, name)
    assert target["Arn"] == aws.sagemaker.describe_pipeline(PipelineName=cfg.pipeline.name)["PipelineArn"]
    assert target["RoleArn"] == EVENTS_ROLE
    assert target["SageMakerPipelineParameters"]["PipelineParameterList"] == [
        {"Name": "Epochs", "Value": "1"},
        {"Name": "InputData", "Value": "s3://b/new/"},
    ]
    listed = {r["kind"]: r for r in triggers.list_(cfg, aws)}
    assert listed["schedule"]["targets"][0]["parameters"] == {"Epochs": "1", "InputData": "s3://b/new/"}
    assert set(listed) == {"deploy-on-approval", "schedule", "rollback-on-reject", "endpoint-state"}


def test_new_data_rule_watches_the_input_prefix(aws):
    cfg = config()
    aws.s3.put_bucket_notification_configuration(
        Bucket=BUCKET,
        NotificationConfiguration={"QueueConfigurations": []},
    )
    triggers.apply(with_triggers(cfg, on_new_data=True, events_role_arn=EVENTS_ROLE), aws)
    name = triggers.rule_names(cfg)["on-new-data"]
    pattern = json.loads(aws.client("events").describe_rule(Name=name)["EventPattern"])
    assert pattern == {
        "source": ["aws.s3"],
        "detail-type": ["Object Created"],
        "detail": {"bucket": {"name": [BUCKET]}, "object": {"key": [{"prefix": "reviews/"}]}},
    }
    assert targets(aws, name)[0]["Arn"] == cfg.pipeline_arn
    # moto's GetBucketNotificationConfiguration leaves EventBridgeConfiguration out: read its backend.
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    notifications = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets[BUCKET].notification_configuration
    assert notifications.event_bridge is not None


def test_delete_removes_exactly_what_apply_made(aws):
    cfg = config()
    aws.client("events").put_rule(Name="someone-elses-rule", ScheduleExpression="rate(1 day)")
    triggers.apply(with_triggers(cfg, schedule="rate(1 day)", on_new_data=True, events_role_arn=EVENTS_ROLE), aws)
    made = [n for kind, n in triggers.rule_names(cfg).items() if kind != "execution-alerts"]  # no alerts topic
    assert sorted(triggers.delete(cfg, aws)) == sorted(made)
    assert rules(aws) == ["someone-elses-rule"]
    assert triggers.list_(cfg, aws) == []
    assert triggers.delete(cfg, aws) == []


def test_print_only_makes_no_calls_and_options_need_a_role(aws):
    cfg = config()
    planned = triggers.apply(
        with_triggers(cfg, schedule="rate(1 day)", events_role_arn=EVENTS_ROLE), None, print_only=True
    )
    assert [p["action"] for p in planned] == ["planned"] * 4
    assert planned[0]["rule"]["EventPattern"]["detail"]["ModelApprovalStatus"] == ["Approved"]
    assert rules(aws) == []
    with pytest.raises(ValueError, match="events_role_arn"):
        triggers.apply(with_triggers(cfg, schedule="rate(1 day)"), aws)
    with pytest.raises(ValueError, match="s3:// data source"):
        triggers.apply(
            with_triggers(config(**{"data.source": "amazon_polarity"}), on_new_data=True, events_role_arn=EVENTS_ROLE),
            aws,
        )


def test_missing_lambda_is_a_one_line_error(aws):
    cfg = config(**{"deploy.lambda_function_name": "no-such-function"})
    with pytest.raises(AwsError, match="the deploy Lambda does not exist"):
        triggers.apply(cfg, aws)


def test_rule_names_fit_eventbridge():
    long = "p" * 200
    name = triggers.rule_name(long, "deploy-on-approval")
    assert len(name) <= 64 and name.endswith("-deploy-on-approval")
    assert name == triggers.rule_name(long, "deploy-on-approval")
    assert triggers.rule_name("trainium-bert", "schedule") == "trainium-bert-schedule"


def test_policies_are_least_privilege():
    cfg = config()
    docs = policies(cfg)
    assert set(docs) == {"deploy-lambda-role", "deploy-lambda-trust", "events-role", "events-trust"}
    actions = [a for s in docs["deploy-lambda-role"]["Statement"] for a in s["Action"]]
    assert "sagemaker:DeleteEndpoint" not in actions and not any(a.endswith("*") for a in actions)
    anywhere = [s["Action"] for s in docs["deploy-lambda-role"]["Statement"] if "*" in s["Resource"]]
    assert anywhere == [["sagemaker:ListModelPackages"]]  # IAM has no resource type for it
    (start,) = docs["events-role"]["Statement"]
    assert start["Action"] == ["sagemaker:StartPipelineExecution"]
    assert start["Resource"] == [cfg.pipeline_arn]
    assert docs["events-trust"]["Statement"][0]["Principal"] == {"Service": "events.amazonaws.com"}
    json.dumps(docs)
