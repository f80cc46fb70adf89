"""Binary classification metrics in the model quality format that SageMaker Studio renders for a model version.

`binary_classification_metrics(labels, margins)` gives the `binary_classification_metrics` object of SageMaker
Model Monitor's model quality statistics (the format the Model Registry shows under "Model quality"): each metric
is {"value": v, "standard_deviation": s} with a number for s, plus the confusion matrix and the ROC and
precision-recall curves. A row is predicted positive when its margin (logit positive - logit negative) is > 0.

Standard deviations: for the threshold metrics, over 200 seeded multinomial resamples of the confusion matrix (a
bootstrap of the test rows that needs no second pass over them); for the AUC, Hanley and McNeil's formula. As Model
Monitor, only for at least MIN_ROWS_FOR_DEVIATION rows: NaN below (a handful of rows has no meaningful spread).
Numpy only, so it runs in any processing image.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from steps import paired
from steps.paired import Z95

BOOTSTRAP_RESAMPLES = 200
NAN = float("nan")
MIN_ROWS_FOR_DEVIATION = 200  # Model Monitor gives standard deviations only from this many samples, else NaN
CURVE_POINTS = 101


def _rates(cm: np.ndarray) -> dict[str, np.ndarray]:
    """Threshold metrics of confusion matrices cm[..., actual, predicted] (vectorised over leading axes)."""
    tn, fp, fn, tp = cm[..., 0, 0], cm[..., 0, 1], cm[..., 1, 0], cm[..., 1, 1]
    n = tn + fp + fn + tp

    def ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.divide(a, b, out=np.zeros_like(a, dtype=float), where=b > 0)

    precision, recall = ratio(tp, tp + fp), ratio(tp, tp + fn)

    def f(beta: float) -> np.ndarray:
        return ratio((1 + beta**2) * precision * recall, beta**2 * precision + recall)

    return {
        "accuracy": ratio(tp + tn, n),
        "precision": precision,
        "recall": recall,
        "f0_5": f(0.5),
        "f1": f(1.0),
        "f2": f(2.0),
        "true_positive_rate": recall,
        "true_negative_rate": ratio(tn, tn + fp),
        "false_positive_rate": ratio(fp, fp + tn),
        "false_negative_rate": ratio(fn, fn + tp),
    }


def confusion(labels: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """cm[actual, predicted] counts."""
    cm = np.zeros((2, 2), np.int64)
    np.add.at(cm, (labels.astype(np.int64), predictions.astype(np.int64)), 1)
    return cm


def auc(labels: np.ndarray, margins: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney, ties counted half)."""
    positives, negatives = int(labels.sum()), int(len(labels) - labels.sum())
    if not positives or not negatives:
        return float("nan")
    order = np.argsort(margins, kind="stable")
    ranks = np.empty(len(margins))
    _, first, counts = np.unique(margins[order], return_index=True, return_counts=True)
    ranks[order] = np.repeat(first + (counts + 1) / 2, counts)  # average 1-based rank of each tie group
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def auc_standard_deviation(value: float, positives: int, negatives: int) -> float:
    """Hanley and McNeil (1982)."""
    if not positives or not negatives or math.isnan(value):
        return float("nan")
    q1, q2 = value / (2 - value), 2 * value**2 / (1 + value)
    variance = (
        value * (1 - value) + (positives - 1) * (q1 - value**2) + (negatives - 1) * (q2 - value**2)
    ) / (positives * negatives)
    return math.sqrt(max(variance, 0.0))


def curves(labels: np.ndarray, margins: np.ndarray) -> tuple[dict, dict]:
    """ROC and precision-recall curves, each at most CURVE_POINTS points (thresholds from high to low), each point at
    the end of a group of equal margins: a threshold takes a tie group whole, so no point lies inside one."""
    order = np.argsort(-margins, kind="stable")
    hits = labels[order].astype(np.float64)
    tp, fp = np.cumsum(hits), np.cumsum(1 - hits)
    descending = -margins[order]  # ascending
    cut = np.linspace(0, len(order) - 1, CURVE_POINTS).round().astype(int)
    cut = np.unique(np.searchsorted(descending, descending[cut], side="right") - 1)
    positives, negatives = max(tp[-1], 1.0), max(fp[-1], 1.0)
    tpr, fpr = tp[cut] / positives, fp[cut] / negatives
    precision = tp[cut] / (tp[cut] + fp[cut])
    roc = {"false_positive_rates": [0.0, *fpr.round(6).tolist()], "true_positive_rates": [0.0, *tpr.round(6).tolist()]}
    pr = {"precisions": precision.round(6).tolist(), "recalls": tpr.round(6).tolist()}
    return roc, pr


def binary_classification_metrics(labels: np.ndarray, margins: np.ndarray, seed: int = 0) -> dict[str, Any]:
    """The `binary_classification_metrics` object for these labels (0/1) and margins."""
    labels = labels.astype(np.int64)
    cm = confusion(labels, margins > 0)
    n, positives = int(cm.sum()), int(cm[1].sum())
    values = _rates(cm)
    draws = np.random.default_rng(seed).multinomial(n, cm.ravel() / max(n, 1), size=BOOTSTRAP_RESAMPLES)
    spread = _rates(draws.reshape(-1, 2, 2))
    metrics: dict[str, Any] = {
        "confusion_matrix": {str(a): {str(p): int(cm[a, p]) for p in (0, 1)} for a in (0, 1)}
    }
    enough = n >= MIN_ROWS_FOR_DEVIATION
    for name, value in values.items():
        metrics[name] = {"value": float(value), "standard_deviation": float(spread[name].std()) if enough else NAN}
    share = positives / n if n else 0.0
    # the always-positive classifier (precision `share`, recall 1), as Model Monitor's *_best_constant_classifier
    # metrics all describe it
    metrics["accuracy_best_constant_classifier"] = {"value": share, "standard_deviation": 0.0}
    metrics["precision_best_constant_classifier"] = {"value": share, "standard_deviation": 0.0}
    metrics["recall_best_constant_classifier"] = {"value": 1.0, "standard_deviation": 0.0}
    for name, beta in (("f0_5", 0.5), ("f1", 1.0), ("f2", 2.0)):
        value = (1 + beta**2) * share / (beta**2 * share + 1)
        metrics[f"{name}_best_constant_classifier"] = {"value": value, "standard_deviation": 0.0}
    area = auc(labels, margins)
    spread_auc = auc_standard_deviation(area, positives, n - positives) if enough else NAN
    metrics["auc"] = {"value": area, "standard_deviation": spread_auc}
    roc, pr = curves(labels, margins)
    metrics["receiver_operating_characteristic_curve"] = roc
    metrics["precision_recall_curve"] = pr
    return metrics


def classification_metrics(labels: np.ndarray, predictions: np.ndarray, names: list[str], seed: int = 0
                           ) -> dict[str, Any]:
    """Accuracy, macro-F1 and each class's precision, recall, F1 and support, with the confusion matrix (by name,
    actual -> predicted), for any number of classes: the gate's metrics (`evaluation.gate_metric`). Standard
    deviations as for the binary metrics: a seeded multinomial bootstrap of the confusion matrix."""
    k = len(names)
    cm = np.zeros((k, k), np.int64)
    np.add.at(cm, (labels.astype(np.int64), predictions.astype(np.int64)), 1)
    n = int(cm.sum())
    draws = np.random.default_rng(seed).multinomial(n, cm.ravel() / max(n, 1), size=BOOTSTRAP_RESAMPLES)

    def scores(m: np.ndarray) -> dict[str, np.ndarray]:
        """accuracy, macro_f1 and per class precision / recall / f1 of confusion matrices m[..., actual, predicted]."""
        hits = np.diagonal(m, axis1=-2, axis2=-1).astype(float)
        predicted, actual = m.sum(axis=-2), m.sum(axis=-1)
        precision = np.divide(hits, predicted, out=np.zeros_like(hits), where=predicted > 0)
        recall = np.divide(hits, actual, out=np.zeros_like(hits), where=actual > 0)
        f1 = np.divide(2 * precision * recall, precision + recall, out=np.zeros_like(hits),
                       where=precision + recall > 0)
        total = m.sum(axis=(-2, -1))
        accuracy = np.divide(hits.sum(axis=-1), total, out=np.zeros_like(total, dtype=float), where=total > 0)
        share = np.divide(actual, total[..., None], out=np.zeros_like(hits), where=total[..., None] > 0)
        return {"accuracy": accuracy, "macro_f1": f1.mean(axis=-1), "precision": precision, "recall": recall,
                "f1": f1, **{f"weighted_{name}": (share * value).sum(axis=-1)
                             for name, value in (("precision", precision), ("recall", recall), ("f1", f1))}}

    values, spread = scores(cm), scores(draws.reshape(-1, k, k))
    enough = n >= MIN_ROWS_FOR_DEVIATION

    def metric(name: str, index: int | None = None) -> dict[str, float]:
        value, draws_ = (values[name], spread[name]) if index is None else (values[name][index],
                                                                            spread[name][:, index])
        return {"value": float(value), "standard_deviation": float(draws_.std()) if enough else NAN}

    return {
        "accuracy": metric("accuracy"),
        "macro_f1": metric("macro_f1"),
        **{name: metric(name) for name in ("weighted_precision", "weighted_recall", "weighted_f1")},
        "per_class": {name: {"precision": metric("precision", i), "recall": metric("recall", i),
                             "f1": metric("f1", i), "support": int(cm[i].sum())} for i, name in enumerate(names)},
        "confusion_matrix": {a: {p: int(cm[i, j]) for j, p in enumerate(names)} for i, a in enumerate(names)},
    }


def multiclass_classification_metrics(classification: dict[str, Any]) -> dict[str, Any]:
    """Model Monitor's `multiclass_classification_metrics` object (what Studio renders for more than two classes) from
    `classification_metrics`: the confusion matrix by label, accuracy and the support-weighted precision, recall and
    F1, and the accuracy of always answering the largest class."""
    supports = [c["support"] for c in classification["per_class"].values()]
    largest = max(supports) / max(sum(supports), 1)
    return {"confusion_matrix": classification["confusion_matrix"],
            **{name: classification[name] for name in ("accuracy", "weighted_precision", "weighted_recall",
                                                       "weighted_f1")},
            "accuracy_best_constant_classifier": {"value": largest, "standard_deviation": 0.0}}


def wilson_interval(successes: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a proportion."""
    if n == 0:
        return 0.0, 1.0
    p, z2 = successes / n, Z95**2
    center = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, center - half), min(1.0, center + half)


def paired_difference(first: np.ndarray, second: np.ndarray) -> tuple[float, float, float]:
    """mean(first) - mean(second) for two 0/1 outcomes of the same rows, with its 95% interval (paired.difference)."""
    first, second = first.astype(bool), second.astype(bool)
    return paired.difference(int((first & ~second).sum()), int((~first & second).sum()), len(first))


def median_ms(run: Callable[[int], object], count: int, most: int = 50) -> float:
    """The median time of run(0), run(1), ... (at most `most` calls) in ms: Evaluate's one-row time of a serving
    variant ("p50_ms"), which the endpoint test compares with the endpoint's p50."""
    times = []
    for i in range(min(count, most)):
        started = time.perf_counter()
        run(i)
        times.append((time.perf_counter() - started) * 1000)
    return round(float(np.median(times)), 3) if times else 0.0


def report_json(report: dict[str, Any]) -> str:
    """evaluation.json's text: a value that is no number (the AUC of a one-class split) written "NaN" as Model
    Monitor writes it, since JSON has no NaN (a strict parser, a browser's, refuses the bare token)."""

    def finite(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return "NaN"
        if isinstance(value, dict):
            return {key: finite(item) for key, item in value.items()}
        return [finite(item) for item in value] if isinstance(value, list) else value

    return json.dumps(finite(report), indent=2, allow_nan=False) + "\n"
