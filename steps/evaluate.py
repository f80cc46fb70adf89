"""Evaluate step: score the trained model on the tokenized test split, on CPU.

Reads the model from --model-dir (SageMaker's model.tar.gz, or an extracted Hugging Face model folder) and the
test split from --test-dir (Parquet shards written by preprocess.py). Predicts in batches of rows of similar
length (sorted by length, padded per batch), then writes OUTPUT/evaluation.json:

    {"metrics": {"accuracy": {"value": 0.91, "standard_deviation": "NaN"}, "precision": {...},
                 "recall": {...}, "f1": {...}},
     "confusion_matrix": {"0": {"0": tn, "1": fp}, "1": {"0": fn, "1": tp}},   # actual -> predicted
     "samples": N,
     "inference": {"quantize": "int8" | "none", "fp32_accuracy": 0.91, "int8_accuracy": 0.909,
                   "tolerance": 0.005, "reason": "..."}}

Precision, recall and F1 are those of the positive class (label 1). Accuracy is computed by the `evaluate`
library with the metric module shipped in metrics/accuracy/ (loaded by path, never from the Hub).

The int8 variant (every Linear layer dynamically quantized, exactly as the endpoint's handler does it) is scored on
the same rows; "inference.quantize" is "int8" when its accuracy is at most --int8-tolerance below fp32's, and the
pipeline passes that choice to the endpoint (INFERENCE_QUANTIZE). Its accuracy is also the metric "int8_accuracy".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

METRIC_DIR = Path(__file__).resolve().parent / "metrics" / "accuracy"
COLUMNS = ("input_ids", "token_type_ids", "label")


class StepError(Exception):
    """A missing or unreadable input, reported as one clear line."""


def find_model(model_dir: Path, scratch: Path) -> tuple[Path, Path]:
    """The folder holding config.json (model_dir itself, or model.tar.gz extracted into scratch) and the
    path to name in messages (the archive or the folder)."""
    if not model_dir.is_dir():
        raise StepError(f"model folder {model_dir} does not exist")
    archive = model_dir / "model.tar.gz"
    if archive.exists():
        try:
            with tarfile.open(archive, "r:*") as tar:
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(scratch, filter="data")
                else:  # older Python: refuse paths that leave the folder
                    for member in tar.getmembers():
                        if not (scratch / member.name).resolve().is_relative_to(scratch.resolve()):
                            raise StepError(f"{archive}: unsafe path {member.name!r}")
                    tar.extractall(scratch)
        except (tarfile.TarError, OSError, EOFError) as e:
            raise StepError(f"{archive} is not a readable tar.gz archive: {type(e).__name__}: {e}") from e
        root, where = scratch, archive
    else:
        root, where = model_dir, model_dir
    configs = sorted(root.rglob("config.json"), key=lambda p: len(p.parts))
    if not configs:
        raise StepError(f"no model in {where}: expected config.json and weights (or model.tar.gz)")
    return configs[0].parent, where


def load_model(folder: Path, where: str) -> Any:
    """The sequence classification model in folder, in eval mode."""
    from transformers import AutoModelForSequenceClassification

    try:
        model = AutoModelForSequenceClassification.from_pretrained(str(folder))
    except Exception as e:  # corrupt weights, bad config, missing files: all reported the same way
        raise StepError(f"cannot load the model from {where}: {type(e).__name__}: {e}") from e
    if model.config.num_labels != 2:
        raise StepError(f"{where}: expected a 2-label classifier, found num_labels={model.config.num_labels}")
    return model.eval()


def read_split(test_dir: Path) -> pa.Table:
    """All Parquet shards of the split, in file-name order, with input_ids, token_type_ids and label."""
    files = sorted(test_dir.glob("*.parquet")) if test_dir.is_dir() else []
    if not files:
        raise StepError(f"no Parquet files in test folder {test_dir}")
    tables = []
    for path in files:
        try:
            schema = pq.read_schema(path)
            missing = [c for c in ("input_ids", "label") if c not in schema.names]
            if missing:
                raise StepError(f"{path}: missing columns {missing} (found {schema.names})")
            table = pq.read_table(path, columns=[c for c in COLUMNS if c in schema.names])
        except (OSError, pa.ArrowException) as e:
            raise StepError(f"cannot read {path}: {type(e).__name__}: {e}") from e
        if "token_type_ids" not in table.column_names:  # single sequences: all zeros
            ids = table["input_ids"].combine_chunks()
            zeros = pa.ListArray.from_arrays(ids.offsets, pa.array(np.zeros(len(ids.values), np.int8)))
            table = table.append_column("token_type_ids", zeros)
        tables.append(table.select(list(COLUMNS)))
    table = pa.concat_tables(tables)
    labels = table["label"].to_numpy()
    if len(table) == 0:
        raise StepError(f"test folder {test_dir} holds no rows")
    if not np.isin(labels, (0, 1)).all():
        found = sorted(set(labels.tolist()))
        raise StepError(f"test folder {test_dir}: labels must be 0 or 1, found {found}")
    return table


def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and values of a list column, as numpy arrays."""
    arr = column.combine_chunks()
    offsets = arr.offsets.to_numpy().astype(np.int64)
    return offsets, arr.values.to_numpy()


def predict(model: Any, table: pa.Table, batch_size: int, pad_id: int) -> np.ndarray:
    """Predicted label per row, batching rows of similar length to keep padding small."""
    import torch

    offsets, ids = _flat(table["input_ids"])
    type_offsets, types = _flat(table["token_type_ids"])
    lengths = np.diff(offsets)
    if not np.array_equal(np.diff(type_offsets), lengths):
        raise StepError("token_type_ids and input_ids differ in length in some rows")
    order = np.argsort(lengths, kind="stable")
    preds = np.empty(len(lengths), np.int64)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            width = int(lengths[rows].max())
            pos = np.arange(width)
            mask = pos[None, :] < lengths[rows, None]
            src = offsets[rows, None] + pos[None, :]
            input_ids = np.full((len(rows), width), pad_id, np.int64)
            input_ids[mask] = ids[src[mask]]
            token_types = np.zeros((len(rows), width), np.int64)
            token_types[mask] = types[(type_offsets[rows, None] + pos[None, :])[mask]]
            logits = model(input_ids=torch.from_numpy(input_ids),
                           attention_mask=torch.from_numpy(mask.astype(np.int64)),
                           token_type_ids=torch.from_numpy(token_types)).logits
            preds[rows] = logits.argmax(-1).numpy()
    return preds


def quantize_int8(model: Any) -> Any:
    """The endpoint's int8 variant: torch dynamic quantization of every Linear layer (see training/inference.py)."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao, and still works
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def choose_variant(fp32: float, int8: float | None, tolerance: float, note: str = "") -> dict[str, Any]:
    """The "inference" section: int8 only when it was measured and lost at most `tolerance` accuracy."""
    chosen = int8 is not None and int8 >= fp32 - tolerance
    if int8 is None:
        reason = note or "int8 not evaluated"
    else:
        reason = f"int8 accuracy {int8:.4f} is {'within' if chosen else 'more than'} {tolerance:g} of fp32 {fp32:.4f}"
    return {"quantize": "int8" if chosen else "none", "fp32_accuracy": fp32, "int8_accuracy": int8,
            "tolerance": tolerance, "reason": reason}


def accuracy(predictions: np.ndarray, references: np.ndarray) -> float:
    """Accuracy from the project's metric module, through the `evaluate` library."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]  # this file shadows the library
    if not hasattr(sys.modules.get("evaluate", sys), "load"):
        sys.modules.pop("evaluate", None)
    import evaluate

    metric = evaluate.load(str(METRIC_DIR), keep_in_memory=True)
    return float(metric.compute(predictions=predictions.tolist(), references=references.tolist())["accuracy"])


def report(predictions: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """evaluation.json's content: accuracy, precision/recall/F1 of class 1, confusion matrix."""
    cm = np.zeros((2, 2), np.int64)
    np.add.at(cm, (labels.astype(np.int64), predictions.astype(np.int64)), 1)
    tp, fp, fn = cm[1, 1], cm[0, 1], cm[1, 0]
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    values = {"accuracy": accuracy(predictions, labels), "precision": precision, "recall": recall, "f1": f1}
    return {
        "metrics": {k: {"value": float(v), "standard_deviation": "NaN"} for k, v in values.items()},
        "confusion_matrix": {str(a): {str(p): int(cm[a, p]) for p in (0, 1)} for a in (0, 1)},
        "samples": int(len(labels)),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole step; returns the evaluation (also written to OUTPUT/evaluation.json)."""
    t0 = time.perf_counter()
    table = read_split(Path(args.test_dir))
    with tempfile.TemporaryDirectory() as scratch:
        folder, where = find_model(Path(args.model_dir), Path(scratch))
        model = load_model(folder, str(where))
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    labels = table["label"].to_numpy()
    preds = predict(model, table, args.batch_size, pad_id)
    result = report(preds, labels)
    fp32, int8, note = result["metrics"]["accuracy"]["value"], None, "--no-int8 was given"
    if args.int8:
        try:
            quantized = quantize_int8(model)
        except Exception as e:  # a torch without torch.ao.quantization: serve fp32
            note = f"int8 unavailable: {type(e).__name__}: {e}"
        else:
            int8 = accuracy(predict(quantized, table, args.batch_size, pad_id), labels)
            result["metrics"]["int8_accuracy"] = {"value": int8, "standard_deviation": "NaN"}
    result["inference"] = choose_variant(fp32, int8, args.int8_tolerance, note)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluation.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"evaluated {result['samples']} rows in {time.perf_counter() - t0:.1f} s: "
          + ", ".join(f"{k}={v['value']:.4f}" for k, v in result["metrics"].items())
          + f"; endpoint variant {result['inference']['quantize']} ({result['inference']['reason']})", flush=True)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of the step (see the contract)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", default="/opt/ml/processing/model")
    p.add_argument("--test-dir", default="/opt/ml/processing/test")
    p.add_argument("--output-dir", default="/opt/ml/processing/evaluation")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--int8", action=argparse.BooleanOptionalAction, default=True,
                   help="also score the int8 variant and choose the endpoint's variant (default on)")
    p.add_argument("--int8-tolerance", type=float, default=0.005,
                   help="largest accuracy loss (a fraction: 0.005 = 0.5 points) that still serves int8")
    args = p.parse_args(argv)
    if args.batch_size < 1:
        p.error("--batch-size must be at least 1")
    if not 0 <= args.int8_tolerance <= 1:
        p.error("--int8-tolerance must be between 0 and 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the step; exit status 1 with a one-line message on a missing or unreadable input."""
    args = parse_args(argv)
    try:
        run(args)
    except StepError as e:
        print(f"evaluate failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
