"""training/launch.py, the Train job's entry point: the compile pass runs inside the Train job only when the compile
cache lacks the manifest of the run's graphs, and training_stats.json tells compiled graphs from cache hits.

Neuron's tools do not run here: the real training toolkit launches the job (as the local runner does), and stand-ins
on PATH play `neuron-ls` (the toolkit counts NeuronCores with it) and `neuron_parallel_compile` (it records its
command line, adds one compiled graph to the cache, and runs the command as the real one does in its trace phase)."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
from pathlib import Path

import pytest
from fixtures_train import config_arguments, make_tiny_model, write_split

from pipeline.code import bundles
from pipeline.local.jobs import run_training
from pipeline.local.storage import LocalS3

ROOT = Path(__file__).resolve().parents[1]
FAKE_NEURON_LS = "#!/bin/sh\necho '[{\"nc_count\": 1}]'\n"
FAKE_PARALLEL_COMPILE = """#!/bin/sh
echo "$@" >> "$COMPILE_RECORD"
graph="$NEURON_COMPILE_CACHE_URL/neuronxcc-0/MODULE_$(date +%s%N)"
mkdir -p "$graph" && touch "$graph/model.neff"
exec "$@"
"""


def load_launch():
    spec = importlib.util.spec_from_file_location("launch", ROOT / "training" / "launch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_key_follows_what_shapes_graphs_and_nothing_else(tmp_path, monkeypatch):
    launch = load_launch()
    base = ["--model-id", "m", "--batch-size", "16", "--max-length", "128", "--backend", "xla", "--epochs", "2",
            "--learning-rate", "5e-05", "--log-interval", "50"]

    def key(arguments=base, world=32, instance="ml.trn1.32xlarge", flags=""):
        return launch.graph_key(launch.graph_inputs(arguments, world, instance, flags))

    def with_value(flag: str, value: str) -> list[str]:
        i = base.index(flag)
        return [*base[:i + 1], value, *base[i + 2:]]

    assert key() == key()
    for changed in (with_value("--batch-size", "32"), with_value("--max-length", "256"), with_value("--model-id", "n")):
        assert key(changed) != key(), changed
    assert key(world=64) != key() and key(instance="ml.trn2.48xlarge") != key() and key(flags="-O2") != key()
    for same in (with_value("--epochs", "3"), with_value("--learning-rate", "1e-4"), with_value("--log-interval", "9")):
        assert key(same) == key(), same  # the schedule and the logging shape no graph
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 768}')
    staged = launch.graph_key(launch.graph_inputs(with_value("--model-id", str(model)), 32, "ml.trn1.32xlarge", ""))
    (model / "config.json").write_text('{"hidden_size": 1024}')
    assert launch.graph_key(launch.graph_inputs(with_value("--model-id", str(model)), 32, "ml.trn1.32xlarge",
                                                "")) != staged  # a staged model: its architecture, not its path
    assert launch.split_arguments(["--a", "1", "--compile-ahead", "true", "--b", "2"]) == (True, ["--a", "1", "--b",
                                                                                               "2"])
    assert launch.split_arguments(["--a", "1"]) == (False, ["--a", "1"])


@pytest.fixture(scope="module")
def neuron_job(tmp_path_factory):
    """A Train job on a pretend Neuron instance with a local compile cache: `run(name, **hyperparameters)` runs it
    through the real toolkit and gives (training_stats.json, the compile pass's command lines so far)."""
    root = tmp_path_factory.mktemp("launch")
    s3 = LocalS3(root)
    model = make_tiny_model(root / "model")
    for split, rows, seed in (("train", 64, 1), ("validation", 16, 2), ("test", 16, 3)):
        write_split(s3.path(f"s3://bucket/data/{split}"), model, rows=rows, seed=seed, max_length=32, max_words=10)
    for name, data in bundles()["training"].files.items():  # the Train step's code, but nothing to install
        if name != "requirements.txt":
            s3.put_bytes(f"s3://bucket/code/{name}", data)
    tools = root / "bin"
    tools.mkdir()
    for name, text in (("neuron-ls", FAKE_NEURON_LS), ("neuron_parallel_compile", FAKE_PARALLEL_COMPILE)):
        (tools / name).write_text(text)
        (tools / name).chmod(stat.S_IRWXU)
    record, cache = root / "compile-record.txt", root / "cache"
    given = dict(zip(config_arguments()[::2], config_arguments()[1::2], strict=True))

    def run(name: str, cache_url: str | None = None, **changed: str) -> tuple[dict, list[str]]:
        hyperparameters = {**{k[2:]: v for k, v in given.items()}, "model-id": str(model), "max-length": "32",
                           "batch-size": "8", "max-steps": "2", "log-interval": "1", "backend": "xla",
                           "compile-ahead": "true", **changed,
                           "sagemaker_program": '"launch.py"', "sagemaker_submit_directory": '"s3://bucket/code"'}
        args = {"AlgorithmSpecification": {"TrainingInputMode": "File"}, "HyperParameters": hyperparameters,
                "InputDataConfig": [{"ChannelName": split, "DataSource": {"S3DataSource": {
                    "S3Uri": f"s3://bucket/data/{split}"}}} for split in ("train", "validation", "test")],
                "Environment": {"NEURON_COMPILE_CACHE_URL": str(cache) if cache_url is None else cache_url,
                                "COMPILE_RECORD": str(record),
                                "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"},
                "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"}}
        with (root / f"{name}.log").open("w") as log:
            run_training(name, args, root / name, s3, log, 1)
        stats = json.loads((root / name / "opt_ml" / "output" / "data" / "training_stats.json").read_text())
        return stats, record.read_text().splitlines() if record.exists() else []

    return run


@pytest.mark.slow
def test_the_train_job_compiles_only_what_the_cache_lacks_then_trains(neuron_job):
    cold, passes = neuron_job("cold")
    assert len(passes) == 1 and passes[0].startswith("torchrun --nnodes 1 --nproc_per_node 1 train.py ")
    assert passes[0].endswith("--precompile True") and "--compile-ahead" not in passes[0]
    assert cold["compile"]["ahead"].startswith("ran") and cold["compile"]["graphs_compiled_ahead"] == 1
    assert cold["precompile"] is False and cold["steps"] == 2  # then it trained
    assert cold["compile"]["graphs_compiled_in_training"] == 0

    warm, passes = neuron_job("warm", **{"learning-rate": "0.001", "epochs": "3"})  # no graph changes
    assert len(passes) == 1, "a warm cache: no compile pass"
    assert warm["compile"]["ahead"].startswith("skipped") and warm["compile"]["key"] == cold["compile"]["key"]
    assert warm["compile"]["graphs_compiled_ahead"] == 0 and warm["steps"] == 2

    other, passes = neuron_job("other-batch", **{"batch-size": "4"})  # other graphs: compiled ahead again
    assert len(passes) == 2 and other["compile"]["ahead"].startswith("ran")
    assert other["compile"]["key"] != cold["compile"]["key"]


@pytest.mark.slow
def test_off_neuron_or_switched_off_the_job_only_trains(neuron_job):
    stats, passes = neuron_job("switched-off", **{"compile-ahead": "false", "batch-size": "2"})
    assert "compile" not in stats and not any(" --batch-size 2 " in line for line in passes)
    assert stats["steps"] == 2
    stats, passes = neuron_job("no-cache", cache_url="", **{"batch-size": "3"})  # nowhere to keep a manifest
    assert "compile" not in stats and not any(" --batch-size 3 " in line for line in passes) and stats["steps"] == 2


def test_the_job_passes_on_train_pys_exit_code(monkeypatch):
    """A SIGTERM checkpoint exits 143, which SageMaker and the local runner read: the launcher keeps it."""
    launch = load_launch()
    from sagemaker_training import errors, runner

    class Failing:
        def run(self, capture_error):
            raise errors.ExecuteUserScriptError(cmd=["torchrun"], return_code=143)

    monkeypatch.setattr(runner, "get", lambda *a, **k: Failing())
    with pytest.raises(SystemExit) as ended:
        launch.torchrun(["--x", "1"], compile_pass=False)
    assert ended.value.code == 143 and "RUN_NEURON_PARALLEL_COMPILE" not in os.environ
