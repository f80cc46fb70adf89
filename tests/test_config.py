"""pipeline.yaml loading: types, ranges, unknown keys, environment and --set overrides."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.config import PARAMETER_KEYS, Config, ConfigError, check_parameter_values, load_config, parse_override
from pipeline.config.devices import MULTI_NODE_NEURON_TYPES
from pipeline.definition import definition

SHIPPED = Path(__file__).resolve().parent.parent / "pipeline.yaml"


def test_shipped_config_loads_with_documented_defaults():
    cfg = load_config(SHIPPED, environ={})
    assert isinstance(cfg, Config)
    assert cfg.training.model_id == "bert-base-uncased"
    assert cfg.training.instance_type.startswith("ml.trn1.")
    assert "pytorch-training-neuronx" in cfg.image("training")
    assert "{region}" not in cfg.image("inference") and cfg.aws.region in cfg.image("inference")
    assert cfg.training.learning_rate == "auto" and cfg.training.learning_rate_for == (5e-5, 512)
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
        ("training.bf16=yes", "training.bf16='yes': expected 'auto' or a valid boolean"),  # a union, said once
        ("images.inference=", "images.inference='': expected at least 1 character"),
        ("aws.region=moon", "aws.region='moon': expected an AWS region like us-east-1"),
        ("triggers.schedule=daily", "triggers.schedule='daily': expected an EventBridge schedule like rate(1 day)"),
        ("pipeline.cache_expire_after=30days", "pipeline.cache_expire_after='30days': expected an ISO 8601 duration"),
        ("tracking.server_arn=arn:aws:sagemaker:us-east-1:123456789012:mlflow-app/x",
         "expected a SageMaker MLflow tracking server ARN like arn:aws:sagemaker:us-east-1:123456789012:"
         "mlflow-tracking-server/name (an MLflow App's ARN is not one: another host and signing)"),
        ("pipeline.model_package_group=a_b", "expected letters, digits and hyphens, starting and ending with a letter"),
        ("aws.tags.Version=2", 'aws.tags.Version=2: expected a string (YAML reads 2 as an integer: quote it, "2")'),
    ],
)
def test_bad_values_name_the_key_the_value_and_the_expectation(override, message):
    with pytest.raises(ConfigError) as error:
        load_config(SHIPPED, [override], environ={})
    assert message in str(error.value)
    assert "\n" not in str(error.value) and "a string matching" not in str(error.value)


def test_every_pattern_of_the_config_says_what_it_expects_in_words():
    from pydantic import BaseModel

    from pipeline import config
    from pipeline.config.base import EXPECTED

    def patterns(model: type[BaseModel]):
        for field in model.model_fields.values():
            for meta in field.metadata:
                if getattr(meta, "pattern", None):
                    yield meta.pattern
            for kind in getattr(field.annotation, "__args__", (field.annotation,)):
                if isinstance(kind, type) and issubclass(kind, BaseModel):
                    yield from patterns(kind)

    found = set(patterns(config.Config))
    assert len(found) >= 12 and found <= EXPECTED.keys(), found - EXPECTED.keys()


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
    assert native.training.backend == "native" and not native.training.compiles_ahead


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


def test_a_bad_value_from_the_environment_names_its_variable():
    with pytest.raises(ConfigError) as error:
        load_config(SHIPPED, [], environ={"TRAINIUM_PIPELINE_REGION": "moon"})
    assert str(error.value) == ("aws.region='moon' (from TRAINIUM_PIPELINE_REGION): expected an AWS region like "
                                "us-east-1")
    with pytest.raises(ConfigError) as error:
        load_config(SHIPPED, ["aws.region=mars"], environ={"TRAINIUM_PIPELINE_REGION": "moon"})
    assert str(error.value).startswith("aws.region='mars': expected")  # --set wins: its value is the one said


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


def test_config_show_says_where_each_value_came_from(tmp_path, capsys):
    """Default, the file, the local profile, the environment, --set: each key's winning layer."""
    from pipeline.config import effective

    tree = yaml.safe_load(SHIPPED.read_text())
    tree["aws"]["bucket"], tree["training"]["epochs"] = "file-bucket", 4
    written = tmp_path / "pipeline.yaml"
    written.write_text(yaml.safe_dump(tree))
    sources: dict[str, str] = {}
    cfg = load_config(written, ["training.epochs=2", "deploy.test={p95_ms: 900}"], local=True, sources=sources,
                      environ={"TRAINIUM_PIPELINE_REGION": "eu-west-1"})
    found = {key: (value, source) for key, value, source in effective(cfg, sources)}
    assert found["aws.bucket"] == ("file-bucket", f"file {written}")
    assert found["aws.region"] == ("eu-west-1", "environment TRAINIUM_PIPELINE_REGION")
    assert found["training.epochs"] == (2, "--set")  # over the file and the local profile
    assert found["training.batch_size"] == (16, "local.overrides (default)")  # the laptop profile's own
    assert found["deploy.test.p95_ms"] == (900, "--set")  # a section set whole
    assert found["deploy.test.rows"][1] == "--set"  # within the section set whole
    plain: dict[str, str] = {}
    shipped = {key: source for key, _, source in effective(load_config(SHIPPED, sources=plain, environ={}), plain)}
    assert shipped["deploy.auto_promote"] == "default" and shipped["aws.region"] == f"file {SHIPPED}"
    assert len(found) > 50 and all(source for _, source in found.values())

    from test_local_e2e import cli

    code, (out, err) = cli(capsys, "--config", str(written), "--set", "training.epochs=3", "config", "show", "--json",
                           split=True)
    assert code == 0, err
    assert json.loads(out)["training.epochs"] == {"value": 3, "source": "--set"}
    code, (out, err) = cli(capsys, "--config", str(written), "config", "show", split=True)
    assert code == 0 and f'aws.bucket = "file-bucket"  # file {written}' in out.splitlines(), out


def test_override_syntax_errors_are_explained():
    with pytest.raises(ConfigError, match="expected KEY.PATH=VALUE"):
        parse_override("training.epochs")
    assert parse_override("aws.vpc=null") == ("aws.vpc", None)
    assert parse_override("training.bf16=false") == ("training.bf16", False)
    with pytest.raises(ConfigError) as error:
        parse_override("aws.tags.team=@x")
    assert str(error.value) == ("--set 'aws.tags.team=@x': the value is not valid YAML (found character '@' that "
                                "cannot start any token); text that YAML cannot read plainly needs quotes: "
                                "--set 'aws.tags.team=\"@x\"'")
    assert parse_override('aws.tags.team="@x"') == ("aws.tags.team", "@x")


@pytest.mark.parametrize(("override", "message"), [
    ("training.backend=native", "training.backend=native: TorchNeuron runs on trn2/trn3 only"),
    ("aws.vpc={subnets: [s], security_group_ids: [g], internet: false}", "aws.vpc.internet=False: the steps cannot"),
    ("aws.tags={" + ", ".join(f"t{i}: v" for i in range(51)) + "}", "aws.tags: 51 tags, expected at most 50"),
    ("training.batch_size=0", "training.batch_size=0: expected greater than or equal to 1"),
    ("training.grad_accum=0", "training.grad_accum=0: expected greater than or equal to 1"),
])
def test_a_check_across_keys_says_its_own_line_not_the_section(override, message):
    """The message of a check that names its key is the whole error: no section dumped, no key the user did not
    set (the `auto` learning rate is not worked out from a wrong batch size)."""
    with pytest.raises(ConfigError) as error:
        load_config(SHIPPED, [override], environ={})
    said = str(error.value)
    assert said.startswith(message) and "{'" not in said and "learning_rate" not in said, said


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml", environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("aws: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, environ={})
    with pytest.raises(ConfigError, match="cannot read the config file"):  # a folder: a config error (exit 2)
        load_config(tmp_path, environ={})


def test_yaml_errors_say_where_and_what(tmp_path):
    """A key given twice loses a value in PyYAML (the last wins): it is refused, as YAML 1.2 says. A syntax error
    names its line, column and problem."""
    text = SHIPPED.read_text()
    twice = tmp_path / "twice.yaml"
    twice.write_text(text.replace("  epochs: 2", "  epochs: 2\n  epochs: 5", 1))
    with pytest.raises(ConfigError) as error:
        load_config(twice, environ={})
    line = text.splitlines().index(next(x for x in text.splitlines() if x.startswith("  epochs: 2"))) + 2
    assert f"line {line}, column 3: not valid YAML: the key 'epochs' is given twice" in str(error.value)
    tab = tmp_path / "tab.yaml"
    tab.write_text("training:\n\tepochs: 2\n")
    with pytest.raises(ConfigError, match=r"line 2, column 1: not valid YAML: found character '\\t'"):
        load_config(tab, environ={})


def test_integers_are_decimal_as_in_yaml_1_2(tmp_path):
    path = tmp_path / "ints.yaml"
    path.write_text(SHIPPED.read_text().replace("  seed: 42", "  seed: 042", 1))
    assert "  seed: 42" in SHIPPED.read_text() and load_config(path, environ={}).training.seed == 42  # not octal 34
    assert parse_override("pipeline.name=1:30") == ("pipeline.name", "1:30")  # not sexagesimal 90


def test_the_file_is_utf8_whatever_the_locale(tmp_path):
    path = tmp_path / "utf8.yaml"
    path.write_text("# café\n" + SHIPPED.read_text(), encoding="utf-8")
    code = f"from pipeline.config import load_config; print(load_config({str(path)!r}, environ={{}}).pipeline.name)"
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and run.stdout.strip() == "trainium-bert", run.stderr
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes("# caf\xe9\n".encode("latin-1") + SHIPPED.read_bytes())
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(latin, environ={})


@pytest.mark.parametrize(("override", "message"), [
    ("images.processing=", "images.processing='': expected"),
    ("images.evaluation=", "images.evaluation='': expected"),
    ("training.model_id=", "training.model_id='': expected"),
    ("training.seed=-1", "training.seed=-1: expected greater than or equal to 0"),
    ("aws.tags.owner=a, b", "aws.tags.owner='a, b': expected at most 256 characters of letters"),
    ("aws.tags.aws:owner=x", "key 'aws:owner': expected a key without the prefix aws:"),
    ("data.source=s3://my-bucket/data,v2/", "data.source='s3://my-bucket/data,v2/': expected at most 256 characters"),
    ("deploy.endpoint_name=" + "e" * 56, "expected at most 55 characters, so that the staging endpoint"),
    ("deploy.endpoint_name=a" + "-" * 62 + "b", "expected at most 63 characters"),
    ("data.labels=[spam]", "data.labels=['spam']: expected two or more different label names in id order"),
    ("data.labels=[Spam, spam]", "data.labels=['Spam', 'spam']: expected two or more different label names"),
    ("data.text_columns=[body, Body]", "data.text_columns=['body', 'Body']: expected one text column or a pair"),
    ("data.text_columns=[a, b, c]", "data.text_columns"),
])
def test_values_the_jobs_or_sagemaker_would_refuse_later_are_refused_now(override, message):
    with pytest.raises(ConfigError) as error:
        load_config(SHIPPED, [override], environ={})
    assert message in str(error.value)


def test_set_reaches_every_key_and_empty_sections():
    cfg = load_config(SHIPPED, ["aws.tags.Project=x", "aws.tags.cost-center=42a",
                                "aws.vpc.subnets=[subnet-1]", "aws.vpc.security_group_ids=[sg-1]"], environ={})
    assert (cfg.aws.tags["Project"], cfg.aws.tags["cost-center"], cfg.aws.vpc.subnets) == ("x", "42a", ["subnet-1"])
    assert "~/data" != load_config(SHIPPED, ["data.source=~/data"], environ={}).data.source  # ~ expanded


def test_setting_one_local_override_keeps_the_rest_of_the_laptop_profile(tmp_path):
    """--set local.overrides.X, or the file's local.overrides, changes keys of the laptop profile, not replaces it."""
    tree = yaml.safe_load(SHIPPED.read_text())
    del tree["local"]
    path = tmp_path / "no-local.yaml"
    path.write_text(yaml.safe_dump(tree))
    cfg = load_config(path, ["local.overrides.training.epochs=3"], environ={}, local=True)
    assert (cfg.training.epochs, cfg.data.source, cfg.registry.approval_status) == (3, "sample:2000", "Approved")
    assert cfg.training.model_id != "bert-base-uncased"
    tree["local"] = {"overrides": {"training": {"epochs": 4}, "evaluation": {"sample_size": 50}}}
    path.write_text(yaml.safe_dump(tree))
    cfg = load_config(path, environ={}, local=True)
    assert (cfg.training.epochs, cfg.training.batch_size, cfg.evaluation.sample_size) == (4, 16, 50)
    assert cfg.data.source == "sample:2000" and load_config(path, environ={}).training.epochs != 4


@pytest.mark.parametrize(("parameters", "message"), [
    ({"Epochs": 0}, "--param Epochs: training.epochs=0: expected greater than or equal to 1"),
    ({"LearningRate": 5.0}, "--param LearningRate: training.learning_rate=5.0: expected less than 1"),
    ({"TrainInstanceCount": 0}, "--param TrainInstanceCount: training.instance_count=0: expected greater than"),
    ({"MaxLength": 100000}, "--param MaxLength: training.max_length=100000: expected less than or equal to 512"),
    ({"TrainInstanceType": "trn1"}, "--param TrainInstanceType: training.instance_type='trn1': expected an "
                                    "instance type"),
])
def test_an_executions_parameters_pass_the_checks_of_their_config_keys(parameters, message):
    cfg = load_config(SHIPPED, environ={})
    with pytest.raises(ConfigError) as error:
        check_parameter_values(cfg, parameters, parameters)
    assert str(error.value) == message or str(error.value).startswith(message)
    check_parameter_values(cfg, {"Epochs": 3, "LearningRate": 3e-5}, ["Epochs", "LearningRate"])


def test_each_parameter_defaults_to_its_config_key():
    cfg = load_config(SHIPPED, environ={})
    declared = json.loads(definition(cfg))["Parameters"]
    assert {p["Name"] for p in declared} == set(PARAMETER_KEYS)
    for parameter in declared:
        section, key = PARAMETER_KEYS[parameter["Name"]].split(".")
        value = getattr(getattr(cfg, section), key)
        if key == "learning_rate":  # auto: the rate for the global batch it is set for (hyperparameter lr-global-batch)
            assert value == "auto" and cfg.training.learning_rate_for[1] == 512
            value = cfg.training.learning_rate_for[0]
        assert parameter["DefaultValue"] == value, parameter
