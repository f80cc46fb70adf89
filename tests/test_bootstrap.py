"""`bootstrap` (pipeline/bootstrap.py): the template lints; against moto the stack creates, updates idempotently
and deletes; then `upsert` and `triggers apply` succeed with the stack's outputs and nothing else set.

moto's CloudFormation does not implement AWS::S3::BucketPolicy, AWS::SageMaker::ModelPackageGroup nor
AWS::SNS::TopicPolicy (it warns and skips them), and its AWS::S3::Bucket applies only BucketEncryption and Tags (not
versioning, public access block, lifecycle). Those are asserted on the rendered template
(tests/test_infra_policies.py), and the test below pins exactly what moto skipped, so that it fails (and can be
tightened) when moto learns them.
"""

from __future__ import annotations

import ast
import json
import shutil
import urllib.request
import warnings
from pathlib import Path

import pytest
from moto import mock_aws
from moto.server import ThreadedMotoServer

from pipeline.config import file as config_file
from pipeline.config import load_config
from pipeline.sagemaker import bootstrap, pipeline_stack, stacks
from pipeline.sagemaker.aws import Aws
from pipeline.sagemaker.stacks import StackError

ROOT = Path(__file__).resolve().parent.parent
STACK = "trainium-bert-bootstrap"
MOTO_SKIPS = {"AWS::S3::BucketPolicy", "AWS::SageMaker::ModelPackageGroup", "AWS::SNS::TopicPolicy"}


def fresh_config(*sets: str):
    """pipeline.yaml as shipped: placeholders for bucket and role."""
    return load_config(ROOT / "pipeline.yaml", list(sets), environ={})


def test_template_passes_cfn_lint():
    from cfnlint.api import lint_file

    assert [str(m) for m in lint_file(ROOT / "infra" / "template.yaml")] == []


def test_the_pipeline_stacks_template_passes_cfn_lint():
    """With every resource it can hold: the Lambda, its retries to the alerts topic, all seven rules."""
    from cfnlint.api import lint

    cfg = fresh_config("deploy.lambda_role_arn=arn:aws:iam::123456789012:role/deploy", "data.source=s3://data-bucket/reviews/",
                       "alerts.topic_arn=arn:aws:sns:us-east-1:123456789012:alerts", "triggers.schedule=rate(1 day)",
                       "triggers.on_new_data=true", "triggers.events_role_arn=arn:aws:iam::123456789012:role/events",
                       "tracking.server_arn=arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/t")
    body = pipeline_stack.template(cfg)
    kinds = [resource["Type"] for resource in json.loads(body)["Resources"].values()]
    assert sorted(set(kinds)) == ["AWS::Events::Rule", "AWS::Lambda::EventInvokeConfig", "AWS::Lambda::Function",
                                  "AWS::Lambda::Permission"]
    assert kinds.count("AWS::Events::Rule") == 7 and kinds.count("AWS::Lambda::Permission") == 4
    assert [str(m) for m in lint(body, regions=["us-east-1"])] == []
    assert body == pipeline_stack.template(cfg)  # byte-identical


@pytest.fixture
def aws(no_network):
    """A fresh in-process moto per test (not the module-wide one: it would also catch the moto_server test's calls)."""
    with mock_aws():
        yield Aws("us-east-1")


def deploy(aws, kms=False, sets=(), **kwargs):
    cfg = fresh_config(*sets)
    events: list[dict] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = bootstrap.deploy_stack(cfg, aws.client("cloudformation"), STACK,
                                        bootstrap.stack_parameters(cfg, kms=kms),
                                        stacks.Waiting(on_event=events.append, **kwargs))
    skipped = {t for w in caught for t in MOTO_SKIPS if f"parse {t} but" in str(w.message)}
    return result, events, skipped


def test_stack_creates_the_bucket_roles_and_key(aws):
    result, events, skipped = deploy(aws, kms=True)
    assert result.action == "created"
    assert skipped == MOTO_SKIPS  # what moto lacks; the rest is real below
    assert events and events[-1]["ResourceStatus"] == "CREATE_COMPLETE"
    # (moto reports the stack's own events only; the per-resource path is covered by the scripted test below)
    out = result.outputs
    assert set(out) == set(bootstrap.OUTPUT_KEYS) - {"TrackingServerArn"}  # no tracking server configured
    assert out["BucketName"] == "trainium-bert-123456789012-us-east-1"
    (rule,) = aws.s3.get_bucket_encryption(Bucket=out["BucketName"])["ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"] == {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": out["KmsKeyArn"]}
    assert aws.client("kms").get_key_rotation_status(KeyId=out["KmsKeyArn"])["KeyRotationEnabled"] is True

    iam = aws.client("iam")
    trusts = {"ExecutionRoleArn": "sagemaker", "DeployLambdaRoleArn": "lambda", "EventsRoleArn": "events"}
    for output, service in trusts.items():
        name = out[output].rsplit("/", 1)[1]
        role = iam.get_role(RoleName=name)["Role"]
        (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
        assert trust["Principal"] == {"Service": f"{service}.amazonaws.com"}
        names = iam.list_role_policies(RoleName=name)["PolicyNames"]
        assert len(names) == (1 if service == "events" else 2)  # + pipeline-execution-kms, deploy-lambda-kms
        documents = [policy_document(iam, name, policy) for policy in names]
        document = documents[0]
        resources = json.dumps(documents)
        assert "123456789012" in resources and "${" not in resources  # resolved by CloudFormation
        if service == "events":
            pipeline = "arn:aws:sagemaker:us-east-1:123456789012:pipeline/trainium-bert"
            assert document["Statement"][0]["Resource"] == [pipeline]
        if service == "sagemaker":
            assert out["KmsKeyArn"] in resources and out["ExecutionRoleArn"] in resources
        if service == "lambda":
            assert out["ExecutionRoleArn"] in resources  # iam:PassRole of the model's role
            assert out["AlertsTopicArn"] in resources and out["KmsKeyArn"] in resources  # alerts, the test sample


def test_alerts_topic_with_an_optional_email_subscription(aws):
    result, _, _ = deploy(aws, sets=["alerts.email=ops@example.com"])
    sns = aws.client("sns")
    topic = result.outputs["AlertsTopicArn"]
    assert topic == "arn:aws:sns:us-east-1:123456789012:trainium-bert-alerts"
    (subscription,) = sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
    assert (subscription["Protocol"], subscription["Endpoint"]) == ("email", "ops@example.com")
    assert bootstrap.config_updates(result.outputs)["alerts.topic_arn"] == topic
    cf = aws.client("cloudformation")
    cf.delete_stack(StackName=STACK)
    result, _, _ = deploy(aws)  # no address: a topic without subscriptions
    assert sns.list_subscriptions_by_topic(TopicArn=result.outputs["AlertsTopicArn"])["Subscriptions"] == []


def policy_document(iam, role: str, policy: str) -> dict:
    document = iam.get_role_policy(RoleName=role, PolicyName=policy)["PolicyDocument"]
    if isinstance(document, str):  # moto stores a role's CloudFormation `Policies` as str(dict), not JSON
        document = ast.literal_eval(document)
    return document


def test_second_run_changes_nothing_and_a_change_updates(aws):
    first, _, _ = deploy(aws)
    again, events, _ = deploy(aws)
    assert again.action == "unchanged" and again.outputs == first.outputs and events == []
    cfg = fresh_config()
    params = {**bootstrap.stack_parameters(cfg), "CheckpointExpirationDays": "7"}
    seen: list[dict] = []
    updated = bootstrap.deploy_stack(cfg, aws.client("cloudformation"), STACK, params, stacks.Waiting(seen.append))
    assert updated.action == "updated" and updated.outputs == first.outputs
    assert seen[-1]["ResourceStatus"] == "UPDATE_COMPLETE"
    assert all(e["ResourceStatus"] != "CREATE_COMPLETE" for e in seen)  # only events of this update


def test_a_run_without_kms_or_bucket_keeps_what_the_stack_has(aws):
    first, _, _ = deploy(aws, kms=True)
    cfg, cf = fresh_config(), aws.client("cloudformation")
    assert "UseKmsKey" not in bootstrap.stack_parameters(cfg) and "BucketName" not in bootstrap.stack_parameters(cfg)
    assert bootstrap.deploy_stack(cfg, cf, STACK).action == "unchanged"
    params = {**bootstrap.stack_parameters(cfg), "NoncurrentVersionExpirationDays": "9"}
    updated = bootstrap.deploy_stack(cfg, cf, STACK, params)
    assert updated.action == "updated" and updated.outputs["KmsKeyArn"] == first.outputs["KmsKeyArn"]
    (stack,) = cf.describe_stacks(StackName=STACK)["Stacks"]
    deployed = {p["ParameterKey"]: p["ParameterValue"] for p in stack["Parameters"]}
    assert deployed["UseKmsKey"] == "true" and deployed["NoncurrentVersionExpirationDays"] == "9"


def test_delete_refuses_while_the_bucket_holds_data_then_force_empties_it(aws):
    result, _, _ = deploy(aws)
    bucket, cf = result.outputs["BucketName"], aws.client("cloudformation")
    aws.s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})  # moto ignores the
    aws.s3.put_object(Bucket=bucket, Key="trainium-bert/a.txt", Body=b"1")                        # template's
    aws.s3.put_object(Bucket=bucket, Key="trainium-bert/a.txt", Body=b"2")
    aws.s3.delete_object(Bucket=bucket, Key="trainium-bert/a.txt")  # only a delete marker and versions remain
    with pytest.raises(StackError, match=r"holds 3 object version\(s\).*--force"):
        bootstrap.delete_stack(fresh_config(), cf, aws.s3, aws.sagemaker, STACK)
    assert cf.describe_stacks(StackName=STACK)["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
    done = bootstrap.delete_stack(fresh_config(), cf, aws.s3, aws.sagemaker, STACK, force=True)
    assert (done.action, done.emptied) == ("deleted", 3)
    assert bucket not in [b["Name"] for b in aws.s3.list_buckets()["Buckets"]]
    assert not [r for r in aws.client("iam").list_roles()["Roles"] if r["RoleName"].startswith(STACK)]
    assert bootstrap.delete_stack(fresh_config(), cf, aws.s3, aws.sagemaker, STACK).action == "absent"


def test_delete_refuses_while_the_group_holds_versions_or_endpoints_run_as_the_role_then_deletes(aws):
    """CloudFormation cannot delete a model package group that holds versions (DELETE_FAILED), and DeleteEndpoint's
    docs say not to delete the endpoint's ExecutionRoleArn before it: nothing is deleted until both are gone."""
    result, _, _ = deploy(aws)
    cf, sm, outputs = aws.client("cloudformation"), aws.sagemaker, result.outputs
    group, role = outputs["ModelPackageGroupName"], outputs["ExecutionRoleArn"]
    image = "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-inference:cpu"
    groups = sm.list_model_package_groups()["ModelPackageGroupSummaryList"]
    if group not in [g["ModelPackageGroupName"] for g in groups]:
        sm.create_model_package_group(ModelPackageGroupName=group)  # moto's CloudFormation skips the group
    package = sm.create_model_package(
        ModelPackageGroupName=group, ModelApprovalStatus="Approved",
        InferenceSpecification={"Containers": [{"Image": image}], "SupportedContentTypes": ["application/json"],
                                "SupportedResponseMIMETypes": ["application/json"]})["ModelPackageArn"]
    sm.create_model(ModelName="trainium-bert-v1", ExecutionRoleArn=role, Containers=[{"ModelPackageName": package}])
    sm.create_endpoint_config(EndpointConfigName="trainium-bert-v1-cfg", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "trainium-bert-v1", "InstanceType": "ml.c5.xlarge",
        "InitialInstanceCount": 1}])
    sm.create_endpoint(EndpointName="trainium-bert", EndpointConfigName="trainium-bert-v1-cfg")
    sm.create_model(ModelName="other", ExecutionRoleArn=role.replace(role.rsplit("/", 1)[1], "Other"),
                    PrimaryContainer={"Image": image})
    sm.create_endpoint_config(EndpointConfigName="other-cfg", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "other", "InstanceType": "ml.c5.xlarge", "InitialInstanceCount": 1}])
    sm.create_endpoint(EndpointName="someone-elses", EndpointConfigName="other-cfg")
    for gone in ("model", "config"):  # endpoints whose model or config was deleted under them: passed over
        sm.create_model(ModelName=f"gone-{gone}", ExecutionRoleArn=role, PrimaryContainer={"Image": image})
        sm.create_endpoint_config(EndpointConfigName=f"gone-{gone}-cfg", ProductionVariants=[{
            "VariantName": "AllTraffic", "ModelName": f"gone-{gone}", "InstanceType": "ml.c5.xlarge",
            "InitialInstanceCount": 1}])
        sm.create_endpoint(EndpointName=f"orphan-{gone}", EndpointConfigName=f"gone-{gone}-cfg")
    sm.delete_model(ModelName="gone-model")
    sm.delete_endpoint_config(EndpointConfigName="gone-config-cfg")

    with pytest.raises(StackError) as refused:
        bootstrap.delete_stack(fresh_config(), cf, aws.s3, sm, STACK, force=True)
    assert str(refused.value) == (
        f"stack {STACK}: nothing was deleted: model package group {group} holds 1 version(s) (delete them: aws "
        f"sagemaker delete-model-package --model-package-name <arn>); endpoint(s) trainium-bert run models as role "
        f"{role} (delete them first: aws sagemaker delete-endpoint --endpoint-name NAME)")
    assert cf.describe_stacks(StackName=STACK)["Stacks"][0]["StackStatus"] == "CREATE_COMPLETE"
    sm.delete_endpoint(EndpointName="trainium-bert")
    with pytest.raises(StackError, match=r"nothing was deleted: model package group \S+ holds 1 version\(s\)"
                                             r" \(delete them: [^;]+\)$"):
        bootstrap.delete_stack(fresh_config(), cf, aws.s3, sm, STACK)
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sagemaker.models import sagemaker_backends

    sagemaker_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].model_packages.pop(package)  # moto lacks DeleteModelPackage
    assert bootstrap.delete_stack(fresh_config(), cf, aws.s3, sm, STACK).action == "deleted"


def test_a_failed_create_names_the_resource_and_its_reason_in_one_line():
    """botocore's waiter stops at ROLLBACK_COMPLETE (its failure state); the events of the stack (newest first, as
    the API lists them) name the resource that failed first, not the ones cancelled after it."""
    import boto3
    from botocore.stub import Stubber

    events = [
        {"EventId": "1", "LogicalResourceId": "s", "ResourceType": "AWS::CloudFormation::Stack",
         "ResourceStatus": "CREATE_IN_PROGRESS"},
        {"EventId": "2", "LogicalResourceId": "Bucket", "ResourceType": "AWS::S3::Bucket",
         "ResourceStatus": "CREATE_FAILED", "ResourceStatusReason": "trainium-bert-1 already exists\n(Service: S3)"},
        {"EventId": "3", "LogicalResourceId": "ExecutionRole", "ResourceType": "AWS::IAM::Role",
         "ResourceStatus": "CREATE_FAILED", "ResourceStatusReason": "Resource creation cancelled"},
        {"EventId": "4", "LogicalResourceId": "s", "ResourceType": "AWS::CloudFormation::Stack",
         "ResourceStatus": "ROLLBACK_COMPLETE"},
    ]
    stamped = [{**e, "StackId": "id", "StackName": "s", "Timestamp": "2026-12-07T12:00:00Z"} for e in events]
    cf = boto3.client("cloudformation", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")

    def stack(status: str) -> dict:
        return {"Stacks": [{"StackName": "s", "StackId": "id", "StackStatus": status,
                            "CreationTime": "2026-12-07T12:00:00Z"}]}

    with Stubber(cf) as stub:
        for status in ("CREATE_IN_PROGRESS", "ROLLBACK_IN_PROGRESS", "ROLLBACK_COMPLETE"):  # the waiter's polls
            stub.add_response("describe_stacks", stack(status), {"StackName": "s"})
        stub.add_response("describe_stacks", stack("ROLLBACK_COMPLETE"), {"StackName": "s"})
        stub.add_response("describe_stack_events", {"StackEvents": stamped[::-1]}, {"StackName": "s"})
        seen: list[dict] = []
        with pytest.raises(StackError) as failure:
            stacks.wait_stack(cf, "s", "CREATE", set(), stacks.Waiting(seen.append, poll=0))
        stub.assert_no_pending_responses()
    message = str(failure.value)
    assert "\n" not in message
    assert message == ("stack s: create failed (ROLLBACK_COMPLETE): Bucket (AWS::S3::Bucket) CREATE_FAILED: "
                       "trainium-bert-1 already exists (Service: S3)")
    assert [e["EventId"] for e in seen] == ["1", "2", "3", "4"]


def test_names_that_iam_arns_cannot_hold_are_refused_before_any_call():
    cfg = load_config(ROOT / "pipeline.yaml", ["pipeline.model_package_group=Trainium-Bert"], environ={})
    with pytest.raises(StackError, match="pipeline.model_package_group='Trainium-Bert': expected lowercase"):
        bootstrap.stack_parameters(cfg)


def test_write_config_edits_only_the_output_lines_and_keeps_comments(tmp_path):
    path = tmp_path / "pipeline.yaml"
    shutil.copy(ROOT / "pipeline.yaml", path)
    before = path.read_text().splitlines()
    updates = {
        "aws.bucket": "trainium-bert-123456789012-us-east-1",
        "aws.role_arn": "arn:aws:iam::123456789012:role/trainium-bert-bootstrap-ExecutionRole-X",
        "deploy.lambda_role_arn": "arn:aws:iam::123456789012:role/trainium-bert-bootstrap-DeployLambdaRole-Y",
        "triggers.events_role_arn": "arn:aws:iam::123456789012:role/trainium-bert-bootstrap-EventsRole-Z",
        "pipeline.model_package_group": "trainium-bert",
        "aws.kms_key_id": "arn:aws:kms:us-east-1:123456789012:key/abc",
    }
    changed = config_file.write_config(path, updates)
    assert set(changed) == set(updates) - {"pipeline.model_package_group"}
    after = path.read_text().splitlines()
    assert len(after) == len(before)
    differing = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(differing) == 5
    assert ("  kms_key_id: arn:aws:kms:us-east-1:123456789012:key/abc  # KMS key for volumes and S3 outputs "
            "(optional)") in after
    assert any(line.startswith("  lambda_role_arn: arn:aws:iam::") and line.endswith("`upsert` creates / updates "
               "the function") for line in after)
    cfg = load_config(path, [], environ={})
    assert (cfg.aws.bucket, cfg.aws.role_arn, cfg.triggers.events_role_arn) == (
        updates["aws.bucket"], updates["aws.role_arn"], updates["triggers.events_role_arn"])
    assert config_file.write_config(path, updates) == [] and path.read_text().splitlines() == after
    lines = config_file.set_lines(updates)
    assert lines[0] == "--set aws.bucket=trainium-bert-123456789012-us-east-1"
    via_set = load_config(ROOT / "pipeline.yaml", [line.removeprefix("--set ") for line in lines], environ={})
    assert via_set.aws == cfg.aws and via_set.deploy == cfg.deploy


def test_write_config_adds_a_missing_key_and_quotes_what_yaml_would_misread(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("# top\naws:\n  region: us-east-1  # r\n\npipeline:\n  name: x\n")
    config_file.write_config(path, {"aws.bucket": "b", "deploy.lambda_role_arn": "a: #b", "pipeline.name": "y"})
    text = path.read_text()
    assert text.startswith("# top\naws:\n  bucket: b\n  region: us-east-1  # r\n")
    assert "pipeline:\n  name: y\n" in text and text.endswith('deploy:\n  lambda_role_arn: "a: #b"\n')


def end_to_end(aws: Aws) -> None:
    """Bootstrap a fresh account, then upsert and triggers apply with only the outputs set."""
    from pipeline.definition import definition
    from pipeline.sagemaker.upsert import upsert

    result = bootstrap.deploy_stack(fresh_config(), aws.client("cloudformation"), STACK)
    sets = [line.removeprefix("--set ") for line in config_file.set_lines(bootstrap.config_updates(result.outputs))]
    cfg = load_config(ROOT / "pipeline.yaml", sets, environ={})
    report = upsert(cfg, definition(cfg), aws)
    assert report.action == "created" and report.deploy_function == "stack trainium-bert-pipeline created"
    function = aws.client("lambda").get_function(FunctionName=cfg.deploy.lambda_function_name)["Configuration"]
    assert function["Role"] == result.outputs["DeployLambdaRoleArn"]
    assert function["Environment"]["Variables"]["SAGEMAKER_ROLE_ARN"] == result.outputs["ExecutionRoleArn"]
    described = aws.sagemaker.describe_pipeline(PipelineName=cfg.pipeline.name)
    assert described["RoleArn"] == result.outputs["ExecutionRoleArn"]
    assert aws.s3.list_objects_v2(Bucket=result.outputs["BucketName"], Prefix="trainium-bert/code/")["KeyCount"] > 0
    assert function["Environment"]["Variables"]["ALERTS_TOPIC_ARN"] == result.outputs["AlertsTopicArn"]
    # moto's CloudFormation skips AWS::Lambda::EventInvokeConfig: its failures destination is read from the template
    retries = json.loads(pipeline_stack.template(cfg))["Resources"]["DeployFunctionRetries"]["Properties"]
    assert retries["DestinationConfig"]["OnFailure"]["Destination"] == result.outputs["AlertsTopicArn"]
    assert pipeline_stack.deploy(cfg, aws, triggers=True).action == "updated"
    events = aws.client("events")
    assert sorted(r["Name"] for r in events.list_rules()["Rules"]) == [
        f"trainium-bert-{kind}" for kind in ("deploy-on-approval", "endpoint-state", "execution-alerts",
                                             "rollback-on-reject")]
    scheduled = load_config(ROOT / "pipeline.yaml", [*sets, "triggers.schedule=rate(7 days)"], environ={})
    assert pipeline_stack.deploy(scheduled, aws, triggers=True).action == "updated"
    (target,) = events.list_targets_by_rule(Rule="trainium-bert-schedule")["Targets"]
    assert target["RoleArn"] == result.outputs["EventsRoleArn"] and target["Arn"] == described["PipelineArn"]
    assert upsert(scheduled, definition(scheduled), aws).deploy_function == "stack trainium-bert-pipeline unchanged"
    assert "trainium-bert-schedule" in {r["Name"] for r in events.list_rules()["Rules"]}  # upsert keeps the rules


def test_upsert_and_triggers_with_only_the_stack_outputs(aws):
    end_to_end(aws)


@pytest.fixture
def moto_server(monkeypatch, no_network):
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10).close()
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    yield
    server.stop()


def test_bootstrap_then_upsert_and_triggers_against_moto_server(moto_server):
    end_to_end(Aws("us-east-1"))
