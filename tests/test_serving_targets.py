"""The serving target follows deploy.instance_type: x86 CPU families keep the CPU inference image, GPU families get its
GPU build and a handler on CUDA, Inferentia2 its Neuron build and a handler that compiles the model with static
shapes; any other family is refused at load naming the supported ones; the version carries one inference
specification per target; the endpoint test expects the target's variant, its p95 budget, and no CPU latency on an
accelerator."""

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
    ("ml.inf2.xlarge", "neuron"), ("ml.inf2.48xlarge", "neuron"),
])
def test_an_instance_family_picks_its_serving_stack(instance_type, target):
    assert serving_target(instance_type) == target


@pytest.mark.parametrize(("instance_type", "why"), [
    ("ml.c6g.large", "Graviton"), ("ml.m7gd.xlarge", "Graviton"), ("ml.t4g.medium", "Graviton"),
    ("ml.inf1.xlarge", "Inferentia1 needs the neuron-cc compiler"), ("ml.trn1.2xlarge", "no serving stack"),
])
def test_any_other_family_is_refused_at_load_naming_the_supported_ones(instance_type, why):
    """A new user's `--set deploy.instance_type=...` that no stack here serves fails at load, not on AWS."""
    with pytest.raises(ConfigError) as refused:
        config(f"deploy.instance_type={instance_type}")
    message = str(refused.value)
    assert f"deploy.instance_type={instance_type}" in message and why in message
    assert "cpu: ml.c*, ml.m*, ml.r*, ml.t* (x86); gpu: ml.g*, ml.p*; neuron: ml.inf2.*" in message


def test_staging_follows_production_and_may_differ_only_in_size():
    gpu = config("deploy.instance_type=ml.g5.xlarge")
    assert gpu.deploy.staging_instance_type == "ml.g5.xlarge" and gpu.deploy.target == "gpu"
    assert config("deploy.instance_type=ml.g5.2xlarge", "deploy.staging.instance_type=ml.g4dn.xlarge").deploy.target \
        == "gpu"
    with pytest.raises(ConfigError, match=r"deploy.staging.instance_type=ml.c5.xlarge: a cpu instance, while "
                                          r"deploy.instance_type=ml.g5.xlarge is a gpu one"):
        config("deploy.instance_type=ml.g5.xlarge", "deploy.staging.instance_type=ml.c5.xlarge")
    assert config("deploy.instance_type=ml.inf2.8xlarge", "deploy.staging.instance_type=ml.inf2.xlarge").deploy.target \
        == "neuron"
    with pytest.raises(ConfigError, match=r"deploy.staging.instance_type=ml.g5.xlarge: a gpu instance, while "
                                          r"deploy.instance_type=ml.inf2.xlarge is a neuron one"):
        config("deploy.instance_type=ml.inf2.xlarge", "deploy.staging.instance_type=ml.g5.xlarge")


@pytest.mark.parametrize(("sets", "budget"), [((), 500.0), (("deploy.instance_type=ml.g5.xlarge",), 100.0),
                                              (("deploy.instance_type=ml.inf2.xlarge",), 100.0),
                                              (("deploy.instance_type=ml.inf2.xlarge", "deploy.test.p95_ms=40"), 40.0),
                                              (("deploy.serverless={memory_mb: 1024}",), 1000.0)])
def test_the_endpoint_tests_p95_budget_is_its_targets_unless_set(sets, budget):
    """Evaluate's CPU time says nothing about an accelerator: the p95 budget defaults per target
    (steps/deploy/targets.py), and that is what the deploy Lambda gets."""
    from pipeline.config.deploy_settings import settings

    cfg = config(*sets)
    assert cfg.deploy.p95_budget_ms == budget
    assert settings(cfg).to_env()["TEST_P95_MS"] == repr(budget)


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


NEURON_ENVIRONMENT = {"INFERENCE_NEURON_BATCH_SIZE": "1", "INFERENCE_NEURON_SEQUENCE_LENGTH": "128",
                      "INFERENCE_NEURON_CAST": "bf16", "NEURON_RT_NUM_CORES": "1"}


@pytest.mark.parametrize(("instance_type", "primary"), [("ml.c5.xlarge", "cpu"), ("ml.g5.xlarge", "gpu"),
                                                        ("ml.inf2.xlarge", "neuron")])
def test_the_version_carries_one_inference_specification_per_target(instance_type, primary):
    """The configured target's image is the primary specification (what the deploy Lambda's model runs), each other
    target's an additional one, with the same artifact; an Inferentia2 container has the static shapes it compiles
    with and leaves the worker count to the toolkit (one per NeuronCore); all as CreateModelPackage takes them."""
    from botocore.validate import validate_parameters

    cfg = config(f"deploy.instance_type={instance_type}")
    images = {"cpu": cfg.image("inference"), "gpu": cfg.image("inference_gpu"), "neuron": cfg.image("inference_neuron")}
    arguments = register_arguments(cfg)
    (container,) = arguments["InferenceSpecification"]["Containers"]
    assert container["Image"] == images[primary] == cfg.serving_image
    assert arguments["InferenceSpecification"]["SupportedRealtimeInferenceInstanceTypes"] == [instance_type]
    containers = {primary: container}
    for additional in arguments["AdditionalInferenceSpecifications"]:
        other = additional["Name"].removesuffix("-endpoint")
        (containers[other],) = additional["Containers"]
        assert containers[other]["Image"] == images[other]
        assert all(serving_target(t) == other for t in additional["SupportedRealtimeInferenceInstanceTypes"])
    assert sorted(containers) == ["cpu", "gpu", "neuron"]
    assert len({c["ModelDataUrl"].__repr__() for c in containers.values()}) == 1  # one artifact
    cpu, gpu, neuron = (containers[t]["Environment"] for t in ("cpu", "gpu", "neuron"))
    precision = gpu["INFERENCE_GPU_PRECISION"]  # the evaluation's choice for a GPU (fp16 or fp32), read on CUDA alone
    assert precision["Std:JsonGet"]["Path"] == "inference.gpu.precision"
    assert cpu == gpu and cpu["SAGEMAKER_MODEL_SERVER_WORKERS"] == "2" and "INFERENCE_NEURON_CAST" not in cpu
    assert neuron == {**{k: v for k, v in cpu.items() if k != "SAGEMAKER_MODEL_SERVER_WORKERS"}, **NEURON_ENVIRONMENT}
    model = boto3.client("sagemaker", region_name="us-east-1").meta.service_model
    validate_parameters(concrete({"ModelPackageGroupName": "g", **{k: arguments[k] for k in (
        "InferenceSpecification", "AdditionalInferenceSpecifications")}}),
        model.operation_model("CreateModelPackage").input_shape)


@pytest.mark.parametrize(("sets", "error"), [
    (("deploy.serverless={memory_mb: 1500}",), "deploy.serverless.memory_mb=1500: expected one of 1024, 2048, 3072, "
                                                "4096, 5120, 6144"),
    (("deploy.serverless={max_concurrency: 2, provisioned_concurrency: 3}",),
     r"deploy.serverless.provisioned_concurrency=3: expected at most deploy.serverless.max_concurrency \(2\)"),
    (("deploy.serverless={max_concurrency: 201}",), "deploy.serverless.max_concurrency"),
    (("deploy.serverless={}", "deploy.instance_type=ml.inf2.xlarge"),
     "deploy.serverless: Serverless Inference runs the CPU image, while deploy.instance_type=ml.inf2.xlarge is a "
     "neuron instance"),
    (("deploy.serverless={}", "deploy.data_capture_s3_uri=s3://bucket/capture"),
     "Serverless Inference does not capture data"),
])
def test_a_serverless_config_that_serverless_inference_cannot_run_is_refused_at_load(sets, error):
    with pytest.raises(ConfigError, match=error):
        config(*sets)


def test_serverless_settings_reach_the_deploy_lambda_as_the_api_takes_them():
    from pipeline.config.deploy_settings import settings
    from steps.deploy.sagemaker_account import Settings

    cfg = config("deploy.serverless={memory_mb: 4096, max_concurrency: 10, provisioned_concurrency: 1}")
    environment = settings(cfg).to_env()
    assert json.loads(environment["SERVERLESS_CONFIG"]) == {"MemorySizeInMB": 4096, "MaxConcurrency": 10,
                                                            "ProvisionedConcurrency": 1}
    assert Settings.from_env(environment).serverless == settings(cfg).serverless
    assert "SERVERLESS_CONFIG" not in settings(config()).to_env()
    from steps.deploy.sagemaker_endpoints import DeployError
    with pytest.raises(DeployError, match="SERVERLESS_CONFIG='{\"MemorySizeInMB\": 1000}': expected JSON like"):
        Settings.from_env({**environment, "SERVERLESS_CONFIG": '{"MemorySizeInMB": 1000}'})


def test_the_neuron_shapes_come_from_the_config():
    cfg = config("deploy.instance_type=ml.inf2.xlarge", "training.max_length=256", "deploy.neuron.batch_size=4",
                 "deploy.neuron.cast=fp32")
    (container,) = register_arguments(cfg)["InferenceSpecification"]["Containers"]
    assert {k: container["Environment"][k] for k in NEURON_ENVIRONMENT} == {
        **NEURON_ENVIRONMENT, "INFERENCE_NEURON_BATCH_SIZE": "4", "INFERENCE_NEURON_SEQUENCE_LENGTH": "256",
        "INFERENCE_NEURON_CAST": "fp32"}
    with pytest.raises(ConfigError, match="deploy.neuron.cast"):
        config("deploy.neuron.cast=fp16")


def test_on_an_accelerator_the_endpoint_test_expects_its_variant_and_no_cpu_latency():
    environment = {"INFERENCE_RUNTIME": "onnxruntime", "INFERENCE_QUANTIZE": "int8"}
    report = {"inference": {"variant": "onnxruntime-int8", "p50_ms": 4.2}}
    assert endpoint_check.expectation(environment, report) == {"variant": "onnxruntime-int8", "p50_ms": 4.2}
    assert endpoint_check.expectation(environment, report, "cuda") == {"variant": "torch-fp32-cuda", "p50_ms": None}
    assert endpoint_check.expectation({**environment, "INFERENCE_GPU_PRECISION": "fp16"}, report, "cuda") == {
        "variant": "torch-fp16-cuda", "p50_ms": None}
    assert endpoint_check.expectation({**environment, **NEURON_ENVIRONMENT}, report, "neuron") == {
        "variant": "neuron-bf16", "p50_ms": None}


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
    assert inference.Classifier(**fields, device="cuda", precision="fp16").variant == "torch-fp16-cuda"


def test_on_a_gpu_the_handler_serves_the_precision_the_evaluation_chose(tmp_path, monkeypatch):
    """INFERENCE_GPU_PRECISION=fp16 loads the torch model in fp16 on CUDA (here: the load is sent to the CPU, which
    has fp16 kernels too, and answers as the fp32 model does on these texts); the CPU ignores the setting."""
    from fixtures_ml import CORPUS, add_serving_code, build_split_model, build_tokenizer
    from test_inference import h

    model_dir = add_serving_code(build_split_model(tmp_path / "m", build_tokenizer(tmp_path / "t", CORPUS), CORPUS))
    monkeypatch.setenv("INFERENCE_GPU_PRECISION", "fp16")
    assert h.model_fn(str(model_dir)).variant == "torch-fp32"  # no GPU here: the CPU's variant
    loads, load = [], h.load

    def on_cpu(*args, device: str, precision: str, **kwargs):
        loads.append((device, precision))
        return load(*args, device="cpu", precision=precision, **kwargs)

    monkeypatch.setattr(h, "cuda_available", lambda: True)
    monkeypatch.setattr(h, "load", on_cpu)
    served = h.model_fn(str(model_dir))
    assert loads == [("cuda", "fp16")] and served.variant == "torch-fp16"
    assert [a["label"] for a in served(CORPUS)] == [a["label"] for a in load(model_dir)(CORPUS)]
    monkeypatch.setenv("INFERENCE_GPU_PRECISION", "fp8")
    with pytest.raises(ValueError, match="INFERENCE_GPU_PRECISION='fp8': expected fp32 or fp16"):
        h.model_fn(str(model_dir))


def test_run_local_says_that_the_aws_target_differs(tmp_path):
    from pipeline.backend import open_backend

    def note(*sets: str) -> str:
        cfg = load_config(ROOT / "pipeline.yaml", list(sets), environ={}, local=True)
        return open_backend(cfg, True, tmp_path).upsert().deploy_function

    assert note() == "local (steps/deploy/ on the local account)"
    assert note("deploy.instance_type=ml.g5.xlarge").endswith(
        "its endpoints serve on this machine's CPU, while on AWS deploy.instance_type=ml.g5.xlarge serves on GPU "
        "with 763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-inference:2.6.0-transformers4.51.3-gpu-"
        "py312-cu124-ubuntu22.04")
    assert note("deploy.serverless={memory_mb: 3072}").endswith(
        "its endpoints serve on this machine's CPU, while on AWS they are serverless (3072 MB, up to 5 requests at "
        "once)")
    assert note("deploy.instance_type=ml.inf2.xlarge").endswith(
        "on AWS deploy.instance_type=ml.inf2.xlarge serves on Inferentia2 with 763104351884.dkr.ecr.us-east-1."
        "amazonaws.com/huggingface-pytorch-inference-neuronx:2.8.0-transformers4.55.4-neuronx-py310-sdk2.26.0-"
        "ubuntu22.04")


def test_cost_serving_prices_a_million_requests_per_target_with_each_figures_source():
    from typer.testing import CliRunner

    from pipeline.cli import app
    from pipeline.serving_cost import cost_per_million, serving_costs

    assert cost_per_million(0.36, 100.0, 0.5) == pytest.approx(0.36 / (100 * 3600 * 0.5) * 1e6)  # 2.0 USD
    assert cost_per_million(None, 100.0, 0.5) is None
    rows = {r["target"]: r for r in serving_costs({"ml.c5.xlarge": 0.204, "ml.g4dn.xlarge": 0.736}.get, 1.0, 2048)}
    assert rows["cpu"]["cost_per_million"] == pytest.approx(0.204 / (rows["cpu"]["requests_per_second"] * 3600) * 1e6,
                                                            rel=1e-3)
    assert "not on an ml.c5.xlarge" in rows["cpu"]["source"]  # measured here, and said so
    assert rows["gpu"]["source"].startswith("published") and rows["neuron"]["source"].startswith("published")
    assert rows["neuron"]["instance_type"] == "ml.inf2.xlarge" and rows["neuron"]["cost_per_million"] is None
    serverless = rows["serverless"]  # 16.2 ms per request at 2 GB x 0.00002 USD per GB-second, and 2 KB of data
    assert serverless["cost_per_million"] == pytest.approx(0.0162 * 2 * 0.00002 * 1e6 + 2048 / 1024**3 * 0.016 * 1e6)
    assert serverless["utilisation"] == 1.0 and "cold start" in serverless["source"]
    with pytest.raises(ValueError, match="--utilisation 0: expected a share"):
        serving_costs({}.get, 0, 2048)
    done = CliRunner().invoke(app, ["--set", "deploy.serverless={memory_mb: 4096}", "cost", "--serving", "--json",
                                    "--utilisation", "0.25"])
    assert done.exit_code == 0, done.output
    shown = {r["target"]: r for r in json.loads(done.output)}
    assert shown["gpu"]["price_per_hour"] == 0.736 and shown["gpu"]["utilisation"] == 0.25
    assert shown["gpu"]["cost_per_million"] == pytest.approx(0.736 / (91.93 * 3600 * 0.25) * 1e6)
    assert shown["serverless"]["instance_type"] == "serverless 4096 MB"  # the configured memory


@pytest.mark.parametrize(("staging", "expected"), [
    ("ml.c5.xlarge", {"variant": "onnxruntime-int8", "p50_ms": 4.2}),
    ("ml.g5.xlarge", {"variant": "torch-fp32-cuda", "p50_ms": None}),
    ("ml.inf2.xlarge", {"variant": "neuron-bf16", "p50_ms": None}),
    ("serverless", {"variant": "onnxruntime-int8", "p50_ms": None}),
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
                                                                    "INFERENCE_QUANTIZE": "int8",
                                                                    **NEURON_ENVIRONMENT}}],
                "SupportedContentTypes": ["application/json"], "SupportedResponseMIMETypes": ["application/json"]},
            ModelMetrics={"ModelQuality": {"Statistics": {"ContentType": "application/json",
                                                          "S3Uri": "s3://bucket/e/evaluation.json"}}})["ModelPackageArn"]
        serverless = staging == "serverless"  # the CPU image without instances: Evaluate's p50 is no reference
        staging = "ml.c5.xlarge" if serverless else staging
        settings = Settings.from_env({"MODEL_PACKAGE_GROUP": "g", "ENDPOINT_NAME": "e", "INSTANCE_TYPE": staging,
                                      "STAGING_INSTANCE_TYPE": staging, **({"SERVERLESS_CONFIG": json.dumps(
                                          {"MemorySizeInMB": 2048, "MaxConcurrency": 5})} if serverless else {})})
        account = SageMakerAccount(settings, sm, s3=s3)
        assert account.expected(lifecycle.Version(1, "Approved", arn=arn)) == expected
