"""The serving artifact on the inference image's stack, served by the image's own toolkit.

What train.py saved under the Neuron training image's transformers, with the ONNX Runtime variants the Evaluate step
adds (steps/evaluation/serving.py: the graphs and a copy of onnxruntime), is loaded and called by the real Hugging Face
inference toolkit (sagemaker-huggingface-inference-toolkit 2.6.0 with multi-model-server's request context, as in
the inference image) under the inference image's transformers, in an environment without onnxruntime: the handler
must import the copy the artifact carries, nothing downloaded. Every variant must reproduce the Train step's own
predictions (predictions/test.parquet) on the same test rows, and bad requests must stay 400s.

CI keeps the XLA test's model (KEEP_ARTIFACT_DIR), adds the variants with the project's venv (`python
steps/evaluation/serving.py DIR`), installs the inference image's transformers and the toolkit, and runs this file with
SERVE_ARTIFACT_DIR=DIR. Skipped without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACT = os.environ.get("SERVE_ARTIFACT_DIR")
pytestmark = pytest.mark.skipif(not ARTIFACT, reason="SERVE_ARTIFACT_DIR not set (CI sets it)")
# tests/test_train_xla.py's test split, made again here from the same generator; the labels of the Train step's
# predictions must match it row for row
XLA_TEST_SPLIT = {"rows": 20, "seed": 4, "max_length": 128, "max_words": 100}
# The Train step scored in bf16 on the XLA device, the endpoint in fp32 (int8 adds its own rounding)
MARGIN_TOLERANCE = {"fp32": 0.05, "int8": 0.1}
WITHOUT_ONNXRUNTIME = importlib.util.find_spec("onnxruntime") is None  # as the inference image


def inference_image_transformers() -> str:
    text = (ROOT / "pipeline.yaml").read_text()
    return re.search(r"^\s*inference: \S+-transformers([0-9.]+)-", text, re.M).group(1)


def context(headers: dict[str, str] | None = None):  # noqa: ANN201 - multi-model-server's Context
    """The request context multi-model-server hands the toolkit."""
    from mms.context import Context, RequestProcessor
    from mms.metrics.metrics_store import MetricsStore

    ctx = Context("model", ARTIFACT, None, 1, None, "1.1.11")
    ctx.request_processor = [RequestProcessor(headers or {})]
    ctx.metrics = MetricsStore({0: "request"}, "model")
    return ctx


@pytest.fixture(scope="module")
def test_rows(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[list[int]], list[list[int]], np.ndarray]:
    """The test split's token ids and types, and the Train step's margins for them."""
    import pyarrow.parquet as pq
    from fixtures_train import write_split

    folder = write_split(tmp_path_factory.mktemp("split") / "test", Path(ARTIFACT), **XLA_TEST_SPLIT)
    split = pq.read_table(sorted(folder.glob("*.parquet"))).to_pydict()
    predictions = pq.read_table(Path(ARTIFACT) / "predictions" / "test.parquet").to_pydict()
    assert predictions["label"] == split["label"], "test_train_xla.py's split changed: update XLA_TEST_SPLIT"
    logits = np.array(predictions["logits"], np.float32)  # two classes: the margin is logit 1 - logit 0
    return split["input_ids"], split["token_type_ids"], logits[:, 1] - logits[:, 0]


@pytest.mark.parametrize("variant", ["torch/none", "onnxruntime/none", "onnxruntime/int8"])
def test_the_toolkit_serves_each_variant_with_the_train_steps_predictions(variant, test_rows, monkeypatch):
    import transformers
    from sagemaker_huggingface_inference_toolkit.handler_service import HuggingFaceHandlerService

    assert transformers.__version__ == inference_image_transformers(), "install the inference image's version"
    runtime, quantize = variant.split("/")
    monkeypatch.setenv("INFERENCE_RUNTIME", runtime)
    monkeypatch.setenv("INFERENCE_QUANTIZE", quantize)
    service = HuggingFaceHandlerService()
    service.initialize(context())
    model = service.model
    assert model.variant == f"{runtime}-{'int8' if quantize == 'int8' else 'fp32'}", "fell back: see the log"
    if runtime == "onnxruntime" and WITHOUT_ONNXRUNTIME:  # the artifact's copy
        assert Path(sys.modules["onnxruntime"].__file__).is_relative_to(Path(ARTIFACT) / "code" / "packages")

    ids, types, trained = test_rows
    served = []
    for row, row_types in zip(ids, types, strict=True):  # one row at a time, as the endpoint runs int8
        logits = model.forward(np.array([row]), None, np.array([row_types]))[0]
        served.append(float(logits[1] - logits[0]))
    served = np.array(served)
    tolerance = MARGIN_TOLERANCE["int8" if quantize == "int8" else "fp32"]
    confident = np.abs(trained) > tolerance
    assert confident.sum() >= len(trained) // 2, f"too few confident rows to compare: {trained}"
    assert ((served > 0) == (trained > 0))[confident].all(), f"labels differ: served {served}, trained {trained}"
    assert (np.abs(served - trained) <= tolerance * (1 + np.abs(trained))).all(), (served, trained)

    body = json.dumps({"inputs": ["great product, love it", "awful, broken after a day"]}).encode()
    (answer,) = service.handle([{"body": bytearray(body)}], context({"Content-Type": "application/json"}))
    assert json.loads(answer) == model(["great product, love it", "awful, broken after a day"])
    pair = ("great product", "love it, works every day " * 40)  # a title and a content cut at max_length
    body = json.dumps({"inputs": [{"text": pair[0], "text_pair": pair[1]}]}).encode()
    (answer,) = service.handle([{"body": bytearray(body)}], context({"Content-Type": "application/json"}))
    assert json.loads(answer) == model([pair]) and json.loads(answer)[0]["truncated"]
    want = transformers.AutoTokenizer.from_pretrained(ARTIFACT)(*pair, truncation="only_second",
                                                                 max_length=model.max_length)
    assert model.encode([pair])[0][:2] == (want["input_ids"], want["token_type_ids"])  # as the Tokenize step encodes
    from mms.service import PredictionException

    for bad, error in ((b'{"inputs": []}', "EmptyInput"), (b'{"inputs": ["a"', "MalformedJSON")):
        with pytest.raises(PredictionException) as raised:
            service.handle([{"body": bytearray(bad)}], context({"Content-Type": "application/json"}))
        assert raised.value.error_code == 400 and json.loads(raised.value.message)["error"] == error


def test_the_gpu_builds_fp16_model_reproduces_the_train_steps_predictions(test_rows):
    """The GPU build of the inference image ships the same Python packages (docs/serving-targets.md): the handler's
    fp16 model (what a GPU serves when the evaluation allows it) under the image's transformers, here on the CPU."""
    spec = importlib.util.spec_from_file_location("artifact_handler", Path(ARTIFACT) / "code" / "inference.py")
    handler = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(handler)
    model = handler.load(ARTIFACT, precision="fp16")
    assert model.variant == "torch-fp16"
    ids, types, trained = test_rows
    served = np.array([float(np.subtract(*model.forward(np.array([row]), None, np.array([row_types]))[0][::-1]))
                       for row, row_types in zip(ids, types, strict=True)])
    confident = np.abs(trained) > MARGIN_TOLERANCE["int8"]
    assert ((served > 0) == (trained > 0))[confident].all(), f"labels differ: served {served}, trained {trained}"


def test_this_check_runs_without_onnxruntime_like_the_inference_image():
    assert WITHOUT_ONNXRUNTIME, "run this file where onnxruntime is not installed, as in the inference image"
