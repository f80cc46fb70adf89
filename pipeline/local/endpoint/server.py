"""The local endpoint's HTTP server: SageMaker's serving routes on 127.0.0.1, standard library only.

Routes: `GET /ping` (200 once a model is loaded; HEAD too), `POST /invocations` (the container's own route) and
`POST /endpoints/<name>/invocations` (SageMaker Runtime's route; another method is 405 with `Allow`), so that
`boto3.client("sagemaker-runtime", endpoint_url=url).invoke_endpoint(EndpointName=name, ...)` works unchanged.
Errors are JSON `{"error", "message", "detail"}` with the code in `x-amzn-ErrorType` too: a handler's error is the
container's 400 `ModelError`, which SageMaker Runtime's route answers as its 424 with `OriginalStatusCode` 400 (the
`ModelError` shape of botocore's sagemaker-runtime model); an unknown endpoint name is 400 `ValidationError`, a body
over 6 MB is 413, an unknown path is 404. So are malformed requests (`framing`): a bad request line or
Content-Length 400, a POST without a length 411, too many or too long headers 431, a body that does not arrive within
`read_timeout` seconds 408; then the connection closes. An idle connection closes after `read_timeout` seconds.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import psutil

from pipeline.local.endpoint.daemon import EndpointStartError, load_state, steer_new_connections, write_state
from pipeline.local.endpoint.draining import DRAIN_SECONDS, DrainingServer
from pipeline.local.endpoint.framing import FramingError, read_body
from pipeline.local.endpoint.handler import JSON_TYPE, LOG, EndpointError, LoadedModel, serving_environment

READ_TIMEOUT = 60.0  # seconds: the most a request's body may take to arrive, and a connection may stay idle
ACCOUNT = "000000000000"
_INVOKE_PATH = re.compile(r"/endpoints/([^/]+)/invocations")


def allowed_methods(path: str) -> str | None:
    """The methods a route answers (a 405's `Allow` header), None for an unknown path (404)."""
    if path == "/ping":
        return "GET, HEAD"
    return "POST" if path == "/invocations" or _INVOKE_PATH.fullmatch(path) else None


class _Server(DrainingServer):
    endpoint: LocalEndpoint

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):  # the client went away: nothing to answer
            LOG.info("%s: connection dropped (%s)", client_address[0], type(error).__name__)
        else:
            LOG.exception("%s: request failed", client_address[0])


class _SharedPortServer(_Server):
    allow_reuse_port = True  # SO_REUSEPORT: a new detached endpoint binds the port while the old one still serves

    def server_activate(self) -> None:
        super().server_activate()
        steer_new_connections(self.socket)  # ready (the model is loaded): new connections come here


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "LocalSageMakerEndpoint/1.0"
    server: _Server

    def setup(self) -> None:
        self.timeout = self.server.endpoint.read_timeout  # idle connections close; StreamRequestHandler applies it
        self.runtime_route = False  # whether the request in hand came by SageMaker Runtime's route
        super().setup()
        # Headers and body go out in two writes: with Nagle's algorithm the body of an answer on a kept-alive
        # connection would wait for the client's delayed ACK of the headers (40 ms on Linux).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        finally:
            self.server.track(self.connection, False)

    def parse_request(self) -> bool:
        self.server.track(self.connection, True)  # the request line is read: answered before the connection closes
        if not super().parse_request():
            return False
        if self.request_version == "HTTP/0.9":  # a two-word request line: answered as HTTP/0.9, without headers
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request line {self.requestline!r}: expected HTTP/1.x")
            return False
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (request line, headers, method) as JSON, and the connection closes."""
        if code in (HTTPStatus.NOT_IMPLEMENTED, HTTPStatus.HTTP_VERSION_NOT_SUPPORTED):
            code = HTTPStatus.METHOD_NOT_ALLOWED if code == HTTPStatus.NOT_IMPLEMENTED else HTTPStatus.BAD_REQUEST
        if self.request_version == "HTTP/0.9" or not self.request_version:
            self.request_version = "HTTP/1.0"  # so that the status line and headers are written
        self.close_connection = True
        name = "ValidationError" if code == 400 else HTTPStatus(code).phrase.title().replace(" ", "").replace("-", "")
        detail = f"{message}: {explain}" if message and explain else message or explain or HTTPStatus(code).phrase
        allow = allowed_methods(urlsplit(getattr(self, "path", "") or "").path) if code == 405 else None
        self._error(EndpointError(int(code), name, detail), time.perf_counter(), {"Allow": allow} if allow else {})

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        """GET /ping, and HEAD of any route: GET's status and headers without the body (RFC 9110, 9.3.2)."""
        started = time.perf_counter()
        self._unread_body()
        path = urlsplit(self.path).path
        if path == "/ping":
            model = self.server.endpoint.model
            if model is None:
                self._error(EndpointError(503, "ServiceUnavailable", "no model loaded"), started)
            else:
                self._send(
                    200,
                    json.dumps({"status": "Healthy", "endpoint": model.name, "version": model.version,
                                "variant": getattr(model.model, "variant", None)}).encode(),
                    JSON_TYPE,
                    started,
                )
        else:
            self._refuse(path, started)

    do_HEAD = do_GET  # noqa: N815

    def do_POST(self) -> None:  # noqa: N802
        started = time.perf_counter()
        endpoint = self.server.endpoint
        path = urlsplit(self.path).path
        try:
            match = _INVOKE_PATH.fullmatch(path)
            self.runtime_route = bool(match)
            if path != "/invocations" and not match:
                self._unread_body()
                return self._refuse(path, started)
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
                extra: dict[str, str] = {}  # what the handler set (the variant in the custom attributes)
                payload, content_type = model.invoke(
                    body, self.headers.get("Content-Type"), self.headers.get("Accept"), headers, extra
                )
            finally:
                model.release()
            extra.update({"x-Amzn-Invoked-Production-Variant": "AllTraffic"} if match else {})
            self._send(200, payload, content_type, started, extra)
        except EndpointError as error:
            self._error(error, started)

    def _refuse(self, path: str, started: float) -> None:
        """A request its route does not answer: 405 with the route's `Allow`, or 404 for an unknown path."""
        allow = allowed_methods(path)
        if allow is None:
            error = EndpointError(404, "NotFound", f"no route {path}: use GET /ping, POST /invocations or "
                                  f"POST /endpoints/{self.server.endpoint.name}/invocations")
            return self._error(error, started)
        self._error(EndpointError(405, "MethodNotAllowed", f"{self.command} {path}: use {allow}"), started,
                    {"Allow": allow})

    def _method_not_allowed(self) -> None:
        self._unread_body()
        self._refuse(urlsplit(self.path).path, time.perf_counter())

    do_PUT = do_DELETE = do_PATCH = _method_not_allowed  # noqa: N815

    def _unread_body(self) -> None:
        """A body this route does not read would be taken for the next request: close after answering."""
        if self.headers.get("Content-Length", "0").strip() != "0" or "Transfer-Encoding" in self.headers:
            self.close_connection = True

    def _read_body(self) -> bytes:
        try:
            return read_body(self.rfile, self.connection, self.headers, self.server.endpoint.read_timeout)
        except FramingError as error:
            self.close_connection = self.close_connection or not error.keep_alive
            raise

    def _error(self, error: EndpointError, started: float, headers: dict[str, str] | None = None) -> None:
        runtime_model_error = error.code == "ModelError" and self.runtime_route
        self._send(
            424 if runtime_model_error else error.status,
            json.dumps(error.body()).encode(),
            JSON_TYPE,
            started,
            {"x-amzn-ErrorType": error.code, **(headers or {})},
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
        if self.close_connection or self.server.draining:
            self.close_connection = True
            self.send_header("Connection", "close")
        LOG.info(
            "%s %s %s %d %dB %.1fms%s",
            self.server.endpoint.name,
            self.command or "-",
            urlsplit(getattr(self, "path", "") or "").path or "-",
            status,
            len(payload),
            (time.perf_counter() - started) * 1000,
            f" ({note})" if note else "",
        )
        self.end_headers()
        if getattr(self, "command", None) != "HEAD":
            self.wfile.write(payload)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # _send logs one line per request

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        LOG.warning("%s: %s", self.address_string(), format % args)


class LocalEndpoint:
    """A model served over HTTP from a background thread of this process."""

    def __init__(self, host: str = "127.0.0.1", program: str | None = None, read_timeout: float = READ_TIMEOUT,
                 reuse_port: bool = False) -> None:
        self.host, self.reuse_port = host, reuse_port
        self.program = program
        self.read_timeout = read_timeout
        self.name: str | None = None
        self.model: LoadedModel | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._swap_lock = threading.Lock()

    def start(self, model_data: Path, name: str, port: int = 8080, version: str | None = None) -> str:
        """Load the model and take host:port (0 picks a free port), then serve it; returns the URL.

        A plain endpoint takes the port first, so that a taken port fails before the model loads; a blue/green one
        (`reuse_port`) loads first, because new connections come to it as soon as it listens."""
        if self._server is not None:
            raise RuntimeError(f"endpoint {self.name} is already running at {self.url}")
        if not name or "/" in name:
            raise ValueError(f"invalid endpoint name {name!r}")
        if self.reuse_port:
            model = LoadedModel(model_data, name, version, self.program)
            try:
                server = self._listen(name, port)
            except BaseException:
                model.close()
                raise
        else:
            server = self._listen(name, port)
            try:
                model = LoadedModel(model_data, name, version, self.program)
            except BaseException:
                server.server_close()
                raise
        self.name, self.model, self._server = name, model, server
        self._server.endpoint = self
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"endpoint-{name}", daemon=True)
        self._thread.start()
        LOG.info("endpoint %s: serving %s at %s", name, model_data, self.url)
        return self.url

    def _listen(self, name: str, port: int) -> _Server:
        try:
            return (_SharedPortServer if self.reuse_port else _Server)((self.host, port), _Handler)
        except OSError as error:
            raise EndpointStartError.cannot_listen(name, self.host, port, error) from error

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

    def stop(self, drain: float = DRAIN_SECONDS) -> None:
        """Stop accepting, let open connections finish (see `DrainingServer.stop_serving`, up to twice `drain`
        seconds), and unload the model."""
        if self._server is not None:
            self._server.stop_serving(drain)
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
        try:
            url = endpoint.start(Path(model_data), name, port, version)
        except EndpointStartError:
            raise
        except Exception as error:  # a broken artifact or handler: one line (the cause stays chained)
            first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
            raise EndpointStartError(f"endpoint {name}: the model at {model_data} did not load: "
                                     f"{type(error).__name__}: {first.rstrip(':')}") from error
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
                    "process_started": psutil.Process().create_time(),
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
