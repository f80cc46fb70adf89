"""Raw-socket framing cases against the real local endpoint (uvicorn and h11, training/inference.py on a tiny BERT).

A client that is not well behaved: malformed or huge Content-Length, broken chunked encoding, garbage request lines,
oversized, cut-short and slow bodies, idle connections. Each gets a 4xx answer (h11's refusals as uvicorn's
plain-text 400, the app's as JSON) or a clean close, and the server keeps serving the next client.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from pathlib import Path

import pytest
from fixtures_ml import add_serving_code, build_model, build_tokenizer

from pipeline.local.endpoint import LocalEndpoint
from pipeline.local.endpoint.app import DRAIN_LIMIT
from steps.contract import MAX_PAYLOAD_BYTES

READ_TIMEOUT = 1.5  # the server's, small so that the slow cases end quickly
WAIT = 30.0  # the client's: far above READ_TIMEOUT, so a server that never answers fails the test, not hangs it
GOOD = json.dumps({"inputs": ["great product", "awful"]}).encode()


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory, no_network_module) -> int:
    root = tmp_path_factory.mktemp("framing")
    folder = add_serving_code(build_model(root / "model", build_tokenizer(root / "tokenizer")))
    endpoint = LocalEndpoint(read_timeout=READ_TIMEOUT)
    endpoint.start(Path(folder), "framing", port=0)
    yield endpoint.port
    endpoint.stop()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=WAIT)


def answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The next response on `sock`: status, headers (lower-case names) and body."""
    response = http.client.HTTPResponse(sock)
    response.begin()
    body = response.read()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, body


def closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection (EOF, or a reset after the answer)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def exchange(port: int, data: bytes) -> tuple[int, dict[str, str], bytes, bool]:
    """Send raw `data`; the answer and whether the connection closed after it."""
    with connect(port) as sock:
        sock.sendall(data)
        status, headers, body = answer(sock)
        return status, headers, body, closed(sock)


def post(headers: str, body: bytes = b"") -> bytes:
    head = f"POST /invocations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{headers}\r\n"
    return head.encode() + body


def assert_serves(port: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        connection.request("POST", "/invocations", body=GOOD, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        labels = [item["label"] for item in json.loads(response.read())]
        assert response.status == 200 and len(labels) == 2 and set(labels) <= {"positive", "negative"}
    finally:
        connection.close()


@pytest.mark.parametrize(
    "request_bytes",
    [
        post("Content-Length: -5\r\n", GOOD),
        post("Content-Length: 12abc\r\n", GOOD),
        post("Content-Length: 34\r\nContent-Length: 35\r\n", GOOD),
        post("Content-Length: " + "9" * 30 + "\r\n", GOOD),
        post("Transfer-Encoding: gzip\r\n", GOOD),
        post("Transfer-Encoding: chunked\r\n", b"zz\r\n" + GOOD),
        post("Transfer-Encoding: chunked\r\n", b"4\r\n" + GOOD + b"\r\n0\r\n\r\n"),
        b"\x00\xff\xfeGARBAGE\r\n\r\n",
        b"GET /ping\r\n\r\n",
        b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
    ],
    ids=["negative-length", "non-numeric-length", "two-lengths", "huge-length", "unknown-coding", "bad-chunk-size",
         "chunk-overrun", "garbage-request-line", "http-0.9", "long-request-line"],
)
def test_requests_h11_cannot_parse_get_a_400_and_a_close(port, request_bytes):
    started = time.monotonic()
    got, headers, _, closed_after = exchange(port, request_bytes)
    assert got == 400 and headers["connection"] == "close" and closed_after
    assert time.monotonic() - started < WAIT / 2  # answered, not timed out by the client
    assert_serves(port)


def test_an_unknown_method_is_a_json_405_naming_the_route_s_methods(port):
    got, headers, body, _ = exchange(port, b"BREW /invocations HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (got, headers["allow"], json.loads(body)["error"]) == (405, "POST", "MethodNotAllowed")
    assert headers["content-type"] == "application/json" and headers["x-amzn-errortype"] == "MethodNotAllowed"


def test_a_body_cut_short_is_not_taken_for_a_request(port):
    """The client half-closes after 10 of 100 bytes: nothing is answered for it, and the server serves on."""
    with connect(port) as sock:
        sock.sendall(post("Content-Length: 100\r\n", GOOD[:10]))
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(1) == b""
    assert_serves(port)


@pytest.mark.parametrize("trickle", [False, True], ids=["stalled", "trickling"])
def test_a_slow_body_is_a_408_after_the_read_timeout_while_others_are_served(port, trickle):
    """A body that stops, or trickles one byte at a time, times out as a whole (not per read)."""
    with connect(port) as sock:
        started = time.monotonic()
        sock.sendall(post(f"Content-Length: {len(GOOD)}\r\n", GOOD[:5]))
        stop = threading.Event()

        def drip() -> None:
            for byte in GOOD[5:-1]:
                if stop.wait(READ_TIMEOUT / 4):
                    return
                try:
                    sock.sendall(bytes([byte]))
                except OSError:  # the server answered 408 and closed
                    return

        dripping = threading.Thread(target=drip, daemon=True)
        if trickle:
            dripping.start()
        assert_serves(port)  # another client is not held up by this one
        status, headers, body = answer(sock)
        stop.set()
        if trickle:
            dripping.join()
        elapsed = time.monotonic() - started
        error = json.loads(body)
        assert status == 408 and error["error"] == "RequestTimeout" and headers["connection"] == "close"
        assert error["message"] == f"the request body did not arrive within {READ_TIMEOUT:g} s"
        assert READ_TIMEOUT * 0.9 <= elapsed < WAIT / 2
        assert closed(sock)
    assert_serves(port)


def test_a_connection_idle_after_an_answer_is_closed_cleanly_after_the_read_timeout(port):
    with connect(port) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer(sock)[0] == 200
        started = time.monotonic()
        assert closed(sock)  # EOF, no bytes: nothing more was asked
        assert READ_TIMEOUT * 0.9 <= time.monotonic() - started < WAIT / 2
    assert_serves(port)


def chunked(body: bytes, size: int = 1 << 20) -> bytes:
    """`body` in chunks of `size` bytes, as a streaming client sends it."""
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_oversized_body_is_read_away_and_the_connection_serves_the_next_request(port, framing):
    """The client is still sending when the body passes the limit: the body is read away so that the client gets
    the 413 (not a reset while it writes), and the connection serves on."""
    big = b"x" * (MAX_PAYLOAD_BYTES + 1)
    with connect(port) as sock:
        if framing == "chunked":
            sock.sendall(post("Transfer-Encoding: chunked\r\n", chunked(big)))
        else:
            sock.sendall(post(f"Content-Length: {len(big)}\r\n", big))
        status, headers, body = answer(sock)
        assert status == 413 and "connection" not in headers and "bytes limit" in json.loads(body)["message"]
        sock.sendall(post(f"Content-Length: {len(GOOD)}\r\n", GOOD))  # same connection, kept alive
        status, _, body = answer(sock)
        assert status == 200 and len(json.loads(body)) == 2


def test_a_body_beyond_what_is_read_away_is_a_413_and_a_close(port):
    with connect(port) as sock:
        sock.sendall(post(f"Content-Length: {DRAIN_LIMIT + 1}\r\n", b"x" * 1000))
        status, headers, body = answer(sock)
        assert status == 413 and headers["connection"] == "close" and "bytes limit" in json.loads(body)["message"]
    assert_serves(port)


def test_a_get_with_a_body_is_answered_and_its_body_not_read_as_a_second_request(port):
    with connect(port) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 18\r\n\r\nGET /nowhere HTTP/")
        status, _, body = answer(sock)
        assert status == 200 and json.loads(body)["status"] == "Healthy"
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")  # the next request is this one, not /nowhere
        assert answer(sock)[0] == 200
