"""What train.py saved under the training image's transformers, served under the inference image's.

CI trains with the XLA test under the Neuron training image's transformers (`KEEP_ARTIFACT_DIR`), then installs
the version of `images.inference` and runs this file with `SERVE_ARTIFACT_DIR` pointing at that model folder.
Skipped without it."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACT = os.environ.get("SERVE_ARTIFACT_DIR")
pytestmark = pytest.mark.skipif(not ARTIFACT, reason="SERVE_ARTIFACT_DIR not set (CI sets it)")


def inference_image_transformers() -> str:
    text = (ROOT / "pipeline.yaml").read_text()
    return re.search(r"^\s*inference: \S+-transformers([0-9.]+)-", text, re.M).group(1)


@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_the_inference_images_transformers_serves_what_train_saved(quantize, monkeypatch):
    import transformers

    assert transformers.__version__ == inference_image_transformers(), "install the inference image's version"
    assert (Path(ARTIFACT) / "code" / "inference.py").is_file()
    monkeypatch.setenv("INFERENCE_QUANTIZE", quantize)
    spec = importlib.util.spec_from_file_location(f"served_{quantize}", Path(ARTIFACT) / "code" / "inference.py")
    handler = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(handler)
    model = handler.model_fn(ARTIFACT)
    texts = handler.input_fn(json.dumps({"inputs": ["great product, love it", "awful, broken after a day"]}),
                             "application/json")
    answer = json.loads(handler.output_fn(handler.predict_fn(texts, model), "application/json"))
    assert [a["label"] in ("positive", "negative") for a in answer] == [True, True]
    assert all(0.0 <= a["score"] <= 1.0 for a in answer)
