"""Tests of steps/evaluation/ (evaluate.py, quality.py, the shipped accuracy metric) with a tiny random BERT."""

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
from fixtures_ml import STEPS, add_serving_code, build_model, build_tokenizer, step_arguments, write_tokenized

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from steps.evaluation import baseline, quality
from steps.evaluation import evaluate as ev

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
    return add_serving_code(build_model(root / "model", build_tokenizer(root / "tok"), seed=1))


def tarball(folder: Path, dest: Path) -> Path:
    """A SageMaker-style model.tar.gz (files at the archive root) in dest."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest / "model.tar.gz", "w:gz") as tar:
        for path in sorted(folder.iterdir()):
            tar.add(path, arcname=path.name)
    return dest


Row = tuple[list[int], list[int], int]


def write_split(folder: Path, rows: list[Row], shards: int = 2, names: tuple[str, ...] = ("negative", "positive")
                ) -> Path:
    """Parquet shards written by preprocess.py's own writer, rows in order."""
    return write_tokenized(folder, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], shards,
                           names=names)


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


def save_copy(model, model_dir: Path, dest: Path) -> Path:
    """The model saved with model_dir's tokenizer and the serving code, as train.py saves an artifact."""
    import shutil

    model.save_pretrained(str(dest))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / name, dest / name)
    return add_serving_code(dest)


def constant_model(model_dir: Path, dest: Path, label: int) -> Path:
    """A copy of the model whose classifier always answers `label` (weights 0, bias favours it)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir))
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([1.0 - label, float(label)]))
    return save_copy(model, model_dir, dest)


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
    return save_copy(model, model_dir, dest)


def row_by_row(model_dir: Path, rows: list[Row], quantize: bool = False, fp16: bool = False) -> np.ndarray:
    """Independent margins: one unpadded row at a time."""
    import torch
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    model = ev.serving_handler(model_dir).quantize_int8(model) if quantize else model.half() if fp16 else model
    with torch.inference_mode():
        logits = [model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])).logits[0]
                  for ids, types, _ in rows]
    return np.array([float(x[1] - x[0]) for x in logits])


def write_predictions(model_dir: Path, rows: list[Row], margins: np.ndarray) -> Path:
    """What train.py ships: predictions/test.parquet with label, prediction and margin per test row."""
    (model_dir / "predictions").mkdir(exist_ok=True)
    table = pa.table({"label": pa.array([r[2] for r in rows], pa.int8()),
                      "prediction": pa.array((margins > 0).astype(np.int8)),
                      "margin": pa.array(margins.astype(np.float32))})
    pq.write_table(table, model_dir / "predictions" / "test.parquet")
    return model_dir


def evaluate(model: Path, test: Path, out: Path, *extra: str, batch_size: int = 3, onnx: bool = False) -> dict:
    """The step on these inputs; the ONNX Runtime variants (an export each time) only when asked for."""
    argv = [*step_arguments("Evaluate"), "--model-dir", str(model), "--test-dir", str(test), "--output-dir", str(out),
            "--serving-dir", str(out / "serving"), "--batch-size", str(batch_size), *extra]
    argv += [] if onnx else ["--no-onnx"]
    assert ev.main(argv) == 0
    return json.loads((out / "evaluation.json").read_text())


@pytest.mark.slow  # the whole Evaluate step as a process
def test_cli_on_model_tarball_matches_row_by_row_predictions(model_dir: Path, tmp_path: Path) -> None:
    """No predictions in the artifact: every test row is scored here on CPU."""
    rows = random_rows(40, seed=3)
    test = write_split(tmp_path / "test", rows)
    model_dir = split_at_median(model_dir, tmp_path / "model", rows)
    cmd = [sys.executable, "-m", "steps.evaluation", *step_arguments("Evaluate"),
           "--model-dir", str(tarball(model_dir, tmp_path / "m")),
           "--test-dir", str(test), "--output-dir", str(tmp_path / "eval"), "--serving-dir", str(tmp_path / "serving"),
           "--batch-size", "8"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=ONE_THREAD)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "eval" / "evaluation.json").read_text())

    margins = row_by_row(model_dir, rows)
    preds, labels = (margins > 0).astype(int), np.array([r[2] for r in rows])
    tp, fp = int(((preds == 1) & (labels == 1)).sum()), int(((preds == 1) & (labels == 0)).sum())
    fn, tn = int(((preds == 0) & (labels == 1)).sum()), int(((preds == 0) & (labels == 0)).sum())
    assert 0 < tp + fp < 40, "the random model should predict both classes for a meaningful test"

    assert set(result) == {"version", "binary_classification_metrics", "classification", "labels", "dataset", "check",
                           "inference", "seconds", "tracking"}
    assert result["labels"] == {"names": ["negative", "positive"], "count": 2, "digest": "af627d94d1fc9a77"}
    assert result["tracking"] == {"run_id": "none", "experiment": "trainium-bert"}  # no MLflow environment: untracked
    metrics = result["binary_classification_metrics"]
    for name in ("accuracy", "precision", "recall", "f1", "auc", "true_positive_rate", "false_positive_rate"):
        assert isinstance(metrics[name]["value"], float) and metrics[name]["standard_deviation"] == "NaN"  # 40 rows
    assert result["dataset"] == {"rows": 40, "positives": int(labels.sum()), "predictions": "this step (cpu)",
                                 "per_class": {"negative": 40 - int(labels.sum()), "positive": int(labels.sum())}}
    assert metrics["accuracy"]["value"] == pytest.approx((tp + tn) / 40, abs=1e-12)
    precision, recall = tp / (tp + fp), (tp / (tp + fn) if tp + fn else 0.0)
    assert metrics["precision"]["value"] == pytest.approx(precision)
    assert metrics["recall"]["value"] == pytest.approx(recall)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    assert metrics["f1"]["value"] == pytest.approx(f1)
    assert metrics["confusion_matrix"] == {"0": {"0": tn, "1": fp}, "1": {"0": fn, "1": tp}}
    pairs = [(pos > neg) + 0.5 * (pos == neg) for pos in margins[labels == 1] for neg in margins[labels == 0]]
    assert metrics["auc"]["value"] == pytest.approx(np.mean(pairs))

    inference = result["inference"]
    assert inference["fp32_accuracy"] == metrics["accuracy"]["value"] == inference["sample_fp32_accuracy"]
    assert inference["sample_size"] == 40 and inference["tolerance"] == 0.005
    tried = inference["candidates"]  # fastest first, until one is within the tolerance
    assert [c["variant"] for c in tried] == ["onnxruntime-int8", "onnxruntime-fp32", "torch-int8"][: len(tried)]
    for candidate in tried:
        low, high = candidate["accuracy_loss_ci95"]
        assert low <= candidate["accuracy_loss"] <= high and candidate["chosen"] == (high <= 0.005)
    assert inference["variant"] == next((c["variant"] for c in tried if c["chosen"]), "torch-fp32")
    assert result["check"]["passed"] and result["check"]["agreement"] == 1.0
    assert (tmp_path / "serving" / "model.tar.gz").is_file()


def test_whole_split_metrics_come_from_the_train_steps_predictions(model_dir: Path, tmp_path: Path) -> None:
    """With predictions/test.parquet, every row counts in the gate's accuracy; only a sample is scored here."""
    rows = random_rows(60, seed=4)
    model = split_at_median(model_dir, tmp_path / "model", rows)
    margins = row_by_row(model, rows)
    write_predictions(model, rows, margins)
    result = evaluate(model, write_split(tmp_path / "test", rows), tmp_path / "eval", "--sample-size", "20")
    labels = np.array([r[2] for r in rows])
    metrics = result["binary_classification_metrics"]
    assert result["dataset"]["predictions"] == "train step" and result["dataset"]["rows"] == 60
    assert metrics["accuracy"]["value"] == pytest.approx(float(np.mean((margins > 0) == (labels == 1))))
    check = result["check"]
    assert check["sample_size"] == 20 and check["agreement"] == 1.0 and check["passed"]
    low, high = check["agreement_ci95"]
    assert 0.8 < low < 1.0 == high  # the Wilson interval of 20 of 20
    sample = ev.stratified_sample(labels, 20, 42)
    assert abs(int(labels[sample].sum()) - round(20 * labels.mean())) <= 1  # stratified by label
    assert result["inference"]["sample_size"] == 20


def test_predictions_of_another_model_fail_the_check(model_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    rows = random_rows(30, seed=6)
    model = split_at_median(model_dir, tmp_path / "model", rows)
    write_predictions(model, rows, -row_by_row(model, rows))  # every prediction flipped
    test = write_split(tmp_path / "test", rows)
    argv = [*step_arguments("Evaluate"),
            "--model-dir", str(model), "--test-dir", str(test), "--output-dir", str(tmp_path / "eval")]
    assert ev.main(argv) == 1
    assert "disagree on 30 of 30 sampled test rows" in capsys.readouterr().err

    write_predictions(model, rows[:-1], row_by_row(model, rows[:-1]))  # one row short: another test split
    assert ev.main(argv) == 1
    assert "does not match the test split (30 rows" in capsys.readouterr().err


def test_torch_int8_accuracy_is_that_of_the_quantized_model(model_dir: Path, tmp_path: Path) -> None:
    import torch

    rows = random_rows(40, seed=3)
    model_dir = split_at_median(model_dir, tmp_path / "model", rows)
    result = evaluate(model_dir, write_split(tmp_path / "test", rows), tmp_path / "eval", "--int8-tolerance", "1")
    handler = ev.serving_handler(model_dir)
    from transformers import AutoModelForSequenceClassification

    int8 = handler.quantize_int8(AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval())
    assert sum(isinstance(m, torch.nn.Linear) for m in int8.modules()) == 0, "every Linear layer is quantized"
    labels = np.array([r[2] for r in rows]) == 1
    fp32_correct = (row_by_row(model_dir, rows) > 0) == labels
    int8_correct = (row_by_row(model_dir, rows, quantize=True) > 0) == labels  # one row at a time, as served
    inference = result["inference"]
    assert result["binary_classification_metrics"]["accuracy"]["value"] == pytest.approx(fp32_correct.mean())
    assert inference["variant"] == "torch-int8" and inference["runtime"] == "torch" and inference["quantize"] == "int8"
    assert inference["accuracy"] == pytest.approx(int8_correct.mean(), abs=1e-12)
    assert inference["accuracy_loss"] == pytest.approx(fp32_correct.mean() - int8_correct.mean())
    assert "no ONNX Runtime variant: --no-onnx was given" in inference["reason"] and inference["onnx"] is None


def test_a_gpu_serves_fp16_when_the_model_in_fp16_loses_no_accuracy_beyond_the_tolerance(model_dir: Path,
                                                                                          tmp_path: Path) -> None:
    """The fp16 model is scored on the sample (here the whole split) with the fp32 one's paired difference; within
    --fp16-tolerance a GPU serves it, else fp32, and --no-fp16 leaves it out; the report says why."""
    rows = random_rows(40, seed=3)
    model_dir = split_at_median(model_dir, tmp_path / "model", rows)
    test = write_split(tmp_path / "test", rows)
    labels = np.array([r[2] for r in rows]) == 1
    fp32_correct, fp16_correct = ((row_by_row(model_dir, rows, fp16=half) > 0) == labels for half in (False, True))
    gpu = evaluate(model_dir, test, tmp_path / "within", "--fp16-tolerance", "1")["inference"]["gpu"]
    assert gpu["precision"] == "fp16" and gpu["accuracy"] == pytest.approx(fp16_correct.mean(), abs=1e-12)
    assert gpu["accuracy_loss"] == pytest.approx(fp32_correct.mean() - fp16_correct.mean())
    assert gpu["reason"].startswith("fp16 loses") and gpu["reason"].endswith("within the tolerance 1")
    off = evaluate(model_dir, test, tmp_path / "off", "--no-fp16")["inference"]["gpu"]
    assert off == {"precision": "fp32", "reason": "--no-fp16 was given"}


def onnx_row_by_row(graph: Path, rows: list[Row]) -> np.ndarray:
    """Margins of an ONNX graph, one row at a time, in a session made here."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    margins = []
    for ids, types, _ in rows:
        given = {"input_ids": [ids], "attention_mask": [[1] * len(ids)], "token_type_ids": [types]}
        feed = {i.name: np.array(given[i.name], np.int32 if "int32" in i.type else np.int64)
                for i in session.get_inputs()}
        logits = session.run(None, feed)[0][0]
        margins.append(float(logits[1] - logits[0]))
    return np.array(margins)


def test_the_onnxruntime_int8_variant_is_scored_and_shipped(model_dir: Path, tmp_path: Path) -> None:
    """Tolerance 1: the fastest variant is served; its accuracy is its graph's, row by row; the serving archive is
    the Train step's plus that graph and the runtime."""
    import onnxruntime

    rows = random_rows(40, seed=3)
    model = split_at_median(model_dir, tmp_path / "model", rows)
    archive = tarball(model, tmp_path / "input")
    result = evaluate(archive, write_split(tmp_path / "test", rows), tmp_path / "eval", "--int8-tolerance", "1",
                      onnx=True)
    inference = result["inference"]
    assert inference["variant"] == "onnxruntime-int8" and len(inference["candidates"]) == 1
    assert (inference["runtime"], inference["quantize"]) == ("onnxruntime", "int8")
    assert inference["onnx"]["onnxruntime"] == onnxruntime.__version__ and inference["onnx"]["fused"]["Attention"] == 2
    assert inference["onnx"]["packages"]["onnxruntime"] == onnxruntime.__version__

    served = tmp_path / "served"
    with tarfile.open(tmp_path / "eval" / "serving" / "model.tar.gz") as tar:
        names = set(tar.getnames())
        tar.extractall(served, filter="data")
    with tarfile.open(archive / "model.tar.gz") as tar:
        assert {m.name for m in tar.getmembers() if m.isfile()} <= names  # every file the Train step shipped
    assert {"onnx/model-int8.onnx", "code/packages/onnxruntime/__init__.py"} <= names
    assert "onnx/model-fp32.onnx" not in names and not any("__pycache__" in n for n in names)
    labels = np.array([r[2] for r in rows]) == 1
    int8_correct = (onnx_row_by_row(served / "onnx" / "model-int8.onnx", rows) > 0) == labels
    assert inference["accuracy"] == pytest.approx(int8_correct.mean(), abs=1e-12)


def test_no_variant_within_tolerance_serves_the_train_steps_archive(model_dir: Path, tmp_path: Path) -> None:
    """Tolerance 0 and 40 rows: no interval can be within it; every variant is scored, torch fp32 is served, and the
    serving archive is the input archive, byte for byte."""
    rows = random_rows(40, seed=3)
    archive = tarball(split_at_median(model_dir, tmp_path / "model", rows), tmp_path / "input")
    result = evaluate(archive, write_split(tmp_path / "test", rows), tmp_path / "eval", "--int8-tolerance", "0",
                      onnx=True)
    inference = result["inference"]
    assert [c["variant"] for c in inference["candidates"]] == ["onnxruntime-int8", "onnxruntime-fp32", "torch-int8"]
    assert not any(c["chosen"] for c in inference["candidates"]) and inference["variant"] == "torch-fp32"
    assert inference["accuracy"] is None and "beyond the tolerance 0" in inference["reason"]
    served = (tmp_path / "eval" / "serving" / "model.tar.gz").read_bytes()
    assert served == (archive / "model.tar.gz").read_bytes()


def test_a_folder_input_is_never_written_and_is_packed_without_graphs(model_dir: Path, tmp_path: Path) -> None:
    model = save_copy(__import__("transformers").AutoModelForSequenceClassification.from_pretrained(str(model_dir)),
                      model_dir, tmp_path / "model")
    before = sorted(p.relative_to(model).as_posix() for p in model.rglob("*"))
    evaluate(model, write_split(tmp_path / "test", random_rows(12, seed=9)), tmp_path / "eval", "--int8-tolerance", "0",
             onnx=True)
    assert sorted(p.relative_to(model).as_posix() for p in model.rglob("*")) == before
    with tarfile.open(tmp_path / "eval" / "serving" / "model.tar.gz") as tar:
        assert sorted(tar.getnames()) == sorted(n for n in before if (model / n).is_file())


def test_a_failed_export_leaves_the_torch_variants(model_dir: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(root: Path) -> dict:
        raise RuntimeError("unsupported operator aten::frobnicate")

    monkeypatch.setattr(ev.serving, "build", fails)
    result = evaluate(model_dir, write_split(tmp_path / "test", random_rows(12, seed=9)), tmp_path / "eval",
                      "--int8-tolerance", "1", onnx=True)
    inference = result["inference"]
    assert inference["variant"] == "torch-int8" and inference["onnx"] is None
    assert "onnxruntime int8 not tried: RuntimeError: unsupported operator aten::frobnicate" in inference["reason"]


def test_no_int8_and_no_onnx_serve_torch_fp32_and_score_once(model_dir: Path, tmp_path: Path) -> None:
    test = write_split(tmp_path / "test", random_rows(12, seed=9))
    result = evaluate(model_dir, test, tmp_path / "out", "--no-int8")
    inference = result["inference"]
    assert inference["variant"] == "torch-fp32" and inference["candidates"] == []
    assert "--no-int8" in inference["reason"] and "--no-onnx" in inference["reason"]
    fp32_only = evaluate(model_dir, test, tmp_path / "fp32", "--no-int8", "--int8-tolerance", "1", onnx=True)
    assert fp32_only["inference"]["variant"] == "onnxruntime-fp32" and fp32_only["inference"]["quantize"] == "none"


def test_an_artifact_without_serving_code_serves_fp32(model_dir: Path, tmp_path: Path) -> None:
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(model_dir, bare, ignore=shutil.ignore_patterns("code"))
    result = evaluate(bare, write_split(tmp_path / "test", random_rows(8, seed=2)), tmp_path / "out")
    assert result["inference"]["variant"] == "torch-fp32" and "code/inference.py" in result["inference"]["reason"]


@pytest.mark.parametrize("label", [1, 0])
def test_hand_computed_metrics_for_a_constant_model(model_dir: Path, tmp_path: Path, label: int) -> None:
    model = constant_model(model_dir, tmp_path / "model", label)
    test = write_split(tmp_path / "test", random_rows(len(LABELS), labels=LABELS), shards=1)
    metrics = evaluate(model, test, tmp_path / "eval")["binary_classification_metrics"]
    values = {k: metrics[k]["value"] for k in ("accuracy", "precision", "recall", "f1")}
    if label == 1:  # always positive: 3 of 7 right, every positive found
        assert values == pytest.approx({"accuracy": 3 / 7, "precision": 3 / 7, "recall": 1.0, "f1": 0.6})
        assert metrics["confusion_matrix"] == {"0": {"0": 0, "1": 4}, "1": {"0": 0, "1": 3}}
    else:  # always negative: 4 of 7 right, no positive predicted
        assert values == pytest.approx({"accuracy": 4 / 7, "precision": 0.0, "recall": 0.0, "f1": 0.0})
        assert metrics["confusion_matrix"] == {"0": {"0": 4, "1": 0}, "1": {"0": 3, "1": 0}}
    # Model Monitor's best constant classifier always says positive (its doc's example: 1 positive of 4 -> 0.25)
    assert metrics["accuracy_best_constant_classifier"]["value"] == pytest.approx(3 / 7)
    assert metrics["precision_best_constant_classifier"]["value"] == pytest.approx(3 / 7)
    assert metrics["auc"]["value"] == 0.5  # one margin for every row: all ties


def test_a_one_class_split_writes_strict_json_with_nan_as_model_monitor_does(model_dir: Path, tmp_path: Path):
    """The AUC of a test split with one class is not a number: evaluation.json said NaN, a token JSON lacks
    (Studio's and any strict parser refuse the file); Model Monitor writes "NaN"."""
    model = constant_model(model_dir, tmp_path / "model", 1)
    test = write_split(tmp_path / "test", random_rows(5, labels=[1] * 5), shards=1)
    evaluate(model, test, tmp_path / "eval")

    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    report = json.loads((tmp_path / "eval" / "evaluation.json").read_text(), parse_constant=refuse)
    auc = report["binary_classification_metrics"]["auc"]
    assert auc == {"value": "NaN", "standard_deviation": "NaN"}


def test_batch_size_does_not_change_predictions(model_dir: Path, tmp_path: Path) -> None:
    test = write_split(tmp_path / "test", random_rows(30, seed=5))
    a = evaluate(model_dir, test, tmp_path / "a", batch_size=1)
    b = evaluate(model_dir, test, tmp_path / "b", batch_size=7)
    for report in (a, b):  # times, not predictions
        report.pop("seconds"), report["inference"].pop("p50_ms")
        assert all(candidate.pop("p50_ms") > 0 for candidate in report["inference"]["candidates"])
    assert a == b


def test_under_200_rows_there_are_no_standard_deviations_as_in_model_monitor() -> None:
    """Model Monitor gives standard deviations only from 200 samples (NaN below), and its binary report has the
    F0.5 and F2 of the best constant classifier too."""
    labels, margins = np.array([1, 0, 0, 1, 0, 0, 1]), np.array([1.0, -1.0, 0.5, 2.0, -0.5, -2.0, -0.1])
    metrics = quality.binary_classification_metrics(labels, margins)
    assert all(np.isnan(metrics[name]["standard_deviation"]) for name in ("accuracy", "f1", "auc"))
    assert metrics["accuracy"]["value"] == pytest.approx(5 / 7)
    share = 3 / 7
    assert metrics["f0_5_best_constant_classifier"]["value"] == pytest.approx(1.25 * share / (0.25 * share + 1))
    assert metrics["f2_best_constant_classifier"]["value"] == pytest.approx(5 * share / (4 * share + 1))
    assert metrics["f1_best_constant_classifier"]["value"] == pytest.approx(2 * share / (share + 1))
    many = quality.binary_classification_metrics(np.tile(labels, 40), np.tile(margins, 40))  # 280 rows
    assert 0 < many["accuracy"]["standard_deviation"] < 0.1 and 0 < many["auc"]["standard_deviation"] < 0.1


def test_a_curve_point_never_lies_inside_a_tie_of_margins() -> None:
    """No threshold separates rows of equal margin: with every margin equal the ROC is the diagonal's end points,
    whose area is the AUC (0.5), not a point inside the tie."""
    labels = np.array([1, 0, 1, 0] * 50)
    roc, pr = quality.curves(labels, np.zeros(200))
    assert roc == {"false_positive_rates": [0.0, 1.0], "true_positive_rates": [0.0, 1.0]}
    assert pr == {"precisions": [0.5], "recalls": [1.0]}
    margins = np.repeat(np.arange(10.0, 0.0, -1.0), 20)  # ten tie groups of 20 rows
    labels = (np.arange(200) % 3 == 0).astype(int)
    roc, _ = quality.curves(labels, margins)
    fpr, tpr = roc["false_positive_rates"], roc["true_positive_rates"]
    area = sum((fpr[i + 1] - fpr[i]) * (tpr[i + 1] + tpr[i]) / 2 for i in range(len(fpr) - 1))
    assert area == pytest.approx(quality.auc(labels, margins), abs=1e-6)


def test_quality_standard_deviations_intervals_and_curves() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 4000)
    margins = rng.normal(labels * 1.5 - 0.75, 1.0)
    metrics = quality.binary_classification_metrics(labels, margins)
    p = metrics["accuracy"]["value"]
    assert metrics["accuracy"]["standard_deviation"] == pytest.approx(np.sqrt(p * (1 - p) / 4000), rel=0.2)
    assert quality.binary_classification_metrics(labels, margins) == metrics  # seeded: the same file every run
    assert 0.75 < metrics["auc"]["value"] < 0.9 and 0 < metrics["auc"]["standard_deviation"] < 0.02
    roc = metrics["receiver_operating_characteristic_curve"]
    assert roc["false_positive_rates"][0] == 0.0 and roc["true_positive_rates"][-1] == 1.0
    assert len(roc["true_positive_rates"]) <= quality.CURVE_POINTS + 1
    assert np.all(np.diff(roc["true_positive_rates"]) >= 0)
    low, high = quality.wilson_interval(95, 100)
    assert low == pytest.approx(0.8882, abs=1e-4) and high == pytest.approx(0.9785, abs=1e-4)
    same = np.ones(500, bool)
    loss, low, high = quality.paired_difference(same, same)
    assert loss == 0.0 and low < 0 < high < 0.01  # no discordant pair still leaves an interval
    worse = same.copy()
    worse[:10] = False
    loss, low, high = quality.paired_difference(same, worse)
    assert loss == pytest.approx(0.02) and 0 < low < 0.02 < high


def test_shipped_accuracy_metric_loads_by_path() -> None:
    import evaluate as hf_evaluate

    metric = hf_evaluate.load(str(STEPS / "evaluation" / "metrics" / "accuracy"), keep_in_memory=True)
    assert metric.compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0])["accuracy"] == 0.75


def test_missing_model_fails_naming_the_path(tmp_path: Path) -> None:
    test = write_split(tmp_path / "test", random_rows(4))
    (tmp_path / "empty").mkdir()
    cmd = [sys.executable, "-m", "steps.evaluation", *step_arguments("Evaluate"),
           "--model-dir", str(tmp_path / "empty"),
           "--test-dir", str(test), "--output-dir", str(tmp_path / "eval")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ONE_THREAD)
    assert proc.returncode != 0
    assert str(tmp_path / "empty") in proc.stderr and "config.json" in proc.stderr
    assert not (tmp_path / "eval" / "evaluation.json").exists()


def test_bad_inputs_fail_with_messages(model_dir: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture) -> None:
    test = write_split(tmp_path / "test", random_rows(4))

    def fails(model: Path, test_dir: Path, *expected: str) -> None:
        assert ev.main([*step_arguments("Evaluate"), "--model-dir", str(model), "--test-dir", str(test_dir),
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
        if f.is_file():
            (broken / f.name).write_bytes(b"garbage" if f.suffix == ".safetensors" else f.read_bytes())
    fails(broken, test, "cannot load the model from", str(broken))

    fails(tmp_path / "nowhere", test, str(tmp_path / "nowhere"), "does not exist")
    fails(model_dir, tmp_path / "no-test", "no Parquet files", str(tmp_path / "no-test"))
    (tmp_path / "bad-test").mkdir()
    (tmp_path / "bad-test" / "part-00000.parquet").write_bytes(b"garbage")
    fails(model_dir, tmp_path / "bad-test", "cannot read", "part-00000.parquet")


def test_classification_metrics_for_any_number_of_classes():
    """Three classes worked by hand: accuracy 6/9; per class P/R/F1 from the confusion matrix; macro-F1 their mean."""
    labels = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2])
    predictions = np.array([0, 0, 1, 1, 1, 2, 2, 0, 2])
    metrics = quality.classification_metrics(labels, predictions, ["billing", "technical", "sales"])
    assert metrics["confusion_matrix"] == {"billing": {"billing": 2, "technical": 1, "sales": 0},
                                           "technical": {"billing": 0, "technical": 2, "sales": 1},
                                           "sales": {"billing": 1, "technical": 0, "sales": 2}}
    assert metrics["accuracy"]["value"] == pytest.approx(6 / 9)
    for name in ("billing", "technical", "sales"):  # each class: 2 of 3 right, 2 of 3 predictions right
        per = metrics["per_class"][name]
        assert (per["precision"]["value"], per["recall"]["value"], per["support"]) == (
            pytest.approx(2 / 3), pytest.approx(2 / 3), 3)
        assert per["f1"]["value"] == pytest.approx(2 / 3)
    assert metrics["macro_f1"]["value"] == pytest.approx(2 / 3)
    assert metrics["accuracy"]["standard_deviation"] != metrics["accuracy"]["standard_deviation"]  # NaN: 9 rows
    skewed = quality.classification_metrics(np.array([0] * 300 + [1] * 10), np.zeros(310, int), ["a", "b"])
    assert skewed["accuracy"]["value"] == pytest.approx(300 / 310)
    assert skewed["macro_f1"]["value"] == pytest.approx((2 * 300 / 610 + 0.0) / 2)  # the missed class counts
    assert 0 < skewed["macro_f1"]["standard_deviation"] < 0.05


def test_three_classes_get_the_multiclass_layout_and_per_class_metrics(tmp_path: Path) -> None:
    """A 3-class model, scored here on CPU: Model Monitor's multiclass layout (no binary one), the classification
    section by name, the CPU check and the int8 decision on argmax, the endpoint sample by name."""
    names = ("billing", "technical", "sales")
    rows = random_rows(60, seed=5, labels=[i % 3 for i in range(60)])
    model = add_serving_code(build_model(tmp_path / "model", build_tokenizer(tmp_path / "tok"), seed=2, labels=names))
    result = evaluate(model, write_split(tmp_path / "test", rows, names=names), tmp_path / "eval")
    assert "binary_classification_metrics" not in result and result["labels"]["count"] == 3
    import torch
    from transformers import AutoModelForSequenceClassification

    loaded = AutoModelForSequenceClassification.from_pretrained(str(model)).eval()
    with torch.inference_mode():
        expected = np.array([int(loaded(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types]))
                                 .logits[0].argmax()) for ids, types, _ in rows])
    labels = np.array([r[2] for r in rows])
    classification = result["classification"]
    assert classification["accuracy"]["value"] == pytest.approx(float((expected == labels).mean()))
    assert list(classification["per_class"]) == list(names)
    assert [c["support"] for c in classification["per_class"].values()] == [20, 20, 20]
    multiclass = result["multiclass_classification_metrics"]
    assert multiclass["accuracy"] == classification["accuracy"]
    assert multiclass["accuracy_best_constant_classifier"]["value"] == pytest.approx(1 / 3)
    assert sum(sum(row.values()) for row in multiclass["confusion_matrix"].values()) == 60
    assert result["dataset"]["per_class"] == dict.fromkeys(names, 20) and "positives" not in result["dataset"]
    assert result["check"]["agreement"] == 1.0


def cue_rows(n: int, seed: int, classes: int = 3) -> list[Row]:
    """random_rows whose label shows in one cue token (200 + label) among the noise, in four rows of five."""
    rng = np.random.default_rng(seed)
    rows = []
    for ids, types, _ in random_rows(n, seed):
        label = int(rng.integers(0, classes))
        cue = 200 + label if rng.random() < 0.8 else int(rng.integers(5, 200))
        rows.append(([*ids[:-1], cue, 3], [*types, 1], label))
    return rows


def test_the_tfidf_baseline_is_fitted_on_a_train_sample_and_scored_on_every_test_row(tmp_path: Path) -> None:
    names = ("billing", "technical", "sales")
    model = add_serving_code(build_model(tmp_path / "model", build_tokenizer(tmp_path / "tok"), seed=2, labels=names))
    train = write_split(tmp_path / "train", cue_rows(600, seed=1), names=names)
    test = write_split(tmp_path / "test", cue_rows(90, seed=2), names=names)
    result = evaluate(model, test, tmp_path / "eval", "--train-dir", str(train), "--baseline-rows", "500",
                      "--gate-metric", "macro_f1")
    found = result["baseline"]
    assert found["train_rows"] == 500 and found["metric"] == "macro_f1"  # a seeded sample of the 600
    assert found["accuracy"] > 0.6 and found["macro_f1"] > 0.6  # the cue in 4 of 5 rows: it learns it
    assert found["margin"] == pytest.approx(result["classification"]["macro_f1"]["value"] - found["macro_f1"],
                                            abs=1e-5)
    assert found["beaten"] is (found["margin"] > 0) and found["beaten"] is False  # a random model does not lead it
    ids, labels = baseline.read_train(train, 500, seed=7)
    again, same = baseline.read_train(train, 500, seed=7)
    assert ids.equals(again) and (labels == same).all() and len(labels) == 500  # seeded
    assert not ids.equals(baseline.read_train(train, 500, seed=8)[0])
    with pytest.raises(ev.StepError, match="no Parquet files in train folder"):
        baseline.read_train(tmp_path / "nowhere", 100, seed=7)


def test_a_split_with_more_classes_than_the_model_is_refused(model_dir: Path, tmp_path: Path, capsys) -> None:
    test = write_split(tmp_path / "test", random_rows(9, labels=[i % 3 for i in range(9)]), names=("a", "b", "c"))
    argv = [*step_arguments("Evaluate"), "--model-dir", str(model_dir), "--test-dir", str(test), "--output-dir",
            str(tmp_path / "out"), "--serving-dir", str(tmp_path / "serving"), "--no-onnx"]
    assert ev.main(argv) == 1
    assert "label ids [0, 1, 2], where the model has 2 classes (negative, positive)" in capsys.readouterr().err
