"""pipeline.yaml loading: types, ranges, unknown keys, environment and --set overrides."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from pipeline.config import Config, ConfigError, load_config, parse_override
from pipeline.devices import MULTI_NODE_NEURON_TYPES

SHIPPED = Path(__file__).resolve().parent.parent / "pipeline.yaml"


def test_shipped_config_loads_with_documented_defaults():
    cfg = load_config(SHIPPED, environ={})
    assert isinstance(cfg, Config)
    assert cfg.training.model_id == "bert-base-uncased"
    assert cfg.training.instance_type.startswith("ml.trn1.")
    assert "pytorch-training-neuronx" in cfg.image("training")
    assert "{region}" not in cfg.image("inference") and cfg.aws.region in cfg.image("inference")
    assert cfg.training.learning_rate == pytest.approx(5e-5)
    assert cfg.deploy.instance_type == "ml.c5.xlarge"
    assert cfg.checkpoint_s3_uri == "s3://my-sagemaker-bucket/trainium-bert/checkpoints"
    assert cfg.deploy_lambda_arn == "arn:aws:lambda:us-east-1:123456789012:function:trainium-bert-deploy"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("training.epochs=two", "training.epochs='two': expected a valid integer"),
        (
            "training.instance_type=trn1.32xlarge",
            "training.instance_type='trn1.32xlarge': expected an instance type like ml.trn1.32xlarge",
        ),
        ("aws.role_arn=MyRole", "aws.role_arn='MyRole': expected an IAM role ARN"),
        ("evaluation.accuracy_threshold=1.5", "evaluation.accuracy_threshold=1.5: expected less than or equal to 1"),
        (
            "evaluation.accuracy_threshold=-0.1",
            "evaluation.accuracy_threshold=-0.1: expected greater than or equal to 0",
        ),
        ("training.epoch=2", "training.epoch: unknown key"),
        ("registry.approval_status=Yes", "registry.approval_status='Yes': expected 'Approved'"),
        ("training.checkpoint_s3_uri=bucket/ckpt", "training.checkpoint_s3_uri='bucket/ckpt': expected an S3 URI"),
        ("training.max_steps=0", "training.max_steps=0: expected a number of optimizer steps >= 1, or -1 for no limit"),
        ("training.max_steps=-5", "training.max_steps=-5: expected a number of optimizer steps >= 1, or -1"),
    ],
)
def test_bad_values_name_the_key_the_value_and_the_expectation(override, message):
    with pytest.raises(ConfigError) as error:
        load_config(SHIPPED, [override], environ={})
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_unknown_top_level_key_and_missing_section(tmp_path):
    tree = yaml.safe_load(SHIPPED.read_text())
    tree["extras"] = {"x": 1}
    del tree["deploy"]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError) as error:
        load_config(path, environ={})
    assert "extras: unknown key" in str(error.value)
    assert "deploy: missing" in str(error.value)


def test_spot_wait_must_cover_the_runtime():
    with pytest.raises(ConfigError, match="max_wait_seconds=3600: expected >= training.max_runtime_seconds"):
        load_config(SHIPPED, ["training.spot.enabled=true", "training.spot.max_wait_seconds=3600"], environ={})


def test_several_instances_of_a_trainium_type_without_efa_are_refused():
    """Neuron's collectives between instances need EFA, which trn1.2xlarge lacks; train.py lists the same types."""
    with pytest.raises(ConfigError, match="training.instance_count=4: expected 1 on ml.trn1.2xlarge"):
        load_config(SHIPPED, ["training.instance_type=ml.trn1.2xlarge", "training.instance_count=4"], environ={})
    for instance_type in MULTI_NODE_NEURON_TYPES:
        cfg = load_config(SHIPPED, [f"training.instance_type={instance_type}", "training.instance_count=2"],
                          environ={})
        assert cfg.training.instance_count == 2
    train = ast.parse((Path(__file__).resolve().parent.parent / "training" / "train.py").read_text())
    listed = next(ast.literal_eval(node.value) for node in train.body if isinstance(node, ast.Assign)
                  and getattr(node.targets[0], "id", "") == "EFA_INSTANCE_TYPES")
    assert listed == MULTI_NODE_NEURON_TYPES


def test_a_pipeline_name_whose_execution_arns_overflow_the_registry_metadata_is_refused():
    load_config(SHIPPED, [f"pipeline.name={'p' * 183}"], environ={})  # us-east-1: 73 + 183 = 256
    with pytest.raises(ConfigError, match="pipeline.name='p{184}': expected at most 183 characters"):
        load_config(SHIPPED, [f"pipeline.name={'p' * 184}"], environ={})


def test_native_backend_is_refused_on_trn1_in_one_line():
    for instance_type in ("ml.trn1.32xlarge", "ml.trn1n.32xlarge"):
        with pytest.raises(ConfigError) as error:
            load_config(SHIPPED, ["training.backend=native", f"training.instance_type={instance_type}"], environ={})
        assert f"training.backend=native: TorchNeuron runs on trn2/trn3 only, not training.instance_type=" \
               f"{instance_type}" in str(error.value) and "\n" not in str(error.value)
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/bert-torchneuron:2.13"  # no "neuronx" in its name
    native = load_config(SHIPPED, ["training.backend=native", "training.instance_type=ml.trn2.48xlarge",
                                   f"images.training={image}"], environ={})
    assert native.training.backend == "native" and not native.training.precompile_job


@pytest.mark.parametrize(("sets", "message"), [
    (["training.backend=native", "training.instance_type=ml.trn2.48xlarge"],
     "expected an image you built with TorchNeuron for training.backend=native"),
    (["images.training=123456789012.dkr.ecr.us-east-1.amazonaws.com/bert-torchneuron:2.13"],
     "expected a pytorch-training-neuronx image (PyTorch/XLA on Neuron) for training.backend=xla"),
])
def test_the_training_image_must_carry_the_backends_pytorch(sets, message):
    """The DLC's XLA torch-neuronx has no TorchNeuron device: native on it failed only once the trn2 job ran."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(SHIPPED, sets, environ={})


def test_environment_then_set_overrides_apply_in_that_order():
    environ = {
        "TRAINIUM_PIPELINE_REGION": "eu-west-1",
        "TRAINIUM_PIPELINE_ROLE_ARN": "arn:aws:iam::210987654321:role/Other",
        "TRAINIUM_PIPELINE_BUCKET": "env-bucket",
    }
    cfg = load_config(
        SHIPPED, ["aws.bucket=set-bucket", "training.learning_rate=3e-5", "training.epochs=1"], environ=environ
    )
    assert cfg.aws.region == "eu-west-1"
    assert cfg.aws.account == "210987654321"
    assert cfg.aws.bucket == "set-bucket"
    assert cfg.training.learning_rate == pytest.approx(3e-5)
    assert cfg.training.epochs == 1
    assert "eu-west-1" in cfg.image("training")


def test_override_syntax_errors_are_explained():
    with pytest.raises(ConfigError, match="expected KEY.PATH=VALUE"):
        parse_override("training.epochs")
    assert parse_override("aws.vpc=null") == ("aws.vpc", None)
    assert parse_override("training.bf16=false") == ("training.bf16", False)


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml", environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("aws: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, environ={})
