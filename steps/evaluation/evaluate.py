"""Evaluate step: the model's quality on the whole test split, checked here, and the endpoint's int8 / fp32 choice.

Inputs: --model-dir (the Train step's model.tar.gz, or an extracted Hugging Face model folder) and --test-dir
(the Parquet shards of preprocess.py).

Any number of classes: the model's id2label names them; a prediction is the class of the largest logit.

Whole split. train.py scores the test split on all training devices and ships `predictions/test.parquet` (label,
prediction, logits per row, in the split's file order) inside the artifact; the metrics, and so the gate's accuracy,
are those of every test row. Scoring 400k reviews with bert-base on a CPU would take hours; reading them takes
seconds. An artifact without that file (a model trained elsewhere) is scored here on CPU, every row.

Check. A fixed stratified sample of --sample-size rows (seeded) is scored here on CPU in fp32 with the artifact's
weights. The share of sampled rows on which it agrees with the Train step's predictions must be at least
--min-agreement (bf16 on the accelerator may flip a row whose top two logits are close), else the step fails:
predictions that are not this model's on this test split never reach the gate.

Serving variant. The endpoint serves the fastest variant whose accuracy on the same sample stays within
--int8-tolerance of fp32: the upper end of the 95% interval of the paired accuracy loss (fp32 - variant) must be at
most the tolerance. Tried fastest first, each scored with the artifact's own code/inference.py (exactly what the
endpoint runs): ONNX Runtime int8 (the graph exported, fused and quantized by serving.py), ONNX Runtime fp32 (fused),
torch int8 (dynamically quantized Linear layers); else torch fp32. --no-int8 leaves out the int8 variants, --no-onnx
the ONNX Runtime ones (also left out when onnxruntime or onnx is not installed).

Serving artifact. SERVING/model.tar.gz is what the registry registers: the trained model plus, for an ONNX Runtime
variant, its graph (onnx/model-<int8|fp32>.onnx) and a copy of the onnxruntime that scored it (code/packages/, used
when the serving image has none); for a torch variant, the Train step's archive as it is.

Output OUTPUT/evaluation.json, in the model quality format SageMaker Studio shows for a model version:

    {"version": 0.0,
     "binary_classification_metrics": {"accuracy": {"value": 0.93, "standard_deviation": 0.0004}, "precision",
         "recall", "f1", "auc", ..., "confusion_matrix": {"0": {"0": tn, "1": fp}, "1": {"0": fn, "1": tp}},
         "receiver_operating_characteristic_curve", "precision_recall_curve"}  (two classes; more:
     "multiclass_classification_metrics": {"confusion_matrix" by name, "accuracy", "weighted_precision", ...}),
     "classification": {"accuracy", "macro_f1", "weighted_*", "per_class": {NAME: {"precision", "recall", "f1",
         "support"}}, "confusion_matrix": {ACTUAL: {PREDICTED: n}}},
     "labels": {"names", "count", "digest"},
     "dataset": {"rows", "positives" (two classes), "per_class", "predictions": "train step" | "this step (cpu)"},
     "check": {"sample_size", "agreement", "agreement_ci95", "min_agreement", "disagreements", "passed"},
     "inference": {"runtime": "onnxruntime" | "torch", "quantize": "int8" | "none", "variant", "reason",
                   "accuracy", "accuracy_loss", "accuracy_loss_ci95", "p50_ms" (the chosen's, null for torch fp32),
                   "candidates": [{"variant", "accuracy", "accuracy_loss", "accuracy_loss_ci95", "chosen", "p50_ms"}],
                   "fp32_accuracy", "sample_fp32_accuracy", "sample_size", "tolerance",
                   "onnx": {"onnxruntime", "opset", "fused", "packages"} | null},
     "seconds": ..., "tracking": {"run_id": the execution's MLflow run ("none": untracked), "experiment"}}

Accuracy is computed by the `evaluate` library with the metric module shipped in metrics/accuracy/ (loaded by
path, never from the Hub); the other metrics by quality.py.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from steps.contract import (
    GATE_METRICS,
    MODEL_ARCHIVE,
    PREDICTIONS_FILE,
    REPORT_FILE,
    SERVING_DIR,
    TEXT_COLUMNS,
    TRAIN_DIR,
    StepError,
)
from steps.evaluation import baseline, endpoint_sample, evaluation_tracking, quality, serving

METRIC_DIR = Path(__file__).resolve().parent / "metrics" / "accuracy"
COLUMNS = ("input_ids", "token_type_ids", "label")
VARIANTS = (("onnxruntime", "int8"), ("onnxruntime", "none"), ("torch", "int8"))  # the faster ones, fastest first


def find_model(model_dir: Path, scratch: Path) -> tuple[Path, Path]:
    """The folder holding config.json (model_dir itself, or model.tar.gz extracted into scratch) and the
    path to name in messages (the archive or the folder)."""
    if not model_dir.is_dir():
        raise StepError(f"model folder {model_dir} does not exist")
    archive = model_dir / "model.tar.gz"
    if archive.exists():
        try:
            with tarfile.open(archive, "r:*") as tar:
                tar.extractall(scratch, filter="data")  # refuses members that would land outside scratch
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
    if model.config.num_labels < 2:
        raise StepError(f"{where}: expected a classifier of 2 or more labels, found num_labels="
                        f"{model.config.num_labels}")
    return model.eval()


def serving_handler(folder: Path) -> Any | None:
    """The artifact's own code/inference.py (the endpoint's handler), or None when it has none."""
    path = folder / "code" / "inference.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("serving_handler", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_split(test_dir: Path) -> pa.Table:
    """All Parquet shards of the split, in file-name order, with input_ids, token_type_ids and label, and the rows'
    original text (title, content) where every shard has it."""
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
            table = pq.read_table(path, columns=[c for c in (*COLUMNS, *TEXT_COLUMNS) if c in schema.names])
        except (OSError, pa.ArrowException) as e:
            raise StepError(f"cannot read {path}: {type(e).__name__}: {e}") from e
        if "token_type_ids" not in table.column_names:  # single sequences: all zeros
            ids = table["input_ids"].combine_chunks()
            zeros = pa.ListArray.from_arrays(ids.offsets, pa.array(np.zeros(len(ids.values), np.int8)))
            table = table.append_column("token_type_ids", zeros)
        tables.append(table)
    text = all(set(TEXT_COLUMNS) <= set(t.column_names) for t in tables)
    table = pa.concat_tables([t.select([*COLUMNS, *(TEXT_COLUMNS if text else ())]) for t in tables])
    if len(table) == 0:
        raise StepError(f"test folder {test_dir} holds no rows")
    return table


def read_predictions(folder: Path, labels: np.ndarray) -> np.ndarray | None:
    """The Train step's logits (rows x classes) of every test row, or None when the artifact has no predictions
    file. An artifact of an earlier Train step holds binary margins (logit 1 - logit 0): as logits [0, margin]."""
    path = folder / PREDICTIONS_FILE
    if not path.is_file():
        return None
    try:
        table = pq.read_table(path)
        scores = table["logits" if "logits" in table.column_names else "margin"]
    except (OSError, pa.ArrowException, KeyError) as e:
        raise StepError(f"cannot read {path}: {type(e).__name__}: {e}") from e
    if len(table) != len(labels) or not np.array_equal(table["label"].to_numpy(), labels):
        raise StepError(
            f"{PREDICTIONS_FILE} of the model artifact ({len(table)} rows) does not match the test split "
            f"({len(labels)} rows, labels in file order): the model was scored on other data"
        )
    if pa.types.is_floating(scores.type):
        margins = scores.to_numpy().astype(np.float32)
        return np.stack([np.zeros_like(margins), margins], axis=1)
    flat = scores.combine_chunks()
    return flat.values.to_numpy().astype(np.float32).reshape(len(flat), -1)


def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and values of a list column, as numpy arrays."""
    arr = column.combine_chunks()
    return arr.offsets.to_numpy().astype(np.int64), arr.values.to_numpy()


def torch_logits(model: Any) -> Any:
    """A (input_ids, attention_mask, token_type_ids) -> logits function of a transformers model, numpy in and out."""
    import torch

    def forward(ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                         token_type_ids=torch.from_numpy(types)).logits.float().numpy()

    return forward


def predict(forward: Any, table: pa.Table, batch_size: int, pad_id: int) -> np.ndarray:
    """Logits (rows x classes), batching rows of similar length to keep padding small. `forward(input_ids,
    attention_mask, token_type_ids)` gives the logits of a batch (int64 arrays in)."""
    offsets, ids = _flat(table["input_ids"])
    type_offsets, types = _flat(table["token_type_ids"])
    lengths = np.diff(offsets)
    if not np.array_equal(np.diff(type_offsets), lengths):
        raise StepError("token_type_ids and input_ids differ in length in some rows")
    order = np.argsort(lengths, kind="stable")
    scores: np.ndarray | None = None
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = int(lengths[rows].max())
        pos = np.arange(width)
        mask = pos[None, :] < lengths[rows, None]
        input_ids = np.full((len(rows), width), pad_id, np.int64)
        input_ids[mask] = ids[(offsets[rows, None] + pos[None, :])[mask]]
        token_types = np.zeros((len(rows), width), np.int64)
        token_types[mask] = types[(type_offsets[rows, None] + pos[None, :])[mask]]
        logits = np.asarray(forward(input_ids, mask.astype(np.int64), token_types), np.float32)
        if scores is None:
            scores = np.zeros((len(lengths), logits.shape[1]), np.float32)
        scores[rows] = logits
    return scores if scores is not None else np.zeros((0, 2), np.float32)


def stratified_sample(labels: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Sorted row indices of a seeded sample of `size` rows with each label in its share of the split."""
    if size >= len(labels):
        return np.arange(len(labels))
    rng = np.random.default_rng(seed)
    picked = []
    for label in np.unique(labels):
        rows = np.flatnonzero(labels == label)
        take = round(size * len(rows) / len(labels))
        picked.append(rng.choice(rows, size=min(take, len(rows)), replace=False))
    return np.sort(np.concatenate(picked))


def accuracy(predictions: np.ndarray, references: np.ndarray) -> float:
    """Accuracy from the project's metric module, through the `evaluate` library."""
    import evaluate

    metric = evaluate.load(str(METRIC_DIR), keep_in_memory=True)
    return float(metric.compute(predictions=predictions.tolist(), references=references.tolist())["accuracy"])


def check(fp32: np.ndarray, train_step: np.ndarray, min_agreement: float, seed: int) -> dict[str, Any]:
    """How often the CPU's fp32 predictions (logits) of the sample agree with the Train step's."""
    agree, n = int((fp32.argmax(axis=1) == train_step.argmax(axis=1)).sum()), len(fp32)
    return {
        "sample_size": n,
        "seed": seed,
        "agreement": agree / n,
        "agreement_ci95": list(quality.wilson_interval(agree, n)),
        "min_agreement": min_agreement,
        "disagreements": n - agree,
        "passed": agree / n >= min_agreement,
    }


def candidates(args: argparse.Namespace, handler: Any | None) -> tuple[list[tuple[str, str]], str]:
    """The variants to try, fastest first, as (runtime, quantize); and why any were left out."""
    if handler is None or not hasattr(handler, "load"):
        return [], "the artifact has no code/inference.py that serves the faster variants"
    missing = serving.unavailable() if args.onnx else "--no-onnx was given"
    tried = [(r, q) for r, q in VARIANTS if (r == "torch" or not missing) and (q == "none" or args.int8)]
    notes = [] if args.int8 else ["--no-int8 was given"]
    return tried, "; ".join(notes + ([f"no ONNX Runtime variant: {missing}"] if missing else []))


def choose(scored: list[dict[str, Any]], fp32_correct: np.ndarray, tolerance: float, notes: list[str]) -> dict:
    """The "inference" section: the first scored variant within tolerance (else torch fp32), and why."""
    chosen = next((c for c in scored if c["chosen"]), {"variant": "torch-fp32"})
    runtime, bits = chosen["variant"].split("-")
    reason = [f"{c['variant']} loses {c['accuracy_loss']:.4f} accuracy on the sample (95% interval up to "
              f"{c['accuracy_loss_ci95'][1]:.4f}), {'within' if c['chosen'] else 'beyond'} the tolerance {tolerance:g}"
              for c in scored]
    return {"runtime": runtime, "quantize": "int8" if bits == "int8" else "none", "variant": chosen["variant"],
            "reason": "; ".join(reason + notes) or "no variant to try",
            **{k: chosen.get(k) for k in ("accuracy", "accuracy_loss", "accuracy_loss_ci95", "p50_ms")},
            "candidates": scored, "sample_size": len(fp32_correct),
            "sample_fp32_accuracy": float(fp32_correct.mean()), "tolerance": tolerance}


def correct_on(classifier: Any, rows: pa.Table, labels: np.ndarray, pad_id: int) -> np.ndarray:
    """Which rows a loaded serving variant classifies right, in its own micro-batches (as it serves)."""
    return predict(classifier.forward, rows, classifier.micro_batch, pad_id).argmax(axis=1) == labels


def score_variants(args: argparse.Namespace, handler: Any, root: Path, rows: pa.Table, labels: np.ndarray,
                   fp32_correct: np.ndarray, pad_id: int) -> tuple[list[dict], dict | None, list[str]]:
    """Score the candidates on the sample, fastest first, until one is within tolerance. Returns the scores, the
    ONNX build's facts, and notes on the variants that could not be tried."""
    tried, note = candidates(args, handler)
    scored, onnx, notes = [], None, [note] if note else []
    for runtime, quantize in tried:
        try:
            if runtime == "onnxruntime" and onnx is None:
                onnx = {}  # stays empty if the build fails
                onnx = serving.build(root)
            classifier = handler.load(root, runtime, quantize)
        except Exception as e:  # an architecture the exporter does not handle, an artifact without tokenizer.json..
            notes.append(f"{runtime} {quantize} not tried: {type(e).__name__}: {str(e)[:300]}")
            continue
        correct = correct_on(classifier, rows, labels, pad_id)
        loss, low, high = quality.paired_difference(fp32_correct, correct)
        p50 = quality.median_ms(lambda i, f=classifier.forward: predict(f, rows.slice(i, 1), 1, pad_id), len(rows))
        scored.append({"variant": classifier.variant, "accuracy": float(correct.mean()), "accuracy_loss": loss,
                       "accuracy_loss_ci95": [low, high], "chosen": high <= args.int8_tolerance, "p50_ms": p50})
        if scored[-1]["chosen"]:
            break
    return scored, onnx or None, notes


def score_gpu(args: argparse.Namespace, handler: Any, root: Path, rows: pa.Table, labels: np.ndarray,
              fp32_correct: np.ndarray, pad_id: int) -> dict[str, Any]:
    """The "inference.gpu" section: the precision a GPU endpoint serves. fp16 when the model in fp16, scored here on
    the CPU on the sample (weights and activations rounded to fp16 as on a GPU), loses at most --fp16-tolerance
    accuracy (95% upper bound), else fp32. A GPU staging endpoint's test checks the served model on the same rows."""
    if not args.fp16:
        return {"precision": "fp32", "reason": "--no-fp16 was given"}
    if handler is None or not hasattr(handler, "PRECISIONS"):
        return {"precision": "fp32", "reason": "the artifact's code/inference.py serves no fp16"}
    try:
        classifier = handler.load(root, "torch", "none", precision="fp16")
        correct = correct_on(classifier, rows, labels, pad_id)
    except Exception as e:  # an operator without a CPU fp16 kernel in this torch
        return {"precision": "fp32", "reason": f"fp16 not scored: {type(e).__name__}: {str(e)[:300]}"}
    loss, low, high = quality.paired_difference(fp32_correct, correct)
    within = high <= args.fp16_tolerance
    return {"precision": "fp16" if within else "fp32", "accuracy": float(correct.mean()), "accuracy_loss": loss,
            "accuracy_loss_ci95": [low, high], "tolerance": args.fp16_tolerance,
            "reason": f"fp16 loses {loss:.4f} accuracy on the sample (95% interval up to {high:.4f}), "
                      f"{'within' if within else 'beyond'} the tolerance {args.fp16_tolerance:g}"}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole step; returns the evaluation (also written to OUTPUT/evaluation.json)."""
    t0 = time.perf_counter()
    table = read_split(Path(args.test_dir))
    labels = table["label"].to_numpy().astype(np.int64)
    with tempfile.TemporaryDirectory() as scratch:
        folder, where = find_model(Path(args.model_dir), Path(scratch) / "model")
        if where == Path(args.model_dir):  # a folder: build the serving variants in a copy, never in the input
            folder = Path(shutil.copytree(folder, Path(scratch) / "model", dirs_exist_ok=True))
        model = load_model(folder, str(where))
        handler = serving_handler(folder)
        logits = read_predictions(folder, labels)
        pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        source, fp32_logits = "train step" if logits is not None else "this step (cpu)", torch_logits(model)
        if logits is None:
            logits = predict(fp32_logits, table, args.batch_size, pad_id)
        names = [model.config.id2label[i] for i in range(model.config.num_labels)]
        if labels.min() < 0 or labels.max() >= len(names):
            raise StepError(f"test folder {args.test_dir}: label ids {sorted(set(labels.tolist()))[:10]}, where the "
                            f"model has {len(names)} classes ({', '.join(names[:10])}): another data set's split")
        predictions = logits.argmax(axis=1)
        classification = quality.classification_metrics(labels, predictions, names, args.seed)
        classification["accuracy"]["value"] = accuracy(predictions, labels)  # through the `evaluate` library
        if len(names) == 2:
            metrics = quality.binary_classification_metrics(labels, logits[:, 1] - logits[:, 0], args.seed)
            metrics["accuracy"]["value"] = classification["accuracy"]["value"]
            layout = {"binary_classification_metrics": metrics}
        else:
            layout = {"multiclass_classification_metrics": quality.multiclass_classification_metrics(classification)}

        compared = None
        if args.baseline_rows:
            model_scores = {"accuracy": classification["accuracy"]["value"],
                            "macro_f1": classification["macro_f1"]["value"]}
            compared = baseline.score(Path(args.train_dir), table, labels, names, args.baseline_rows, args.seed,
                                      model_scores, args.gate_metric)
        sample = stratified_sample(labels, args.sample_size, args.seed)
        rows = table.take(pa.array(sample))
        endpoint_sample.write(args.output_dir, rows, labels[sample], predictions[sample], names)  # endpoint test
        fp32 = logits[sample] if source != "train step" else predict(fp32_logits, rows, args.batch_size, pad_id)
        checked = check(fp32, logits[sample], args.min_agreement, args.seed)
        fp32_correct = fp32.argmax(axis=1) == labels[sample]
        scored, onnx, notes = [], None, ["not tried: the CPU check failed"]
        gpu = {"precision": "fp32", "reason": "fp16 not tried: the CPU check failed"}
        if checked["passed"]:
            scored, onnx, notes = score_variants(args, handler, folder, rows, labels[sample], fp32_correct, pad_id)
            gpu = score_gpu(args, handler, folder, rows, labels[sample], fp32_correct, pad_id)
        inference = {**choose(scored, fp32_correct, args.int8_tolerance, notes), "gpu": gpu}
        if checked["passed"]:
            serving.write_artifact(folder, where if where.is_file() else None, inference, onnx,
                                   Path(args.serving_dir) / MODEL_ARCHIVE)
    counts = np.bincount(labels, minlength=len(names))
    result = {
        "version": 0.0,
        **layout,
        "classification": classification,
        "labels": {"names": names, "count": len(names),
                   "digest": hashlib.sha256(json.dumps(names).encode()).hexdigest()[:16]},
        "dataset": {"rows": len(labels), **({"positives": int(counts[1])} if len(names) == 2 else {}),
                    "per_class": {name: int(n) for name, n in zip(names, counts, strict=True)}, "predictions": source},
        **({"baseline": compared} if compared else {}),
        "check": checked,
        "inference": {**inference, "fp32_accuracy": classification["accuracy"]["value"], "onnx": onnx},
        "seconds": round(time.perf_counter() - t0, 3),
    }
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_FILE).write_text(quality.report_json(result))
    print(
        f"evaluated {len(labels)} rows of {len(names)} classes (predictions: {source}) in {result['seconds']:.1f} s: "
        f"accuracy={classification['accuracy']['value']:.4f} macro_f1={classification['macro_f1']['value']:.4f}; "
        + (f"baseline {compared['metric']} {compared[compared['metric']]:.4f} ({compared['train_rows']} train rows, "
           f"{compared['seconds']:.1f} s); " if compared else "")
        + f"cpu check on {len(sample)} rows: agreement {checked['agreement']:.4f}; "
        f"endpoint variant {inference['variant']} ({inference['reason']}); on a GPU "
        f"{inference['gpu']['precision']} ({inference['gpu']['reason']})",
        flush=True,
    )
    if not checked["passed"]:
        raise StepError(
            f"the Train step's predictions and this model on CPU disagree on {checked['disagreements']} of "
            f"{len(sample)} sampled test rows (agreement {checked['agreement']:.4f} < --min-agreement "
            f"{args.min_agreement}): the predictions do not come from this model on this test split"
        )
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of the step (see the contract)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", default="/opt/ml/processing/model")
    p.add_argument("--test-dir", default="/opt/ml/processing/test")
    p.add_argument("--train-dir", default=TRAIN_DIR, help="the train split (the baseline's)")
    p.add_argument("--output-dir", default="/opt/ml/processing/evaluation")
    p.add_argument("--serving-dir", default=SERVING_DIR,
                   help="where the serving artifact (model.tar.gz) is written")
    p.add_argument("--batch-size", type=int, default=64)
    given = p.add_argument_group("passed by the Evaluate step (required: their defaults live in the config alone)")
    given.add_argument("--sample-size", type=int, required=True, help="rows scored here on CPU (check and variants)")
    given.add_argument("--min-agreement", type=float, required=True,
                       help="least share of sampled rows on which the CPU agrees with the Train step's predictions")
    given.add_argument("--seed", type=int, required=True)
    given.add_argument("--baseline-rows", type=int, required=True,
                       help="train rows the TF-IDF + logistic regression baseline is fitted on (0: no baseline)")
    given.add_argument("--gate-metric", choices=tuple(GATE_METRICS), required=True,
                       help="the metric the gate reads: the baseline's margin is the model's lead on it")
    given.add_argument("--int8", action=argparse.BooleanOptionalAction, required=True,
                       help="consider the int8 variants for the endpoint")
    given.add_argument("--int8-tolerance", type=float, required=True,
                       help="largest accuracy loss (a fraction: 0.005 = 0.5 points) of a variant the endpoint serves")
    given.add_argument("--fp16", action=argparse.BooleanOptionalAction, required=True,
                       help="score the model in fp16, which a GPU endpoint serves if close")
    given.add_argument("--fp16-tolerance", type=float, required=True,
                       help="largest accuracy loss of fp16 that a GPU endpoint serves (else fp32)")
    p.add_argument("--tracking-dir", help="the folder of tracking.json (where the MLflow server is; none: untracked)")
    p.add_argument("--onnx", action=argparse.BooleanOptionalAction, default=True,
                   help="consider the ONNX Runtime variants for the endpoint (default on)")
    args = p.parse_args(argv)
    if args.batch_size < 1 or args.sample_size < 1 or args.baseline_rows < 0:
        p.error("--batch-size and --sample-size must be at least 1, --baseline-rows at least 0")
    if not all(0 <= value <= 1 for value in (args.int8_tolerance, args.fp16_tolerance, args.min_agreement)):
        p.error("--int8-tolerance, --fp16-tolerance and --min-agreement must be between 0 and 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the step; exit status 1 with a one-line message on a missing, unreadable or inconsistent input (and the
    execution's MLflow run marked FAILED)."""
    args = parse_args(argv)
    try:
        evaluation_tracking.log(run(args), args, Path(args.output_dir) / REPORT_FILE)
    except BaseException as e:  # the execution's run ends FAILED, whatever ended the step
        evaluation_tracking.failed(args)
        if not isinstance(e, StepError):
            raise
        print(f"evaluate failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
