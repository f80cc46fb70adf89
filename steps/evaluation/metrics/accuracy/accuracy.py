"""Accuracy metric for `evaluate`, shipped with the project so it loads offline by path.

    metric = evaluate.load("steps/evaluation/metrics/accuracy")
    metric.compute(predictions=[0, 1, 1], references=[0, 1, 0])  # {"accuracy": 0.6666...}
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Accuracy: the share of predictions equal to their reference label."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list[int]): predicted labels.
    references (list[int]): true labels.
    sample_weight (list[float], optional): weight of each example; defaults to equal weights.
Returns:
    accuracy (float): (weighted) share of correct predictions, in [0, 1].
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    """Share of correct predictions, computed with numpy (no scikit-learn needed)."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int32"),
                                        "references": datasets.Value("int32")}),
        )

    def _compute(self, predictions: list[int], references: list[int],
                 sample_weight: list[float] | None = None) -> dict[str, float]:
        correct = np.asarray(predictions) == np.asarray(references)
        weights = np.ones(len(correct)) if sample_weight is None else np.asarray(sample_weight, float)
        if len(correct) == 0 or weights.sum() == 0:
            return {"accuracy": float("nan")}
        return {"accuracy": float((correct * weights).sum() / weights.sum())}
