"""training/train.py on CPU: real `torchrun --nproc_per_node 2` (gloo) runs on a tiny BERT, synthetic data."""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_train import config_arguments, make_tiny_model, write_split
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "training" / "train.py"
LOG_LINE = re.compile(
    r"^step=(\d+) epoch=(\d+) loss=([0-9.]+) samples_per_sec=([0-9.]+) lr=([0-9.e+-]+)$", re.M
)
HYPERPARAMETERS = [  # over the config's (config_arguments come first: argparse keeps the last)
    "--epochs",
    "3",
    "--batch-size",
    "8",
    "--learning-rate",
    "5e-3",
    "--max-length",
    "64",
    "--log-interval",
    "5",
    "--checkpoint-interval",
    "5",
    "--seed",
    "7",
    "--bf16",
    "auto",
]


def load_train_module():
    spec = importlib.util.spec_from_file_location("train_under_test", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("train")
    model = make_tiny_model(root / "base-model")
    write_split(root / "data" / "train", model, rows=288, seed=1, max_length=64, max_words=30)
    write_split(root / "data" / "validation", model, rows=96, seed=2, max_length=64, max_words=30)
    write_split(root / "data" / "test", model, rows=64, seed=3, max_length=64, max_words=30)
    return root


def torchrun(workspace: Path, out: Path, extra: tuple[str, ...] = (), **popen) -> subprocess.Popen:
    """Start a 2-process CPU training run writing into `out` (`extra`: arguments that override the usual ones)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(TRAIN),
        *config_arguments(),
        "--model-id",
        str(workspace / "base-model"),
        "--train-dir",
        str(workspace / "data" / "train"),
        "--validation-dir",
        str(workspace / "data" / "validation"),
        "--test-dir",
        str(workspace / "data" / "test"),
        "--model-dir",
        str(out / "model"),
        "--output-data-dir",
        str(out / "output"),
        "--checkpoint-dir",
        str(out / "checkpoints"),
        *HYPERPARAMETERS,
        "--some-future-key",
        "1",
        *extra,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen
    )


def finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


@pytest.fixture(scope="module")
def runs(workspace: Path) -> dict[str, str]:
    """An uninterrupted run and, started alongside it, a run stopped by SIGTERM after its first checkpoint and
    then resumed. Returns their logs ("reference", "interrupted", "resumed")."""
    reference = torchrun(workspace, workspace / "reference")
    out = workspace / "interrupted"
    interrupted = torchrun(workspace, out, start_new_session=True)
    deadline = time.time() + 100
    while not list((out / "checkpoints").glob("slot-*/COMPLETE")):
        assert interrupted.poll() is None and time.time() < deadline, finish(interrupted)
        time.sleep(0.02)
    interrupted.send_signal(signal.SIGTERM)  # torchrun forwards it to both workers
    logs = {"interrupted": finish(interrupted), "reference": finish(reference)}
    assert reference.returncode == 0, logs["reference"]
    assert interrupted.returncode != 0, logs["interrupted"]
    resumed = torchrun(workspace, out)
    logs["resumed"] = finish(resumed)
    assert resumed.returncode == 0, logs["resumed"]
    return logs


@pytest.mark.slow  # real torchrun launches
def test_learns_and_logs_contract_lines(runs):
    log = runs["reference"]
    lines = LOG_LINE.findall(log)
    assert len(lines) >= 5, log
    losses = [float(m) for m in re.findall(r"loss=([0-9.]+)", log)]
    assert all(float(s) > 0 for s in re.findall(r"samples_per_sec=([0-9.]+)", log))
    assert losses[-1] < 0.5 * losses[0], losses
    accuracy = float(re.search(r"^val_accuracy=([0-9.]+)$", log, re.M).group(1))
    assert accuracy > 0.8, log
    test_accuracy = float(re.search(r"^test_accuracy=([0-9.]+)$", log, re.M).group(1))
    assert test_accuracy > 0.8, log
    assert "ignoring unknown arguments ['--some-future-key', '1']" in log


@pytest.mark.slow  # real torchrun launches
def test_artifact_reloads_and_serves(workspace, runs):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = workspace / "reference"
    model_dir = out / "model"
    assert (model_dir / "model.safetensors").exists()
    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    assert model.config.id2label == {0: "negative", 1: "positive"}
    assert model.config.label2id == {"negative": 0, "positive": 1}
    assert AutoTokenizer.from_pretrained(model_dir).model_max_length == 64  # the training length, for the handler
    assert (model_dir / "code" / "requirements.txt").exists()

    spec = importlib.util.spec_from_file_location("inference_under_test", model_dir / "code" / "inference.py")
    handler = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(handler)
    loaded = handler.model_fn(str(model_dir))
    assert loaded.max_length == 64
    body = json.dumps({"inputs": ["great excellent love it", "terrible awful broken refund"]})
    prediction = handler.predict_fn(handler.input_fn(body, "application/json"), loaded)
    result = json.loads(handler.output_fn(prediction, "application/json"))
    assert [r["label"] for r in result] == ["positive", "negative"]
    assert all(0.5 <= r["score"] <= 1 for r in result)
    single = handler.predict_fn(
        handler.input_fn(b'{"inputs": "love it"}', "application/json; charset=utf-8"), loaded
    )
    assert len(single) == 1

    stats = json.loads((out / "output" / "training_stats.json").read_text())
    assert stats["world_size"] == 2 and stats["device"] == "cpu" and stats["global_step"] == 54
    assert 0.8 < stats["test_accuracy"] <= 1 and 0.8 < stats["val_accuracy"] <= 1
    assert (
        0 < stats["padding_efficiency"] <= 1 and stats["samples_per_sec"] > 0 and stats["tokens_per_sec"] > 0
    )


@pytest.mark.slow  # real torchrun launches
def test_sigterm_then_resume_ends_with_identical_weights(workspace, runs):
    out = workspace / "interrupted"
    stopped = int(re.search(r"stopping on SIGTERM at step=(\d+)", runs["interrupted"]).group(1))
    assert stopped < 54 and "saved model" not in runs["interrupted"]
    assert f"resumed from checkpoint at step={stopped}" in runs["resumed"]
    resumed = load_file(out / "model" / "model.safetensors")
    expected = load_file(workspace / "reference" / "model" / "model.safetensors")
    assert resumed.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(resumed[name], tensor), name


def test_batch_order_is_a_pure_function_of_seed_and_epoch():
    train = load_train_module()
    lengths = np.random.default_rng(0).integers(5, 128, size=1000)
    ranks = [train.train_batches(lengths, 16, seed=3, epoch=1, rank=r, world_size=2) for r in range(2)]
    again = train.train_batches(lengths, 16, seed=3, epoch=1, rank=0, world_size=2)
    other_epoch = train.train_batches(lengths, 16, seed=3, epoch=2, rank=0, world_size=2)
    assert all(np.array_equal(a, b) for a, b in zip(ranks[0], again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(ranks[0], other_epoch, strict=True))
    seen = np.concatenate(ranks[0] + ranks[1])
    assert len(seen) == len(set(seen)) == 992  # disjoint across ranks; only the partial batch is dropped
    padded = sum(len(b) * lengths[b].max() for b in ranks[0] + ranks[1])
    assert lengths[seen].sum() / padded > 0.9  # length grouping keeps padding low
    assert train.length_buckets(128) == [32, 64, 128] and train.length_buckets(200) == [32, 64, 128, 200]
    assert train.pad_length(33, [32, 64, 128], 1) == 64 and train.pad_length(33, None, 8) == 40


def test_an_auto_learning_rate_follows_the_global_batch_of_the_run():
    """training.learning_rate auto passes the reference rate and the global batch it is set for; train.py, which
    alone knows the run's world size, trains at the square-root rule's rate for its own global batch."""
    from pipeline.config.devices import REFERENCE_GLOBAL_BATCH, REFERENCE_LEARNING_RATE

    train = load_train_module()
    reference = (REFERENCE_LEARNING_RATE, REFERENCE_GLOBAL_BATCH)
    assert train.scaled_rate(*reference, 2048) == pytest.approx(1e-4)  # 5e-5 x sqrt(2048 / 512): 8 GPUs x 256
    assert train.scaled_rate(*reference, 32) == pytest.approx(1.25e-5)  # 2 CPU processes x 16
    assert train.scaled_rate(1e-4, 0, 32) == 1e-4  # set by hand: as given
    assert train.scaled_rate(1e-4, 512, 512) == 1e-4


def test_resume_skips_incomplete_and_truncated_checkpoints(tmp_path):
    train = load_train_module()
    train.save_checkpoint(tmp_path, 5, {"step": 5})
    train.save_checkpoint(tmp_path, 10, {"step": 10})
    assert train.load_latest_checkpoint(tmp_path)[0]["step"] == 10
    (tmp_path / "slot-1" / "checkpoint.pt").write_bytes(b"truncated")  # slot-1 holds step 10
    state, good = train.load_latest_checkpoint(tmp_path)
    assert state["step"] == 5 and good.name == "slot-0"
    # the next save must not overwrite the only good checkpoint, though its step is the oldest
    assert train.save_checkpoint(tmp_path, 15, {"step": 15}, keep=good).name == "slot-1"
    (tmp_path / "slot-1" / "COMPLETE").unlink()  # crashed before its marker
    assert train.load_latest_checkpoint(tmp_path)[0]["step"] == 5


def test_checkpoints_reuse_a_fixed_number_of_files(tmp_path):
    """SageMaker syncs the checkpoint folder to S3 but never deletes there: the set of file names must not grow."""
    train = load_train_module()
    names = set()
    for step in range(5, 55, 5):
        train.save_checkpoint(tmp_path, step, {"step": step, "weights": torch.full((4,), float(step))})
        names |= {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert names == {f"slot-{k}/{f}" for k in range(train.KEEP_CHECKPOINTS) for f in ("checkpoint.pt", "COMPLETE")}
    assert [step for step, _ in train.complete_checkpoints(tmp_path)] == [45, 50]
    assert train.load_latest_checkpoint(tmp_path)[0]["weights"].tolist() == [50.0] * 4
    # a slot whose file was replaced behind its marker's back (a half-synced overwrite) is skipped
    slot = dict((s, p) for s, p in train.complete_checkpoints(tmp_path))[50]
    torch.save({"step": 45, "weights": torch.zeros(4)}, slot / "checkpoint.pt")
    assert train.load_latest_checkpoint(tmp_path)[0]["step"] == 45


@pytest.mark.slow  # real torchrun launches
def test_test_predictions_cover_the_whole_test_split(workspace, runs):
    import pyarrow.parquet as pq

    out = workspace / "reference"
    predictions = pq.read_table(out / "model" / "predictions" / "test.parquet").to_pydict()
    test = load_train_module().TokenizedSplit(str(workspace / "data" / "test"), 64)
    assert predictions["label"] == test.labels.tolist()  # every row, in the split's file order
    assert predictions["prediction"] == [int(np.argmax(logits)) for logits in predictions["logits"]]
    accuracy = float(np.mean(np.array(predictions["prediction"]) == test.labels))
    logged = float(re.search(r"^test_accuracy=([0-9.]+)$", runs["reference"], re.M).group(1))
    assert accuracy == pytest.approx(logged, abs=5e-5)
    stats = json.loads((out / "output" / "training_stats.json").read_text())
    assert stats["test_rows"] == 64 and stats["test_accuracy"] == pytest.approx(accuracy)


def test_neuron_environment_for_single_and_multi_node(tmp_path):
    train = load_train_module()
    single = train.neuron_environment({"SM_HOSTS": '["algo-1"]', "SM_CURRENT_INSTANCE_TYPE": "ml.trn1.32xlarge"},
                                      tmp_path)
    assert single == {"NEURON_CC_FLAGS": "--model-type=transformer --auto-cast=none --retry_failed_compilation "
                                         f"--cache_dir={tmp_path}/neuron-compile-cache"}
    for instance_type in ("ml.trn1.32xlarge", "ml.trn1n.32xlarge"):
        multi = train.neuron_environment(
            {"SM_HOSTS": '["algo-1", "algo-2"]', "SM_CURRENT_INSTANCE_TYPE": instance_type,
             "NEURON_CC_FLAGS": "--model-type=generic", "NEURON_COMPILE_CACHE_URL": "s3://b/cache",
             "FI_EFA_FORK_SAFE": "0"},
            tmp_path,
        )
        assert multi == {
            "NEURON_CC_FLAGS": "--model-type=generic --auto-cast=none --retry_failed_compilation "
                               "--cache_dir=s3://b/cache",
            "FI_PROVIDER": "efa",
            "FI_EFA_USE_DEVICE_RDMA": "1",
        }, "what the job sets wins"
    one_small = {"SM_HOSTS": '["algo-1"]', "SM_CURRENT_INSTANCE_TYPE": "ml.trn1.2xlarge"}
    assert set(train.neuron_environment(one_small, tmp_path)) == {"NEURON_CC_FLAGS"}  # no EFA on trn1.2xlarge
    with pytest.raises(ValueError, match="2 instances of ml.trn1.2xlarge: Neuron's collectives between instances "
                                         "need EFA"):
        train.neuron_environment({**one_small, "SM_HOSTS": '["algo-1", "algo-2"]'}, tmp_path)


@pytest.mark.slow  # real torchrun launches
def test_every_metric_definition_reads_a_number_from_the_real_log(workspace, runs):
    """SageMaker applies each regex of the TrainingStep's MetricDefinitions to the log lines train.py prints."""
    from steps.contract import METRIC_DEFINITIONS, STATS_FILE, STATS_METRICS

    lines = runs["reference"].splitlines()
    for metric in METRIC_DEFINITIONS:
        values = [float(m.group(1)) for line in lines if (m := re.search(metric["regex"], line))]
        assert values and all(np.isfinite(values)), metric
    stats = json.loads((workspace / "reference" / "output" / STATS_FILE).read_text())
    assert set(STATS_METRICS) <= set(stats) and all(stats[key] is not None for key in STATS_METRICS)


SEEDED_HEAD = """
import importlib.util, json, os, sys
import torch
spec = importlib.util.spec_from_file_location("train", sys.argv[1])
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
torch.manual_seed(1000 + int(os.environ["RANK"]))  # each rank's generator differs before the model is made
args = train.parse_args([*json.loads(sys.argv[4]), "--model-id", sys.argv[2], "--seed", "7",
                         "--checkpoint-dir", sys.argv[3]])
rt = train.setup(args)
model = train.load_model(args.model_id, rt, args.seed, train.UNNAMED_LABELS)
torch.save(model.classifier.weight.detach(), os.path.join(sys.argv[3], f"head-{rt.rank}.pt"))
rt.end()
"""


@pytest.mark.slow  # real torchrun launches
def test_every_rank_starts_from_the_same_head_whatever_its_generator(workspace, tmp_path):
    """Two gloo ranks under torchrun whose default generators differ: the explicit seed gives both the same fresh
    classifier head (on XLA no DDP broadcasts it)."""
    script = tmp_path / "seeded_head.py"
    script.write_text(SEEDED_HEAD)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
           str(TRAIN), str(workspace / "base-model"), str(tmp_path), json.dumps(config_arguments())]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    heads = [torch.load(tmp_path / f"head-{rank}.pt") for rank in range(2)]
    assert torch.equal(heads[0], heads[1])


def test_splits_stay_narrow_in_memory_and_batches_are_int64(workspace):
    """The Parquet types (int32 ids, int8 token types and labels) are kept: 32 ranks x int64 would fill the host."""
    train = load_train_module()
    split = train.TokenizedSplit(str(workspace / "data" / "train"), 64)
    assert (split.input_ids.dtype, split.token_type_ids.dtype, split.labels.dtype) == (np.int32, np.int8, np.int8)
    batch = split.collate(np.arange(4), pad_to=64, rows=6)
    assert all(v.dtype == torch.int64 for v in batch.values())
    assert batch["labels"].tolist()[4:] == [-1, -1] and batch["input_ids"][0, 0] == int(split.input_ids[0])


@pytest.mark.slow  # real torchrun launches
def test_checkpoints_also_on_the_clock(workspace, tmp_path):
    """--checkpoint-minutes: a checkpoint at the first log line after the interval ran out, with step checkpoints
    off; all ranks agree on it (2 ranks)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(TRAIN),
           *config_arguments(),
           "--model-id", str(workspace / "base-model"), "--train-dir", str(workspace / "data" / "train"),
           "--model-dir", str(tmp_path / "model"), "--output-data-dir", str(tmp_path / "output"),
           "--checkpoint-dir", str(tmp_path / "checkpoints"), "--batch-size", "8", "--max-length", "64",
           "--max-steps", "6", "--log-interval", "3", "--checkpoint-interval", "0", "--checkpoint-minutes", "1e-6"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.findall(r"^saved checkpoint \S+ at step=(\d+)$", proc.stdout, re.M) == ["3", "6"], proc.stdout
    assert [step for step, _ in load_train_module().complete_checkpoints(tmp_path / "checkpoints")] == [3, 6]


def test_a_training_given_the_folder_of_a_finished_one_starts_afresh(tmp_path):
    """The Train step's checkpoint folder is per training, not per execution: a later job with the same folder (a
    cache that expired, a local --no-cache run) trains from step 0, and the finished training's slots are stale."""
    train = load_train_module()
    folder = tmp_path / "checkpoints"
    train.save_checkpoint(folder, 5, {"step": 5})
    train.mark_training(folder, "running")
    assert not train.finished_before(folder) and train.load_latest_checkpoint(folder)[0]["step"] == 5  # resumes
    train.mark_training(folder, "finished")
    assert train.finished_before(folder)
    train.mark_training(folder, "running", stale_slots=True)  # what the next job does
    assert train.load_latest_checkpoint(folder) is None and not train.finished_before(folder)
    assert (folder / "slot-0" / "COMPLETE").exists()  # rewritten, not deleted: S3's copy would come back


@pytest.mark.slow  # real torchrun launches
def test_a_finished_training_marks_its_folder_finished(workspace, runs):
    out = workspace / "interrupted"
    assert (out / "checkpoints" / "TRAINING").read_text() == "finished\n"
    assert "resumed from checkpoint" in runs["resumed"] and "starting afresh" not in runs["resumed"]


def test_native_backend_takes_the_shared_loop_on_device_neuron():
    """--backend native: device "neuron" where TorchNeuron is the accelerator (faked here), with the CUDA/CPU loop's
    DDP and torch.compile, Neuron's compiler backend over fixed length buckets; refused in one line without it."""
    train = load_train_module()
    assert train.device_type_for("native", xla=True, neuron=True, cuda=False) == "neuron"
    assert train.device_type_for("xla", xla=True, neuron=True, cuda=False) == "xla"
    assert train.device_type_for("xla", xla=False, neuron=False, cuda=False) == "cpu"
    with pytest.raises(ValueError, match="--backend native: no TorchNeuron device 'neuron' here"):
        train.device_type_for("native", xla=True, neuron=False, cuda=True)
    assert train.parse_args([*config_arguments(), "--backend", "native"]).backend == "native"
    neuron = train.Runtime(torch.device("cpu"), "neuron", 0, 1, False, True, True)
    assert neuron.fixed_shapes and not neuron.xla
    assert neuron.compile_options() == {"backend": "neuron", "dynamic": False}
    cpu = train.Runtime(torch.device("cpu"), "cpu", 0, 1, False, False, False)
    assert not cpu.fixed_shapes and cpu.compile_options() == {"dynamic": True}


def test_the_native_path_imports_torch_neuronx_and_joins_the_neuron_backend(monkeypatch, tmp_path):
    """As Neuron's torch-distributed guide: `import torch_neuronx` (which registers the device and the distributed
    backend "neuron") before the device is looked for, then init_process_group(backend="neuron")."""
    import types

    train = load_train_module()
    assert not train.neuron_available()  # no TorchNeuron here
    (tmp_path / "torch_neuronx.py").write_text("")  # registers "neuron" when imported (see is_available below)
    monkeypatch.syspath_prepend(str(tmp_path))
    joined, devices = [], []
    monkeypatch.setattr(train.torch, "accelerator", types.SimpleNamespace(
        is_available=lambda: "torch_neuronx" in sys.modules, set_device_index=devices.append,
        current_accelerator=lambda: types.SimpleNamespace(type="neuron")))
    monkeypatch.setattr(train.torch, "device", lambda kind, index=None: (kind, index))
    monkeypatch.setattr(train.dist, "init_process_group", lambda *args, **kwargs: joined.append((args, kwargs)))
    monkeypatch.setattr(train.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(train.dist, "get_world_size", lambda: 2)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delitem(sys.modules, "torch_neuronx", raising=False)
    rt = train.setup(train.parse_args([*config_arguments(), "--backend", "native"]))
    assert (rt.device_type, rt.device, rt.rank, rt.world_size) == ("neuron", ("neuron", 1), 1, 2)
    assert joined == [((), {"backend": "neuron"})] and devices == [1]
    monkeypatch.delitem(sys.modules, "torch_neuronx")


GLOO_RANK_ENDS = """
import atexit, importlib.util, os, sys, torch
spec = importlib.util.spec_from_file_location("train", sys.argv[1])
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
train.dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
torch.optim.AdamW(model.parameters(), fused=True)  # imports torch._dynamo, which keeps the group alive
model(torch.ones(1, 4)).sum().backward()
atexit.register(print, "finalized")
rt = train.Runtime(torch.device("cpu"), "cpu", 0, 1, True, False, False)
print("ending", end="")
rt.end(int(sys.argv[3]))
print("not ended")
"""


@pytest.mark.parametrize("code", [0, 143])
def test_a_gloo_rank_ends_at_once_without_finalizing_the_interpreter(tmp_path, code):
    """Gloo's workers may still free a collective's tensors, which needs the GIL, when the interpreter finalizes:
    the rank would abort (or, its group freed by DDP's reducer, deadlock) after the training succeeded. end() leaves
    the group and ends the process, with its exit code and its output flushed, before any of that can happen."""
    done = subprocess.run([sys.executable, "-c", GLOO_RANK_ENDS, str(TRAIN), str(tmp_path / "store"), str(code)],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert done.stdout == "ending", done.stdout


@pytest.mark.slow  # real torchrun launches
def test_a_sigterm_far_from_the_next_read_out_still_checkpoints(workspace):
    """torchrun SIGKILLs its workers 30 s after forwarding a SIGTERM (the local runner sooner): with the next log
    read-out far away, the ranks agree on the stop between read-outs, checkpoint and exit 143."""
    out = workspace / "far-read-out"
    extra = ("--epochs", "1000", "--log-interval", "100000", "--checkpoint-interval", "0", "--checkpoint-minutes", "0")
    proc = torchrun(workspace, out, extra, start_new_session=True)
    lines = []
    for line in proc.stdout:  # until the loop runs
        lines.append(line)
        if "steps_per_epoch=" in line:
            break
    time.sleep(2.0)
    assert proc.poll() is None, "".join(lines)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    log = "".join(lines) + finish(proc, timeout=60)
    assert time.monotonic() - signalled < 25, log
    assert re.search(r"stopping on SIGTERM at step=\d+", log) and "saved checkpoint" in log, log
    assert list((out / "checkpoints").glob("slot-*/COMPLETE")), log


def test_an_empty_split_is_no_split_and_bad_labels_name_their_folder(workspace, tmp_path):
    """Tokenize writes one empty file for an empty split: its accuracy is unknown (None), not NaN. Labels other
    than 0/1 stop the run with the folder named, not an IndexError deep in the loss."""
    import pyarrow.parquet as pq

    train = load_train_module()
    source = next((workspace / "data" / "validation").glob("*.parquet"))
    table = pq.read_table(source)
    (tmp_path / "empty").mkdir()
    pq.write_table(table.slice(0, 0), tmp_path / "empty" / "part-0.parquet")
    assert train.load_split(str(tmp_path / "empty"), 64) is None
    assert train.load_split(str(tmp_path / "absent"), 64) is None
    (tmp_path / "bad").mkdir()
    labels = table.column("label").to_numpy().copy()
    labels[3] = 2
    pq.write_table(table.set_column(table.column_names.index("label"), "label",
                                    pa_array(labels, table.schema.field("label").type)), tmp_path / "bad" / "p.parquet")
    with pytest.raises(ValueError, match=r"bad: labels \[2\]: expected ids 0 to 1 of negative, positive"):
        train.TokenizedSplit(str(tmp_path / "bad"), 64)


@pytest.mark.parametrize("argument", ["--epochs", "--batch-size", "--grad-accum", "--log-interval"])
def test_counts_below_one_are_refused(argument, capsys):
    with pytest.raises(SystemExit) as stopped:
        load_train_module().parse_args([*config_arguments(), argument, "0"])
    assert stopped.value.code == 2 and f"{argument} 0: expected a whole number >= 1" in capsys.readouterr().err


def pa_array(values, kind):
    import pyarrow as pa

    return pa.array(values, type=kind)
