"""The local endpoint: the serving contract over HTTP, boto3's sagemaker-runtime client, swaps, detached runs."""

from __future__ import annotations

import http.client
import json
import logging
import os
import shutil
import sys
import tarfile
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from fixtures_ml import CORPUS, build_split_model, build_tokenizer

from pipeline.local.endpoint import (
    MAX_PAYLOAD_BYTES,
    LocalEndpoint,
    read_state,
    start_background,
    stop_background,
)

ROOT = Path(__file__).resolve().parents[1]
TEXTS = CORPUS + ["great", "terrible zippers", "the battery broke after a week of great sound"]

# A torch-free handler that reports what the toolkit contract handed it.
CONTRACT_HANDLER = '''
import json


def model_fn(model_dir, context):
    return {"context": type(context).__name__, "model_dir": model_dir}


def input_fn(input_data, content_type):
    text = input_data if isinstance(input_data, str) else bytes(input_data).decode()
    return {"type": type(input_data).__name__, "content_type": content_type, "text": text}


def predict_fn(data, model):
    if data["text"] == "boom":
        raise RuntimeError("boom!")
    return dict(data, model_context=model["context"])


def output_fn(prediction, accept, context=None):
    if accept == "text/plain":
        return "plain:" + prediction["text"]
    if accept == "application/octet-stream":
        return b"\\x00\\x01"
    return {"prediction": prediction, "accept": accept, "context": type(context).__name__}
'''


def build_served_model(folder: Path, tokenizer_dir: Path, labels: tuple[str, str], seed: int) -> list[str]:
    """A classifier whose labels split TEXTS in two, with the project's handler in code/; returns its labels."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    build_split_model(folder, tokenizer_dir, TEXTS, seed, labels)
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        expected = [labels[int(i)] for i in model(**tok(TEXTS, padding=True, return_tensors="pt")).logits.argmax(-1)]
    (folder / "code").mkdir()
    shutil.copy(ROOT / "training" / "inference.py", folder / "code" / "inference.py")
    return expected


def make_tarball(folder: Path, target: Path) -> Path:
    """model.tar.gz with the folder's files at the archive root, as SageMaker writes it."""
    with tarfile.open(target, "w:gz") as archive:
        for path in sorted(folder.iterdir()):
            archive.add(path, arcname=path.name)
    return target


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("models")
    build_tokenizer(root / "tokenizer", TEXTS)
    expected_a = build_served_model(root / "a", root / "tokenizer", ("negative", "positive"), seed=0)
    expected_b = build_served_model(root / "b", root / "tokenizer", ("bad", "good"), seed=1)
    contract = root / "contract"
    (contract / "code").mkdir(parents=True)
    (contract / "code" / "inference.py").write_text(CONTRACT_HANDLER)
    return {
        "a": make_tarball(root / "a", root / "a.tar.gz"), "expected_a": expected_a,
        "b": make_tarball(root / "b", root / "b.tar.gz"), "expected_b": expected_b,
        "contract": contract, "contract_tar": make_tarball(contract, root / "contract.tar.gz"),
    }


@pytest.fixture(scope="module")
def endpoint(models: dict, no_network_module):
    served = LocalEndpoint()
    served.start(models["a"], "bert-local", port=0, version="1")
    yield served
    served.stop()


@pytest.fixture(scope="module")
def contract(models: dict, no_network_module):
    served = LocalEndpoint()
    served.start(models["contract"], "contract", port=0)
    yield served
    served.stop()


def request(url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any, bytes]:
    """Status, headers (names in any case, as HTTP has them) and body."""
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            return answer.status, answer.headers, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def invoke_json(url: str, payload: object) -> tuple[int, object]:
    status, _, body = request(f"{url}/invocations", json.dumps(payload).encode(), {"Content-Type": "application/json"})
    return status, json.loads(body)


def test_ping_and_invocations_answer_labels_in_input_order(endpoint: LocalEndpoint, models: dict, caplog):
    caplog.set_level(logging.INFO, logger="pipeline.local.endpoint")
    status, _, body = request(f"{endpoint.url}/ping")
    assert status == 200 and json.loads(body)["status"] == "Healthy"
    assert any("GET /ping 200" in record.getMessage() for record in caplog.records)

    status, answer = invoke_json(endpoint.url, {"inputs": TEXTS})
    assert status == 200
    assert [item["label"] for item in answer] == models["expected_a"]
    assert set(models["expected_a"]) == {"negative", "positive"}  # the order of mixed labels is checked
    assert all(0.5 <= item["score"] <= 1 for item in answer)
    status, single = invoke_json(endpoint.url, {"inputs": TEXTS[-1]})
    assert status == 200 and [item["label"] for item in single] == models["expected_a"][-1:]


def test_boto3_sagemaker_runtime_client_works_unchanged(endpoint: LocalEndpoint, models: dict):
    runtime = boto3.client("sagemaker-runtime", endpoint_url=endpoint.url, region_name="us-east-1")
    answer = runtime.invoke_endpoint(EndpointName="bert-local", Body=json.dumps({"inputs": TEXTS[:3]}),
                                     ContentType="application/json", Accept="application/json")
    assert answer["ContentType"] == "application/json"
    assert answer["InvokedProductionVariant"] == "AllTraffic"
    assert [item["label"] for item in json.loads(answer["Body"].read())] == models["expected_a"][:3]

    with pytest.raises(ClientError) as unknown:
        runtime.invoke_endpoint(EndpointName="nope", Body=b"{}", ContentType="application/json")
    assert unknown.value.response["Error"]["Code"] == "ValidationError"
    assert "Endpoint nope of account" in unknown.value.response["Error"]["Message"]

    with pytest.raises(ClientError) as bad:
        runtime.invoke_endpoint(EndpointName="bert-local", Body=b"{not json", ContentType="application/json")
    assert bad.value.response["Error"]["Code"] == "ModelError"  # SageMaker Runtime's ModelError: 424, and the
    assert bad.value.response["ResponseMetadata"]["HTTPStatusCode"] == 424  # container's own status inside
    assert bad.value.response["OriginalStatusCode"] == 400


def test_bad_input_is_a_4xx_json_error_and_the_server_keeps_serving(endpoint: LocalEndpoint, models: dict):
    cases = (
        (b"{not json", "application/json", 400, "MalformedJSON"),
        (b'{"inputs": 3}', "application/json", 400, "InvalidInput"),
        (b"<a>hello</a>", "application/xml", 400, "UnsupportedContentType"),  # the toolkit: 400 for every one
        (b"\xff\xfe", "application/json", 400, "InvalidEncoding"),
    )
    for body, content_type, code, name in cases:
        status, headers, answer = request(f"{endpoint.url}/invocations", body, {"Content-Type": content_type})
        error = json.loads(answer)
        assert (status, error["error"]) == (code, name), answer
        assert headers["Content-Type"] == "application/json" and headers["x-amzn-ErrorType"] == "ModelError"
        assert error["detail"] and error["OriginalStatusCode"] == code
    assert request(f"{endpoint.url}/ping")[0] == 200
    status, answer = invoke_json(endpoint.url, {"inputs": TEXTS})
    assert status == 200 and [item["label"] for item in answer] == models["expected_a"]


def test_unknown_paths_and_oversized_bodies(endpoint: LocalEndpoint):
    status, _, body = request(f"{endpoint.url}/predict", b"{}")
    assert status == 404 and json.loads(body)["error"] == "NotFound"
    assert request(f"{endpoint.url}/nothing")[0] == 404
    assert request(f"{endpoint.url}/invocations")[0] == 405

    connection = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=30)
    connection.request("POST", "/invocations", body=b"x" * (MAX_PAYLOAD_BYTES + 1),
                       headers={"Content-Type": "application/json"})
    answer = connection.getresponse()
    assert answer.status == 413 and "limit" in json.loads(answer.read())["message"]
    connection.request("GET", "/ping")  # same connection: the body was read away
    assert connection.getresponse().status == 200
    connection.close()


def test_each_route_answers_its_methods_and_names_them_when_refusing(endpoint: LocalEndpoint):
    """HEAD is GET without a body (RFC 9110, 9.3.2); a 405 names the route's methods in Allow (15.5.6)."""
    connection = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=30)
    try:
        connection.request("HEAD", "/ping")
        answer = connection.getresponse()
        assert answer.status == 200 and answer.read() == b"" and int(answer.getheader("Content-Length")) > 0
        for method, path, allow in (("GET", "/invocations", "POST"), ("HEAD", "/invocations", "POST"),
                                    ("POST", "/ping", "GET, HEAD"), ("DELETE", "/ping", "GET, HEAD"),
                                    ("PUT", f"/endpoints/{endpoint.name}/invocations", "POST"),
                                    ("OPTIONS", "/invocations", "POST")):
            connection.request(method, path, body=b"{}" if method in ("POST", "PUT") else None)
            answer = connection.getresponse()
            body = answer.read()
            assert (answer.status, answer.getheader("Allow")) == (405, allow), (method, path, body)
            assert method == "HEAD" or json.loads(body)["error"] == "MethodNotAllowed"
            connection.close()
        connection.request("DELETE", "/nothing")
        assert connection.getresponse().status == 404
    finally:
        connection.close()
    assert request(f"{endpoint.url}/ping")[0] == 200


def test_handler_contract(contract: LocalEndpoint):
    def call(body: bytes, headers: dict[str, str]) -> tuple[int, dict, bytes]:
        return request(f"{contract.url}/invocations", body, headers)

    status, headers, body = call(b"hi", {"Content-Type": "application/json"})
    answer = json.loads(body)
    assert status == 200 and headers["Content-Type"] == "application/json"  # no Accept -> application/json
    assert answer["prediction"]["type"] == "str" and answer["prediction"]["text"] == "hi"
    assert answer["prediction"]["model_context"] == "Context" and answer["context"] == "Context"
    assert json.loads(call(b"hi", {"Content-Type": "text/csv", "Accept": "*/*"})[2])["accept"] == "application/json"
    assert json.loads(call(b"a,b", {"Content-Type": "text/csv"})[2])["prediction"]["type"] == "str"
    charset = json.loads(call(b"hi", {"Content-Type": "application/json; charset=utf-8"})[2])
    assert charset["prediction"]["type"] == "bytearray"
    assert json.loads(call(b"hi", {"Content-Type": "application/x-npy"})[2])["prediction"]["type"] == "bytearray"
    status, headers, body = call(b"hi", {"Content-Type": "application/json", "Accept": "text/plain"})
    assert (status, headers["Content-Type"], body) == (200, "text/plain", b"plain:hi")
    assert call(b"hi", {"Content-Type": "text/csv", "Accept": "application/octet-stream"})[2] == b"\x00\x01"
    status, _, body = call(b"boom", {"Content-Type": "application/json"})
    assert status == 400 and json.loads(body)["detail"] == "boom!"
    assert call(b"ok", {"Content-Type": "application/json"})[0] == 200


def test_transform_fn_and_invalid_handlers(tmp_path: Path):
    folder = tmp_path / "model"
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "inference.py").write_text(
        "def model_fn(model_dir):\n    return 2\n\n"
        "def transform_fn(model, data, content_type, accept):\n    return {'twice': data * model}\n")
    with LocalEndpoint() as served:
        served.start(folder, "transform", port=0)
        status, answer = invoke_json(served.url, "ab")
        assert (status, answer) == (200, {"twice": '"ab""ab"'})
    (folder / "code" / "inference.py").write_text(
        "def transform_fn(model, data, content_type, accept):\n    return data\n\n"
        "def input_fn(data, content_type):\n    return data\n")
    with pytest.raises(ValueError, match="not both"):
        LocalEndpoint().start(folder, "both", port=0)
    (folder / "code" / "inference.py").write_text("def model_fn(a, b, c):\n    return 1\n")
    with pytest.raises(TypeError, match="model_fn takes 1 or 2 arguments but 3"):
        LocalEndpoint().start(folder, "arity", port=0)


def test_update_swaps_the_model_while_serving(models: dict, no_network):
    served = LocalEndpoint()
    try:
        served.start(models["a"], "swap", port=0)
        old_dir, old_code = served.model.model_dir, served.model.code_dir
        answers: list[list[str]] = []
        updating = threading.Thread(target=served.update, args=(models["b"],), kwargs={"version": "2"})
        updating.start()
        while updating.is_alive() or len(answers) < 2:
            status, answer = invoke_json(served.url, {"inputs": TEXTS})
            assert status == 200
            answers.append([item["label"] for item in answer])
        updating.join()
        answers.append([item["label"] for item in invoke_json(served.url, {"inputs": TEXTS})[1]])
        assert answers[0] == models["expected_a"] and answers[-1] == models["expected_b"]
        assert all(labels in (models["expected_a"], models["expected_b"]) for labels in answers)
        assert not old_dir.exists() and old_code not in sys.path  # the old model is unloaded
        assert json.loads(request(f"{served.url}/ping")[2])["version"] == "2"
    finally:
        served.stop()
    assert not served.model


def test_background_process_outlives_its_starter_and_is_replaced(models: dict, tmp_path: Path, no_network):
    state_file = tmp_path / "run" / "endpoint.json"
    assert read_state(state_file) is None and stop_background(state_file) is False
    first = start_background(models["contract_tar"], "bg", port=0, state_file=state_file, version="1")
    try:
        assert first["running"] and first["version"] == "1" and first["port"] > 0
        assert read_state(state_file)["pid"] == first["pid"] and read_state(state_file)["running"]
        status, answer = invoke_json(first["url"], "hello")
        assert status == 200 and answer["prediction"]["text"] == '"hello"'

        # a second start on the same port swaps the model inside the running endpoint
        second = start_background(models["contract"], "bg", port=first["port"], state_file=state_file, version="2")
        assert second["pid"] == first["pid"] and second["version"] == "2" and second["url"] == first["url"]
        assert json.loads(request(f"{second['url']}/ping")[2])["version"] == "2"
        assert read_state(state_file)["model_data"] == str(models["contract"])  # what a restarted worker loads
        runtime = boto3.client("sagemaker-runtime", endpoint_url=second["url"], region_name="us-east-1")
        answer = runtime.invoke_endpoint(EndpointName="bg", Body=b"x", ContentType="text/csv", Accept="text/plain")
        assert answer["Body"].read() == b"plain:x"
    finally:
        assert stop_background(state_file) is True
    assert read_state(state_file) is None and stop_background(state_file) is False
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{second['url']}/ping", timeout=5)
    with pytest.raises(ProcessLookupError):
        os.kill(first["pid"], 0)  # the process is gone
    assert "POST /endpoints/bg/invocations 200" in (tmp_path / "run" / "endpoint.log").read_text()


def test_an_endpoint_never_joins_the_port_of_another_roots_endpoint(models: dict, tmp_path: Path, no_network):
    """Detached endpoints share their port for blue/green: one of another local root must not be joined."""
    theirs = tmp_path / "other-root" / "endpoint.json"
    first = start_background(models["contract_tar"], "bg", port=0, state_file=theirs, version="1")
    try:
        with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{first['port']}: Address already in use"):
            start_background(models["contract"], "bg", port=first["port"], state_file=tmp_path / "ours.json")
        assert read_state(tmp_path / "ours.json") is None
        assert all(json.loads(request(f"{first['url']}/ping")[2])["version"] == "1" for _ in range(20))
    finally:
        assert stop_background(theirs) is True


def test_a_failing_background_start_reports_the_log(tmp_path: Path, no_network):
    with pytest.raises(RuntimeError, match="exited with code 1 before serving"):
        start_background(tmp_path / "missing.tar.gz", "broken", port=0, state_file=tmp_path / "endpoint.json")


def test_code_requirements_are_named_not_installed(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """The container pip-installs code/requirements.txt; locally this Python's packages serve, and the log names
    what the file asks for (a file of comments only, like the one train.py ships, asks for nothing)."""
    folder = tmp_path / "model"
    (folder / "code").mkdir(parents=True)
    (folder / "code" / "inference.py").write_text(
        "def model_fn(model_dir):\n    return 1\n\n"
        "def transform_fn(model, data, content_type, accept):\n    return data\n")
    caplog.set_level(logging.WARNING, logger="pipeline.local.endpoint")
    cases = (("# nothing to install\n\n", None), ("# pinned\nsomepackage==1.0  # why\n", "somepackage==1.0"))
    for text, named in cases:
        caplog.clear()
        (folder / "code" / "requirements.txt").write_text(text)
        with LocalEndpoint() as served:
            served.start(folder, "requirements", port=0)
        warned = [r.getMessage() for r in caplog.records if "requirements.txt" in r.getMessage()]
        assert warned == ([f"endpoint requirements: code/requirements.txt is not installed locally: {named}"]
                          if named else [])


def test_answers_go_out_at_once_without_waiting_for_the_clients_delayed_ack():
    """The head and the body of an answer are two writes: with Nagle's algorithm the body waited 40 ms for the
    client's delayed ACK of the head (43 ms a request through boto3, 2.5 ms without). Connections the listening
    socket accepts have TCP_NODELAY."""
    import socket

    from pipeline.local.endpoint.app import listen

    server = listen("nagle", "127.0.0.1", 0)
    try:
        with socket.create_connection(server.getsockname()[:2]):
            accepted, _ = server.accept()
            with accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
                assert accepted.proto == socket.IPPROTO_TCP  # so that asyncio's transport keeps it so
    finally:
        server.close()
