"""The labelled sample Evaluate writes for the endpoint test (steps/evaluation/endpoint_sample.py): the evaluation's
sampled test rows as text with their labels and the evaluation's predictions. Served by the project's handler on a
real local endpoint, the same model answers exactly those predictions: the test's accuracy reference is exact."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from fixtures_ml import CORPUS, add_serving_code, build_split_model, build_tokenizer, step_arguments, write_tokenized

from pipeline.local.endpoint import LocalEndpoint
from steps import contract
from steps.deploy import endpoint_check as check
from steps.evaluation import endpoint_sample
from steps.evaluation import evaluate as ev

TEXTS = CORPUS + ["great", "terrible zippers", "the battery broke after a week of great sound", "love it",
                  "Works PERFECTLY, five stars!!", "broke after two days (zzqx ##ing)"]  # case, [UNK], stray "##"
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
    test = write_tokenized(root / "test", ids, types, labels, texts=ROWS)
    out = root / "evaluation"
    ev.run(ev.parse_args([*step_arguments("Evaluate"),
                          "--model-dir", str(model), "--test-dir", str(test), "--output-dir", str(out),
                          "--sample-size", "10", "--no-int8"]))
    return model, out, labels


def test_evaluate_writes_the_sampled_rows_as_their_original_text_with_its_predictions(evaluated):
    _, out, labels = evaluated
    assert (out / contract.SAMPLE_FILE).exists() and contract.SAMPLE_FILE == check.SAMPLE_FILE
    rows = check.read_sample((out / contract.SAMPLE_FILE).read_text().splitlines())
    report = json.loads((out / contract.REPORT_FILE).read_text())
    assert len(rows) == report["check"]["sample_size"] == 10
    assert sum(r["label"] == "positive" for r in rows) == 5  # stratified: the split is half positive
    names = ("negative", "positive")  # the model's id2label: what the endpoint answers
    by_text = {(title, text) if title else (text,): names[label]
               for (title, text), label in zip(ROWS, labels, strict=True)}
    assert all(by_text[(r["text"], r["text_pair"]) if "text_pair" in r else (r["text"],)] == r["label"]
               for r in rows)  # the reviews as they came in (case and all), a title and its content apart
    assert any("text_pair" in r for r in rows) and any("text_pair" not in r for r in rows)
    predictions = {r["prediction"] for r in rows}
    assert predictions == {"negative", "positive"}  # the split model labels half of the texts positive


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


def test_a_split_without_text_gets_no_sample(tmp_path, capsys):
    import pyarrow as pa

    rows = pa.table({"input_ids": [[2, 5, 3]], "token_type_ids": [[0, 0, 0]], "label": [1]})
    assert endpoint_sample.write(tmp_path / "out", rows, [1], [1], ["no", "yes"]) is None
    assert "no title and content columns (the Tokenize step writes them): endpoint_sample.jsonl not written" in \
        capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def test_every_sampled_row_is_kept_as_it_came_in_even_where_its_tokens_would_not_decode_back(tmp_path):
    import pyarrow as pa

    texts = [("Great ZZQX sound", "love it"), (None, "##ing, not a word")]  # [UNK] and a lone "##" piece
    rows = pa.table({"title": [t for t, _ in texts], "content": [c for _, c in texts]})
    path = endpoint_sample.write(tmp_path, rows, [1, 0], [1, 0], ["ham", "spam"])
    assert check.read_sample(path.read_text().splitlines()) == [
        {"text": "Great ZZQX sound", "text_pair": "love it", "label": "spam", "prediction": "spam"},
        {"text": "##ing, not a word", "label": "ham", "prediction": "ham"},
    ]
