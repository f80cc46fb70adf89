"""The labelled sample Evaluate writes for the endpoint test (steps/endpoint_sample.py): the evaluation's sampled test
rows as text with their labels and the evaluation's predictions. Served by the project's handler on a real local
endpoint, the same model answers exactly those predictions: the test's accuracy reference is exact."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from fixtures_ml import CORPUS, add_serving_code, build_split_model, build_tokenizer, load_step, write_tokenized

from pipeline import contract
from pipeline.code import step_module
from pipeline.local.endpoint import LocalEndpoint

ev = load_step("evaluate")
check = step_module("endpoint_check")
TEXTS = CORPUS + ["great", "terrible zippers", "the battery broke after a week of great sound", "love it",
                  "works perfectly, five stars", "broke after two days"]
ROWS = [(TEXTS[(i + 3) % len(TEXTS)] if i % 3 == 0 else None, text) for i, text in enumerate(TEXTS)]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory, no_network_module) -> tuple[Path, Path, list[int]]:
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("sample")
    model = add_serving_code(build_split_model(root / "model", build_tokenizer(root / "tok", TEXTS), TEXTS))
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    labels = [i % 2 for i in range(len(TEXTS))]
    ids, types = [], []
    for title, content in ROWS:  # every third row a review with a title: a pair, token types 0 then 1
        encoded = tokenizer(title or content, content if title else None, return_token_type_ids=True)
        ids.append(encoded["input_ids"])
        types.append(encoded["token_type_ids"])
    assert any(1 in row for row in types)
    test = write_tokenized(root / "test", ids, types, labels)
    out = root / "evaluation"
    ev.run(ev.parse_args(["--model-dir", str(model), "--test-dir", str(test), "--output-dir", str(out),
                          "--sample-size", "10", "--no-int8"]))
    return model, out, labels


def test_evaluate_writes_the_sampled_rows_as_text_with_its_predictions(evaluated):
    _, out, labels = evaluated
    assert (out / contract.SAMPLE_FILE).exists() and contract.SAMPLE_FILE == check.SAMPLE_FILE
    rows = check.read_sample((out / contract.SAMPLE_FILE).read_text().splitlines())
    report = json.loads((out / contract.REPORT_FILE).read_text())
    assert len(rows) == report["check"]["sample_size"] == 10
    assert sum(r["label"] for r in rows) == 5  # stratified: the split is half positive
    by_text = {(title, text) if title else (text,): label for (title, text), label in zip(ROWS, labels, strict=True)}
    assert all(by_text[(r["text"], r["text_pair"]) if "text_pair" in r else (r["text"],)] == r["label"]
               for r in rows)  # decoded back to the reviews (lowercase, spaced), a title and its content apart
    assert any("text_pair" in r for r in rows) and any("text_pair" not in r for r in rows)
    predictions = {r["prediction"] for r in rows}
    assert predictions == {0, 1}  # the split model labels half of the texts positive


def test_the_served_model_answers_the_evaluations_predictions_on_the_sample(evaluated, monkeypatch):
    model, out, _ = evaluated
    rows = check.read_sample((out / contract.SAMPLE_FILE).read_text().splitlines())
    monkeypatch.setenv("INFERENCE_QUANTIZE", "none")
    served = LocalEndpoint()
    served.start(model, "sample-check", port=0)
    try:
        runtime = boto3.client("sagemaker-runtime", endpoint_url=served.url, region_name="us-east-1")
        result = check.run(runtime, "sample-check", rows, max_accuracy_drop=0.0, p95_budget_ms=60_000)
    finally:
        served.stop()
    assert result["passed"] and result["errors"] == 0, result
    assert result["accuracy"] == result["reference_accuracy"]  # same rows, same model, same predictions


def test_no_tokenizer_no_sample(tmp_path, capsys):
    endpoint_sample = load_step("endpoint_sample")
    assert endpoint_sample.codec(tmp_path) is None
    assert endpoint_sample.write(tmp_path / "out", tmp_path, {"input_ids": None}, [1], [1]) is None
    assert "endpoint_sample.jsonl not written" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def test_rows_are_kept_only_when_their_text_encodes_back_to_their_tokens(evaluated, tmp_path, capsys):
    import pyarrow as pa
    from transformers import AutoTokenizer

    model, _, _ = evaluated
    endpoint_sample = load_step("endpoint_sample")
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    unknown = tokenizer("great zzqx sound", "love it", return_token_type_ids=True)  # zzqx: [UNK], kept as such
    assert tokenizer.unk_token_id in unknown["input_ids"]
    piece = next(i for t, i in tokenizer.get_vocab().items() if t.startswith("##"))
    stray = [tokenizer.cls_token_id, piece, tokenizer.sep_token_id]  # a lone "##" piece: no text encodes to it
    rows = pa.table({"input_ids": [unknown["input_ids"], stray],
                     "token_type_ids": [unknown["token_type_ids"], [0, 0, 0]]})
    path = endpoint_sample.write(tmp_path, model, rows, [1, 0], [1, 0])
    (row,) = check.read_sample(path.read_text().splitlines())
    assert row == {"text": "great [UNK] sound", "text_pair": "love it", "label": 1, "prediction": 1}
    assert "1 of 2 sampled rows for the endpoint test (1 left out: their text does not encode back" in \
        capsys.readouterr().out
