"""The deploy Lambda's lifecycle (steps/deploy/handler.py) against moto, in-process: events in EventBridge's shapes, the
Model Registry, S3 (the labelled sample), SNS (alerts, read through an SQS subscription) and Application Auto Scaling
are moto's. The endpoint test goes through the stock `sagemaker-runtime` client to a real local endpoint serving a
torch-free classifier under the staging endpoint's name (moto's own invoke answers a canned body).

moto creates endpoints InService at once and lacks UpdateEndpoint: `Service` plays SageMaker's asynchrony (Creating /
Updating until `finish()`, which returns the "SageMaker Endpoint State Change" event SageMaker would send)."""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import boto3
import pytest
from aws_shapes import service_error, validated
from botocore.exceptions import ClientError
from fixtures_lifecycle import toy_version

from pipeline.config import load_config
from pipeline.local.endpoint import LocalEndpoint
from pipeline.sagemaker.pipeline_stack import lambda_environment
from steps.deploy import handler as deploy
from steps.deploy import lifecycle
from steps.deploy import sagemaker_account as account_module
from steps.deploy import sagemaker_endpoints as endpoints

ROOT = Path(__file__).resolve().parent.parent
REGION, ACCOUNT, BUCKET, GROUP = "us-east-1", "123456789012", "lifecycle-bucket", "trainium-bert"
STAGING, PRODUCTION = "trainium-bert-staging", "trainium-bert"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/SageMakerExecutionRole"
TOLERANCE = ("deploy.challenge.tolerance=0.05",)  # 40 sample rows: the interval of two equal models is +-0.047


class Service:
    """moto's SageMaker client, with endpoints that take their time as SageMaker's do."""

    def __init__(self, client) -> None:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.sagemaker.models import sagemaker_backends

        self._client, self.updates = client, []
        self._endpoints = sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].endpoints
        self._pending: dict[str, str] = {}

    def __getattr__(self, name):
        return getattr(self._client, name)

    def create_endpoint(self, **kwargs):
        answer = self._client.create_endpoint(**kwargs)  # moto: botocore validates the request
        self._endpoints[kwargs["EndpointName"]].endpoint_status = "Creating"
        return answer

    def update_endpoint(self, **kwargs):
        self.updates.append(validated(self._client, "update_endpoint", kwargs))
        endpoint = self._endpoints[kwargs["EndpointName"]]
        if endpoint.endpoint_status != "InService":
            raise service_error(self._client, "update_endpoint", "ValidationException",
                                "Cannot update in-progress endpoint")
        self._pending[kwargs["EndpointName"]] = kwargs["EndpointConfigName"]
        endpoint.endpoint_status = "Updating"
        return {"EndpointArn": endpoint.arn}

    def describe_endpoint(self, **kwargs):
        described = self._client.describe_endpoint(**kwargs)
        if kwargs["EndpointName"] in self._pending:
            described["PendingDeploymentSummary"] = {"EndpointConfigName": self._pending[kwargs["EndpointName"]]}
        return described

    def busy(self, name: str, status: str = "Updating") -> None:
        self._endpoints[name].endpoint_status = status

    def finish(self, name: str, status: str = "IN_SERVICE") -> dict:
        """End the endpoint's creation or update; the event SageMaker then sends."""
        endpoint = self._endpoints[name]
        endpoint.endpoint_config_name = self._pending.pop(name, endpoint.endpoint_config_name)
        endpoint.endpoint_status = "InService" if status == "IN_SERVICE" else "Failed"
        return {"version": "0", "id": str(uuid.uuid4()), "source": "aws.sagemaker",
                "detail-type": deploy.ENDPOINT_EVENT, "resources": [endpoint.arn],
                "detail": {"EndpointName": name, "EndpointArn": endpoint.arn, "EndpointStatus": status,
                           "EndpointConfigName": endpoint.endpoint_config_name, "LastModifiedTime": changed_at()}}


def package_event(version: int, status: str, updated: list[str] | None = None) -> dict:
    arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package/{GROUP}/{version}"
    detail = {"ModelPackageGroupName": GROUP, "ModelPackageVersion": version, "ModelPackageArn": arn,
              "ModelApprovalStatus": status, "ModelPackageStatus": "Completed", "LastModifiedTime": changed_at()}
    if updated is not None:
        detail["UpdatedModelPackageFields"] = updated
    return {"version": "0", "id": str(uuid.uuid4()), "source": "aws.sagemaker",
            "detail-type": deploy.MODEL_PACKAGE_EVENT, "resources": [arn], "detail": detail}


def changed_at() -> str:
    """When a resource changed (the LastModifiedTime of a state change event): each change its own."""
    return datetime.now(timezone.utc).isoformat()


@pytest.fixture(scope="module")
def served(tmp_path_factory, no_network_module):
    """The two endpoints' models, served for real under the endpoints' names: the runtime client of the tests goes
    to the one its EndpointName names, as SageMaker's does."""
    folder = tmp_path_factory.mktemp("toys")
    models = {kind: toy_version(folder / kind, kind)[0] for kind in ("good", "broken", "weak")}
    endpoints = {name: LocalEndpoint() for name in (STAGING, PRODUCTION)}
    for name, endpoint in endpoints.items():
        endpoint.start(models["good"], name, port=0, version="good")
    yield endpoints, models
    for endpoint in endpoints.values():
        endpoint.stop()


class Runtime:
    """The stock `sagemaker-runtime` client of each local endpoint, picked by EndpointName."""

    def __init__(self, endpoints: dict[str, LocalEndpoint]) -> None:
        self.clients = {name: boto3.client("sagemaker-runtime", endpoint_url=endpoint.url, region_name=REGION)
                        for name, endpoint in endpoints.items()}

    def invoke_endpoint(self, **request):
        return self.clients[request["EndpointName"]].invoke_endpoint(**request)


class World:
    """One moto account: registry, bucket, alerts topic with an SQS subscription, and the lifecycle's account."""

    def __init__(self, served, tmp_path: Path, *sets: str) -> None:
        self.endpoints, self.models = served
        self.sm = Service(boto3.client("sagemaker", region_name=REGION))
        self.s3, self.sns, self.sqs = (boto3.client(s, region_name=REGION) for s in ("s3", "sns", "sqs"))
        self.aas = boto3.client("application-autoscaling", region_name=REGION)
        self.s3.create_bucket(Bucket=BUCKET)
        topic = self.sns.create_topic(Name="trainium-bert-alerts")["TopicArn"]
        self.queue = self.sqs.create_queue(QueueName="alerts")["QueueUrl"]
        queue_arn = self.sqs.get_queue_attributes(QueueUrl=self.queue, AttributeNames=["QueueArn"])["Attributes"]
        self.sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn["QueueArn"])
        self.sm.create_model_package_group(ModelPackageGroupName=GROUP)
        self.cfg = load_config(ROOT / "pipeline.yaml", [f"aws.role_arn={ROLE}", f"aws.bucket={BUCKET}",
                                                        f"alerts.topic_arn={topic}", *TOLERANCE, *sets], environ={})
        self.settings = account_module.Settings.from_env(lambda_environment(self.cfg))
        self.account = account_module.SageMakerAccount(self.settings, self.sm, s3=self.s3, sns=self.sns,
                                                       autoscaling=self.aas, runtime=Runtime(self.endpoints))
        self.tmp = tmp_path

    def register(self, status: str = "Approved", kind: str = "good", digest: str = "d1") -> int:
        number = len(self.sm.list_model_packages(ModelPackageGroupName=GROUP)["ModelPackageSummaryList"]) + 1
        _, report = toy_version(self.tmp / f"v{number}", kind)
        prefix = f"trainium-bert/executions/exec{number}/evaluation"
        for path in report.parent.iterdir():
            self.s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{path.name}", Body=path.read_bytes())
        self.sm.create_model_package(
            ModelPackageGroupName=GROUP, ModelApprovalStatus=status,
            CustomerMetadataProperties={"accuracy": "0.95", "kind": kind, "label_digest": digest},
            InferenceSpecification={"Containers": [{"Image": "763104351884.dkr.ecr.us-east-1.amazonaws.com/hf:cpu",
                                                    "ModelDataUrl": f"s3://{BUCKET}/model{number}.tar.gz"}],
                                    "SupportedContentTypes": ["application/json"],
                                    "SupportedResponseMIMETypes": ["application/json"]},
            ModelMetrics={"ModelQuality": {"Statistics": {"ContentType": "application/json",
                                                          "S3Uri": f"s3://{BUCKET}/{prefix}/evaluation.json"}}},
        )
        return number

    def approve(self, number: int, status: str = "Approved") -> dict:
        arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package/{GROUP}/{number}"
        metadata = self.sm.describe_model_package(ModelPackageName=arn)["CustomerMetadataProperties"]
        self.sm.update_model_package(ModelPackageArn=arn, ModelApprovalStatus=status,  # as `models approve` does
                                     CustomerMetadataProperties=metadata)
        return package_event(number, status, ["ModelApprovalStatus"])

    def handle(self, event: dict) -> dict:
        """The Lambda's entry, as EventBridge invokes it; each endpoint serves the model of the version it holds."""
        for stage, name in ((lifecycle.STAGING, STAGING), (lifecycle.PRODUCTION, PRODUCTION)):
            served = self.account.endpoint(stage).version
            if served:
                kind = self.account.version(served).metadata["kind"]
                self.endpoints[name].update(self.models[kind], kind)
        return deploy.handle(event, self.account)

    def metadata(self, number: int) -> dict:
        arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package/{GROUP}/{number}"
        return self.sm.describe_model_package(ModelPackageName=arn).get("CustomerMetadataProperties") or {}

    def serving(self, stage: str) -> int | None:
        return self.account.endpoint(stage).version

    def alerts(self) -> list[tuple[str, str]]:
        found = []
        while messages := self.sqs.receive_message(QueueUrl=self.queue, MaxNumberOfMessages=10).get("Messages"):
            for message in messages:
                body = json.loads(message["Body"])
                found.append((body["Subject"], body["Message"]))
                self.sqs.delete_message(QueueUrl=self.queue, ReceiptHandle=message["ReceiptHandle"])
        return found


@pytest.fixture
def world(moto_session, served, tmp_path, monkeypatch):
    mock, _ = moto_session
    mock.reset()
    monkeypatch.setenv("SAGEMAKER_ROLE_ARN", ROLE)
    return World(served, tmp_path)


def actions(result: dict) -> list[tuple[str, str, int | None]]:
    return [(o["stage"], o["action"], o["version"]) for o in result["outcomes"]]


def test_approval_staging_test_promotion_autoscaling(world):
    world.register()
    result = world.handle(world.approve(1))
    assert actions(result) == [("staging", "created", 1)]
    assert result["endpoint_config_name"].startswith(f"{STAGING}-v1-") and world.serving("staging") == 1
    assert world.metadata(1).get("staging_test") is None  # Creating: the test waits for InService

    result = world.handle(world.sm.finish(STAGING))
    assert actions(result) == [("staging", "unchanged", 1), ("staging", "test", 1)]
    test = world.metadata(1)
    assert test["staging_test"] == "pass" and test["staging_test_rows"] == "40"
    assert test["staging_test_accuracy"] == "1.0" and test["staging_test_reference_accuracy"] == "0.95"
    assert float(test["staging_test_p95_ms"]) >= float(test["staging_test_p50_ms"]) > 0
    legal = re.compile(r"[\w\s.:/=+\-@]*")  # UpdateModelPackage's alphabet of metadata values (moto checks none)
    assert all(legal.fullmatch(value) and len(value) <= 256 for value in test.values()), test
    assert test["kind"] == "good" and test["accuracy"] == "0.95"  # merged, nothing wiped
    (subject, message), = world.alerts()
    assert subject.startswith("staging test of version 1 on trainium-bert-staging: PASS on 40 rows")
    line, body = message.split("\n", 1)
    assert line.startswith(subject[:60]) and json.loads(body)["test"]["passed"] is True
    assert world.serving("production") is None  # deploy.auto_promote is off on AWS by default

    with pytest.raises(lifecycle.Refused, match="version 2 is PendingManualApproval, not Approved"):
        lifecycle.Lifecycle(world.account, world.settings.policy).promote(world.account.version(world.register(
            "PendingManualApproval")))
    outcomes = lifecycle.Lifecycle(world.account, world.settings.policy).promote(world.account.version(1))
    assert [(o["action"], o["version"]) for o in outcomes] == [("promotion", 1), ("created", 1)]
    assert "promoted_at" in world.metadata(1)
    result = world.handle(world.sm.finish(PRODUCTION))
    assert actions(result) == [("production", "unchanged", 1), ("production", "scaling", 1)]
    world.handle(world.sm.finish(PRODUCTION))  # events repeat: the same target and policy, updated in place
    resource = endpoints.scaling_resource(PRODUCTION)
    (target,) = world.aas.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[resource])[
        "ScalableTargets"]
    assert (target["MinCapacity"], target["MaxCapacity"]) == (1, 2)
    (policy,) = world.aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=resource)[
        "ScalingPolicies"]
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["TargetValue"] == 100.0
    assert tracking["PredefinedMetricSpecification"]["PredefinedMetricType"] == "SageMakerVariantInvocationsPerInstance"
    assert [s for s, _ in world.alerts()] == ["production trainium-bert: version 1 promoted by hand"]


def test_auto_promotion_and_a_broken_version_that_never_reaches_production(world):
    world.settings = world.account.settings = account_module.Settings.from_env(
        {**lambda_environment(world.cfg), "AUTO_PROMOTE": "true"})
    world.register()
    world.handle(world.approve(1))
    result = world.handle(world.sm.finish(STAGING))
    assert actions(result) == [("staging", "unchanged", 1), ("staging", "test", 1), ("production", "promotion", 1),
                               ("production", "created", 1)]
    world.handle(world.sm.finish(PRODUCTION))
    world.register(kind="broken")
    assert actions(world.handle(world.approve(2))) == [("staging", "updated", 2)]
    result = world.handle(world.sm.finish(STAGING))
    assert actions(result) == [("staging", "unchanged", 2), ("staging", "test", 2)]
    assert world.metadata(2)["staging_test"] == "fail"
    assert "40 of 40 requests got an error answer ModelError: " in world.metadata(2)["staging_test_reason"]
    assert (world.serving("staging"), world.serving("production")) == (2, 1)
    assert len(world.sm.updates) == 1  # production untouched


def auto_promoting(world: World, *env: tuple[str, str]) -> None:
    world.settings = world.account.settings = account_module.Settings.from_env(
        {**lambda_environment(world.cfg), "AUTO_PROMOTE": "true", **dict(env)})


def in_production(world: World, number: int) -> None:
    """Version `number`, registered good and approved, tested on staging and promoted (nothing in production)."""
    world.register()
    world.handle(world.approve(number))
    world.handle(world.sm.finish(STAGING))
    world.handle(world.sm.finish(PRODUCTION))
    assert world.serving("production") == number


def test_a_weaker_candidate_is_held_for_a_person_and_an_equal_one_promoted(world):
    """Champion/challenger on macro-F1 (test_lifecycle_local.py's on accuracy): both endpoints are sent the
    candidate's 40 sample rows; the weak model (wrong on 4 of them, where production is right) passes its staging
    test yet stays out of production, the reason in the registry and an alert; an equal model is promoted
    automatically."""
    metric = "macro_f1"
    auto_promoting(world, ("CHALLENGE_METRIC", metric))
    in_production(world, 1)
    world.alerts()
    world.register(kind="weak")
    world.handle(world.approve(2))
    result = world.handle(world.sm.finish(STAGING))
    assert actions(result) == [("staging", "unchanged", 2), ("staging", "test", 2), ("production", "held", 2)]
    held = world.metadata(2)
    assert held["staging_test"] == "pass" and held["challenge"] == "hold" and held["challenge_champion"] == "1"
    assert (held["challenge_metric"], held["challenge_rows"]) == (metric, "40")
    assert float(held["challenge_difference"]) == pytest.approx(-0.10101, abs=1e-5)  # F1 .889, .909 against 1, 1
    assert float(held["challenge_low"]) < -0.05 < float(held["challenge_high"]), held
    assert "may be worse by more than 0.05 left for a person promote N" in held["challenge_reason"]  # alphabet
    subjects = [subject for subject, _ in world.alerts()]
    assert subjects[-1].startswith(f"production trainium-bert: version 2 scores {metric} -0.10")
    assert world.serving("production") == 1 and "promoted_at" not in held

    world.register()  # as good as production: promoted
    world.handle(world.approve(3))
    result = world.handle(world.sm.finish(STAGING))
    assert actions(result)[2:] == [("production", "challenge-passed", 3), ("production", "promotion", 3),
                                   ("production", "updated", 3)]
    assert world.metadata(3)["challenge"] == "pass" and float(world.metadata(3)["challenge_low"]) > -0.05

    world.handle(world.sm.finish(PRODUCTION))
    world.register(digest="d2")  # another label set: never compared, left for a person
    world.handle(world.approve(4))
    result = world.handle(world.sm.finish(STAGING))
    assert actions(result)[-1] == ("production", "held", 4) and world.serving("production") == 3
    held = world.metadata(4)
    assert held["challenge"] == "hold" and "challenge_rows" not in held  # no row was sent to production
    assert "another label set than production version 3 label_digest d2 against d1" in held["challenge_reason"]

    # a person may still promote a held version
    outcomes = lifecycle.Lifecycle(world.account, world.settings.policy).promote(world.account.version(2))
    assert [o["action"] for o in outcomes][:1] == ["promotion"]


def test_a_challenge_while_production_is_busy_is_due_and_made_once_production_is_in_service(world):
    auto_promoting(world)
    in_production(world, 1)
    world.register()
    world.handle(world.approve(2))
    world.sm.busy(PRODUCTION, "Updating")  # e.g. a data capture change in flight
    result = world.handle(world.sm.finish(STAGING))
    assert actions(result)[-1] == ("production", "challenge-due", 2) and world.metadata(2)["challenge"] == "due"
    result = world.handle(world.sm.finish(PRODUCTION))
    assert actions(result) == [("production", "unchanged", 1), ("production", "scaling", 1),
                               ("production", "challenge-passed", 2), ("production", "promotion", 2),
                               ("production", "updated", 2)]
    assert world.metadata(2)["challenge"] == "pass"


def test_a_staging_test_the_lambda_has_no_time_for_records_a_failed_verdict(world, monkeypatch):
    """The Lambda is killed at its timeout: a test of a hung model (60 s per request, 200 rows) never wrote a
    verdict, and each retry started it again. The test stops in time and the version fails it, saying why."""
    world.settings = world.account.settings = account_module.Settings.from_env(
        {**lambda_environment(world.cfg), "AUTO_PROMOTE": "true"})
    world.register()
    world.handle(world.approve(1))
    world.account.deadline = time.monotonic() + account_module.RUNTIME_READ_TIMEOUT_S  # under a minute left
    assert world.account.test_seconds() == 0
    result = world.handle(world.sm.finish(STAGING))
    assert actions(result) == [("staging", "unchanged", 1), ("staging", "test", 1)]  # and no promotion
    assert world.metadata(1)["staging_test"] == "fail"
    assert "out of time: 0 of 40 rows answered" in world.metadata(1)["staging_test_reason"]


def test_an_approval_while_the_endpoint_is_busy_is_deployed_after_the_update(world):
    """Issue 19 item 3: the approval is not refused nor lost; the update's own InService event deploys it."""
    world.register()
    world.handle(world.approve(1))
    world.handle(world.sm.finish(STAGING))
    world.sm.busy(STAGING, "Updating")  # e.g. a data capture change in flight
    world.register()
    result = world.handle(world.approve(2))
    assert actions(result) == [("staging", "deferred", 2)] and result["action"] == "deferred"
    assert "follows when it is InService" in result["outcomes"][0]["line"] and world.sm.updates == []
    world.register()
    assert actions(world.handle(world.approve(3))) == [("staging", "deferred", 3)]  # two approvals, one update
    result = world.handle(world.sm.finish(STAGING))
    assert actions(result) == [("staging", "updated", 3)]
    (update,) = world.sm.updates
    assert update["EndpointConfigName"].startswith(f"{STAGING}-v3-") and "RetainAllVariantProperties" not in update
    result = world.handle(world.sm.finish(STAGING))
    assert actions(result) == [("staging", "unchanged", 3), ("staging", "test", 3)]


def test_a_promotion_while_production_is_busy_is_recorded_and_deployed_after_the_update(world):
    """Production busy with an update of its own: the promotion is kept in the registry and sent when it ends."""
    life = promoted_twice(world)
    world.register("PendingManualApproval")
    world.handle(world.approve(3))
    world.handle(world.sm.finish(STAGING))
    updates = len(world.sm.updates)
    world.sm.busy(PRODUCTION, "Updating")  # e.g. a data capture change in flight
    outcomes = life.promote(world.account.version(3))
    assert [(o["action"], o["version"]) for o in outcomes] == [("promotion", 3), ("deferred", 3)]
    assert "promoted_at" in world.metadata(3) and len(world.sm.updates) == updates
    assert actions(world.handle(world.sm.finish(PRODUCTION))) == [("production", "updated", 3)]
    world.handle(world.sm.finish(PRODUCTION))
    assert world.serving("production") == 3


def test_rejection_rolls_back_and_says_when_there_is_nothing_to_roll_back_to(world):
    promoted_twice(world)
    update = world.sm.updates[-1]
    assert update["EndpointName"] == PRODUCTION and update["RetainAllVariantProperties"] is True
    assert "ExcludeRetainedVariantProperties" not in update  # DataCaptureConfig there: "(Not currently supported.)"
    world.alerts()

    result = world.handle(world.approve(2, "Rejected"))
    assert actions(result)[:2] == [("production", "rollback", 1), ("production", "updated", 1)]
    assert ("staging", "rollback", 1) in actions(result) and world.serving("staging") == 1
    world.handle(world.sm.finish(PRODUCTION))
    assert world.serving("production") == 1
    subjects = [s for s, _ in world.alerts()]
    assert subjects[0].startswith("production trainium-bert: version 2 is no longer Approved: back to version 1")
    # A version rejected where nothing else passed: the endpoint is left serving it, and the alert says so.
    result = world.handle(world.approve(1, "Rejected"))
    assert actions(result)[0] == ("production", "no-rollback", 1) and world.serving("production") == 1
    assert any(m.startswith("production") and "keeps serving it" in m.split("\n")[0] for _, m in world.alerts())



def promoted_twice(world) -> lifecycle.Lifecycle:
    """Versions 1 and 2 approved, tested and promoted in turn; production serves 2 (updated from 1)."""
    for _ in range(2):
        world.register("PendingManualApproval")
    life = lifecycle.Lifecycle(world.account, world.settings.policy)
    for number in (1, 2):
        world.handle(world.approve(number))
        world.handle(world.sm.finish(STAGING))
        life.promote(world.account.version(number))
        world.handle(world.sm.finish(PRODUCTION))
    return life


def test_an_update_rolled_back_by_its_alarm_is_not_retried_until_promoted_again(world):
    life = promoted_twice(world)
    world.register("PendingManualApproval")
    world.handle(world.approve(3))
    world.handle(world.sm.finish(STAGING))
    life.promote(world.account.version(3))
    updates = len(world.sm.updates)
    world.sm._pending.pop(PRODUCTION)  # the blue/green update rolled back: production stays on version 2
    result = world.handle(world.sm.finish(PRODUCTION))
    assert actions(result) == [("production", "deploy-failed", 3)] and len(world.sm.updates) == updates
    assert "version 3 was sent there after version 2, yet 2 serves (rolled back or failed); not retried" in result[
        "outcomes"][0]["line"]
    assert actions(world.handle(world.sm.finish(PRODUCTION))) == [("production", "deploy-failed", 3)]  # no loop
    outcomes = life.promote(world.account.version(3))  # by hand: sent again
    assert [(o["action"], o["version"]) for o in outcomes] == [("promotion", 3), ("updated", 3)]
    assert len(world.sm.updates) == updates + 1


def test_metadata_writes_other_groups_and_endpoints_are_ignored(world):
    world.register()
    assert world.handle(package_event(1, "Approved", ["CustomerMetadataProperties"]))["action"] == "ignored"
    other = package_event(1, "Approved")
    other["detail"]["ModelPackageGroupName"] = "another-group"
    assert world.handle(other)["action"] == "ignored"
    stray = {"detail-type": deploy.ENDPOINT_EVENT,
             "detail": {"EndpointName": "someone-elses", "EndpointStatus": "IN_SERVICE"}}
    assert world.handle(stray)["action"] == "ignored"
    assert world.sm.list_endpoints()["Endpoints"] == []
    with pytest.raises(deploy.UnknownEvent, match="unrecognised event"):
        world.handle({"hello": "world"})


def test_the_deploy_step_refuses_a_version_that_is_not_approved_and_fails_on_a_failed_endpoint(world):
    world.register("PendingManualApproval")
    arn = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package/{GROUP}/1"
    with pytest.raises(endpoints.NotApproved, match="is PendingManualApproval, not Approved"):
        world.handle({"model_package_arn": arn})
    world.approve(1)
    result = world.handle({"model_package_arn": arn})
    assert (result["action"], result["endpoint_name"]) == ("created", STAGING)
    result = world.handle(world.sm.finish(STAGING, "FAILED"))
    assert actions(result) == [("staging", "deploy-failed", None)]
    with pytest.raises(endpoints.DeployError, match="is Failed and cannot be updated"):
        world.register()
        world.approve(2)
        world.handle({"model_package_arn": arn.replace("/1", "/2")})


def sns_subject_ok(subject: str) -> bool:
    """SNS Publish's Subject (botocore's model: "no line breaks or control characters, and less than 100 characters
    long"; the SNS guide: ASCII text beginning with a letter, number or punctuation mark)."""
    return bool(re.fullmatch(r"[!-~][ -~]{0,98}", subject))


def test_an_alert_subject_from_a_multi_line_failure_reason_is_one_printable_line(world):
    """A FailureReason or an exception text with line breaks, tabs, control or non-ASCII characters made a Subject
    that SNS rejects: the FAILED event's alert failed the invocation."""
    world.register()
    world.handle(world.approve(1))
    reason = ("ClientError: Please ensure the model artifact is valid.\r\nTraceback (most recent call last):\n\t"
              "File \"inference.py\"\x07, line 3 \u2014 caf\u00e9 " + "x" * 120)
    world.sm._endpoints[STAGING].failure_reason = reason
    result = world.handle(world.sm.finish(STAGING, "FAILED"))
    assert actions(result) == [("staging", "deploy-failed", None)]
    (subject, message), = world.alerts()
    assert sns_subject_ok(subject), repr(subject)
    assert subject.startswith("staging trainium-bert-staging failed: ClientError: Please ensure the model artifact "
                              "is valid. Tr") and subject.endswith("...") and len(subject) == 99
    assert message.startswith(f"staging trainium-bert-staging failed: {reason}\n")  # the message keeps it whole
    assert [account_module.subject(s) for s in ("\n\t", "\u00e9t\u00e9")] == ["alert", "?t?"]


def test_deploy_n_tests_again_a_version_tested_before_once_its_update_is_in_service(world):
    """`deploy N`'s help says it tests the version on staging; on AWS the update ends later, and the InService event
    saw the old result in the registry and tested nothing (locally the test ran at once)."""
    life = promoted_twice(world)  # versions 1 and 2 tested (pass); staging serves 2
    first = world.metadata(1)["staging_test_at"]
    outcomes = life.deploy(1)
    assert [(o["stage"], o["action"], o["version"]) for o in outcomes] == [("staging", "updated", 1)]
    result = world.handle(world.sm.finish(STAGING))
    # tested, then compared with production (version 2): equal models, not promoted (auto_promote is off)
    assert actions(result) == [("staging", "unchanged", 1), ("staging", "test", 1),
                               ("production", "challenge-passed", 1)]
    assert world.metadata(1)["staging_test_at"] > first and world.metadata(1)["staging_test"] == "pass"
    assert world.metadata(1)["challenge_champion"] == "2" and world.serving("production") == 2
    assert actions(world.handle(world.sm.finish(STAGING))) == [("staging", "unchanged", 1)]  # once: not again
    outcomes = life.deploy(1)  # staging serves it already: the test runs at once, as locally
    assert [o["action"] for o in outcomes] == ["unchanged", "test", "challenge-passed"]


def test_a_state_change_delivered_twice_is_handled_once_even_while_the_first_delivery_runs(world):
    """SageMaker may send several events per state change ("Events that Amazon SageMaker AI sends to Amazon
    EventBridge"): the second, arriving while the first invocation tests staging, must not test it again."""
    world.register()
    world.handle(world.approve(1))
    event = world.sm.finish(STAGING)
    twin = {**event, "id": str(uuid.uuid4())}  # another event about the same change
    sample, inner, started = world.account.sample, [], []

    def sample_while_the_twin_arrives(version):
        if not started:
            started.append(True)
            inner.append(world.handle(twin))
        return sample(version)

    world.account.sample = sample_while_the_twin_arrives
    result = world.handle(event)
    assert actions(result) == [("staging", "unchanged", 1), ("staging", "test", 1)]
    assert inner[0]["action"] == "ignored" and inner[0]["reason"].startswith("a duplicate: this state change")
    assert len(world.alerts()) == 1  # one test, one alert
    assert world.handle({**event, "id": str(uuid.uuid4())})["action"] == "ignored"  # a later duplicate too


def test_an_invocation_killed_at_its_timeout_leaves_its_state_change_to_the_retry(world, monkeypatch):
    """Lambda kills an invocation at its timeout: nothing releases its claim, yet the retry must handle the change;
    a delivery while the claim is younger than the timeout, or after it finished, is a duplicate."""
    world.register()
    world.handle(world.approve(1))
    event = world.sm.finish(STAGING)
    assert world.account.claim(f"events/{deploy.event_key(event)}")  # the killed invocation's claim, never finished
    assert world.handle(event)["action"] == "ignored"  # within the timeout: it may still run
    assert world.metadata(1).get("staging_test") is None
    monkeypatch.setattr(deploy, "DEPLOY_LAMBDA_TIMEOUT_S", 0)  # the timeout has passed since the claim
    assert actions(world.handle(event)) == [("staging", "unchanged", 1), ("staging", "test", 1)]
    assert world.metadata(1)["staging_test"] == "pass"
    assert world.handle(event)["action"] == "ignored"  # finished: a duplicate however late


def test_a_claim_released_while_being_taken_over_is_claimed_afresh_though_s3_says_403(world):
    """The deploy role has no s3:ListBucket, so S3 answers a GetObject of a marker deleted a moment before with 403
    AccessDenied, not 404 (moto answers 404): the take-over must claim it afresh, not fail the invocation."""
    account = world.account
    key = "events/released-meanwhile"
    assert account.claim(key)
    bucket, name = account._marker(key)
    get_object = account.s3.get_object

    def deleted_then_denied(**kwargs):
        if kwargs.get("Key") == name:
            account.s3.delete_object(Bucket=bucket, Key=name)  # the holder released it
            account.s3.get_object = get_object
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "GetObject")
        return get_object(**kwargs)

    account.s3.get_object = deleted_then_denied
    assert account.claim(key, abandoned_after_s=0)
    assert not account.claim(key)  # held again


def test_a_409_on_a_conditional_write_is_tried_again_and_only_a_412_means_another_claimant_won(world, monkeypatch):
    """S3 answers a conditional PutObject 409 ConditionalRequestConflict when a conflicting operation ran during the
    upload (try again) and 412 PreconditionFailed when the condition no longer holds (the other claimant won)."""
    monkeypatch.setattr(account_module.time, "sleep", lambda seconds: None)
    account = world.account
    put_object, answers = account.s3.put_object, []

    def conflicting(*codes: str):
        answers[:] = list(codes)

        def put(**kwargs):
            validated(account.s3, "put_object", kwargs)
            if answers:
                code = answers.pop(0)
                raise service_error(account.s3, "put_object", code, f"{code} on purpose",
                                    409 if code == "ConditionalRequestConflict" else 412)
            return put_object(**kwargs)
        return put

    account.s3.put_object = conflicting("ConditionalRequestConflict", "ConditionalRequestConflict")
    assert account.claim("events/conflicted") and answers == []  # third attempt: claimed
    assert not account.claim("events/conflicted")  # it exists: S3 says 412, a duplicate
    account.s3.put_object = conflicting("PreconditionFailed")
    assert not account.claim("events/won-elsewhere") and answers == []  # no retry of a 412
    account.s3.put_object = conflicting(*["ConditionalRequestConflict"] * account_module.CONFLICT_ATTEMPTS)
    with pytest.raises(ClientError, match="ConditionalRequestConflict"):
        account.claim("events/never-settles")  # the invocation fails, and Lambda retries it


def test_a_failed_invocation_releases_its_state_change_for_the_retry(world):
    world.register()
    event = world.approve(1)
    endpoint = world.account.endpoint
    world.account.endpoint = lambda stage: (_ for _ in ()).throw(ClientError(
        {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "DescribeEndpoint"))
    with pytest.raises(ClientError, match="Rate exceeded"):
        world.handle(event)
    world.account.endpoint = endpoint
    assert actions(world.handle(event)) == [("staging", "created", 1)]  # Lambda's retry of the same event


def test_concurrent_metadata_writes_are_merged_not_lost(world):
    """UpdateModelPackage replaces the map from a read (it has no condition): a write between our read and our write
    was lost. Each write now claims the next revision of what it read, and a writer that lost the claim reads again."""
    world.register()
    account, version = world.account, world.account.version(1)
    interleaved: list[bool] = []

    def describe_then_another_writer(**kwargs):
        answer = world.sm._client.describe_model_package(**kwargs)
        if not interleaved:
            interleaved.append(True)
            account.set_metadata(version, {"promoted_at": "2026-12-04T10:00:00.000000Z"})  # e.g. `promote 1`
        return answer

    world.sm.describe_model_package = describe_then_another_writer
    account.set_metadata(version, {"staging_test": "pass"})  # e.g. the Lambda's endpoint test, read before
    metadata = world.metadata(1)
    assert metadata["promoted_at"] == "2026-12-04T10:00:00.000000Z" and metadata["staging_test"] == "pass"
    assert metadata["kind"] == "good" and metadata[account_module.REVISION] == "2"
