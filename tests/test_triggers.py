"""EventBridge triggers (pipeline/sagemaker/triggers.py), put by the pipeline stack (pipeline_stack.py), against
moto's CloudFormation, in-process. The deploy Lambda here is the user's own (deploy.lambda_role_arn unset): the stack
holds the rules and their permissions only.

moto delivers put_events to SQS with real pattern matching, but raises for a Lambda or SageMaker pipeline
target. So event routing is tested by an SQS queue added as an extra target of the approval rule, with
moto's delivery to the Lambda target recorded instead of attempted (`lambda_deliveries`); the recorded
event is then given to the deploy handler by hand. Schedule and pipeline targets are read back, never fired.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from unittest import mock

import pytest
from botocore.exceptions import ClientError

from pipeline.cli import main
from pipeline.config import Triggers, load_config
from pipeline.errors import ConfigError
from pipeline.sagemaker import pipeline_stack, triggers
from pipeline.sagemaker.pipeline_stack import LAMBDA_HANDLER, deploy_lambda_zip, lambda_environment
from pipeline.sagemaker.stacks import StackError
from steps.deploy import handler as deploy_step

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
BUCKET = "test-data-bucket"
EVENTS_ROLE = "arn:aws:iam::123456789012:role/EventBridgeStartPipeline"
EVENT = "SageMaker Model Package State Change"


def apply(cfg, aws) -> str:
    """`triggers apply`: the pipeline stack with its rules; what the stack did."""
    return pipeline_stack.deploy(cfg, aws, triggers=True).action


def stack_rules(cfg) -> dict[str, dict]:
    """Rule name -> the properties of its AWS::Events::Rule in the stack's template."""
    resources = json.loads(pipeline_stack.template(cfg))["Resources"]
    return {r["Properties"]["Name"]: r["Properties"] for r in resources.values() if r["Type"] == "AWS::Events::Rule"}


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
        AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}]}),
    )["Role"]["Arn"]
    aws.client("lambda").create_function(
        FunctionName=cfg.deploy.lambda_function_name,
        Runtime="python3.12",
        Role=role,
        Handler=LAMBDA_HANDLER,
        Code={"ZipFile": deploy_lambda_zip()},
    )
    aws.s3.create_bucket(Bucket=BUCKET)
    return aws


def record_deliveries(monkeypatch, service: str) -> list[dict]:
    """Events moto would hand to a target of `service` (it can invoke no Lambda function and start no pipeline):
    recorded, other targets served."""
    from moto.events.models import Rule

    delivered: list[dict] = []
    send = Rule.send_to_targets

    def send_to_targets(self, original_event, transform_input=True):
        if not self.event_pattern.matches_event(original_event):
            return
        targets = self.targets
        delivered.extend(dict(original_event) for t in targets if f":{service}:" in t["Arn"])
        self.targets = [t for t in targets if f":{service}:" not in t["Arn"]]
        try:
            send(self, original_event, transform_input)
        finally:
            self.targets = targets

    monkeypatch.setattr(Rule, "send_to_targets", send_to_targets)
    return delivered


@pytest.fixture
def lambda_deliveries(monkeypatch):
    return record_deliveries(monkeypatch, "lambda")


@pytest.fixture
def pipeline_starts(monkeypatch):
    return record_deliveries(monkeypatch, "sagemaker")


def queue_on(aws, rule: str) -> str:
    """The URL of an SQS queue added as a target of `rule`: moto delivers it what the rule's pattern matches."""
    sqs = aws.client("sqs")
    queue = sqs.create_queue(QueueName=f"{rule}-test")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    aws.client("events").put_targets(Rule=rule, Targets=[{"Id": "test-queue", "Arn": arn}])
    return queue


def received(aws, queue: str) -> list[dict]:
    """The events waiting in `queue` (received ones stay invisible for the rest of the test)."""
    sqs, bodies = aws.client("sqs"), []
    while messages := sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10).get("Messages", []):
        bodies += [json.loads(m["Body"]) for m in messages]
    return bodies


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
    assert apply(cfg, aws) == "created"
    assert apply(cfg, aws) == "unchanged"
    names = triggers.rule_names(cfg)
    assert rules(aws) == sorted(n for kind, n in names.items() if kind not in ("execution-alerts",
                                                                                "execution-tracking"))
    assert [t["Id"] for t in targets(aws, names["deploy-on-approval"])] == ["deploy-lambda"]
    assert [t["Id"] for t in targets(aws, names["schedule"])] == ["start-pipeline"]
    assert [t["Id"] for t in targets(aws, names["on-new-data"])] == ["start-pipeline"]
    assert targets(aws, names["deploy-on-approval"])[0]["Arn"] == cfg.deploy_lambda_arn
    statements = lambda_policy(aws, cfg)
    assert len(statements) == 3  # one per rule that invokes the deploy Lambda
    sources = {s["Condition"]["ArnLike"]["AWS:SourceArn"].rsplit("/", 1)[-1] for s in statements}
    assert sources == {names["deploy-on-approval"], names["rollback-on-reject"], names["endpoint-state"]}
    assert {s["Principal"]["Service"] for s in statements} == {"events.amazonaws.com"}
    # An option turned off loses its rule on the next apply.
    assert apply(with_triggers(cfg), aws) == "updated"
    assert rules(aws) == sorted([names["deploy-on-approval"], names["rollback-on-reject"], names["endpoint-state"]])


def test_approval_rule_matches_approved_versions_of_our_group_only(aws, lambda_deliveries, monkeypatch):
    cfg = config()
    apply(cfg, aws)
    queue = queue_on(aws, triggers.rule_names(cfg)["deploy-on-approval"])

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

    bodies = received(aws, queue)
    assert [(b["detail"]["ModelPackageGroupName"], b["detail"]["ModelApprovalStatus"]) for b in bodies] == [
        (group, "Approved")
    ]
    assert bodies[0]["detail-type"] == EVENT and bodies[0]["source"] == "aws.sagemaker"
    assert len(lambda_deliveries) == 3  # Approved (this rule), Rejected and PendingManualApproval (rollback-on-reject)

    # The deploy handler, given the delivered event, deploys the version it names to staging.
    for key, value in lambda_environment(cfg).items():
        monkeypatch.setenv(key, value)
    aws.s3.create_bucket(Bucket=cfg.aws.bucket)  # the lifecycle's markers
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
        schedule_parameters={"Epochs": "1", "InputData": "s3://my-bucket/new/"},
        events_role_arn=EVENTS_ROLE,
    )
    apply(cfg, aws)
    name = triggers.rule_names(cfg)["schedule"]
    assert aws.client("events").describe_rule(Name=name)["ScheduleExpression"] == "rate(7 days)"
    (target,) = targets(aws, name)
    assert target["Arn"] == aws.sagemaker.describe_pipeline(PipelineName=cfg.pipeline.name)["PipelineArn"]
    assert target["RoleArn"] == EVENTS_ROLE
    assert target["SageMakerPipelineParameters"]["PipelineParameterList"] == [
        {"Name": "Epochs", "Value": "1"},
        {"Name": "InputData", "Value": "s3://my-bucket/new/"},
    ]
    listed = {r["kind"]: r for r in triggers.list_(cfg, aws)}
    assert listed["schedule"]["targets"][0]["parameters"] == {"Epochs": "1", "InputData": "s3://my-bucket/new/"}
    assert set(listed) == {"deploy-on-approval", "schedule", "rollback-on-reject", "endpoint-state"}


def test_the_rules_of_the_template_keep_to_put_rule_and_put_targets(aws):
    """The on-new-data rule's description names the data source, which may be long (256 characters, what the
    registry's metadata takes): PutRule takes 512 at most. Each rule and its targets, as the template states them,
    checked against the input shapes of the calls CloudFormation makes."""
    from botocore.validate import ParamValidator

    cfg = config(**{"data.source": f"s3://{BUCKET}/{'reviews/' * 28}",
                    "alerts.topic_arn": "arn:aws:sns:us-east-1:123456789012:alerts",
                    "tracking.server_arn": "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/t"})
    model = aws.client("events").meta.service_model
    put_rule, put_targets = (model.operation_model(name).input_shape for name in ("PutRule", "PutTargets"))
    rules_ = stack_rules(with_triggers(cfg, on_new_data=True, schedule="rate(1 day)", events_role_arn=EVENTS_ROLE))
    assert len(rules_) == 7
    for properties in rules_.values():
        rule = {k: v for k, v in properties.items() if k != "Targets"}
        rule |= {"EventPattern": json.dumps(rule["EventPattern"])} if "EventPattern" in rule else {}
        assert len(rule["Description"]) <= put_rule.members["Description"].metadata["max"]
        assert not ParamValidator().validate(rule, put_rule).has_errors(), rule
        request = {"Rule": rule["Name"], "Targets": properties["Targets"]}
        assert not ParamValidator().validate(request, put_targets).has_errors(), request


def test_new_data_rule_watches_the_input_prefix(aws):
    cfg = config()
    aws.s3.put_bucket_notification_configuration(
        Bucket=BUCKET,
        NotificationConfiguration={"QueueConfigurations": []},
    )
    apply(with_triggers(cfg, on_new_data=True, events_role_arn=EVENTS_ROLE), aws)
    name = triggers.rule_names(cfg)["on-new-data"]
    pattern = json.loads(aws.client("events").describe_rule(Name=name)["EventPattern"])
    assert pattern == {
        "source": ["aws.s3"],
        "detail-type": ["Object Created"],
        "detail": {
            "bucket": {"name": [BUCKET]},
            "object": {"key": ["reviews/_SUCCESS", {"wildcard": "reviews/*/_SUCCESS"}]},
        },
    }
    assert targets(aws, name)[0]["Arn"] == cfg.pipeline_arn
    # moto's GetBucketNotificationConfiguration leaves EventBridgeConfiguration out: read its backend.
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    notifications = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets[BUCKET].notification_configuration
    assert notifications.event_bridge is not None


def s3_object_created(key: str, bucket: str = BUCKET) -> dict:
    """S3's "Object Created" event as EventBridge delivers it (the example of the S3 user guide, ev-events.html;
    keys are not URL-encoded there, unlike S3's own notifications)."""
    return {
        "version": "0",
        "id": "17793124-05d4-b198-2fde-7ededc63b103",
        "detail-type": "Object Created",
        "source": "aws.s3",
        "account": "123456789012",
        "time": "2021-11-12T00:00:00Z",
        "region": REGION,
        "resources": [f"arn:aws:s3:::{bucket}"],
        "detail": {
            "version": "0",
            "bucket": {"name": bucket},
            "object": {"key": key, "size": 5, "etag": "b1946ac92492d2347c6235b4d2611184",
                       "version-id": "IYV3p45BT0ac8hjHg1houSdS1a.Mro8e", "sequencer": "617f08299329d189"},
            "request-id": "N4N7GDK58NMKJ12R",
            "requester": "123456789012",
            "source-ip-address": "1.2.3.4",
            "reason": "PutObject",
        },
    }


def reviews_csv(rows: int, start: int = 0) -> bytes:
    lines = ["label,title,content", *(f"{i % 2},title {i},review number {i}" for i in range(start, start + rows))]
    return ("\n".join(lines) + "\n").encode()


def test_a_data_drop_starts_one_execution_and_tokenize_reads_its_shards_only(aws, pipeline_starts, tmp_path):
    """S3 (moto) emits one "Object Created" per object to EventBridge; the rule passes only the drop's marker."""
    cfg = with_triggers(config(), on_new_data=True, events_role_arn=EVENTS_ROLE)
    apply(cfg, aws)
    queue = queue_on(aws, triggers.rule_names(cfg)["on-new-data"])
    s3 = aws.s3

    def drop(folder: str, shards: int) -> None:
        """Shards first (the test split as a multipart upload), the marker last."""
        for i in range(shards):
            s3.put_object(Bucket=BUCKET, Key=f"{folder}train-{i:05d}.csv", Body=reviews_csv(10, 10 * i))
        upload = s3.create_multipart_upload(Bucket=BUCKET, Key=f"{folder}test-00000.csv")["UploadId"]
        part = s3.upload_part(Bucket=BUCKET, Key=f"{folder}test-00000.csv", UploadId=upload, PartNumber=1,
                              Body=reviews_csv(4))
        s3.complete_multipart_upload(Bucket=BUCKET, Key=f"{folder}test-00000.csv", UploadId=upload,
                                     MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
        s3.put_object(Bucket=BUCKET, Key=f"{folder}_SUCCESS", Body=b"")

    drop("reviews/", 12)
    first = received(aws, queue)
    assert [(e["source"], e["detail-type"], e["detail"]["object"]["key"]) for e in first] == [
        ("aws.s3", "Object Created", "reviews/_SUCCESS")
    ]
    drop("reviews/2026-07/", 3)  # a drop in a folder of its own under the prefix
    for key in ("other/_SUCCESS", "reviews/not_SUCCESS", "reviews/_SUCCESS.tmp", "reviews/2026-07/more.csv"):
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"")
    assert [e["detail"]["object"]["key"] for e in received(aws, queue)] == ["reviews/2026-07/_SUCCESS"]
    assert [e["detail"]["object"]["key"] for e in pipeline_starts] == ["reviews/_SUCCESS", "reviews/2026-07/_SUCCESS"]

    # SageMaker stages the prefix into the Tokenize job as is, markers included: the reader skips them.
    staged = tmp_path / "data"
    for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="reviews/")["Contents"]:
        (staged / o["Key"].removeprefix("reviews/")).parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(BUCKET, o["Key"], str(staged / o["Key"].removeprefix("reviews/")))
    from steps.tokenize import readers

    files = readers.find_files(staged)
    assert all("_SUCCESS" not in p.name for split in files.values() for p in split)
    chunks = readers.source_chunks(argparse.Namespace(source=cfg.data.source, input_dir=str(staged), seed=0,
                                                      label_column="label", text_columns=["title", "content"]))
    rows = {split: sum(len(t) for t, _ in parts if t is not None) for split, parts in chunks.items()}
    assert rows == {"train": 150, "test": 8}


@pytest.mark.parametrize(
    ("source", "matching", "other"),
    [
        ("s3://test-data-bucket/reviews/", ["reviews/_SUCCESS", "reviews/2026/07/_SUCCESS"],
         ["reviews/train.csv", "reviews/x_SUCCESS", "reviews/_SUCCESS.tmp", "other/_SUCCESS", "reviewsX/_SUCCESS"]),
        ("s3://test-data-bucket/reviews", ["reviews/_SUCCESS", "reviews-2026/a/_SUCCESS"],
         ["reviews_SUCCESS", "other/_SUCCESS", "reviews/train.csv"]),
        ("s3://test-data-bucket", ["_SUCCESS", "a/b/_SUCCESS"], ["x_SUCCESS", "a/train.csv"]),
    ],
)
def test_new_data_pattern_matches_the_marker_under_the_prefix_only(source, matching, other):
    from moto.events.models import EventPattern

    pattern = EventPattern.load(json.dumps(triggers.new_data_pattern(config(**{"data.source": source}))))
    assert [k for k in matching + other if pattern.matches_event(s3_object_created(k))] == matching
    assert not pattern.matches_event(s3_object_created(matching[0], bucket="another-bucket"))


def test_the_marker_is_configurable_and_never_a_data_file(aws, pipeline_starts):
    cfg = with_triggers(config(), on_new_data=True, new_data_marker=".ready", events_role_arn=EVENTS_ROLE)
    apply(cfg, aws)
    queue = queue_on(aws, triggers.rule_names(cfg)["on-new-data"])
    entries = [s3_object_created(k) for k in ("reviews/_SUCCESS", "reviews/a.csv", "reviews/.ready")]
    events = [{"Source": e["source"], "DetailType": e["detail-type"], "Detail": json.dumps(e["detail"]),
               "Resources": e["resources"]} for e in entries]
    assert aws.client("events").put_events(Entries=events)["FailedEntryCount"] == 0
    assert [e["detail"]["object"]["key"] for e in received(aws, queue)] == ["reviews/.ready"]
    assert len(pipeline_starts) == 1
    for marker in ("READY", "train.csv", "a/_SUCCESS", "..", ""):
        with pytest.raises(ConfigError, match="triggers.new_data_marker"):
            config(**{"triggers.new_data_marker": marker or "''"})


def apply_command(capsys, parameters: str, *options: str) -> tuple[int, str, str]:
    """`trainium-pipeline triggers apply` with a schedule and these schedule_parameters (YAML), in-process:
    (exit code, stdout, stderr)."""
    sets = {"data.source": f"s3://{BUCKET}/reviews/", "triggers.schedule": "rate(7 days)",
            "triggers.events_role_arn": EVENTS_ROLE, "triggers.schedule_parameters": parameters}
    argv = ["trainium-pipeline", "--config", str(ROOT / "pipeline.yaml")]
    argv += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")] + ["triggers", "apply", *options]
    with mock.patch.object(sys, "argv", argv), pytest.raises(SystemExit) as exit_:
        main()
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


@pytest.mark.parametrize(
    ("parameters", "error"),
    [
        ("{Epoch: '3'}", "triggers.schedule_parameters.Epoch: unknown parameter; expected one of AccuracyThreshold, "),
        ("{LearningRate: fast}", "triggers.schedule_parameters.LearningRate='fast': expected a Float"),
        ("{InputData: amazon_polarity}", "triggers.schedule_parameters.InputData='amazon_polarity': this pipeline "
                                          "was built for an s3:// data.source and stages InputData from S3"),
    ],
)
def test_apply_refuses_bad_schedule_parameters_before_creating_anything(aws, capsys, parameters, error):
    options = ("--print-only",) if "InputData" in parameters else ()  # the check precedes printing, too
    code, out, err = apply_command(capsys, parameters, *options)
    assert code == 2 and out == ""
    assert err.startswith(f"config error: {error}") and len(err.strip().splitlines()) == 1, err
    assert rules(aws) == []


def test_apply_passes_checked_schedule_parameters(aws, capsys):
    code, out, err = apply_command(capsys, "{Epochs: 3, LearningRate: 2.0e-05, InputData: 's3://my-bucket/2026/'}")
    assert code == 0, err
    assert "stack trainium-bert-pipeline created" in out and "trainium-bert-schedule" in out
    (target,) = targets(aws, "trainium-bert-schedule")
    assert target["SageMakerPipelineParameters"]["PipelineParameterList"] == [
        {"Name": "Epochs", "Value": "3"},
        {"Name": "InputData", "Value": "s3://my-bucket/2026/"},
        {"Name": "LearningRate", "Value": "2e-05"},
    ]


def test_delete_removes_exactly_what_apply_made(aws, capsys):
    """With the user's own Lambda the stack holds the rules only: `triggers delete` deletes it. (moto's CloudFormation
    leaves the Lambda permissions of deleted rules behind, so those are read from the template.)"""
    cfg = config(**{"tracking.server_arn": "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/t"})
    aws.client("events").put_rule(Name="someone-elses-rule", ScheduleExpression="rate(1 day)")
    apply(with_triggers(cfg, schedule="rate(1 day)", on_new_data=True, events_role_arn=EVENTS_ROLE), aws)
    assert len(lambda_policy(aws, cfg)) == 4  # approval, rejection, endpoint state, execution tracking
    made = [n for kind, n in triggers.rule_names(cfg).items() if kind != "execution-alerts"]
    assert rules(aws) == sorted([*made, "someone-elses-rule"])
    assert pipeline_stack.deploy(cfg, aws, triggers=False).action == "deleted"
    assert rules(aws) == ["someone-elses-rule"] and triggers.list_(cfg, aws) == []
    assert pipeline_stack.deploy(cfg, aws, triggers=False).action == "absent"
    code, out, err = cli_command(capsys, "triggers", "delete")
    assert code == 0 and "stack trainium-bert-pipeline absent" in out, err


def test_a_rule_turned_off_takes_its_lambda_permission_with_it():
    tracked = config(**{"tracking.server_arn": "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/t"})
    resources = json.loads(pipeline_stack.template(tracked))["Resources"]
    assert resources["ExecutionTrackingRulePermission"]["Properties"]["SourceArn"] == {
        "Fn::GetAtt": ["ExecutionTrackingRule", "Arn"]}
    untracked = json.loads(pipeline_stack.template(config()))["Resources"]
    permissions = sorted(k for k, r in untracked.items() if r["Type"] == "AWS::Lambda::Permission")
    assert permissions == ["DeployOnApprovalRulePermission", "EndpointStateRulePermission",
                           "RollbackOnRejectRulePermission"]
    assert json.loads(pipeline_stack.template(tracked, rules=False))["Resources"] == {}  # the user's own Lambda


def lambda_policy(aws, cfg) -> list[dict]:
    try:
        policy = aws.client("lambda").get_policy(FunctionName=cfg.deploy.lambda_function_name)["Policy"]
    except ClientError:  # no policy left
        return []
    return json.loads(policy)["Statement"]


def cli_command(capsys, *args: str) -> tuple[int, str, str]:
    argv = ["trainium-pipeline", "--config", str(ROOT / "pipeline.yaml"), "--set", f"data.source=s3://{BUCKET}/r/",
            *args]
    with mock.patch.object(sys, "argv", argv), pytest.raises(SystemExit) as exit_:
        main()
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def test_print_only_makes_no_calls_and_options_need_a_role(aws, capsys):
    code, out, err = cli_command(capsys, "--set", "triggers.schedule=rate(1 day)", "--set",
                                 f"triggers.events_role_arn={EVENTS_ROLE}", "triggers", "apply", "--print-only")
    assert code == 0, err
    planned = json.loads(out)["Resources"]
    assert planned["DeployOnApprovalRule"]["Properties"]["EventPattern"]["detail"]["ModelApprovalStatus"] == [
        "Approved"]
    assert planned["ScheduleRule"]["Properties"]["Targets"][0]["RoleArn"] == EVENTS_ROLE
    assert rules(aws) == [] and aws.client("cloudformation").describe_stacks()["Stacks"] == []
    with pytest.raises(ValueError, match="events_role_arn"):
        apply(with_triggers(config(), schedule="rate(1 day)"), aws)
    with pytest.raises(ValueError, match="s3:// data source"):
        apply(with_triggers(config(**{"data.source": "amazon_polarity"}), on_new_data=True,
                            events_role_arn=EVENTS_ROLE), aws)


def test_missing_lambda_is_a_one_line_error(aws):
    cfg = config(**{"deploy.lambda_function_name": "no-such-function"})
    with pytest.raises(StackError, match="the deploy Lambda no-such-function does not exist"):
        apply(cfg, aws)
    assert aws.client("cloudformation").describe_stacks()["Stacks"] == []


def test_rules_made_outside_the_stack_are_named_before_anything_is_created(aws):
    """What an earlier version of `triggers apply` made with boto3: CloudFormation would fail on the names."""
    cfg = config()
    aws.client("events").put_rule(Name=triggers.rule_names(cfg)["endpoint-state"], ScheduleExpression="rate(1 day)")
    with pytest.raises(StackError, match="rule trainium-bert-endpoint-state exist.* outside the stack"):
        apply(cfg, aws)
    assert aws.client("cloudformation").describe_stacks()["Stacks"] == []


def test_rule_names_fit_eventbridge():
    long = "p" * 200
    name = triggers.rule_name(long, "deploy-on-approval")
    assert len(name) <= 64 and name.endswith("-deploy-on-approval")
    assert name == triggers.rule_name(long, "deploy-on-approval")
    assert triggers.rule_name("trainium-bert", "schedule") == "trainium-bert-schedule"
