"""Raw-socket framing cases against the real local endpoint server (training/inference.py on a tiny BERT).

A client that is not well behaved: negative, huge, malformed or missing Content-Length, truncated and slow bodies,
broken chunked encoding, garbage request lines, header floods, idle connections. Each gets a 4xx JSON answer (or,
idle, a clean close) within the server's read timeout, and the server keeps serving the next client.
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
from pipeline.local.endpoint.framing import DRAIN_LIMIT
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


def answer(sock: socket.socket) -> tuple[int, dict[str, str], dict]:
    """The next response on `sock`: status, headers (lower-case names) and its JSON body."""
    response = http.client.HTTPResponse(sock)
    response.begin()
    body = response.read()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(body)


def closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection (EOF, or a reset after the answer)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def exchange(port: int, data: bytes, *, end: bool = False) -> tuple[int, dict[str, str], dict, bool]:
    """Send raw `data` (then half-close with `end`); the answer and whether the connection closed after it."""
    with connect(port) as sock:
        sock.sendall(data)
        if end:
            sock.shutdown(socket.SHUT_WR)
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
    ("request_bytes", "status", "error", "words"),
    [
        (post("Content-Length: -5\r\n", GOOD), 400, "ValidationError", "Content-Length '-5'"),
        (post("Content-Length: -1\r\n", GOOD), 400, "ValidationError", "Content-Length '-1'"),  # not "read to EOF"
        (post("Content-Length: 12abc\r\n", GOOD), 400, "ValidationError", "expected one number of bytes"),
        (post("Content-Length: +34\r\n", GOOD), 400, "ValidationError", "Content-Length '+34'"),
        (post("Content-Length: 34\r\nContent-Length: 35\r\n", GOOD), 400, "ValidationError", "'34, 35'"),
        (post("Content-Length: " + "9" * 30 + "\r\n", GOOD), 413, "ValidationError", "bytes limit"),
        (post("", GOOD), 411, "LengthRequired", "Content-Length"),
        (post("Transfer-Encoding: gzip\r\n", GOOD), 400, "ValidationError", "only chunked"),
        (post("Transfer-Encoding: chunked\r\n", b"zz\r\n" + GOOD), 400, "ValidationError", "chunk size"),
        (post("Transfer-Encoding: chunked\r\n", b"4\r\n" + GOOD + b"\r\n0\r\n\r\n"), 400, "ValidationError",
         "longer than its size"),
        (post("Transfer-Encoding: chunked\r\n", f"{DRAIN_LIMIT + 1:x}\r\n".encode()), 413, "ValidationError",
         "bytes limit"),
        (b"\x00\xff\xfeGARBAGE\r\n\r\n", 400, "ValidationError", "Bad request"),
        (b"GET /ping\r\n\r\n", 400, "ValidationError", "expected HTTP/1.x"),  # HTTP/0.9: no status line otherwise
        (b"POST /invocations HTTP/2.0\r\n\r\n", 400, "ValidationError", "HTTP version"),
        (b"BREW /invocations HTTP/1.1\r\nHost: x\r\n\r\n", 405, "MethodNotAllowed", "BREW"),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414, "RequestUriTooLong", "URI"),
        (post("".join(f"X-Flood-{i}: {i}\r\n" for i in range(150)), GOOD), 431, "RequestHeaderFieldsTooLarge",
         "headers"),
        (post("X-Long: " + "b" * 70_000 + "\r\n", GOOD), 431, "RequestHeaderFieldsTooLarge", "Line too long"),
    ],
    ids=["negative-length", "minus-one-length", "non-numeric-length", "signed-length", "two-lengths",
         "huge-length", "missing-length", "unknown-coding", "bad-chunk-size", "chunk-overrun", "huge-chunk",
         "garbage-request-line", "http-0.9", "http-2", "unknown-method", "long-request-line", "header-flood",
         "long-header"],
)
def test_malformed_requests_get_a_4xx_json_answer_and_a_close(port, request_bytes, status, error, words):
    started = time.monotonic()
    got, headers, body, closed_after = exchange(port, request_bytes)
    assert (got, body["error"]) == (status, error), body
    assert words in body["message"] and headers["content-type"] == "application/json"
    assert headers["x-amzn-errortype"] == error and headers["connection"] == "close" and closed_after
    assert time.monotonic() - started < WAIT / 2  # answered, not timed out by the client
    assert_serves(port)


def test_a_body_cut_short_is_a_400_naming_the_bytes_received(port):
    got, _, body, closed_after = exchange(port, post("Content-Length: 100\r\n", GOOD[:10]), end=True)
    assert got == 400 and body["message"] == "the request body ended after 10 of 100 bytes" and closed_after
    _, _, body, _ = exchange(port, post("Transfer-Encoding: chunked\r\n", b"40\r\n" + GOOD[:10]), end=True)
    assert body["message"] == "the request body ended after 10 of 64 bytes"
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
        assert status == 408 and body["error"] == "RequestTimeout" and headers["connection"] == "close"
        assert body["message"] == f"the request body did not arrive within {READ_TIMEOUT:g} s"
        assert READ_TIMEOUT * 0.9 <= elapsed < WAIT / 2
        assert closed(sock)
    assert_serves(port)


def test_an_idle_connection_is_closed_cleanly_after_the_read_timeout(port):
    with connect(port) as sock:
        started = time.monotonic()
        assert closed(sock)  # EOF, no bytes: nothing was asked
        assert READ_TIMEOUT * 0.9 <= time.monotonic() - started < WAIT / 2
    with connect(port) as sock:  # half a request line, then silence
        sock.sendall(b"POST /invoc")
        assert closed(sock)
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
        assert status == 413 and "connection" not in headers and "bytes limit" in body["message"]
        sock.sendall(post(f"Content-Length: {len(GOOD)}\r\n", GOOD))  # same connection, kept alive
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 200 and len(json.loads(response.read())) == 2


def test_a_get_with_a_body_is_answered_then_closed_not_read_as_a_second_request(port):
    with connect(port) as sock:
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 18\r\n\r\nGET /nowhere HTTP/1")
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 200 and json.loads(response.read())["status"] == "Healthy"
        assert closed(sock)
