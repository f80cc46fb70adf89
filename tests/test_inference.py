"""training/inference.py: every input form, every documented error, truncation, int8, threads, order."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from fixtures_ml import CORPUS, build_split_model, build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TEXTS = CORPUS + ["great", "terrible zippers", "the battery broke after a week of great sound"]


def load_handler():
    spec = importlib.util.spec_from_file_location("inference_handler", ROOT / "training" / "inference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


h = load_handler()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inference")
    return build_split_model(root / "model", build_tokenizer(root / "tokenizer", TEXTS), TEXTS)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("INFERENCE_QUANTIZE", "INFERENCE_MAX_TEXTS", "INFERENCE_MAX_LENGTH", "INFERENCE_MICRO_BATCH",
                "INFERENCE_THREADS", "SAGEMAKER_MODEL_SERVER_WORKERS"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def fp32(model_dir: Path):
    return h.model_fn(str(model_dir))


def reference(model_dir: Path, texts: list[str], max_length: int = 128, int8: bool = False) -> list[tuple[str, float]]:
    """Label and probability of each text, one unpadded text at a time, straight from transformers."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    if int8:
        model = h.quantize_int8(model)
    out = []
    with torch.inference_mode():
        for text in texts:
            encoded = tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt")
            probs = model(**encoded).logits.softmax(-1)[0]
            out.append((model.config.id2label[int(probs.argmax())], float(probs.max())))
    return out


def call(model, body: str | bytes, content_type: str = "application/json", accept: str = "application/json"):
    """The container's sequence; the toolkit hands input_fn a str for exactly application/json and text/csv."""
    if isinstance(body, str) and content_type not in ("application/json", "text/csv"):
        body = bytearray(body.encode())
    return h.output_fn(h.predict_fn(h.input_fn(body, content_type), model), accept)


def labels(answer: str) -> list[str]:
    return [item["label"] for item in json.loads(answer)]


def test_each_input_form_gives_the_reference_labels_in_input_order(fp32, model_dir: Path) -> None:
    expected = reference(model_dir, TEXTS)
    assert {label for label, _ in expected} == {"negative", "positive"}, "the fixture model predicts both labels"
    answer = json.loads(call(fp32, json.dumps({"inputs": TEXTS})))
    assert [a["label"] for a in answer] == [label for label, _ in expected]
    assert [a["score"] for a in answer] == pytest.approx([score for _, score in expected], abs=2e-4)
    assert all(set(a) == {"label", "score"} for a in answer)

    want = [label for label, _ in expected]
    assert labels(call(fp32, json.dumps(TEXTS))) == want
    assert labels(call(fp32, json.dumps({"inputs": TEXTS[2], "parameters": {"top_k": 1}}))) == want[2:3]
    assert labels(call(fp32, json.dumps(TEXTS[3]))) == want[3:4]
    assert labels(call(fp32, TEXTS[4], "text/plain")) == want[4:5]
    assert labels(call(fp32, TEXTS[4], "text/plain; charset=utf-8")) == want[4:5]
    csv_body = "\n".join(TEXTS) + "\n"
    assert labels(call(fp32, csv_body, "text/csv")) == want
    # bytes, as the toolkit passes them for a content type with parameters
    assert labels(call(fp32, json.dumps(TEXTS).encode(), "application/json; charset=utf-8")) == want


def test_csv_quoting_keeps_commas_and_newlines_inside_a_review(fp32, model_dir: Path) -> None:
    reviews = ['broke after a week, "never" again', "line one\nline two, great sound", "love it, works"]
    body = "".join('"' + r.replace('"', '""') + '"\r\n' for r in reviews)
    expected = [label for label, _ in reference(model_dir, reviews)]
    assert labels(call(fp32, body, "text/csv")) == expected
    unquoted = "love it, works perfectly\nterrible, broke\n\n"  # unquoted commas are joined back; blank lines skipped
    assert labels(call(fp32, unquoted, "text/csv")) == [
        label for label, _ in reference(model_dir, ["love it, works perfectly", "terrible, broke"])
    ]


def test_jsonlines_on_request(fp32) -> None:
    plain = json.loads(call(fp32, json.dumps({"inputs": TEXTS[:3]})))
    lines = call(fp32, json.dumps({"inputs": TEXTS[:3]}), accept="application/jsonlines")
    assert lines.endswith("\n") and [json.loads(line) for line in lines.splitlines()] == plain
    assert json.loads(call(fp32, json.dumps(TEXTS[:3]), accept="text/html, application/json;q=0.9")) == plain
    assert json.loads(call(fp32, json.dumps(TEXTS[:3]), accept="*/*")) == plain


@pytest.mark.parametrize(
    ("body", "content_type", "status", "error"),
    [
        ('{"inputs": ["a"', "application/json", 400, "MalformedJSON"),
        ("[" * 100_000 + "]" * 100_000, "application/json", 400, "MalformedJSON"),
        ("", "application/json", 400, "MalformedJSON"),
        ('{"inputs": []}', "application/json", 400, "EmptyInput"),
        ("[]", "application/json", 400, "EmptyInput"),
        ('{"inputs": ["fine", "  "]}', "application/json", 400, "EmptyInput"),
        ("", "text/plain", 400, "EmptyInput"),
        ("\n\n", "text/csv", 400, "EmptyInput"),
        ('{"inputs": ["fine", 3]}', "application/json", 400, "InvalidInput"),
        ('{"inputs": [["nested"]]}', "application/json", 400, "InvalidInput"),
        ('{"inputs": null}', "application/json", 400, "InvalidInput"),
        ('{"text": "hello"}', "application/json", 400, "InvalidInput"),
        ('{"inputs": "x", "extra": 1}', "application/json", 400, "InvalidInput"),
        ('{"inputs": "x", "parameters": 5}', "application/json", 400, "InvalidInput"),
        ('{"inputs": "\\ud800 lone surrogate"}', "application/json", 400, "InvalidInput"),
        ("7", "application/json", 400, "InvalidInput"),
        ("<review>great</review>", "application/xml", 415, "UnsupportedContentType"),
        ("great", "text/plain; charset=klingon", 415, "UnsupportedCharset"),
    ],
)
def test_bad_input_is_a_documented_4xx(fp32, body: str, content_type: str, status: int, error: str) -> None:
    with pytest.raises(h.InferenceError) as raised:
        call(fp32, body, content_type)
    assert (raised.value.status, raised.value.error) == (status, error)
    message = json.loads(str(raised.value))  # the container's 400 carries this message
    assert message["error"] == error and message["detail"]


def test_invalid_utf8_and_unsupported_accept(fp32) -> None:
    with pytest.raises(h.InferenceError) as raised:
        h.input_fn(bytearray(b'{"inputs": "\xff"}'), "application/json; charset=utf-8")
    assert (raised.value.status, raised.value.error) == (400, "InvalidEncoding")
    with pytest.raises(h.InferenceError) as raised:
        call(fp32, json.dumps("great"), accept="text/html")
    assert (raised.value.status, raised.value.error) == (406, "UnsupportedAccept")


def test_limits_on_texts_and_bytes(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERENCE_MAX_TEXTS", "3")
    fp32 = h.model_fn(str(model_dir))
    assert len(json.loads(call(fp32, json.dumps(TEXTS[:3])))) == 3
    with pytest.raises(h.InferenceError) as raised:
        call(fp32, json.dumps(TEXTS[:4]))
    assert (raised.value.status, raised.value.error) == (413, "TooManyTexts") and "limit is 3" in raised.value.detail
    with pytest.raises(h.InferenceError, match="TooManyTexts"):  # predict_fn called directly checks it too
        h.predict_fn(TEXTS[:4], fp32)
    big = json.dumps({"inputs": "a" * h.MAX_PAYLOAD_BYTES})
    with pytest.raises(h.InferenceError) as raised:
        h.input_fn(big, "application/json")
    assert (raised.value.status, raised.value.error) == (413, "PayloadTooLarge")


def test_long_texts_are_truncated_and_say_so(fp32, model_dir: Path) -> None:
    long_text = " ".join(TEXTS * 400)  # far beyond 128 tokens and beyond the character cut
    spaced = TEXTS[0] + " " * 20_000 + TEXTS[1] * 300  # whitespace the cut must not lose
    solid = "x" * 30_000 + " great"  # one alphanumeric run longer than the cut: a single [UNK]
    answer = json.loads(call(fp32, json.dumps({"inputs": [long_text, "great", spaced, solid]})))
    assert [a.get("truncated", False) for a in answer] == [True, False, True, False]
    expected = reference(model_dir, [long_text, "great", spaced, solid])
    assert [a["label"] for a in answer] == [label for label, _ in expected]
    assert [a["score"] for a in answer] == pytest.approx([score for _, score in expected], abs=2e-4)


@pytest.mark.parametrize("cut_at", [50, 128, 200])
def test_cutting_long_texts_never_changes_their_tokens(fp32, cut_at: int) -> None:
    backend = fp32.tokenizer.backend_tokenizer
    samples = [
        " ".join(TEXTS * 50),
        "!?" * 5000,
        "superlongword" * 400 + " tail " * 300,
        ("great, " * 10 + " " * 3000) * 5,
        "é" * 9000,
    ]
    original = h.CHARS_PER_TOKEN_CUT
    try:
        h.CHARS_PER_TOKEN_CUT = cut_at // 10 or 1  # cut much closer to max_length than in production
        encoded = fp32.encode(samples)
    finally:
        h.CHARS_PER_TOKEN_CUT = original
    for text, (ids, _) in zip(samples, encoded, strict=True):
        assert ids == backend.encode(text).ids


def test_order_is_kept_across_micro_batches(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERENCE_MICRO_BATCH", "2")
    small = h.model_fn(str(model_dir))
    texts = [TEXTS[i % len(TEXTS)] * (1 + i % 3) for i in range(23)]
    expected = reference(model_dir, texts)
    answer = json.loads(call(small, json.dumps(texts)))
    assert [a["label"] for a in answer] == [label for label, _ in expected]
    assert [a["score"] for a in answer] == pytest.approx([score for _, score in expected], abs=2e-4)


def test_int8_variant_and_settings_from_the_environment(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setenv("INFERENCE_QUANTIZE", "int8")
    monkeypatch.setenv("INFERENCE_MAX_LENGTH", "16")
    monkeypatch.setenv("INFERENCE_THREADS", "1")
    int8 = h.model_fn(str(model_dir))
    assert int8.quantized and not any(isinstance(m, torch.nn.Linear) for m in int8.model.modules())
    assert int8.max_length == 16 and torch.get_num_threads() == 1
    for text in TEXTS[:4]:  # one text per request: no padding in the per-batch activation scale
        (answer,) = json.loads(call(int8, json.dumps(text)))
        ((label, score),) = reference(model_dir, [text], max_length=16, int8=True)
        assert answer["label"] == label and answer["score"] == pytest.approx(score, abs=1e-5)

    monkeypatch.setenv("INFERENCE_QUANTIZE", "fp16")
    with pytest.raises(ValueError, match="INFERENCE_QUANTIZE='fp16': expected int8 or none"):
        h.model_fn(str(model_dir))
    monkeypatch.setenv("INFERENCE_QUANTIZE", "none")
    monkeypatch.setenv("INFERENCE_MAX_TEXTS", "zero")
    with pytest.raises(ValueError, match="INFERENCE_MAX_TEXTS='zero': expected an integer >= 1"):
        h.model_fn(str(model_dir))


def test_threads_share_the_cpus_among_model_server_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(h.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert h.cpu_threads() == 8
    monkeypatch.setenv("SAGEMAKER_MODEL_SERVER_WORKERS", "4")
    assert h.cpu_threads() == 2
    monkeypatch.setenv("SAGEMAKER_MODEL_SERVER_WORKERS", "16")
    assert h.cpu_threads() == 1
    monkeypatch.setenv("INFERENCE_THREADS", "3")
    assert h.cpu_threads() == 3
