"""The deploy Lambda's SageMaker calls (steps/deploy/sagemaker_endpoints.py) against moto, in-process; its zip and entry
point. The lifecycle it drives is tested in test_lifecycle_aws.py."""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import boto3
import pytest
from aws_shapes import service_error, validated
from moto import mock_aws

from pipeline.code import bundles
from pipeline.config import load_config
from pipeline.sagemaker.pipeline_stack import LAMBDA_HANDLER, deploy_lambda_zip, lambda_environment
from steps.deploy import handler
from steps.deploy import sagemaker_endpoints as deploy_step

ROOT = Path(__file__).resolve().parent.parent

REGION = "us-east-1"
GROUP = "trainium-bert"
ENDPOINT = "trainium-bert"
ROLE = "arn:aws:iam::123456789012:role/SageMakerExecutionRole"
SPEC = {
    "Containers": [
        {"Image": "763104351884.dkr.ecr.us-east-1.amazonaws.com/hf:cpu", "ModelDataUrl": "s3://b/model.tar.gz"}
    ],
    "SupportedContentTypes": ["application/json"],
    "SupportedResponseMIMETypes": ["application/json"],
}


def register(sm, status: str, group: str = GROUP, accuracy: str = "0.9") -> str:
    return sm.create_model_package(
        ModelPackageGroupName=group,
        InferenceSpecification=SPEC,
        ModelApprovalStatus=status,
        CustomerMetadataProperties={"accuracy": accuracy},
    )["ModelPackageArn"]


class RecordingClient:
    """The moto client, with update_endpoint recorded and applied by hand: moto does not implement
    UpdateEndpoint (NotImplementedError in-process), so this is the only way to exercise that path."""

    def __init__(self, client, backend_endpoints):
        self._client = client
        self._endpoints = backend_endpoints
        self.updates: list[dict] = []

    def __getattr__(self, name):
        return getattr(self._client, name)

    def update_endpoint(self, **kwargs):
        self.updates.append(validated(self._client, "update_endpoint", kwargs))
        self._endpoints[kwargs["EndpointName"]].endpoint_config_name = kwargs["EndpointConfigName"]
        return {"EndpointArn": f"arn:aws:sagemaker:{REGION}:123456789012:endpoint/{kwargs['EndpointName']}"}


@pytest.fixture(scope="module")
def moto_sagemaker(no_network_module):
    """One moto session and client for the module (the first call costs ~1 s); each test resets it."""
    with mock_aws() as mock:
        yield mock, boto3.client("sagemaker", region_name=REGION)


@pytest.fixture
def sm(moto_sagemaker, monkeypatch):
    for var in ("ENDPOINT_NAME", "INSTANCE_TYPE", "INSTANCE_COUNT", "DATA_CAPTURE_S3_URI", "GUARDRAILS_ALARM"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SAGEMAKER_ROLE_ARN", ROLE)
    mock, client = moto_sagemaker
    mock.reset()
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sagemaker.models import sagemaker_backends

    client.create_model_package_group(ModelPackageGroupName=GROUP)
    return RecordingClient(client, sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].endpoints)


def counts(sm) -> tuple[int, int, int]:
    return (
        len(sm.list_models()["Models"]),
        len(sm.list_endpoint_configs()["EndpointConfigs"]),
        len(sm.list_endpoints()["Endpoints"]),
    )


def test_first_deploy_creates_model_config_and_endpoint(sm):
    arn = register(sm, "Approved")
    result = deploy_step.deploy(
        sm, arn, ENDPOINT, "ml.c5.2xlarge", 2, data_capture_s3_uri="s3://b/capture", role_arn=ROLE
    )
    assert result["action"] == "created"
    assert result["model_name"] == "trainium-bert-v1"
    assert result["endpoint_config_name"].startswith("trainium-bert-v1-")
    model = sm.describe_model(ModelName="trainium-bert-v1")
    assert model["ExecutionRoleArn"] == ROLE
    assert model["Containers"][0]["ModelPackageName"] == arn
    config = sm.describe_endpoint_config(EndpointConfigName=result["endpoint_config_name"])
    variant = config["ProductionVariants"][0]
    assert (variant["ModelName"], variant["InstanceType"], variant["InitialInstanceCount"]) == (
        "trainium-bert-v1",
        "ml.c5.2xlarge",
        2,
    )
    assert config["DataCaptureConfig"]["DestinationS3Uri"] == "s3://b/capture"
    assert sm.describe_endpoint(EndpointName=ENDPOINT)["EndpointConfigName"] == result["endpoint_config_name"]
    assert counts(sm) == (1, 1, 1)
    assert sm.updates == []


@pytest.mark.parametrize(("instance_type", "startup"), [("ml.inf2.xlarge", 1800), ("ml.g5.xlarge", None),
                                                      ("ml.c5.xlarge", None)])
def test_an_inferentia2_endpoint_gives_its_instances_time_to_compile_at_start(sm, instance_type, startup, monkeypatch):
    """The handler compiles the model for Neuron when an inf2 instance starts: its first health check may take
    1800 s (SageMaker's default is kept elsewhere). moto 5.2.6's list of endpoint instance types lags the API's
    (no ml.inf2, no ml.g5): the instance type is checked against botocore's enum instead."""
    from moto.sagemaker.exceptions import ValidationError
    from moto.sagemaker.models import FakeEndpointConfig

    types = sm.meta.service_model.shape_for("ProductionVariantInstanceType").enum

    def validate_instance_type(_: FakeEndpointConfig, instance_type: str) -> None:
        if instance_type not in types:
            raise ValidationError(message=f"Value '{instance_type}' at 'instanceType' failed to satisfy constraint")

    monkeypatch.setattr(FakeEndpointConfig, "validate_instance_type", validate_instance_type)
    result = deploy_step.deploy(sm, register(sm, "Approved"), ENDPOINT, instance_type, 1, role_arn=ROLE)
    (variant,) = sm.describe_endpoint_config(EndpointConfigName=result["endpoint_config_name"])["ProductionVariants"]
    assert variant.get("ContainerStartupHealthCheckTimeoutInSeconds") == startup


SERVERLESS = {"MemorySizeInMB": 2048, "MaxConcurrency": 5}


def test_a_serverless_endpoint_has_a_serverless_config_and_no_instances_and_updates_without_scaling(sm):
    """deploy.serverless: the variant carries ServerlessConfig alone (the API's ProductionVariant); a new version
    updates it, and no autoscaling is touched (SageMaker scales serverless endpoints)."""
    from botocore.validate import validate_parameters

    class NoScaling:
        def __getattr__(self, name):
            raise AssertionError(f"application-autoscaling {name} called for a serverless endpoint")

    first = deploy_step.deploy(sm, register(sm, "Approved"), ENDPOINT, autoscaling=NoScaling(), serverless=SERVERLESS)
    (variant,) = sm.describe_endpoint_config(EndpointConfigName=first["endpoint_config_name"])["ProductionVariants"]
    assert variant["ServerlessConfig"] == SERVERLESS and "InstanceType" not in variant
    validate_parameters({"EndpointConfigName": "c", "ProductionVariants": [
        {k: variant[k] for k in ("VariantName", "ModelName", "ServerlessConfig")}]},
        sm.meta.service_model.operation_model("CreateEndpointConfig").input_shape)
    bigger = deploy_step.deploy(sm, register(sm, "Approved"), ENDPOINT, autoscaling=NoScaling(),
                                serverless={**SERVERLESS, "MemorySizeInMB": 4096})
    (update,) = sm.updates
    assert bigger["action"] == "updated" and "RetainAllVariantProperties" not in update


def test_an_instance_based_endpoint_is_not_turned_serverless_and_serverless_does_not_capture(sm):
    """SageMaker answers UpdateEndpoint from instances to serverless with a ValidationException: refused before any
    call, saying what to do; data capture is not supported on serverless endpoints."""
    arn = register(sm, "Approved")
    deploy_step.deploy(sm, arn, ENDPOINT, "ml.c5.xlarge", 1)
    with pytest.raises(deploy_step.DeployError, match=r"serves on instances, and SageMaker cannot update an "
                                                      r"instance-based endpoint to serverless: delete it"):
        deploy_step.deploy(sm, register(sm, "Approved"), ENDPOINT, serverless=SERVERLESS)
    with pytest.raises(deploy_step.DeployError, match="a serverless endpoint cannot capture data"):
        deploy_step.deploy(sm, arn, "other", serverless=SERVERLESS, data_capture_s3_uri="s3://b/capture")
    assert counts(sm) == (1, 1, 1) and sm.updates == []


def test_redeploying_the_same_version_changes_nothing(sm):
    arn = register(sm, "Approved")
    first = deploy_step.deploy(sm, arn, ENDPOINT)
    again = deploy_step.deploy(sm, arn, ENDPOINT)
    assert again["action"] == "unchanged"
    assert again["endpoint_config_name"] == first["endpoint_config_name"]
    assert counts(sm) == (1, 1, 1) and sm.updates == []


def test_newer_version_updates_the_endpoint_to_a_new_config(sm):
    v1 = register(sm, "Approved")
    first = deploy_step.deploy(sm, v1, ENDPOINT)
    v2 = register(sm, "Approved", accuracy="0.93")
    second = deploy_step.deploy(sm, v2, ENDPOINT, guardrails_alarm="trainium-bert-5xx")
    assert second["action"] == "updated"
    assert second["model_name"] == "trainium-bert-v2"
    assert second["endpoint_config_name"] != first["endpoint_config_name"]
    assert second["previous_endpoint_config_name"] == first["endpoint_config_name"]
    # update_endpoint is recorded by RecordingClient (moto lacks it); check the request it got.
    (update,) = sm.updates
    assert update["EndpointName"] == ENDPOINT and update["EndpointConfigName"] == second["endpoint_config_name"]
    assert update["DeploymentConfig"]["AutoRollbackConfiguration"] == {"Alarms": [{"AlarmName": "trainium-bert-5xx"}]}
    assert "BlueGreenUpdatePolicy" in update["DeploymentConfig"]
    assert counts(sm) == (2, 2, 1)
    # Once updated, the same call is a no-op.
    assert deploy_step.deploy(sm, v2, ENDPOINT)["action"] == "unchanged"
    assert len(sm.updates) == 1


def test_changed_serving_settings_make_a_new_config(sm):
    arn = register(sm, "Approved")
    first = deploy_step.deploy(sm, arn, ENDPOINT, "ml.c5.xlarge", 1)
    scaled = deploy_step.deploy(sm, arn, ENDPOINT, "ml.c5.xlarge", 3)
    assert scaled["action"] == "updated" and scaled["endpoint_config_name"] != first["endpoint_config_name"]
    assert counts(sm) == (1, 2, 1)
    assert "DeploymentConfig" not in sm.updates[0]


@pytest.mark.parametrize("status", ["PendingManualApproval", "Rejected"])
def test_versions_not_approved_are_refused(sm, status):
    arn = register(sm, status)
    with pytest.raises(deploy_step.NotApproved, match=f"version 1 is {status}, not Approved"):
        deploy_step.deploy(sm, arn, ENDPOINT)
    assert issubclass(deploy_step.NotApproved, ValueError)
    assert counts(sm) == (0, 0, 0)


def test_names_are_trimmed_to_63_characters():
    long = "a" * 63
    assert deploy_step.model_name(long, 12345) == "a" * 56 + "-v12345"
    config = deploy_step.endpoint_config_name(long, 7, "ml.c5.xlarge", 1)
    assert len(config) == 63 and config.startswith("a" * 51 + "-v7-")
    assert config == deploy_step.endpoint_config_name(long, 7, "ml.c5.xlarge", 1)


def test_the_handler_deploys_the_step_version_to_staging_with_its_environment(sm, monkeypatch):
    cfg = load_config(ROOT / "pipeline.yaml", [f"aws.role_arn={ROLE}"], environ={})
    for key, value in lambda_environment(cfg).items():
        monkeypatch.setenv(key, value)
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=cfg.aws.bucket)  # the lifecycle's markers
    arn = register(sm, "Approved")
    result = handler.lambda_handler({"model_package_arn": arn, "endpoint_name": "ignored"}, None)
    assert (result["action"], result["endpoint_name"]) == ("created", "trainium-bert-staging")
    assert result["endpoint_config_name"].startswith("trainium-bert-staging-v1-")
    variant = sm.describe_endpoint_config(EndpointConfigName=result["endpoint_config_name"])["ProductionVariants"][0]
    assert (variant["InstanceType"], variant["InitialInstanceCount"]) == ("ml.c5.xlarge", 1)
    with pytest.raises(handler.UnknownEvent, match="unrecognised event"):
        handler.lambda_handler({"hello": "world"}, None)
    monkeypatch.delenv("MODEL_PACKAGE_GROUP")
    with pytest.raises(deploy_step.DeployError, match="environment has no MODEL_PACKAGE_GROUP: run trainium-pipeline "
                                                      "upsert"):
        handler.lambda_handler({"model_package_arn": arn}, None)


# the tracker's MLflow library import, only for a local sqlite:/// store: the Lambda's store is the server's ARN
LOCAL_STORE = ("steps.tracking", "mlflow")


def test_the_lambda_zip_carries_every_module_the_handler_imports_and_nothing_but_the_standard_library_and_boto3(
    tmp_path,
):
    """The zip is the deploy package with the `steps` package's modules; every module the handler reaches imports
    from it, the standard library or boto3 only (the python3.12 runtime has nothing else); and the handler imports
    from the unpacked zip alone, as the runtime does."""
    with zipfile.ZipFile(io.BytesIO(deploy_lambda_zip())) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path)
    assert names == set(bundles()["deploy"].files) and "steps/contract.py" in names and "steps/run.py" not in names
    module, _, function = LAMBDA_HANDLER.rpartition(".")
    needed, todo, outside = set(), [module], set()
    while todo:
        name = todo.pop()
        needed.add(name)
        for node in ast.walk(ast.parse((tmp_path / (name.replace(".", "/") + ".py")).read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module, *(f"{node.module}.{a.name}" for a in node.names)]  # a module, or a name in one
                if isinstance(node, ast.ImportFrom) else [])
            for imported in names:
                path = tmp_path / imported.replace(".", "/")
                if path.with_suffix(".py").is_file():
                    todo += [] if imported in needed else [imported]
                elif not path.is_dir() and not path.parent.with_suffix(".py").is_file():
                    top = imported.split(".")[0]
                    if (name, top) != LOCAL_STORE:
                        outside.add(top)
    assert {"steps.deploy.lifecycle", "steps.deploy.sagemaker_account", "steps.contract"} <= needed
    assert outside <= set(sys.stdlib_module_names) | {"boto3", "botocore"}, outside
    code = f"import sys; sys.path[:0] = [{str(tmp_path)!r}]; import {module} as m; assert callable(m.{function})"
    assert subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path).returncode == 0
    assert deploy_lambda_zip() == deploy_lambda_zip()  # reproducible: unchanged code is not re-uploaded


def test_an_autoscaled_update_keeps_the_instance_count_or_deregisters_for_a_new_type(sm):
    aas = boto3.client("application-autoscaling", region_name=REGION)
    v1 = register(sm, "Approved")
    deploy_step.deploy(sm, v1, ENDPOINT, "ml.c5.xlarge", 1, autoscaling=aas)
    deploy_step.apply_autoscaling(aas, ENDPOINT, 1, 4, 70)
    v2 = register(sm, "Approved")
    deploy_step.deploy(sm, v2, ENDPOINT, "ml.c5.xlarge", 1, autoscaling=aas)
    assert sm.updates[-1]["RetainAllVariantProperties"] is True  # the autoscaled count survives the update
    resource = {"ServiceNamespace": "sagemaker", "ResourceIds": [deploy_step.scaling_resource(ENDPOINT)]}
    assert len(aas.describe_scalable_targets(**resource)["ScalableTargets"]) == 1
    deploy_step.deploy(sm, v2, ENDPOINT, "ml.c5.2xlarge", 1, autoscaling=aas)
    assert "RetainAllVariantProperties" not in sm.updates[-1]  # a new instance type: SageMaker requires ...
    assert aas.describe_scalable_targets(**resource)["ScalableTargets"] == []  # ... no scaling target during it
    assert deploy_step.remove_autoscaling(aas, ENDPOINT) is False
    with pytest.raises(deploy_step.DeployError, match="expected 1 <= min <= max"):
        deploy_step.apply_autoscaling(aas, ENDPOINT, 3, 2, 70)




class RacingClient(RecordingClient):
    """The moto client, as the second of two concurrent deploy() calls sees SageMaker: the other call's
    UpdateEndpoint has just been accepted, so the endpoint is Updating towards `pending` (or, with
    `hide_endpoint`, this call's first look saw no endpoint at all)."""

    def __init__(self, client, backend_endpoints, pending: str | None = None, hide_endpoint: bool = False):
        super().__init__(client, backend_endpoints)
        self.pending, self.hide_endpoint, self.describes = pending, hide_endpoint, 0

    def describe_endpoint(self, **kwargs):
        self.describes += 1
        if self.hide_endpoint and self.describes == 1:
            validated(self._client, "describe_endpoint", kwargs)
            raise service_error(self._client, "describe_endpoint", "ValidationException",
                                f"Could not find endpoint \"{kwargs['EndpointName']}\".")
        described = self._client.describe_endpoint(**kwargs)
        if self.pending and self.describes > 1:
            described["EndpointStatus"] = "Updating"
            described["PendingDeploymentSummary"] = {"EndpointConfigName": self.pending}
        return described

    def update_endpoint(self, **kwargs):
        self.updates.append(validated(self._client, "update_endpoint", kwargs))
        raise service_error(self._client, "update_endpoint", "ValidationException",
                            "Cannot update in-progress endpoint")

    def create_endpoint(self, **kwargs):
        """SageMaker refuses a second CreateEndpoint of one name; moto overwrites the endpoint instead."""
        name = kwargs["EndpointName"]
        if name in self._endpoints:
            arn = f"arn:aws:sagemaker:{REGION}:123456789012:endpoint/{name}"
            raise service_error(self._client, "create_endpoint", "ValidationException",
                                f'Cannot create already existing endpoint "{arn}".')
        return self._client.create_endpoint(**kwargs)


def race(sm, pending_is_ours: bool) -> tuple[RacingClient, str]:
    """Version 1 serves; then the Deploy step and the approval rule both deploy version 2, registered Approved."""
    deploy_step.deploy(sm, register(sm, "Approved"), ENDPOINT)
    second = register(sm, "Approved")
    ours = deploy_step.endpoint_config_name(ENDPOINT, 2, deploy_step.DEFAULT_INSTANCE_TYPE, 1)
    racing = RacingClient(sm._client, sm._endpoints, pending=ours if pending_is_ours else "someone-elses-config")
    return racing, second


def test_the_second_of_two_concurrent_deploys_of_one_version_succeeds(sm):
    racing, second = race(sm, pending_is_ours=True)
    result = deploy_step.deploy(racing, second, ENDPOINT)
    assert racing.updates, "the race is lost at UpdateEndpoint, after both saw InService"
    assert result["action"] == "in-progress" and result["endpoint_status"] == "Updating"
    assert result["endpoint_config_name"].startswith(f"{ENDPOINT}-v2-")
    again = deploy_step.deploy(racing, second, ENDPOINT)  # a retry while the update runs: no second UpdateEndpoint
    assert again["action"] == "in-progress" and len(racing.updates) == 1


def test_a_concurrent_deploy_of_another_version_is_refused_with_the_reason(sm):
    racing, second = race(sm, pending_is_ours=False)
    with pytest.raises(deploy_step.DeployError, match="is Updating \\(to config someone-elses-config\\)"):
        deploy_step.deploy(racing, second, ENDPOINT)


def test_two_first_deploys_racing_to_create_the_endpoint_both_succeed(sm):
    arn = register(sm, "Approved")
    assert deploy_step.deploy(sm, arn, ENDPOINT)["action"] == "created"
    late = RacingClient(sm._client, sm._endpoints, hide_endpoint=True)  # it looked before the endpoint existed
    assert deploy_step.deploy(late, arn, ENDPOINT)["action"] == "unchanged"
    assert counts(sm) == (1, 1, 1)


class RefusingClient(RecordingClient):
    """UpdateEndpoint refused for a reason of its own (the endpoint stays InService on its old config)."""

    def __init__(self, client, backend_endpoints, message: str):
        super().__init__(client, backend_endpoints)
        self.message = message

    def update_endpoint(self, **kwargs):
        self.updates.append(validated(self._client, "update_endpoint", kwargs))
        raise service_error(self._client, "update_endpoint", "ValidationException", self.message)


@pytest.mark.parametrize("message", [
    "The alarm 'trainium-bert-5xx' specified in AutoRollbackConfiguration does not exist.",  # guardrails
    "Cannot update endpoint: the instance type of variant AllTraffic cannot change while\nautoscaling is "
    "registered for it.",  # "Update an endpoint that uses autoscaling": deregister first
])
def test_an_update_refused_for_its_own_reason_says_that_reason_not_a_race(sm, message):
    deploy_step.deploy(sm, register(sm, "Approved"), ENDPOINT)
    refusing = RefusingClient(sm._client, sm._endpoints, message)
    with pytest.raises(deploy_step.DeployError) as refused:
        deploy_step.deploy(refusing, register(sm, "Approved"), ENDPOINT, guardrails_alarm="trainium-bert-5xx")
    config = deploy_step.endpoint_config_name(ENDPOINT, 2, deploy_step.DEFAULT_INSTANCE_TYPE, 1)
    assert str(refused.value) == (f"endpoint {ENDPOINT}: UpdateEndpoint to {config} refused: "
                                  f"{' '.join(message.split())}")
    assert "\n" not in str(refused.value) and "changed while deploying" not in str(refused.value)


class MissingPackageClient(RecordingClient):
    """DescribeModelPackage answers `code` with `message`, parsed by botocore as SageMaker's answer would be."""

    def __init__(self, client, backend_endpoints, code: str, message: str):
        super().__init__(client, backend_endpoints)
        self.code, self.message = code, message

    def describe_model_package(self, **kwargs):
        validated(self._client, "describe_model_package", kwargs)
        raise service_error(self._client, "describe_model_package", self.code, self.message)


@pytest.mark.parametrize(("code", "message"), [
    ("ValidationException", "ModelPackage {arn} does not exist."),
    ("ValidationException", "Could not find model package {arn}."),
    ("ResourceNotFound", "Model package {arn} not found."),
    ("ValidationException", "Model package group trainium-bert has no version 7."),  # any other wording
])
def test_a_package_that_does_not_exist_is_a_deploy_error(sm, code, message):
    """Whatever SageMaker's wording, a missing package is a DeployError naming it, and nothing is deployed; the
    ways SageMaker says "missing" read as such. moto's own answer is one more case."""
    arn = f"arn:aws:sagemaker:{REGION}:123456789012:model-package/{GROUP}/7"
    with pytest.raises(deploy_step.DeployError, match=f"model package {arn}") as refused:
        deploy_step.deploy(MissingPackageClient(sm._client, sm._endpoints, code, message.format(arn=arn)), arn,
                           ENDPOINT)
    said_missing = "does not exist" in message or "Could not find" in message or code == "ResourceNotFound"
    assert ("does not exist: nothing was deployed" in str(refused.value)) == said_missing
    assert said_missing or message.format(arn=arn) in str(refused.value)
    with pytest.raises(deploy_step.DeployError, match=f"model package {arn}"):
        deploy_step.deploy(sm, arn, ENDPOINT)  # moto's answer
    assert counts(sm) == (0, 0, 0)


@pytest.mark.parametrize("sets", [
    [],
    ["deploy.auto_promote=true", "deploy.test.rows=37", "deploy.test.max_accuracy_drop=0.125",
     "deploy.test.p95_ms=750.5", "deploy.data_capture_s3_uri=s3://bucket/capture", "deploy.guardrails_alarm=alarm",
     "alerts.topic_arn=arn:aws:sns:us-east-1:123456789012:alerts", "deploy.autoscaling.target_invocations=12.5"],
    ["deploy.serverless={memory_mb: 3072, max_concurrency: 20, provisioned_concurrency: 2}"],
])
def test_the_lambda_reads_back_from_its_environment_the_settings_the_cli_hands_over_directly(sets):
    """The CLI passes the config's settings to the lifecycle as they are; the Lambda gets them through its
    environment: both must hold the same settings."""
    from pipeline.config.deploy_settings import settings
    from steps.deploy.sagemaker_account import Settings

    cfg = load_config(ROOT / "pipeline.yaml", sets, environ={})
    direct = settings(cfg)
    assert Settings.from_env(lambda_environment(cfg)) == direct
    assert direct.policy.test_rows == cfg.deploy.test.rows
    assert direct.scaling[2] == cfg.deploy.autoscaling.target_invocations


def test_the_lifecycle_defaults_have_one_home_that_the_config_and_the_lambda_read():
    """deploy.test and deploy.auto_promote default to the lifecycle's Policy: the config (pipeline.yaml sets none of
    them) and the Lambda's environment without them give the same policy."""
    from pipeline.config.deploy_settings import policy
    from steps.deploy.lifecycle import Policy
    from steps.deploy.sagemaker_account import Settings

    cfg = load_config(ROOT / "pipeline.yaml", environ={})
    assert policy(cfg) == Policy()
    bare = {"MODEL_PACKAGE_GROUP": "g", "ENDPOINT_NAME": "e"}
    assert Settings.from_env(bare).policy == Policy()
