"""Tests of steps/evaluate.py and the shipped accuracy metric, with a tiny random BERT classifier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fixtures_ml import STEPS, build_model, build_tokenizer, load_step

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

ev = load_step("evaluate")
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}  # a tiny model runs fastest on one thread
LABELS = [1, 0, 1, 1, 0, 0, 0]  # 3 positive of 7


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model")
    return build_model(root / "model", build_tokenizer(root / "tok"), seed=1)


def tarball(folder: Path, dest: Path) -> Path:
    """A SageMaker-style model.tar.gz (files at the archive root) in dest."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest / "model.tar.gz", "w:gz") as tar:
        for path in sorted(folder.iterdir()):
            tar.add(path, arcname=path.name)
    return dest


def write_split(folder: Path, rows: list[tuple[list[int], list[int], int]], shards: int = 2) -> Path:
    """Parquet shards in the preprocess format."""
    folder.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("input_ids", pa.list_(pa.int32())), ("token_type_ids", pa.list_(pa.int8())),
                        ("label", pa.int8()), ("length", pa.int32())])
    for i in range(shards):
        part = rows[i::shards]
        pq.write_table(pa.table({"input_ids": [r[0] for r in part], "token_type_ids": [r[1] for r in part],
                                 "label": [r[2] for r in part], "length": [len(r[0]) for r in part]},
                                schema=schema), folder / f"part-{i:05d}.parquet")
    return folder


Row = tuple[list[int], list[int], int]


def random_rows(n: int, seed: int = 0, labels: list[int] | None = None) -> list[Row]:
    """Sentence pairs of random tokens ([CLS]=2, [SEP]=3), varied lengths, random or given labels."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        a = rng.integers(5, 200, rng.integers(1, 6)).tolist()
        b = rng.integers(5, 200, rng.integers(1, 40)).tolist()
        ids = [2, *a, 3, *b, 3]
        types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        rows.append((ids, types, labels[i] if labels else int(rng.integers(0, 2))))
    return rows


def constant_model(model_dir: Path, dest: Path, label: int) -> Path:
    """A copy of the model whose classifier always answers `label` (weights 0, bias favours it)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir))
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([1.0 - label, float(label)]))
    model.save_pretrained(str(dest))
    return dest


def split_at_median(model_dir: Path, dest: Path, rows: list[Row]) -> Path:
    """A copy of the model whose classifier puts half of `rows` on each side (threshold between two scores),
    so that a random model predicts both classes."""
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    with torch.no_grad():
        direction = model.classifier.weight[1] - model.classifier.weight[0]
        model.classifier.weight.copy_(torch.stack([torch.zeros_like(direction), direction * 100]))
        scores = sorted(float(model.bert(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types]))
                              .pooler_output[0] @ model.classifier.weight[1]) for ids, types, _ in rows)
        middle = len(scores) // 2
        model.classifier.bias.copy_(torch.tensor([0.0, -(scores[middle - 1] + scores[middle]) / 2]))
    model.save_pretrained(str(dest))
    return dest


def evaluate(model: Path, test: Path, out: Path, batch_size: int = 3) -> dict:
    argv = ["--model-dir", str(model), "--test-dir", str(test), "--output-dir", str(out),
            "--batch-size", str(batch_size)]
    assert ev.main(argv) == 0
    return json.loads((out / "evaluation.json").read_text())


def test_cli_on_model_tarball_matches_row_by_row_predictions(model_dir: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification

    rows = random_rows(40, seed=3)
    test = write_split(tmp_path / "test", rows)
    model_dir = split_at_median(model_dir, tmp_path / "model", rows)
    cmd = [sys.executable, str(STEPS / "evaluate.py"), "--model-dir", str(tarball(model_dir, tmp_path / "m")),
           "--test-dir", str(test), "--output-dir", str(tmp_path / "eval"), "--batch-size", "8"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=ONE_THREAD)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "eval" / "evaluation.json").read_text())

    # independent predictions: one unpadded row at a time, in file order
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    ordered = [r for i in range(2) for r in rows[i::2]]
    with torch.inference_mode():
        preds = np.array([int(model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types]))
                              .logits.argmax(-1)) for ids, types, _ in ordered])
    labels = np.array([r[2] for r in ordered])
    tp, fp = int(((preds == 1) & (labels == 1)).sum()), int(((preds == 1) & (labels == 0)).sum())
    fn, tn = int(((preds == 0) & (labels == 1)).sum()), int(((preds == 0) & (labels == 0)).sum())
    assert 0 < tp + fp < 40, "the random model should predict both classes for a meaningful test"

    assert set(result) == {"metrics", "confusion_matrix", "samples", "inference"}
    assert set(result["metrics"]) == {"accuracy", "precision", "recall", "f1", "int8_accuracy"}
    for metric in result["metrics"].values():
        assert metric["standard_deviation"] == "NaN" and isinstance(metric["value"], float)
    assert result["samples"] == 40
    assert result["metrics"]["accuracy"]["value"] == pytest.approx((tp + tn) / 40, abs=1e-12)
    precision, recall = tp / (tp + fp), (tp / (tp + fn) if tp + fn else 0.0)
    assert result["metrics"]["precision"]["value"] == pytest.approx(precision)
    assert result["metrics"]["recall"]["value"] == pytest.approx(recall)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    assert result["metrics"]["f1"]["value"] == pytest.approx(f1)
    assert result["confusion_matrix"] == {"0": {"0": tn, "1": fp}, "1": {"0": fn, "1": tp}}

    inference = result["inference"]
    assert inference["fp32_accuracy"] == result["metrics"]["accuracy"]["value"]
    assert inference["int8_accuracy"] == result["metrics"]["int8_accuracy"]["value"]
    assert inference["tolerance"] == 0.005
    expected = "int8" if inference["int8_accuracy"] >= inference["fp32_accuracy"] - 0.005 else "none"
    assert inference["quantize"] == expected


def test_int8_accuracy_is_that_of_the_quantized_model(model_dir: Path, tmp_path: Path) -> None:
    """Batch size 1, so that no padding enters the per-batch activation scales of dynamic quantization."""
    import torch
    from transformers import AutoModelForSequenceClassification

    rows = random_rows(40, seed=3)
    model_dir = split_at_median(model_dir, tmp_path / "model", rows)
    result = evaluate(model_dir, write_split(tmp_path / "test", rows), tmp_path / "eval", batch_size=1)
    fp32 = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    int8 = ev.quantize_int8(AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval())
    assert sum(isinstance(m, torch.nn.Linear) for m in int8.modules()) == 0, "every Linear layer is quantized"
    with torch.inference_mode():
        correct = {name: [int(model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types]))
                              .logits.argmax(-1)) == label for ids, types, label in rows]
                   for name, model in (("fp32", fp32), ("int8", int8))}
    assert result["metrics"]["accuracy"]["value"] == pytest.approx(np.mean(correct["fp32"]), abs=1e-12)
    assert result["metrics"]["int8_accuracy"]["value"] == pytest.approx(np.mean(correct["int8"]), abs=1e-12)


@pytest.mark.parametrize(
    ("fp32", "int8", "tolerance", "chosen"),
    [(0.90, 0.90, 0.005, "int8"), (0.90, 0.896, 0.005, "int8"), (0.90, 0.894, 0.005, "none"),
     (0.90, 0.95, 0.0, "int8"), (0.90, 0.8999, 0.0, "none"), (0.90, None, 0.005, "none")],
)
def test_int8_is_served_only_within_the_tolerance(fp32: float, int8: float | None, tolerance: float,
                                                  chosen: str) -> None:
    section = ev.choose_variant(fp32, int8, tolerance, "--no-int8 was given")
    assert section["quantize"] == chosen
    assert section["fp32_accuracy"] == fp32 and section["int8_accuracy"] == int8
    assert ("--no-int8" in section["reason"]) == (int8 is None)


def test_no_int8_serves_fp32_and_scores_once(model_dir: Path, tmp_path: Path) -> None:
    test = write_split(tmp_path / "test", random_rows(12, seed=9))
    argv = ["--model-dir", str(model_dir), "--test-dir", str(test), "--output-dir", str(tmp_path / "out"),
            "--no-int8"]
    assert ev.main(argv) == 0
    result = json.loads((tmp_path / "out" / "evaluation.json").read_text())
    assert "int8_accuracy" not in result["metrics"]
    assert result["inference"]["quantize"] == "none" and result["inference"]["int8_accuracy"] is None


@pytest.mark.parametrize("label", [1, 0])
def test_hand_computed_metrics_for_a_constant_model(model_dir: Path, tmp_path: Path, label: int) -> None:
    model = constant_model(model_dir, tmp_path / "model", label)
    test = write_split(tmp_path / "test", random_rows(len(LABELS), labels=LABELS), shards=1)
    result = evaluate(model, test, tmp_path / "eval")
    values = {k: v["value"] for k, v in result["metrics"].items() if k != "int8_accuracy"}
    if label == 1:  # always positive: 3 of 7 right, every positive found
        assert values == pytest.approx({"accuracy": 3 / 7, "precision": 3 / 7, "recall": 1.0, "f1": 0.6})
        assert result["confusion_matrix"] == {"0": {"0": 0, "1": 4}, "1": {"0": 0, "1": 3}}
    else:  # always negative: 4 of 7 right, no positive predicted
        assert values == pytest.approx({"accuracy": 4 / 7, "precision": 0.0, "recall": 0.0, "f1": 0.0})
        assert result["confusion_matrix"] == {"0": {"0": 4, "1": 0}, "1": {"0": 3, "1": 0}}
    assert result["samples"] == 7


def test_batch_size_does_not_change_predictions(model_dir: Path, tmp_path: Path) -> None:
    test = write_split(tmp_path / "test", random_rows(30, seed=5))
    a = evaluate(model_dir, test, tmp_path / "a", batch_size=1)
    b = evaluate(model_dir, test, tmp_path / "b", batch_size=7)
    assert a == b


def test_shipped_accuracy_metric_loads_by_path() -> None:
    import evaluate as hf_evaluate

    metric = hf_evaluate.load(str(STEPS / "metrics" / "accuracy"), keep_in_memory=True)
    assert metric.compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0])["accuracy"] == 0.75


def test_missing_model_fails_naming_the_path(tmp_path: Path) -> None:
    test = write_split(tmp_path / "test", random_rows(4))
    (tmp_path / "empty").mkdir()
    cmd = [sys.executable, str(STEPS / "evaluate.py"), "--model-dir", str(tmp_path / "empty"),
           "--test-dir", str(test), "--output-dir", str(tmp_path / "eval")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ONE_THREAD)
    assert proc.returncode != 0
    assert str(tmp_path / "empty") in proc.stderr and "config.json" in proc.stderr
    assert not (tmp_path / "eval" / "evaluation.json").exists()


def test_bad_inputs_fail_with_messages(model_dir: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture) -> None:
    test = write_split(tmp_path / "test", random_rows(4))

    def fails(model: Path, test_dir: Path, *expected: str) -> None:
        assert ev.main(["--model-dir", str(model), "--test-dir", str(test_dir),
                        "--output-dir", str(tmp_path / "eval")]) == 1
        err = capsys.readouterr().err
        for text in expected:
            assert text in err, err

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "model.tar.gz").write_bytes(b"not a tarball")
    fails(corrupt, test, str(corrupt / "model.tar.gz"), "not a readable tar.gz")

    broken = tmp_path / "broken"
    broken.mkdir()
    for f in model_dir.iterdir():
        (broken / f.name).write_bytes(b"garbage" if f.suffix == ".safetensors" else f.read_bytes())
    fails(broken, test, "cannot load the model from", str(broken))

    fails(tmp_path / "nowhere", test, str(tmp_path / "nowhere"), "does not exist")
    fails(model_dir, tmp_path / "no-test", "no Parquet files", str(tmp_path / "no-test"))
    (tmp_path / "bad-test").mkdir()
    (tmp_path / "bad-test" / "part-00000.parquet").write_bytes(b"garbage")
    fails(model_dir, tmp_path / "bad-test", "cannot read", "part-00000.parquet")
