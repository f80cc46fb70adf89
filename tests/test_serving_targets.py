"""The serving target follows deploy.instance_type: x86 CPU families keep the CPU inference image, GPU families get its
GPU build and a handler on CUDA, any other family is refused at load naming the supported ones; the version carries
one inference specification per target; the endpoint test expects the GPU's variant and no CPU latency there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest

from pipeline.config import ConfigError, load_config
from pipeline.dag.graph import flatten_steps
from pipeline.definition import definition
from steps.deploy import endpoint_check
from steps.deploy.targets import serving_target

ROOT = Path(__file__).resolve().parent.parent


def config(*sets: str):
    return load_config(ROOT / "pipeline.yaml", list(sets), environ={})


@pytest.mark.parametrize(("instance_type", "target"), [
    ("ml.c5.xlarge", "cpu"), ("ml.m5d.large", "cpu"), ("ml.r6i.large", "cpu"), ("ml.t2.medium", "cpu"),
    ("ml.g5.xlarge", "gpu"), ("ml.g4dn.xlarge", "gpu"), ("ml.g6e.2xlarge", "gpu"), ("ml.p4d.24xlarge", "gpu"),
])
def test_an_instance_family_picks_its_serving_stack(instance_type, target):
    assert serving_target(instance_type) == target


@pytest.mark.parametrize(("instance_type", "why"), [
    ("ml.c6g.large", "Graviton"), ("ml.m7gd.xlarge", "Graviton"), ("ml.t4g.medium", "Graviton"),
    ("ml.inf2.xlarge", "Inferentia2 needs a model compiled for Neuron"), ("ml.trn1.2xlarge", "no serving stack"),
])
def test_any_other_family_is_refused_at_load_naming_the_supported_ones(instance_type, why):
    """A new user's `--set deploy.instance_type=...` that no stack here serves fails at load, not on AWS."""
    with pytest.raises(ConfigError) as refused:
        config(f"deploy.instance_type={instance_type}")
    message = str(refused.value)
    assert f"deploy.instance_type={instance_type}" in message and why in message
    assert "cpu: ml.c*, ml.m*, ml.r*, ml.t* (x86); gpu: ml.g*, ml.p*" in message


def test_staging_follows_production_and_may_differ_only_in_size():
    gpu = config("deploy.instance_type=ml.g5.xlarge")
    assert gpu.deploy.staging_instance_type == "ml.g5.xlarge" and gpu.deploy.target == "gpu"
    assert config("deploy.instance_type=ml.g5.2xlarge", "deploy.staging.instance_type=ml.g4dn.xlarge").deploy.target \
        == "gpu"
    with pytest.raises(ConfigError, match=r"deploy.staging.instance_type=ml.c5.xlarge: a cpu instance, while "
                                          r"deploy.instance_type=ml.g5.xlarge is a gpu one"):
        config("deploy.instance_type=ml.g5.xlarge", "deploy.staging.instance_type=ml.c5.xlarge")


def register_arguments(cfg) -> dict:
    dag = json.loads(definition(cfg))
    (register,) = [s for s in flatten_steps(dag["Steps"]).values() if s["Type"] == "RegisterModel"]
    return register["Arguments"]


def concrete(node: Any) -> Any:
    """A definition fragment with each pipeline expression replaced by a string, as the service resolves it."""
    if isinstance(node, dict):
        if len(node) == 1 and next(iter(node)).startswith(("Get", "Std:")):
            return "resolved"
        return {k: concrete(v) for k, v in node.items()}
    if isinstance(node, list):
        return [concrete(v) for v in node]
    return node


@pytest.mark.parametrize(("instance_type", "primary", "other"), [("ml.c5.xlarge", "cpu", "gpu"),
                                                                 ("ml.g5.xlarge", "gpu", "cpu")])
def test_the_version_carries_one_inference_specification_per_target(instance_type, primary, other):
    """The configured target's image is the primary specification (what the deploy Lambda's model runs), the other
    target's the additional one, with the same artifact and environment; both as CreateModelPackage takes them."""
    from botocore.validate import validate_parameters

    cfg = config(f"deploy.instance_type={instance_type}")
    images = {"cpu": cfg.image("inference"), "gpu": cfg.image("inference_gpu")}
    arguments = register_arguments(cfg)
    (container,) = arguments["InferenceSpecification"]["Containers"]
    assert container["Image"] == images[primary] == cfg.serving_image
    assert arguments["InferenceSpecification"]["SupportedRealtimeInferenceInstanceTypes"] == [instance_type]
    (additional,) = arguments["AdditionalInferenceSpecifications"]
    assert additional["Name"] == f"{other}-endpoint"
    (other_container,) = additional["Containers"]
    assert other_container == {**container, "Image": images[other]}
    assert all(serving_target(t) == other for t in additional["SupportedRealtimeInferenceInstanceTypes"])
    model = boto3.client("sagemaker", region_name="us-east-1").meta.service_model
    validate_parameters(concrete({"ModelPackageGroupName": "g", **{k: arguments[k] for k in (
        "InferenceSpecification", "AdditionalInferenceSpecifications")}}),
        model.operation_model("CreateModelPackage").input_shape)


def test_on_a_gpu_the_endpoint_test_expects_the_cuda_variant_and_no_cpu_latency():
    environment = {"INFERENCE_RUNTIME": "onnxruntime", "INFERENCE_QUANTIZE": "int8"}
    report = {"inference": {"variant": "onnxruntime-int8", "p50_ms": 4.2}}
    assert endpoint_check.expectation(environment, report) == {"variant": "onnxruntime-int8", "p50_ms": 4.2}
    assert endpoint_check.expectation(environment, report, "cuda") == {"variant": "torch-fp32-cuda", "p50_ms": None}


def test_the_handler_names_the_device_it_serves_on():
    """The variant an answer reports (its CustomAttributes) says cuda on a GPU: a GPU endpoint that fell back to the
    CPU fails its staging test on the variant."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("inference_under_test", ROOT / "training" / "inference.py")
    inference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(inference)
    fields = dict(tokenizer=None, pair_tokenizer=None, forward=None, model=None, labels=("a", "b"), max_length=8,
                  max_texts=1, micro_batch=1, pad_id=0, runtime="torch", quantize="none")
    assert inference.Classifier(**fields).variant == "torch-fp32"
    assert inference.Classifier(**fields, device="cuda").variant == "torch-fp32-cuda"
    assert inference.cuda_available() is False  # this machine: the CPU path, unchanged


def test_run_local_says_that_the_aws_target_differs(tmp_path):
    from pipeline.backend import open_backend

    def note(*sets: str) -> str:
        cfg = load_config(ROOT / "pipeline.yaml", list(sets), environ={}, local=True)
        return open_backend(cfg, True, tmp_path).upsert().deploy_function

    assert note() == "local (steps/deploy/ on the local account)"
    assert note("deploy.instance_type=ml.g5.xlarge").endswith(
        "its endpoints serve on this machine's CPU, while on AWS deploy.instance_type=ml.g5.xlarge serves on the GPU "
        "with 763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-inference:2.6.0-transformers4.51.3-gpu-"
        "py312-cu124-ubuntu22.04")


def test_cost_serving_prices_a_million_requests_per_target_with_each_figures_source():
    from typer.testing import CliRunner

    from pipeline.cli import app
    from pipeline.serving_cost import cost_per_million, serving_costs

    assert cost_per_million(0.36, 100.0, 0.5) == pytest.approx(0.36 / (100 * 3600 * 0.5) * 1e6)  # 2.0 USD
    assert cost_per_million(None, 100.0, 0.5) is None
    rows = {r["target"]: r for r in serving_costs({"ml.c5.xlarge": 0.204, "ml.g4dn.xlarge": 0.736}.get, 1.0)}
    assert rows["cpu"]["cost_per_million"] == pytest.approx(0.204 / (rows["cpu"]["requests_per_second"] * 3600) * 1e6,
                                                            rel=1e-3)
    assert "not on an ml.c5.xlarge" in rows["cpu"]["source"]  # measured here, and said so
    assert rows["gpu"]["source"].startswith("published") and rows["inf2"]["source"].startswith("published")
    assert rows["inf2"]["cost_per_million"] is None and not rows["inf2"]["deployable"]
    with pytest.raises(ValueError, match="--utilisation 0: expected a share"):
        serving_costs({}.get, 0)
    done = CliRunner().invoke(app, ["cost", "--serving", "--json", "--utilisation", "0.25"])
    assert done.exit_code == 0, done.output
    shown = {r["target"]: r for r in json.loads(done.output)}
    assert shown["gpu"]["price_per_hour"] == 0.736 and shown["gpu"]["utilisation"] == 0.25
    assert shown["gpu"]["cost_per_million"] == pytest.approx(0.736 / (54.28 * 3600 * 0.25) * 1e6)


@pytest.mark.parametrize(("staging", "expected"), [
    ("ml.c5.xlarge", {"variant": "onnxruntime-int8", "p50_ms": 4.2}),
    ("ml.g5.xlarge", {"variant": "torch-fp32-cuda", "p50_ms": None}),
])
def test_the_deploy_lambda_expects_the_variant_of_its_staging_instances_target(staging, expected, monkeypatch):
    """The Lambda reads a version's environment and evaluation from the registry (moto) and expects, on a GPU
    staging endpoint, the CUDA variant without Evaluate's CPU p50."""
    from moto import mock_aws

    from steps.deploy import lifecycle
    from steps.deploy.sagemaker_account import SageMakerAccount, Settings

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        sm, s3 = (boto3.client(name, region_name="us-east-1") for name in ("sagemaker", "s3"))
        s3.create_bucket(Bucket="bucket")
        s3.put_object(Bucket="bucket", Key="e/evaluation.json",
                      Body=json.dumps({"inference": {"variant": "onnxruntime-int8", "p50_ms": 4.2}}).encode())
        sm.create_model_package_group(ModelPackageGroupName="g")
        arn = sm.create_model_package(
            ModelPackageGroupName="g", ModelApprovalStatus="Approved",
            InferenceSpecification={"Containers": [{"Image": "img", "ModelDataUrl": "s3://bucket/m.tar.gz",
                                                    "Environment": {"INFERENCE_RUNTIME": "onnxruntime",
                                                                    "INFERENCE_QUANTIZE": "int8"}}],
                "SupportedContentTypes": ["application/json"], "SupportedResponseMIMETypes": ["application/json"]},
            ModelMetrics={"ModelQuality": {"Statistics": {"ContentType": "application/json",
                                                          "S3Uri": "s3://bucket/e/evaluation.json"}}})["ModelPackageArn"]
        settings = Settings.from_env({"MODEL_PACKAGE_GROUP": "g", "ENDPOINT_NAME": "e", "INSTANCE_TYPE": staging,
                                      "STAGING_INSTANCE_TYPE": staging})
        account = SageMakerAccount(settings, sm, s3=s3)
        assert account.expected(lifecycle.Version(1, "Approved", arn=arn)) == expected
