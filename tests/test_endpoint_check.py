"""The endpoint test (steps/deploy/endpoint_check.py) through the stock boto3 `sagemaker-runtime` client against a
real local endpoint: accuracy against the evaluation's on the same rows, the p95 budget, error answers; the sample's
format."""

from __future__ import annotations

import json
import re

import boto3
import pytest
from fixtures_lifecycle import sample_rows, toy_version

from pipeline.local.endpoint import LocalEndpoint
from steps.deploy import endpoint_check as check


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory, no_network_module):
    folder = tmp_path_factory.mktemp("check")
    models = {kind: toy_version(folder / kind, kind)[0] for kind in ("good", "flipped")}
    served = LocalEndpoint()
    served.start(models["good"], "under-test", port=0)
    runtime = boto3.client("sagemaker-runtime", endpoint_url=served.url, region_name="us-east-1")
    yield served, models, runtime
    served.stop()


def test_a_good_model_passes_and_a_flipped_one_fails_on_accuracy(endpoint):
    served, models, runtime = endpoint
    rows = sample_rows()
    result = check.run(runtime, "under-test", rows, max_accuracy_drop=0.02, p95_budget_ms=5000)
    assert result["passed"] and result["rows"] == 40 and result["errors"] == 0
    assert (result["accuracy"], result["reference_accuracy"]) == (1.0, 0.95)  # the evaluation erred on 2 rows
    assert 0 < result["p50_ms"] <= result["p95_ms"] < 5000
    served.update(models["flipped"])
    try:
        failed = check.run(runtime, "under-test", rows, max_accuracy_drop=0.02, p95_budget_ms=5000)
    finally:
        served.update(models["good"])
    assert not failed["passed"] and failed["accuracy"] == 0.0 and failed["errors"] == 0
    assert failed["reason"] == "accuracy 0.0000 is below the evaluation's 0.9500 on the same rows by more than 0.02"


def test_latency_budget_and_error_answers(endpoint):
    _, _, runtime = endpoint
    rows = sample_rows(10)
    slow = check.run(runtime, "under-test", rows, max_accuracy_drop=0.02, p95_budget_ms=0.001)
    assert not slow["passed"] and re.fullmatch(r"p95 latency [\d.]+ ms is over the budget of 0.001 ms", slow["reason"])
    wrong = check.run(runtime, "no-such-endpoint", rows, max_accuracy_drop=1, p95_budget_ms=5000)
    assert not wrong["passed"] and wrong["errors"] == 10
    assert wrong["reason"].startswith("10 of 10 requests got an error answer (ValidationError: Endpoint no-such-")
    values = check.metadata(wrong, "2026-01-01T00:00:00.000000Z")
    assert values["staging_test"] == "fail" and values["staging_test_errors"] == "10"
    assert all(re.fullmatch(r"[\w\s.:/=+\-@]{1,256}", v) for v in values.values()), values
    assert check.last_test(values).startswith("fail: 10 of 10 requests got an error answer ValidationError")


def test_p50_against_the_evaluations_one_row_time(endpoint):
    """Within factor x Evaluate's one-row time + overhead passes; slower fails, as does an answer that reports no
    variant (the toy handler reports none) where the version's environment names one."""
    _, _, runtime = endpoint
    rows, expected = sample_rows(10), {"variant": None, "p50_ms": 1000.0}
    fine = check.run(runtime, "under-test", rows, max_accuracy_drop=0.02, p95_budget_ms=5000, expected=expected,
                     p50_factor=5, p50_overhead_ms=20)
    assert fine["passed"], fine["reason"]
    expected = {"variant": "onnxruntime-int8", "p50_ms": 0.0001}
    slow = check.run(runtime, "under-test", rows, max_accuracy_drop=0.02, p95_budget_ms=5000, expected=expected,
                     p50_factor=5, p50_overhead_ms=0)
    assert not slow["passed"] and re.fullmatch(r"the endpoint serves no variant reported, not the onnxruntime-int8 "
                                               r".*; p50 latency [\d.]+ ms is over 5 times the 0.0001 ms the Evaluate "
                                               r"step measured for onnxruntime-int8 plus 0 ms", slow["reason"])


def test_a_hung_model_fails_the_test_once_its_time_is_spent():
    """InvokeEndpoint waits up to 60 s for a model: 200 rows of a hung one took 200 minutes, far past the Lambda's
    15. Rows are sent while the test's time lasts; then it fails, on what was answered."""
    now = [0.0]

    class Hung:
        def invoke_endpoint(self, **request):
            now[0] += 60.0
            raise TimeoutError("Read timeout on endpoint URL")

    rows = [{"text": f"review {i}", "label": i % 2, "prediction": i % 2} for i in range(200)]
    result = check.run(Hung(), "under-test", rows, max_accuracy_drop=0.02, p95_budget_ms=500,
                       clock=lambda: now[0], time_budget_s=300)
    assert not result["passed"] and now[0] == 300.0
    assert result["reason"].startswith("out of time: 5 of 200 rows answered within the test's 300 s; "
                                       "5 of 5 requests got an error answer")


def test_sample_format_and_stratified_pick():
    rows = sample_rows(40)
    lines = [json.dumps(r) for r in rows]
    names = ("negative", "positive")  # a sample of ids 0 / 1 (written before samples named labels) reads as names
    named = [{**r, "label": names[r["label"]], "prediction": names[r["prediction"]]} for r in rows]
    assert check.read_sample(lines) == named
    assert check.read_sample([json.dumps(r) for r in named]) == named
    with pytest.raises(check.SampleError, match="endpoint_sample.jsonl line 2: expected"):
        check.read_sample([lines[0], '{"text": "x", "label": 2, "prediction": 0}'])
    with pytest.raises(check.SampleError, match="holds no rows"):
        check.read_sample(["", "  "])
    picked = check.pick(rows, 10)
    assert len(picked) == 10 and sum(r["label"] for r in picked) == 5 and picked == [r for r in rows if r in picked]
    skewed = [{"text": str(i), "label": int(i < 10), "prediction": 0} for i in range(40)]  # a quarter positive
    assert sum(r["label"] for r in check.pick(skewed, 8)) == 2
    assert check.pick(rows, 100) == rows
