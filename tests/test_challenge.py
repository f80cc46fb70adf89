"""Champion/challenger's parts: the paired intervals (steps/paired.py) against scikit-learn and the numpy version
Evaluate uses, and `challenge.ask` / `challenge.compare` against real local endpoints serving torch-free models."""

from __future__ import annotations

import random

import boto3
import numpy as np
import pytest
from fixtures_lifecycle import sample_rows, toy_version
from sklearn.metrics import f1_score

from pipeline.local.endpoint import LocalEndpoint
from steps import paired
from steps.deploy import challenge
from steps.evaluation import quality


def test_macro_f1_is_scikit_learns_for_any_number_of_classes():
    draw = random.Random(3)
    for classes in (2, 3, 20):
        labels = [draw.randrange(classes) for _ in range(500)]
        predictions = [y if draw.random() < 0.7 else draw.randrange(classes) for y in labels]
        pairs = paired.Counter(zip(labels, predictions, strict=True))
        expected = f1_score(labels, predictions, average="macro", labels=sorted(set(labels)), zero_division=0)
        assert paired.macro_f1(pairs, sorted(set(labels))) == pytest.approx(expected, abs=1e-12)


def test_the_bootstrap_interval_is_seeded_holds_its_estimate_and_narrows_with_rows():
    draw = random.Random(0)
    labels = [draw.randrange(3) for _ in range(2000)]
    first = [y if draw.random() < 0.9 else (y + 1) % 3 for y in labels]
    second = [y if draw.random() < 0.8 else (y + 1) % 3 for y in labels]
    estimate, low, high = paired.macro_f1_difference(labels, first, second, seed=7)
    assert paired.macro_f1_difference(labels, first, second, seed=7) == (estimate, low, high)
    assert 0 < low < estimate < high  # 0.9 against 0.8: better, and the interval says so
    _, low_200, high_200 = paired.macro_f1_difference(labels[:200], first[:200], second[:200], seed=7)
    assert high_200 - low_200 > high - low
    assert paired.macro_f1_difference(labels, first, first) == (0.0, 0.0, 0.0)


def test_the_accuracy_interval_is_the_one_evaluate_uses():
    draw = np.random.default_rng(1)
    first, second = draw.random(300) < 0.9, draw.random(300) < 0.85
    b, c = int((first & ~second).sum()), int((~first & second).sum())
    assert paired.difference(b, c, 300) == quality.paired_difference(first, second)
    estimate, low, high = paired.difference(0, 0, 4000)  # equal models on 4,000 rows: within 0.0005 either way
    assert estimate == 0 and -0.0005 < low < 0 < high < 0.0005


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory, no_network_module):
    folder = tmp_path_factory.mktemp("challenge")
    served = {}
    for kind in ("good", "weak", "broken"):
        served[kind] = LocalEndpoint()
        served[kind].start(toy_version(folder / kind, kind)[0], kind, port=0, version=kind)
    yield {kind: (boto3.client("sagemaker-runtime", endpoint_url=e.url, region_name="us-east-1"), kind)
           for kind, e in served.items()}
    for endpoint in served.values():
        endpoint.stop()


class Counting:
    """A runtime client that counts the texts of each request it passes on."""

    def __init__(self, client) -> None:
        self.client, self.texts = client, []

    def invoke_endpoint(self, **request):
        import json

        self.texts.append(len(json.loads(request["Body"])["inputs"]))
        return self.client.invoke_endpoint(**request)


def test_ask_sends_the_rows_in_batches_and_reads_one_label_each(endpoints):
    client, name = endpoints["weak"]
    counting = Counting(client)
    rows = sample_rows(70)
    labels, problem = challenge.ask(counting, name, rows)
    assert problem == "" and counting.texts == [challenge.BATCH_ROWS, challenge.BATCH_ROWS, 6]
    assert labels == ["positive" if "great" in row["text"] else "negative" for row in rows]


def test_ask_stops_at_an_error_answer_and_when_its_time_is_up(endpoints):
    client, name = endpoints["broken"]
    labels, problem = challenge.ask(client, name, sample_rows(40))
    assert labels == [] and problem.startswith("ModelError: ") and "this model is broken" in problem
    client, name = endpoints["good"]
    assert challenge.ask(client, name, sample_rows(40), time_budget_s=0) == ([], "")


def test_compare_holds_a_weaker_candidate_and_passes_an_equal_one(endpoints):
    rows = sample_rows(400)
    good, weak = (challenge.ask(*endpoints[kind], rows)[0] for kind in ("good", "weak"))
    names = ["positive" if row["label"] else "negative" for row in rows]
    rows = [{**row, "label": name} for row, name in zip(rows, names, strict=True)]
    held = challenge.compare(rows, weak, good, "accuracy", 0.01, champion=4)
    assert (held["verdict"], held["champion"], held["rows"], held["difference"]) == ("hold", 4, 400, -0.1)
    assert held["high"] < 0 and "left for a person" in held["reason"]
    passed = challenge.compare(rows, good, good, "macro_f1", 0.01, champion=4)
    assert passed["verdict"] == "pass" and passed["low"] == passed["high"] == 0.0
    better = challenge.compare(rows, good, weak[:100], "accuracy", 0.01, champion=4)
    assert better["rows"] == 100 and better["verdict"] == "pass"  # the rows both answered
    assert challenge.metadata(held, "2026-12-07T00:00:00Z")["challenge_reason"].startswith(
        "scores accuracy -0.1000 against production version 4 on the same 400 rows 95 interval -0.")
