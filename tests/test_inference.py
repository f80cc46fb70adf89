"""training/inference.py: every input form, every documented error, truncation, every variant (torch and ONNX
Runtime, fp32 and int8), the fallback to torch fp32, threads, order."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fixtures_ml import CORPUS, add_onnx_graphs, add_serving_code, build_split_model, build_tokenizer

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
    for var in ("INFERENCE_RUNTIME", "INFERENCE_QUANTIZE", "INFERENCE_MAX_TEXTS", "INFERENCE_MAX_LENGTH",
                "INFERENCE_MICRO_BATCH", "INFERENCE_THREADS", "SAGEMAKER_MODEL_SERVER_WORKERS"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def graphs(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the model with the ONNX graphs the Evaluate step builds."""
    return add_onnx_graphs(add_serving_code(Path(shutil.copytree(model_dir, tmp_path_factory.mktemp("g") / "m"))))


@pytest.fixture(scope="module")
def variants(graphs: Path) -> dict:
    return {name: h.load(graphs, *name.split("/")) for name in ("torch/none", "onnxruntime/none", "onnxruntime/int8")}


@pytest.fixture(scope="module", params=["torch/none", "onnxruntime/none"])
def fp32(request: pytest.FixtureRequest, variants: dict):
    """Each fp32 variant: the same answers as transformers, within float noise."""
    return variants[request.param]


@pytest.fixture(scope="module", params=["torch/none", "onnxruntime/none", "onnxruntime/int8"])
def served(request: pytest.FixtureRequest, variants: dict):
    return variants[request.param]


def reference(model_dir: Path, texts: list, max_length: int = 128, int8: bool = False) -> list[tuple[str, float]]:
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
            pair = {} if isinstance(text, str) else {"text_pair": text[1], "truncation": "only_second"}
            first = text if isinstance(text, str) else text[0]
            encoded = tokenizer(first, **{"truncation": True, **pair}, max_length=max_length, return_tensors="pt",
                                return_token_type_ids=True)
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
    assert all(set(a) == {"label", "score", "probabilities"} for a in answer)

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


def test_a_title_and_content_pair_is_encoded_as_the_training_rows_were(served, model_dir: Path) -> None:
    pairs = [(TEXTS[i], TEXTS[-1 - i] + f" {TEXTS[i]}" * 130) for i in range(len(TEXTS))]  # long contents: cut
    body = json.dumps({"inputs": [{"text": t, "text_pair": c} for t, c in pairs] + [TEXTS[0]]})
    answer = json.loads(call(served, body))
    expected = reference(model_dir, [*pairs, TEXTS[0]], int8=served.quantize == "int8")
    if served.variant != "onnxruntime-int8":  # the fused int8 graph differs from torch's int8 in its scores
        assert [a["label"] for a in answer] == [label for label, _ in expected]
        assert [a["score"] for a in answer] == pytest.approx([score for _, score in expected], abs=2e-4)
    assert [a.get("truncated", False) for a in answer] == [True] * len(pairs) + [False]
    as_one_text = json.loads(call(served, json.dumps({"inputs": [f"{t} {c}" for t, c in pairs]})))
    assert [a["score"] for a in as_one_text] != [a["score"] for a in answer[:-1]]  # token types matter


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
    # the container answers with the Accept header as Content-Type: JSON Lines only when it is the one type named
    assert json.loads(call(fp32, json.dumps(TEXTS[:3]), accept="application/jsonlines, application/json")) == plain
    assert json.loads(call(fp32, json.dumps(TEXTS[:3]), accept="application/*")) == plain


def test_a_pair_is_answered_as_the_tokenize_step_kept_it(fp32, model_dir: Path) -> None:
    """Tokenize keeps a row with a blank title (encoded as its content alone) and one with a title and blank
    content (the pair); the endpoint test sends such rows as pairs, so each gets its training encoding's answer."""
    content, title = TEXTS[1], TEXTS[2]
    blank_title = json.loads(call(fp32, json.dumps({"inputs": [{"text": "  ", "text_pair": content}]})))
    assert blank_title == json.loads(call(fp32, json.dumps({"inputs": [content]})))
    (blank_content,) = json.loads(call(fp32, json.dumps({"inputs": [{"text": title, "text_pair": ""}]})))
    ((label, score),) = reference(model_dir, [(title, " ")])  # transformers drops an empty text_pair; a blank one
    # encodes as Tokenize encodes (title, ""): [CLS] title [SEP] [SEP]
    assert blank_content["label"] == label and blank_content["score"] == pytest.approx(score, abs=2e-4)
    one_pair = {"text": title, "text_pair": content}
    assert call(fp32, json.dumps({"inputs": one_pair})) == call(fp32, json.dumps({"inputs": [one_pair]}))


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
        ('{"inputs": [{"text": "a title"}]}', "application/json", 400, "InvalidInput"),
        ('{"inputs": [{"text": "a", "text_pair": 3}]}', "application/json", 400, "InvalidInput"),
        ('{"inputs": [{"text": "a", "text_pair": "b", "x": 1}]}', "application/json", 400, "InvalidInput"),
        ('{"inputs": {"text": "a", "text_pair": "b", "x": 1}}', "application/json", 400, "InvalidInput"),
        ('{"inputs": [{"text": " ", "text_pair": "\\t"}]}', "application/json", 400, "EmptyInput"),
        ('"an unmatched quote\nswallows\nthe next lines\n', "text/csv", 400, "MalformedCSV"),
        ('{"inputs": "x", "extra": 1}', "application/json", 400, "InvalidInput"),
        ('{"inputs": "x", "parameters": 5}', "application/json", 400, "InvalidInput"),
        ('{"inputs": "\\ud800 lone surrogate"}', "application/json", 400, "InvalidInput"),
        ("7", "application/json", 400, "InvalidInput"),
        ("<review>great</review>", "application/xml", 415, "UnsupportedContentType"),
        ("great", "text/plain; charset=klingon", 415, "UnsupportedCharset"),
    ],
)
def test_bad_input_is_a_documented_4xx(served, body: str, content_type: str, status: int, error: str) -> None:
    with pytest.raises(h.InferenceError) as raised:
        call(served, body, content_type)
    assert (raised.value.status, raised.value.error) == (status, error)
    message = json.loads(str(raised.value))  # the container's 400 carries this message
    assert message["error"] == error and message["detail"]


@pytest.mark.parametrize(("body", "detail"), [
    ('{"inputs": ["fine", 3]}', 'inputs[1] is a number: expected a string or {"text": str, "text_pair": str}'),
    ('{"inputs": [null]}', 'inputs[0] is null: expected a string or {"text": str, "text_pair": str}'),
    ('{"inputs": {"a": 1}}', "inputs must be a string or an array, not an object"),
])
def test_an_invalid_input_is_named_by_its_json_type(served, body: str, detail: str) -> None:
    with pytest.raises(h.InferenceError) as raised:
        call(served, body, "application/json")
    assert json.loads(str(raised.value))["detail"] == detail


def test_every_class_has_its_probability_top_k_orders_them_and_csv_answers_the_same(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    from fixtures_ml import build_model

    names = ("billing", "technical", "sales")
    folder = tmp_path_factory.mktemp("three")
    model = h.model_fn(str(add_serving_code(build_model(folder / "model", build_tokenizer(folder / "tok"),
                                                        seed=3, labels=names))))
    answer = json.loads(call(model, json.dumps({"inputs": TEXTS[:3], "parameters": {"top_k": 2}})))
    for item in answer:
        probabilities = item["probabilities"]
        assert list(probabilities) == list(names) and sum(probabilities.values()) == pytest.approx(1, abs=1e-5)
        assert item["score"] == probabilities[item["label"]] == max(probabilities.values())
        ranked = sorted(probabilities, key=lambda name: -probabilities[name])
        assert item["top_k"] == [{"label": name, "score": probabilities[name]} for name in ranked[:2]]
    plain = json.loads(call(model, json.dumps(TEXTS[:3])))
    assert [{k: v for k, v in a.items() if k != "top_k"} for a in answer] == plain and "top_k" not in plain[0]
    table = call(model, json.dumps(TEXTS[:3]), accept="text/csv").splitlines()
    assert table[0] == "label,score,truncated,probability:billing,probability:technical,probability:sales"
    assert table[1:] == [",".join([a["label"], str(a["score"]), "false", *map(str, a["probabilities"].values())])
                         for a in plain]
    for bad in (0, "2", True, 1.5):
        with pytest.raises(h.InferenceError) as raised:
            call(model, json.dumps({"inputs": "great", "parameters": {"top_k": bad}}))
        assert raised.value.status == 400 and "parameters.top_k" in raised.value.detail


def test_invalid_utf8_and_unsupported_accept(served) -> None:
    with pytest.raises(h.InferenceError) as raised:
        h.input_fn(bytearray(b'{"inputs": "\xff"}'), "application/json; charset=utf-8")
    assert (raised.value.status, raised.value.error) == (400, "InvalidEncoding")
    with pytest.raises(h.InferenceError) as raised:
        call(served, json.dumps("great"), accept="text/html")
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


def test_a_csv_review_longer_than_the_csv_modules_field_limit_is_truncated_as_json_is(fp32) -> None:
    review = " ".join(TEXTS * 2000)  # over the csv module's default 131,072 characters a field
    assert len(review) > 131_072
    as_csv = json.loads(call(fp32, '"' + review + '"\n', "text/csv"))
    assert as_csv == json.loads(call(fp32, json.dumps(review))) and as_csv[0]["truncated"] is True


def test_the_hugging_face_toolkits_csv_reads_its_inputs_column(fp32, model_dir: Path) -> None:
    """The default handler's CSV names an "inputs" column in its header: its values are the reviews, the header
    none of them (read as a review, it would shift every answer by one)."""
    want = labels(call(fp32, json.dumps(TEXTS[:3])))
    assert labels(call(fp32, "inputs\n" + "\n".join(TEXTS[:3]) + "\n", "text/csv")) == want
    quoted = "id,Inputs\r\n" + "".join(f'{i},"{t}"\r\n' for i, t in enumerate(TEXTS[:3]))
    assert labels(call(fp32, quoted, "text/csv")) == want
    with pytest.raises(h.InferenceError) as raised:
        call(fp32, "id,inputs\n1,great, really\n", "text/csv")
    assert (raised.value.status, raised.value.error) == (400, "MalformedCSV") and "quote it" in raised.value.detail
    with pytest.raises(h.InferenceError, match="EmptyInput"):
        call(fp32, "inputs\n", "text/csv")


@pytest.mark.parametrize("accept", ["application/json; charset=utf-16", "application/jsonlines;charset=latin-1"])
def test_an_accept_with_another_charset_than_utf8_is_refused(fp32, accept: str) -> None:
    """The answer is UTF-8 and the container echoes Accept as its Content-Type: another charset would mislabel it."""
    with pytest.raises(h.InferenceError) as raised:
        call(fp32, json.dumps("great"), accept=accept)
    assert (raised.value.status, raised.value.error) == (406, "UnsupportedAccept")
    assert json.loads(call(fp32, json.dumps("great"), accept="application/json; charset=UTF-8"))[0]["label"]


@pytest.mark.parametrize("cut_at", [50, 128, 200])
def test_cutting_long_texts_never_changes_their_tokens(variants: dict, cut_at: int) -> None:
    fp32 = variants["torch/none"]
    backend = fp32.tokenizer
    samples = [
        " ".join(TEXTS * 50),
        "!?" * 5000,
        "superlongword" * 400 + " tail " * 300,
        ("great, " * 10 + " " * 3000) * 5,
        "é" * 9000,
        ("a short title", "superlongword" * 400 + " tail " * 300),  # a pair is cut in its content
        ("great, " * 3000, "fine " * 3000),  # a title leaving no room for content: both are cut
    ]
    original = h.CHARS_PER_TOKEN_CUT
    try:
        h.CHARS_PER_TOKEN_CUT = cut_at // 10 or 1  # cut much closer to max_length than in production
        encoded = fp32.encode(samples)
    finally:
        h.CHARS_PER_TOKEN_CUT = original
    expected = [backend.encode(t) for t in samples[:-2]]
    expected += [fp32.pair_tokenizer.encode(*samples[-2]), backend.encode(*samples[-1])]
    for (ids, types, _), want in zip(encoded, expected, strict=True):
        assert ids == want.ids and types == want.type_ids
    assert encoded[-1][2] and encoded[-2][2]
    title = backend.encode("a short title").ids  # [CLS] title [SEP], kept whole
    assert encoded[-2][0][: len(title)] == title and encoded[-2][1][len(title)] == 1


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
    assert int8.variant == "torch-int8" and not any(isinstance(m, torch.nn.Linear) for m in int8.model.modules())
    assert int8.max_length == 16 and torch.get_num_threads() == 1
    for text in TEXTS[:4]:  # one text per request: no padding in the per-batch activation scale
        (answer,) = json.loads(call(int8, json.dumps(text)))
        ((label, score),) = reference(model_dir, [text], max_length=16, int8=True)
        assert answer["label"] == label and answer["score"] == pytest.approx(score, abs=1e-5)

    monkeypatch.setenv("INFERENCE_QUANTIZE", "fp16")
    with pytest.raises(ValueError, match="INFERENCE_QUANTIZE='fp16': expected none or int8"):
        h.model_fn(str(model_dir))
    monkeypatch.setenv("INFERENCE_QUANTIZE", "none")
    monkeypatch.setenv("INFERENCE_RUNTIME", "tensorrt")
    with pytest.raises(ValueError, match="INFERENCE_RUNTIME='tensorrt': expected torch or onnxruntime"):
        h.model_fn(str(model_dir))
    monkeypatch.delenv("INFERENCE_RUNTIME")
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


def graph_answer(session, tokenizer, labels: tuple[str, ...], text: str) -> tuple[str, float]:
    """A text alone through an ONNX Runtime session made here with default options."""
    ids = np.array([tokenizer.encode(text).ids])
    given = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    feed = {i.name: given[i.name].astype(np.int32 if "int32" in i.type else np.int64) for i in session.get_inputs()}
    logits = session.run(None, feed)[0][0].astype(np.float64)
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    return labels[int(probs.argmax())], float(probs.max())


def test_onnx_variants_are_fused_quantized_and_answer_each_text_as_alone(variants: dict, graphs: Path) -> None:
    import onnx
    import onnxruntime as ort

    ops = {q: {n.op_type for n in onnx.load(str(h.onnx_path(graphs, q))).graph.node} for q in ("none", "int8")}
    assert {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization"} <= ops["none"]
    assert {"QAttention", "QEmbedLayerNormalization", "MatMulInteger"} <= ops["int8"] and "MatMul" not in ops["int8"]
    int8 = variants["onnxruntime/int8"]
    assert int8.micro_batch == 1  # activation scales per batch: one text at a time
    session = ort.InferenceSession(str(h.onnx_path(graphs, "int8")), providers=["CPUExecutionProvider"])
    expected = [graph_answer(session, int8.tokenizer, int8.labels, text) for text in TEXTS]
    together = json.loads(call(int8, json.dumps({"inputs": TEXTS})))
    assert [a["label"] for a in together] == [label for label, _ in expected]
    assert [a["score"] for a in together] == pytest.approx([score for _, score in expected], abs=1e-5)
    for text, answer in zip(TEXTS, together, strict=True):  # the same answer alone as among other texts
        assert json.loads(call(int8, json.dumps(text))) == [answer]


def test_the_onnxruntime_variant_from_the_environment(graphs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERENCE_RUNTIME", "onnxruntime")
    monkeypatch.setenv("INFERENCE_THREADS", "1")
    monkeypatch.setenv("INFERENCE_MICRO_BATCH", "3")
    served = h.model_fn(str(graphs))
    assert served.variant == "onnxruntime-fp32" and served.micro_batch == 3
    assert served.model.get_session_options().intra_op_num_threads == 1
    texts = [TEXTS[i % len(TEXTS)] * (1 + i % 3) for i in range(11)]
    answer = json.loads(call(served, json.dumps(texts)))
    expected = reference(graphs, texts)
    assert [a["label"] for a in answer] == [label for label, _ in expected]
    assert [a["score"] for a in answer] == pytest.approx([score for _, score in expected], abs=2e-4)


def test_a_variant_that_cannot_run_here_falls_back_to_torch_fp32_and_says_so(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("INFERENCE_RUNTIME", "onnxruntime")
    monkeypatch.setenv("INFERENCE_QUANTIZE", "int8")
    with caplog.at_level(logging.INFO, logger=h.LOG.name):
        fallback = h.model_fn(str(model_dir))  # an artifact without onnx/
    assert fallback.variant == "torch-fp32"
    assert "the artifact has no onnx/model-int8.onnx" in caplog.text and "serving torch fp32" in caplog.text
    assert labels(call(fallback, json.dumps(TEXTS))) == [label for label, _ in reference(model_dir, TEXTS)]

    # Each answer says which variant served it (the model server's Context.set_response_header, returned by
    # InvokeEndpoint as CustomAttributes): the endpoint test tells the fallback from what the environment names.
    from pipeline.local.endpoint import Context

    context = Context("m", str(model_dir))
    h.predict_fn(h.input_fn(json.dumps(TEXTS[:1]), "application/json"), fallback, context)
    attributes = context.response_headers["X-Amzn-SageMaker-Custom-Attributes"]
    from steps.deploy import endpoint_check as check
    assert check.served_variant({"CustomAttributes": attributes}) == "torch-fp32"
    expected = check.expectation({"INFERENCE_RUNTIME": "onnxruntime", "INFERENCE_QUANTIZE": "int8"}, {})
    assert expected == {"variant": "onnxruntime-int8", "p50_ms": None}


# An image without onnxruntime: importing it fails unless the artifact's code/packages/ is on sys.path (where it is
# then found); find_spec still answers, as transformers' availability probes need.
WITHOUT_ONNXRUNTIME = """
import importlib.abc, importlib.machinery, importlib.util, json, os, sys
class Missing(importlib.abc.Loader):
    def create_module(self, spec):
        raise ModuleNotFoundError(f"No module named {spec.name!r}", name=spec.name)
    def exec_module(self, module):
        pass
class Image(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] != "onnxruntime":
            return None
        vendored = [p for p in sys.path if p.endswith(os.path.join("code", "packages"))]
        spec = importlib.machinery.PathFinder.find_spec(name, path or vendored) if vendored else None
        return spec or importlib.util.spec_from_loader(name, Missing())
sys.meta_path.insert(0, Image())
sys.path.insert(0, os.path.join(sys.argv[1], "code"))
import inference
model = inference.model_fn(sys.argv[1])
answer = inference.output_fn(inference.predict_fn(inference.input_fn('["great", "awful"]', "application/json"),
                                                  model), "application/json")
print(json.dumps({"variant": model.variant, "answer": json.loads(answer),
                  "onnxruntime": getattr(sys.modules.get("onnxruntime"), "__file__", None)}))
"""


def serve_without_onnxruntime(model: Path) -> tuple[dict, str]:
    env = {**os.environ, "INFERENCE_RUNTIME": "onnxruntime", "INFERENCE_QUANTIZE": "int8", "INFERENCE_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", WITHOUT_ONNXRUNTIME, str(model)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1]), proc.stderr


@pytest.mark.slow  # three handler processes in an image-like environment
def test_an_image_without_onnxruntime_uses_the_copy_in_the_artifact(graphs: Path, tmp_path: Path) -> None:
    import onnxruntime

    from steps.evaluation import serving

    model = Path(shutil.copytree(graphs, tmp_path / "model"))
    served, _ = serve_without_onnxruntime(model)
    assert served["variant"] == "torch-fp32" and served["onnxruntime"] is None  # no copy: torch fp32

    assert serving.vendor_runtime(model)["onnxruntime"] == onnxruntime.__version__
    served, log = serve_without_onnxruntime(model)
    assert served["variant"] == "onnxruntime-int8", log
    assert served["onnxruntime"].startswith(str(model / "code" / "packages" / "onnxruntime"))
    assert [a["label"] for a in served["answer"]] == labels(call(h.load(graphs, "onnxruntime", "int8"),
                                                                 json.dumps(["great", "awful"])))

    shutil.rmtree(model / "code" / "packages" / "onnxruntime")  # a copy built for another Python
    (model / "code" / "packages" / "onnxruntime").mkdir()
    (model / "code" / "packages" / "onnxruntime" / "__init__.py").write_text("raise ImportError('cpython-399')\n")
    served, log = serve_without_onnxruntime(model)
    assert served["variant"] == "torch-fp32" and "does not load here" in log and "cpython-399" in log
