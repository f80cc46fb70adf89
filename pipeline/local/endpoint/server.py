"""The local endpoint's HTTP server: SageMaker's serving routes on 127.0.0.1, standard library only.

Routes: `GET /ping` (200 once a model is loaded), `POST /invocations` (the container's own route) and
`POST /endpoints/<name>/invocations` (SageMaker Runtime's route), so that
`boto3.client("sagemaker-runtime", endpoint_url=url).invoke_endpoint(EndpointName=name, ...)` works unchanged.
Errors are JSON `{"error", "message", "detail"}` with the code in `x-amzn-ErrorType` too: an unknown endpoint name
is 400 `ValidationError`, a body over 6 MB is 413, an unknown path is 404.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pipeline.contract import MAX_PAYLOAD_BYTES
from pipeline.local.endpoint.daemon import load_state, steer_new_connections, write_state
from pipeline.local.endpoint.handler import JSON_TYPE, LOG, EndpointError, LoadedModel, serving_environment

_DRAIN_LIMIT = 64 * 1024 * 1024  # an oversized body up to this size is read and dropped, beyond it unread
ACCOUNT = "000000000000"
_INVOKE_PATH = re.compile(r"/endpoints/([^/]+)/invocations")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    endpoint: LocalEndpoint


class _SharedPortServer(_Server):
    allow_reuse_port = True  # SO_REUSEPORT: a new detached endpoint binds the port while the old one still serves

    def server_activate(self) -> None:
        super().server_activate()
        steer_new_connections(self.socket)  # ready (the model is loaded): new connections come here


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "LocalSageMakerEndpoint/1.0"
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        started = time.perf_counter()
        path = urlsplit(self.path).path
        if path == "/ping":
            model = self.server.endpoint.model
            if model is None:
                self._error(EndpointError(503, "ServiceUnavailable", "no model loaded"), started)
            else:
                self._send(
                    200,
                    json.dumps({"status": "Healthy", "endpoint": model.name, "version": model.version}).encode(),
                    JSON_TYPE,
                    started,
                )
        elif path in ("/invocations",) or _INVOKE_PATH.fullmatch(path):
            self._error(EndpointError(405, "MethodNotAllowed", f"use POST {path}"), started)
        else:
            self._error(EndpointError(404, "NotFound", f"no route {path}: use GET /ping or POST /invocations"), started)

    def do_POST(self) -> None:  # noqa: N802
        started = time.perf_counter()
        endpoint = self.server.endpoint
        path = urlsplit(self.path).path
        try:
            match = _INVOKE_PATH.fullmatch(path)
            if path != "/invocations" and not match:
                raise EndpointError(
                    404,
                    "NotFound",
                    f"no route {path}: use POST /invocations or POST /endpoints/{endpoint.name}/invocations",
                )
            body = self._read_body()
            if match and unquote(match[1]) != endpoint.name:
                raise EndpointError(
                    400, "ValidationError", f"Endpoint {unquote(match[1])} of account {ACCOUNT} not found."
                )
            model = endpoint.model
            if model is None:
                raise EndpointError(503, "ServiceUnavailable", "no model loaded")
            model.acquire()
            try:
                headers = {k.lower(): v for k, v in self.headers.items()}
                payload, content_type = model.invoke(
                    body, self.headers.get("Content-Type"), self.headers.get("Accept"), headers
                )
            finally:
                model.release()
            extra = {"x-Amzn-Invoked-Production-Variant": "AllTraffic"} if match else {}
            self._send(200, payload, content_type, started, extra)
        except EndpointError as error:
            self._error(error, started)

    def _method_not_allowed(self) -> None:
        self._error(EndpointError(405, "MethodNotAllowed", f"{self.command} is not supported"), time.perf_counter())

    do_PUT = do_DELETE = do_PATCH = _method_not_allowed  # noqa: N815

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError as exc:
            raise EndpointError(400, "ValidationError", "invalid Content-Length") from exc
        if length > MAX_PAYLOAD_BYTES:
            if length <= _DRAIN_LIMIT:  # read it away, so that a client still sending gets the answer
                left = length
                while left > 0 and (chunk := self.rfile.read(min(left, 1 << 20))):
                    left -= len(chunk)
            else:
                self.close_connection = True  # the body stays unread
            raise EndpointError(
                413,
                "ValidationError",
                f"Request body of {length} bytes is over the {MAX_PAYLOAD_BYTES} bytes limit of real-time inference.",
            )
        return self.rfile.read(length)

    def _read_chunked(self) -> bytes:
        chunks, total = [], 0
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            total += size
            if total > MAX_PAYLOAD_BYTES:
                self.close_connection = True
                raise EndpointError(
                    413,
                    "ValidationError",
                    f"Request body is over the {MAX_PAYLOAD_BYTES} bytes limit of real-time inference.",
                )
            chunks.append(self.rfile.read(size))
            self.rfile.readline()

    def _error(self, error: EndpointError, started: float) -> None:
        self._send(
            error.status,
            json.dumps(error.body()).encode(),
            JSON_TYPE,
            started,
            {"x-amzn-ErrorType": error.code},
            note=error.message,
        )

    def _send(
        self,
        status: int,
        payload: bytes,
        content_type: str,
        started: float,
        headers: dict[str, str] | None = None,
        note: str = "",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        LOG.info(
            "%s %s %s %d %dB %.1fms%s",
            self.server.endpoint.name,
            self.command,
            urlsplit(self.path).path,
            status,
            len(payload),
            (time.perf_counter() - started) * 1000,
            f" ({note})" if note else "",
        )
        self.end_headers()
        self.wfile.write(payload)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # _send logs one line per request

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        LOG.warning("%s: %s", self.address_string(), format % args)


class LocalEndpoint:
    """A model served over HTTP from a background thread of this process."""

    def __init__(self, host: str = "127.0.0.1", program: str | None = None, reuse_port: bool = False) -> None:
        self.host, self.reuse_port = host, reuse_port
        self.program = program
        self.name: str | None = None
        self.model: LoadedModel | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._swap_lock = threading.Lock()

    def start(self, model_data: Path, name: str, port: int = 8080, version: str | None = None) -> str:
        """Load the model, then serve it on host:port (0 picks a free port); returns the URL."""
        if self._server is not None:
            raise RuntimeError(f"endpoint {self.name} is already running at {self.url}")
        if not name or "/" in name:
            raise ValueError(f"invalid endpoint name {name!r}")
        self.name = name
        self.model = LoadedModel(model_data, name, version, self.program)
        try:
            self._server = (_SharedPortServer if self.reuse_port else _Server)((self.host, port), _Handler)
        except OSError:
            self.model.close()
            self.model = None
            raise
        self._server.endpoint = self
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"endpoint-{name}", daemon=True)
        self._thread.start()
        LOG.info("endpoint %s: serving %s at %s", name, model_data, self.url)
        return self.url

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("endpoint is not running")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def update(self, model_data: Path, version: str | None = None) -> None:
        """Load another model, then swap it in; requests keep going to the old one until the swap."""
        if self.name is None:
            raise RuntimeError("endpoint is not running")
        new = LoadedModel(model_data, self.name, version, self.program)
        with self._swap_lock:
            old, self.model = self.model, new
        if old is not None:
            old.retire()
        LOG.info("endpoint %s: now serving %s", self.name, model_data)

    def invoke(self, body: bytes, content_type: str | None = JSON_TYPE, accept: str | None = None) -> tuple[bytes, str]:
        """Call the loaded model directly, without HTTP; raises EndpointError like the server answers."""
        if self.model is None:
            raise RuntimeError("endpoint is not running")
        model = self.model.acquire()
        try:
            return model.invoke(body, content_type, accept)
        finally:
            model.release()

    def stop(self) -> None:
        """Stop serving and unload the model."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self.model is not None:
            self.model.retire()
            self.model = None

    def __enter__(self) -> LocalEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(
    model_data: Path,
    name: str,
    port: int = 8080,
    host: str = "127.0.0.1",
    *,
    version: str | None = None,
    state_file: Path | None = None,
    on_ready: Callable[[str], Any] | None = None,
    environment: dict[str, str] | None = None,
    reuse_port: bool = False,
) -> None:
    """Serve in the foreground until Ctrl-C or SIGTERM; with `state_file`, record pid/port/version there.

    `environment` (the model's container environment) is set in this process before the handler loads."""
    os.environ.update(serving_environment(environment))
    endpoint = LocalEndpoint(host, reuse_port=reuse_port)
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        url = endpoint.start(Path(model_data), name, port, version)
        if state_file is not None:
            write_state(
                Path(state_file),
                {
                    "pid": os.getpid(),
                    "name": name,
                    "host": host,
                    "port": endpoint.port,
                    "url": url,
                    "model_data": str(Path(model_data).resolve()),
                    "version": version,
                    "status": "InService",
                    "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                },
            )
        if on_ready is not None:
            on_ready(url)
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        endpoint.stop()
        if state_file is not None and (load_state(Path(state_file)) or {}).get("pid") == os.getpid():
            Path(state_file).unlink(missing_ok=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        LOG.info("endpoint %s: stopped", name)
