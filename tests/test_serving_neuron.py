"""The handler on Inferentia2, up to the compiler call: with an Inferentia2 target's environment and a Neuron device,
the first model-server worker compiles the model once with the configured static shapes and cast, the others load
what it saved, requests run in batches of the compiled size truncated to its length, and answers say neuron-<cast>.
optimum-neuron and neuronx-cc cannot run here: tests/standins/optimum stands in for the API the handler calls."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from fixtures_ml import CORPUS, add_serving_code, build_split_model, build_tokenizer
from test_inference import call, h

ROOT = Path(__file__).resolve().parent.parent
STANDINS = ROOT / "tests" / "standins"
SHAPES = {"INFERENCE_NEURON_BATCH_SIZE": "2", "INFERENCE_NEURON_SEQUENCE_LENGTH": "16", "INFERENCE_NEURON_CAST": "bf16"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("neuron")
    return add_serving_code(build_split_model(root / "model", build_tokenizer(root / "tokenizer", CORPUS), CORPUS))


@pytest.fixture
def inferentia2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """This process as an Inferentia2 instance: a Neuron device, optimum-neuron's stand-in, an empty compile folder and
    the target's environment."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "neuron0").touch()
    monkeypatch.setattr(h, "NEURON_DEVICES", tmp_path / "dev")
    monkeypatch.setattr(h, "NEURON_COMPILED", tmp_path / "compiled")
    monkeypatch.syspath_prepend(str(STANDINS))
    for name in ("optimum", "optimum.neuron"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.invalidate_caches()
    for name, value in SHAPES.items():
        monkeypatch.setenv(name, value)
    standin = importlib.import_module("optimum.neuron")
    standin.COMPILES.clear()
    yield standin
    for name in ("optimum", "optimum.neuron"):
        sys.modules.pop(name, None)


def test_the_first_worker_compiles_once_with_the_configured_shapes_and_the_others_load_it(model_dir, inferentia2):
    first = h.model_fn(str(model_dir))
    assert inferentia2.COMPILES == [{"model_id": str(model_dir), "batch_size": 2, "sequence_length": 16,
                                     "auto_cast": "matmul", "auto_cast_type": "bf16", "disable_neuron_cache": True}]
    assert (first.variant, first.micro_batch, first.max_length) == ("neuron-bf16", 2, 16)
    second = h.model_fn(str(model_dir))  # another model-server worker of the instance
    assert len(inferentia2.COMPILES) == 1 and second.variant == "neuron-bf16"
    assert sorted(p.name for p in h.NEURON_COMPILED.iterdir()) == ["batch2-length16-bf16", "batch2-length16-bf16.lock"]


def test_requests_run_in_the_compiled_shapes_and_answer_as_on_the_cpu(model_dir, inferentia2):
    """Five texts, one over the compiled length: batches of two, truncated at 16 tokens, the CPU's labels."""
    texts = [*CORPUS[:4], " ".join(CORPUS)]
    neuron = h.model_fn(str(model_dir))
    answers, headers = json.loads(call(neuron, json.dumps(texts))), []
    cpu = h.load(model_dir, max_length=16)
    assert [a["label"] for a in answers] == [a["label"] for a in cpu(texts)]
    assert answers[-1]["truncated"] is True and "truncated" not in answers[0]

    class Context:
        def set_response_header(self, _: int, name: str, value: str) -> None:
            headers.append((name, value))

    h.predict_fn(h.input_fn(json.dumps(texts[:1]), "application/json"), neuron, Context())
    assert headers == [("X-Amzn-SageMaker-Custom-Attributes", "inference-variant=neuron-bf16")]


def test_fp32_compiles_without_casting(model_dir, inferentia2, monkeypatch):
    monkeypatch.setenv("INFERENCE_NEURON_CAST", "fp32")
    assert h.model_fn(str(model_dir)).variant == "neuron-fp32"
    assert inferentia2.COMPILES[0]["auto_cast"] is None and "auto_cast_type" not in inferentia2.COMPILES[0]
    monkeypatch.setenv("INFERENCE_NEURON_CAST", "fp16")
    with pytest.raises(ValueError, match="INFERENCE_NEURON_CAST='fp16': expected bf16 or fp32"):
        h.model_fn(str(model_dir))


def test_the_handler_runs_in_the_neuron_images_python_and_against_its_optimum_neuron():
    """The Neuron image has Python 3.10 and optimum-neuron 0.4.1 (tests/images/inference_neuron.txt): the handler
    parses as 3.10, and the stand-in is of that version's API."""
    import ast

    pins = dict(line.split("==") for line in (ROOT / "tests" / "images" / "inference_neuron.txt").read_text()
                .splitlines() if "==" in line and not line.startswith("#"))
    assert pins["python"].startswith("3.10.")
    ast.parse((ROOT / "training" / "inference.py").read_text(), feature_version=(3, 10))
    sys.path.insert(0, str(STANDINS))
    try:
        spec = importlib.util.find_spec("optimum.neuron")
        standin = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(standin)
    finally:
        sys.path.remove(str(STANDINS))
        sys.modules.pop("optimum", None)
    assert pins["optimum-neuron"] == standin.VERSION


def test_without_a_neuron_device_the_target_serves_on_the_cpu(model_dir, inferentia2, monkeypatch, tmp_path):
    """run --local, or the Inferentia2 specification deployed on another instance: the CPU, no compile."""
    monkeypatch.setattr(h, "NEURON_DEVICES", tmp_path / "no-devices")
    assert h.model_fn(str(model_dir)).variant == "torch-fp32" and inferentia2.COMPILES == []
