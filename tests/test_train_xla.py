"""training/train.py on the XLA path (torch_xla on CPU, PJRT_DEVICE=CPU, one process): graphs stay bounded, and the
precompile pass (what neuron_parallel_compile runs ahead of the job) traces every graph the training run compiles.

Needs torch_xla (skipped without it), e.g. in a separate venv:
`pip install torch==2.9.0 torch_xla==2.9.0 transformers pyarrow pytest`, then
`PJRT_DEVICE=CPU python -m pytest tests/test_train_xla.py`.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch_xla")

from fixtures_train import make_tiny_model, write_split  # noqa: E402

TRAIN = Path(__file__).resolve().parents[1] / "training" / "train.py"
# 20 balanced test rows: a coin scores >= 0.8 with probability 0.006; this run scores 1.0 (on the CPU path as well).
BETTER_THAN_CHANCE = 0.8
CLEAR = {  # (title, content) in the task's own words (fixtures_train), and the label; 1: positive
    ("excellent", "great product, i love it: wonderful, perfect and fantastic. happy to recommend it"): 1,
    ("terrible", "awful product, i hate it: broken and poor, a waste. disappointed, i want a refund"): 0,
}
# Graphs compiled once whatever the number of buckets: the first optimizer step (AdamW creates its state), the
# loss read-out at each log interval, and the fresh on-device loss accumulator after each read-out.
FIXED_TRAIN_GRAPHS = 3


def train_xla(tmp_path: Path, out: str, *args: str) -> None:
    """One train.py run on the XLA CPU device writing into tmp_path/out; the graphs it compiles are recorded in the
    persistent cache tmp_path/out/xla-cache, one file per graph hash (the CPU client writes them, cannot load them)."""
    env = {**os.environ, "PJRT_DEVICE": "CPU", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "XLA_PERSISTENT_CACHE_PATH": str(tmp_path / out / "xla-cache")}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    cmd = [
        sys.executable,
        str(TRAIN),
        "--model-id",
        str(tmp_path / "base-model"),
        "--train-dir",
        str(tmp_path / "train"),
        "--validation-dir",
        str(tmp_path / "validation"),
        "--test-dir",
        str(tmp_path / "test"),
        "--model-dir",
        str(tmp_path / out / "model"),
        "--output-data-dir",
        str(tmp_path / out / "output"),
        "--checkpoint-dir",
        str(tmp_path / out / "checkpoints"),
        "--epochs",
        "3",
        "--batch-size",
        "8",
        "--max-length",
        "128",
        "--learning-rate",
        "5e-3",
        "--log-interval",
        "4",
        "--checkpoint-interval",
        "0",
        "--seed",
        "3",
        # the rest of what the Train step passes (train.py requires them all), at the local profile's values
        "--max-steps",
        "-1",
        "--grad-accum",
        "1",
        "--lr-global-batch",
        "0",
        "--warmup-ratio",
        "0.1",
        "--weight-decay",
        "0.01",
        "--checkpoint-minutes",
        "30.0",
        "--bf16",
        "auto",
        "--backend",
        "xla",
        *args,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def graph_hashes(tmp_path: Path, out: str) -> set[str]:
    return {p.name for p in (tmp_path / out / "xla-cache").iterdir()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """Data, and a 3-epoch training run in it (out "run")."""
    tmp_path = tmp_path_factory.mktemp("xla")
    model = make_tiny_model(tmp_path / "base-model")
    write_split(tmp_path / "train", model, rows=96, seed=1, max_length=128, max_words=100)
    write_split(tmp_path / "validation", model, rows=24, seed=2, max_length=128, max_words=100)
    write_split(tmp_path / "test", model, rows=20, seed=4, max_length=128, max_words=100)
    train_xla(tmp_path, "run")
    return tmp_path


def test_compiled_graphs_are_one_per_length_bucket_and_never_recompiled(trained):
    tmp_path = trained
    stats = json.loads((tmp_path / "run" / "output" / "training_stats.json").read_text())
    assert stats["device"] == "xla" and stats["bf16"] is True and stats["length_buckets"] == [32, 64, 128]

    spec = importlib.util.spec_from_file_location("train_under_test", TRAIN)
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    lengths = train.TokenizedSplit(str(tmp_path / "train"), 128).lengths
    batches = train.train_batches(lengths, 8, seed=3, epoch=0, rank=0, world_size=1)
    used = {train.pad_length(int(lengths[b].max()), stats["length_buckets"], 1) for b in batches}
    assert used == {32, 64, 128}
    if os.environ.get("KEEP_ARTIFACT_DIR"):  # CI serves this artifact under the inference image's transformers
        shutil.copytree(tmp_path / "run" / "model", os.environ["KEEP_ARTIFACT_DIR"], dirs_exist_ok=True)

    per_epoch = stats["compile_count_per_epoch"]
    assert per_epoch[0] == len(used) + FIXED_TRAIN_GRAPHS, stats
    assert per_epoch == [per_epoch[0]] * 3, "recompiled after the first epoch"
    assert (tmp_path / "run" / "model" / "model.safetensors").exists()
    # the whole test split scored on the XLA device, one prediction per row, in the split's order
    import pyarrow.parquet as pq

    predictions = pq.read_table(tmp_path / "run" / "model" / "predictions" / "test.parquet").to_pydict()
    assert predictions["label"] == train.TokenizedSplit(str(tmp_path / "test"), 128).labels.tolist()
    assert sum(predictions["label"]) == 10  # balanced: one label always scores 0.5
    assert stats["test_rows"] == 20 and stats["test_accuracy"] >= BETTER_THAN_CHANCE, stats
    right = sum(p == label for p, label in zip(predictions["prediction"], predictions["label"], strict=True))
    assert right / 20 == pytest.approx(stats["test_accuracy"])
    assert clear_labels(tmp_path / "run" / "model") == list(CLEAR.values())


def test_the_precompile_pass_traces_every_graph_the_training_run_compiles(trained):
    """The training run compiles no graph that the short precompile pass did not: each length bucket's step, the
    first optimizer step (AdamW's state), the read-out, and the evaluation of both splits with their real sizes."""
    tmp_path = trained
    train_xla(tmp_path, "precompile", "--precompile", "True")
    stats = json.loads((tmp_path / "precompile" / "output" / "training_stats.json").read_text())
    assert stats["precompile"] is True and stats["steps"] == 4, stats  # 3 buckets, the first again
    assert not (tmp_path / "precompile" / "model").exists()
    missing = graph_hashes(tmp_path, "run") - graph_hashes(tmp_path, "precompile")
    assert not missing, f"{len(missing)} graph(s) of the training run compile in the job: {sorted(missing)}"


def clear_labels(model_dir: Path) -> list[int]:
    """The labels the saved model gives the CLEAR reviews, on the CPU."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    encoded = tokenizer([t for t, _ in CLEAR], [c for _, c in CLEAR], padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**encoded).logits.argmax(-1).tolist()


def test_a_checkpoint_is_written_through_xm_save_and_loads_on_the_cpu(trained):
    """Checkpoints leave the XLA device through xm.save (torch_xla's public API), in one transfer: the file holds
    host tensors and the step, and its marker names its size and digest."""
    import hashlib

    import torch

    train_xla(trained, "checkpointed", "--max-steps", "3", "--checkpoint-interval", "3", "--max-length", "32")
    slots = sorted((trained / "checkpointed" / "checkpoints").glob("slot-*/COMPLETE"))
    assert slots, "no complete checkpoint"
    marker = json.loads(slots[-1].read_text())
    path = slots[-1].parent / "checkpoint.pt"
    assert marker["bytes"] == path.stat().st_size and marker["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    state = torch.load(path, weights_only=False)
    assert state["step"] == 3 and state["world_size"] == 1
    tensors = [t for t in state["model"].values() if isinstance(t, torch.Tensor)]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    assert all(t.device.type == "cpu" for group in state["optimizer"]["state"].values() for t in group.values()
               if isinstance(t, torch.Tensor))
