"""Torch-free model versions for lifecycle tests: a keyword classifier under the SageMaker handler contract (served by
the real local endpoint), with an evaluation folder holding evaluation.json and the labelled endpoint sample."""

from __future__ import annotations

import json
from pathlib import Path

HANDLER = '''
import json
from pathlib import Path


def model_fn(model_dir):
    return json.loads((Path(model_dir) / "toy.json").read_text())


def input_fn(input_data, content_type):
    texts = json.loads(input_data)["inputs"]
    return [texts] if isinstance(texts, str) else texts


def predict_fn(texts, model):
    if model["kind"] == "broken":
        raise RuntimeError("this model is broken")
    words = ("great",) if model["kind"] == "weak" else ("great", "love")
    positive = [any(word in text for word in words) for text in texts]
    if model["kind"] == "flipped":
        positive = [not p for p in positive]
    return [{"label": "positive" if p else "negative", "score": 0.9} for p in positive]


def output_fn(prediction, accept):
    return json.dumps(prediction)
'''
GOOD = ["great sound, love it", "a great blender", "love the colour", "great value", "works great"]
BAD = ["awful lid, broke", "terrible zipper", "a waste of money", "stopped working", "flimsy and cheap"]


def sample_rows(count: int = 40, kind: str = "good") -> list[dict]:
    """Labelled rows with the evaluation's predictions: right on all but the last two (accuracy 0.95); a `weak`
    model's own (it takes only "great" for praise: wrong on one positive text in five, accuracy 0.9)."""
    rows = []
    for i in range(count):
        label = i % 2
        text = (GOOD if label else BAD)[i // 2 % 5] + f" #{i}"
        prediction = int("great" in text) if kind == "weak" else label if i < count - 2 else 1 - label
        rows.append({"text": text, "label": label, "prediction": prediction})
    return rows


def toy_version(folder: Path, kind: str = "good", sample: list[dict] | None = None) -> tuple[Path, Path]:
    """A model folder (`kind`: good, weak, flipped or broken) and its evaluation.json beside endpoint_sample.jsonl."""
    model, evaluation = folder / "model", folder / "evaluation"
    (model / "code").mkdir(parents=True)
    (model / "code" / "inference.py").write_text(HANDLER)
    (model / "toy.json").write_text(json.dumps({"kind": kind}))
    evaluation.mkdir()
    report = {"binary_classification_metrics": {"accuracy": {"value": 0.95, "standard_deviation": 0.01}}}
    (evaluation / "evaluation.json").write_text(json.dumps(report))
    rows = sample_rows(kind=kind) if sample is None else sample
    (evaluation / "endpoint_sample.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model, evaluation / "evaluation.json"
