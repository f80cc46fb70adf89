"""The local endpoint serving training/inference.py under fuzzing and concurrent load, over HTTP on 127.0.0.1.

The endpoint serves the variant the pipeline registers when the evaluation chooses it: ONNX Runtime int8, on the
graph built as the Evaluate step builds it."""

from __future__ import annotations

import http.client
import json
import random
import threading
from pathlib import Path

import pytest
from fixtures_ml import CORPUS, add_onnx_graphs, add_serving_code, build_split_model, build_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.local.endpoint import LocalEndpoint

ROOT = Path(__file__).resolve().parents[1]
TEXTS = CORPUS + ["great", "terrible zippers", "love it", "broke after a week"]
CONTENT_TYPES = ["application/json", "text/csv", "text/plain", "application/json; charset=utf-8",
                 "text/plain; charset=latin-1", "application/xml", "", "*/*", "multipart/form-data; boundary=x"]
ACCEPTS = ["application/json", "application/jsonlines", "*/*", "", "text/html", "application/json, text/csv;q=0.1"]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, no_network_module):
    root = tmp_path_factory.mktemp("robust")
    folder = build_split_model(root / "model", build_tokenizer(root / "tokenizer", TEXTS), TEXTS, seed=1)
    add_onnx_graphs(add_serving_code(folder))
    endpoint = LocalEndpoint()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("INFERENCE_RUNTIME", "onnxruntime")  # the registered environment of that variant
        env.setenv("INFERENCE_QUANTIZE", "int8")
        endpoint.start(folder, "robust", port=0)
    yield endpoint
    endpoint.stop()


def test_the_served_variant_is_onnxruntime_int8(served: LocalEndpoint) -> None:
    assert served.model.model.variant == "onnxruntime-int8"


def post(port: int, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/invocations", body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    json_values.map(lambda v: json.dumps({"inputs": v}).encode()),
    st.lists(st.text(max_size=60), max_size=8).map(lambda v: json.dumps({"inputs": v}).encode()),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
)
header_text = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, content_type=st.sampled_from(CONTENT_TYPES) | header_text,
       accept=st.sampled_from(ACCEPTS) | header_text)
def test_fuzzed_requests_never_get_a_5xx(served: LocalEndpoint, body: bytes, content_type: str, accept: str) -> None:
    status, headers, answer = post(served.port, body, {"Content-Type": content_type, "Accept": accept})
    assert status < 500, answer
    if status >= 400:
        error = json.loads(answer)
        assert isinstance(error["error"], str) and error["detail"]
        assert status in (400, 406, 413, 415)
    else:
        kind = headers["content-type"]
        items = ([json.loads(line) for line in answer.decode().splitlines()] if "jsonlines" in kind
                 else json.loads(answer))
        assert items and all(item["label"] in ("negative", "positive") and 0 <= item["score"] <= 1 for item in items)


def test_still_serving_after_the_fuzzing(served: LocalEndpoint) -> None:
    status, _, answer = post(served.port, json.dumps({"inputs": TEXTS}).encode(), {"Content-Type": "application/json"})
    assert status == 200 and len(json.loads(answer)) == len(TEXTS)


def test_concurrent_clients_each_get_their_own_answers(served: LocalEndpoint) -> None:
    """8 clients x 12 requests of random texts in random order: no errors, every answer matches its request."""
    status, _, answer = post(served.port, json.dumps({"inputs": TEXTS}).encode(), {"Content-Type": "application/json"})
    truth = {text: item for text, item in zip(TEXTS, json.loads(answer), strict=True)}
    tolerance = 1e-6  # int8 runs one text per forward pass: a text's answer is the same in any request
    signed = {t: item["score"] * (1 if item["label"] == "positive" else -1) for t, item in truth.items()}
    # only texts whose answer no other text's comes close to: a mix-up cannot hide behind the tolerance
    pool = [t for t in TEXTS if all(abs(signed[t] - signed[u]) > 2 * tolerance for u in TEXTS if u != t)]
    assert len(pool) >= 8 and {truth[t]["label"] for t in pool} == {"negative", "positive"}
    failures: list[str] = []

    def client(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(12):
            texts = rng.sample(pool, rng.randint(1, len(pool)))
            as_csv = rng.random() < 0.3
            body = ("\n".join(texts) if as_csv else json.dumps({"inputs": texts})).encode()
            try:
                status, _, answer = post(served.port, body, {"Content-Type": "text/csv" if as_csv else
                                                             "application/json"})
            except OSError as e:
                failures.append(f"client {seed}: {e!r}")
                return
            got = json.loads(answer) if status == 200 else None
            if got is None or [g["label"] for g in got] != [truth[t]["label"] for t in texts] or any(
                abs(g["score"] - truth[t]["score"]) > tolerance for g, t in zip(got, texts, strict=True)
            ):
                failures.append(f"client {seed}: {status} {answer[:300]!r} for {[truth[t] for t in texts]}")

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "clients did not finish within 5 minutes"
    assert failures == []
