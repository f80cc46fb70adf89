"""The Train step's speed features on CPU: honest throughput figures, the FLOPs formula, unpadded batches without
a mask, and the per-device batch and learning rate the config chooses."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from fixtures_train import config_arguments, make_tiny_model, write_split

from pipeline.config import load_config
from pipeline.config.devices import REFERENCE_GLOBAL_BATCH, REFERENCE_LEARNING_RATE, default_batch_size, device_kind

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "training" / "train.py"


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("train_speed", ROOT / "training" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_steady_state_rate_and_warmup_are_reported_apart(train, monkeypatch):
    """A first interval that compiles for 30 s: samples/s is the later intervals' rate, warmup_s the 30 s."""
    from transformers import BertConfig

    clock = Clock()
    monkeypatch.setattr(train.time, "time", clock)
    throughput = train.Throughput(BertConfig(), world_size=2)
    tokens = train.BatchTokens.of(train.np.full(16, 128), 128)
    for seconds in (30.0 + 1.0, 1.0, 1.0):  # 10 batches of 16 rows x 2 ranks each interval: 320 samples
        for _ in range(10):
            throughput.add(16, tokens)
        clock.now += seconds
        throughput.interval()
    clock.now += 100.0  # scoring the splits after the loop: not the loop's time
    stats = throughput.stats()
    assert stats["samples"] == 960 and stats["steady_state_samples"] == 640
    assert stats["samples_per_sec"] == pytest.approx(320.0)
    assert stats["warmup_s"] == pytest.approx(30.0)
    assert stats["wall_time_s"] == pytest.approx(33.0)
    assert stats["samples_per_sec_with_warmup"] == pytest.approx(960 / 33.0)
    per_sample = 12 * (72 * 768**2 * 128 + 12 * 768 * 128**2)  # bert-base at length 128: 72Lh^2s + 12Lhs^2
    assert stats["model_tflops_per_sec"] == pytest.approx(320.0 * per_sample / 1e12)


def test_one_interval_has_no_steady_state_rate_only_its_rate_with_warmup(train, monkeypatch):
    """A run of one log interval never left its warm-up: its rate is not a steady state (nor its FLOP rate)."""
    from transformers import BertConfig

    clock = Clock()
    monkeypatch.setattr(train.time, "time", clock)
    throughput = train.Throughput(BertConfig(), world_size=1)
    throughput.add(8, train.BatchTokens.of(train.np.full(8, 10), 10))
    clock.now += 2.0
    throughput.interval()
    stats = throughput.stats()
    assert stats["samples_per_sec"] is None and stats["warmup_s"] is None and stats["model_tflops_per_sec"] is None
    assert stats["samples_per_sec_with_warmup"] == pytest.approx(4.0) and stats["steady_state_samples"] == 0


def test_unpadded_batch_without_a_mask_gives_the_same_logits(train, tmp_path):
    """SDPA with no mask (its flash path on CUDA) for a batch the host knows has no padding: same logits."""
    model_dir = make_tiny_model(tmp_path / "model")
    rt = train.Runtime(torch.device("cpu"), "cpu", 0, 1, distributed=False, bf16=False, compile=False)
    model = train.load_model(str(model_dir), rt, seed=0, names=train.UNNAMED_LABELS).eval()
    assert model.config._attn_implementation == "sdpa"
    batch = {"input_ids": torch.randint(5, 100, (4, 12)), "token_type_ids": torch.zeros(4, 12, dtype=torch.long),
             "attention_mask": torch.ones(4, 12, dtype=torch.long)}
    assert not train.has_padding(rt, batch)
    with torch.no_grad():
        torch.testing.assert_close(train.forward(rt, model, batch, padded=False), train.forward(rt, model, batch))
    batch["attention_mask"][0, 6:] = 0
    assert train.has_padding(rt, batch)


def test_compile_is_refused_on_xla_and_on_by_default_only_for_cuda(train):
    assert train.parse_args([*config_arguments()]).compile == "auto"
    assert not train.setup(train.parse_args([*config_arguments(), "--bf16", "false"])).compile  # CPU: auto is off
    assert {kind: train.compile_choice("auto", kind) for kind in ("cuda", "neuron", "cpu", "xla")} == {
        "cuda": True, "neuron": True, "cpu": False, "xla": False}
    assert train.compile_choice("True", "cpu") and not train.compile_choice("false", "cuda")
    with pytest.raises(ValueError, match="XLA compiles every graph already"):
        train.compile_choice("true", "xla")


@pytest.mark.slow  # an Inductor compile
@pytest.mark.skipif(not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")),
                    reason="Inductor's CPU backend compiles C++: no C++ compiler (g++ or clang++) here")
def test_compiled_loop_takes_one_graph_for_every_length_and_caches_it_beside_the_checkpoints(train, tmp_path):
    """`--compile True` on CPU, the Inductor path CUDA takes (less Triton): batches of many padded lengths cost one
    graph, and one more for an unpadded batch's mask-free call, not one per length; training_stats.json counts the
    graphs and the seconds spent compiling them, and the compiled graphs are cached in the checkpoint folder."""
    model = make_tiny_model(tmp_path / "model")
    write_split(tmp_path / "train", model, rows=128, seed=1, max_length=64, max_words=30)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", str(TRAIN),
           *config_arguments(),
           "--model-id", str(model), "--train-dir", str(tmp_path / "train"), "--validation-dir", str(out / "none"),
           "--test-dir", str(out / "none"), "--model-dir", str(out / "model"),
           "--output-data-dir", str(out / "output"), "--checkpoint-dir", str(out / "checkpoints"),
           "--compile", "True", "--batch-size", "8", "--max-steps", "12", "--log-interval", "4",
           "--checkpoint-interval", "0", "--max-length", "64"]
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    done = subprocess.run(cmd, env={**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    stats = json.loads((out / "output" / "training_stats.json").read_text())
    split = train.TokenizedSplit(str(tmp_path / "train"), 64)
    lengths = {int(split.lengths[b].max()) for b in train.train_batches(split.lengths, 8, 42, 0, 0, 1)[:12]}
    assert len(lengths) >= 4 and stats["steps"] == 12
    assert 1 <= stats["compile_count"] <= 2, stats
    assert 0 < stats["compile_s"] < stats["wall_time_s"]
    assert any(p.is_file() for p in (out / "checkpoints" / "inductor-cache").rglob("*"))


def test_inductor_cache_goes_beside_the_checkpoints_unless_the_job_sets_one(train, tmp_path):
    assert train.inductor_environment({}, tmp_path) == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-cache")}
    assert train.inductor_environment({"TORCHINDUCTOR_CACHE_DIR": "/cache"}, tmp_path) == {}


@pytest.mark.parametrize(("instance_type", "kind", "batch"), [
    ("ml.trn1.32xlarge", "neuron", 16), ("ml.trn2.48xlarge", "neuron", 16), ("ml.p4d.24xlarge", "gpu", 256),
    ("ml.g5.xlarge", "gpu", 256), ("ml.m5.xlarge", "cpu", 16),
])
def test_auto_batch_by_device_kind(instance_type, kind, batch):
    assert device_kind(instance_type) == kind and default_batch_size(instance_type) == batch


def test_config_chooses_batch_and_learning_rate_per_device():
    """A GPU run is not launched at batch 16; an auto learning rate passes the reference rate and its global batch
    (train.py scales it to the run's: test_an_auto_learning_rate_follows_the_global_batch_of_the_run)."""
    trn = load_config(ROOT / "pipeline.yaml", environ={}).training
    assert (trn.batch_size, trn.learning_rate) == (16, "auto")
    assert trn.learning_rate_for == (REFERENCE_LEARNING_RATE, REFERENCE_GLOBAL_BATCH)
    assert 16 * 32 == REFERENCE_GLOBAL_BATCH  # the reference: one ml.trn1.32xlarge at the default batch
    gpu = load_config(ROOT / "pipeline.yaml", ["training.instance_type=ml.p4d.24xlarge"], environ={}).training
    assert gpu.batch_size == 256 and gpu.learning_rate_for == (REFERENCE_LEARNING_RATE, REFERENCE_GLOBAL_BATCH)
    explicit = load_config(ROOT / "pipeline.yaml", ["training.instance_type=ml.p4d.24xlarge",
                                                   "training.batch_size=32", "training.learning_rate=3e-5"],
                           environ={}).training
    assert (explicit.batch_size, explicit.learning_rate, explicit.learning_rate_for) == (32, 3e-5, (3e-5, 0))
    local = load_config(ROOT / "pipeline.yaml", environ={}, local=True).training
    assert (local.batch_size, local.learning_rate) == (16, 1e-4)


def test_a_bad_batch_names_the_field():
    with pytest.raises(ValueError, match=r"training.batch_size='fast': expected a number or 'auto'"):
        load_config(ROOT / "pipeline.yaml", ["training.batch_size=fast"], environ={})


def test_cost_and_compare_read_steady_state_and_warmup_apart(tmp_path):
    """A training job's output.tar.gz in S3, as train.py writes it: `cost` and `compare` read its steady-state rate,
    its rate with the warm-up and the warm-up apart, and fill what it lacks from the job's final metrics."""
    import boto3
    from moto import mock_aws

    from pipeline.compare.report import Row
    from pipeline.cost import ExecutionCost
    from pipeline.prices import JobCost
    from pipeline.sagemaker.aws import Aws
    from pipeline.sagemaker.cost import sagemaker_training_stats
    from pipeline.views import throughput_lines

    written = {"samples": 1000, "samples_per_sec": 500.0, "samples_per_sec_with_warmup": 100.0, "warmup_s": 8.0,
               "compile_s": 6.5, "train_loss": 0.25}
    (tmp_path / "training_stats.json").write_text(json.dumps(written))
    with tarfile.open(tmp_path / "output.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "training_stats.json", arcname="training_stats.json")
    described = {"TrainingJobName": "train-1", "OutputDataConfig": {"S3OutputPath": "s3://bucket-1/p/model"},
                 "FinalMetricDataList": [{"MetricName": "test:accuracy", "Value": 0.9},
                                         {"MetricName": "train:samples_per_sec", "Value": 1.0}]}
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="bucket-1")
        boto3.client("s3", region_name="us-east-1").upload_file(str(tmp_path / "output.tar.gz"), "bucket-1",
                                                                "p/model/train-1/output/output.tar.gz")
        stats = sagemaker_training_stats(Aws("us-east-1"), described)
    assert (stats.samples_per_sec, stats.samples_per_sec_with_warmup, stats.warmup_s, stats.compile_s) == (
        500.0, 100.0, 8.0, 6.5)  # the file's steady state, not the final metric's 1.0
    assert (stats.test_accuracy, stats.source) == (0.9, "training_stats.json + final metrics")
    job = JobCost("Train", "train-1", "Training", "ml.trn1.32xlarge", 1, 3600.0, "billable", 21.5)
    lines = throughput_lines(ExecutionCost("e-1", "sagemaker", "USD", [job], stats))
    assert lines[0].startswith("training throughput: 500.0 samples/s steady state (100.0 with the warm-up); "
                               "warm-up 8.0 s (compiling 6.5 s); samples trained: 1,000"), lines
    row = Row(job, 3700.0, stats, 64, 16).to_dict()
    assert (row["samples_per_sec"], row["samples_per_sec_with_warmup"], row["warmup_s"], row["compile_s"]) == (
        500.0, 100.0, 8.0, 6.5)
    assert row["cost_per_million_samples"] == 21.5 / 1000 * 1e6


def test_the_model_names_its_classes_as_the_shards_do(train, tmp_path):
    """Tokenize names the labels in every shard's schema metadata; train.py gives them to the model's head, which
    saves them (the endpoint answers them)."""
    from steps.tokenize import preprocess as pre

    writer = pre.SplitWriter(tmp_path / "train", 8, names=["ham", "spam"])
    writer.write(pa.table({"input_ids": [[2, 5, 3], [2, 6, 3]], "token_type_ids": [[0, 0, 0]] * 2, "label": [1, 0],
                           "length": [3, 3]}, schema=pre.SCHEMA), np.zeros(2, bool))
    writer.close()
    split = train.TokenizedSplit(str(tmp_path / "train"), 8)
    assert split.names == ["ham", "spam"] and split.labels.tolist() == [1, 0]
    rt = train.Runtime(torch.device("cpu"), "cpu", 0, 1, distributed=False, bf16=False, compile=False)
    model = train.load_model(str(make_tiny_model(tmp_path / "model")), rt, seed=0, names=split.names)
    assert model.config.id2label == {0: "ham", 1: "spam"} and model.config.label2id == {"ham": 0, "spam": 1}


def test_three_classes_are_scored_by_their_logits_and_written_for_evaluate(train, tmp_path):
    """Any number of classes: each row's logits (one per class), accuracy by argmax, and the predictions file that
    Evaluate reads (its label, prediction and logits)."""
    from steps.evaluation import evaluate as ev
    from steps.tokenize import preprocess as pre

    names = ["billing", "technical", "sales"]
    writer = pre.SplitWriter(tmp_path / "test", 16, names=names)
    ids = [[2, 5 + i % 7, 9 + i % 5, 3] for i in range(12)]
    writer.write(pa.table({"input_ids": ids, "token_type_ids": [[0] * 4] * 12, "label": [i % 3 for i in range(12)],
                           "length": [4] * 12}, schema=pre.SCHEMA), np.zeros(12, bool))
    writer.close()
    split = train.TokenizedSplit(str(tmp_path / "test"), 16)
    rt = train.Runtime(torch.device("cpu"), "cpu", 0, 1, distributed=False, bf16=False, compile=False)
    model = train.load_model(str(make_tiny_model(tmp_path / "model")), rt, seed=0, names=split.names)
    args = train.parse_args([*config_arguments(), "--model-id", "m", "--batch-size", "5"])
    accuracy, logits = train.score_splits(args, rt, model, {"test": split, "validation": None}, workers=0)
    assert logits["test"].shape == (12, 3) and accuracy["validation"] is None
    assert accuracy["test"] == pytest.approx(float(np.mean(logits["test"].argmax(axis=1) == split.labels)))
    train.write_predictions(tmp_path / "predictions" / "test.parquet", split, logits["test"])
    read = ev.read_predictions(tmp_path, split.labels.astype(np.int64))
    np.testing.assert_allclose(read, logits["test"], rtol=1e-6)
