"""The local endpoint's HTTP side: SageMaker's serving routes as a Starlette app, served by uvicorn (h11).

Routes: `GET /ping` (200 once a model is loaded; HEAD too), `POST /invocations` (the container's own route) and
`POST /endpoints/<name>/invocations` (SageMaker Runtime's route), so that
`boto3.client("sagemaker-runtime", endpoint_url=url).invoke_endpoint(EndpointName=name, ...)` works unchanged;
`PUT /local/model` loads another model beside the served one and swaps it in (the local deploy; requests keep going
to the old model until the swap, and those in flight finish on it).
Errors are JSON `{"error", "message", "detail"}` with the code in `x-amzn-ErrorType` too: a handler's error is the
container's 400 `ModelError`, which SageMaker Runtime's route answers as its 424 with `OriginalStatusCode` 400 (the
`ModelError` shape of botocore's sagemaker-runtime model); an unknown endpoint name is 400 `ValidationError`, a body
over 6 MB is 413 (read away up to 64 MB, so that the connection serves on), a body that does not arrive within
`read_timeout` seconds 408 (and the connection closes), an unknown path 404, another method 405 with `Allow`.
Requests that h11 cannot parse (a malformed Content-Length or chunk, a garbage or over-long request line, HTTP/0.9
or 2) are answered by uvicorn itself: a plain-text 400, then a close. A connection idle after an answer closes after
`read_timeout` seconds; uvicorn has no timeout for a request line that never ends.

`LocalEndpoint` serves from a thread of this process (tests, `invoke` without HTTP); `pipeline.local.endpoint.process`
runs it detached, under uvicorn's process manager.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from pipeline.errors import UserError
from pipeline.local.endpoint.handler import JSON_TYPE, LOG, EndpointError, LoadedModel, serving_environment
from steps.contract import MAX_PAYLOAD_BYTES

READ_TIMEOUT = 60.0  # seconds: the most a request's body may take to arrive, and a connection may stay idle
DRAIN_LIMIT = 64 * 1024 * 1024  # an oversized body up to this size is read and dropped, beyond it the connection closes
BACKLOG = 2048  # connections the kernel queues before they are accepted (a new connection per request, many clients)
ACCOUNT = "000000000000"
MODEL_ROUTE = "/local/model"
_METHODS = ("GET", "HEAD", "POST", "PUT")  # the order a 405's Allow names them in


class EndpointStartError(UserError, RuntimeError):
    """An endpoint did not start or take a new model: its port is taken, its model does not load, ... (one line,
    with the reason); the one it was to replace still serves."""

    @classmethod
    def cannot_listen(cls, name: str, host: str, port: int, error: OSError) -> EndpointStartError:
        return cls(f"endpoint {name}: cannot listen on {host}:{port}: {error.strerror or error} (choose another port)")


def listen(name: str, host: str, port: int) -> socket.socket:
    """A listening socket on host:port (0 picks a free port), inheritable by uvicorn's worker processes."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # connections in TIME_WAIT do not hold it
        # The answer's body is written after its head: with Nagle's algorithm it waited for the client's delayed
        # ACK of the head, 40 ms on every request of a kept-alive connection. asyncio sets TCP_NODELAY only on a
        # socket whose proto says TCP (hence IPPROTO_TCP above); Linux hands it to the connections it accepts.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as error:
        sock.close()
        raise EndpointStartError.cannot_listen(name, host, port, error) from error
    sock.set_inheritable(True)
    return sock


def server_config(app: Any, read_timeout: float, **options: Any) -> uvicorn.Config:
    """uvicorn's settings for an endpoint: h11, no access log (the app logs one line per request), idle
    connections closed after `read_timeout`."""
    return uvicorn.Config(app, http="h11", log_config=None, access_log=False, proxy_headers=False,
                          server_header=False, timeout_keep_alive=read_timeout, timeout_graceful_shutdown=30,
                          **options)


class Serving:
    """The model an endpoint serves, swapped whole: a new one loads beside it, then takes the requests."""

    def __init__(self, name: str, program: str | None = None, read_timeout: float = READ_TIMEOUT) -> None:
        if not name or "/" in name:
            raise ValueError(f"invalid endpoint name {name!r}")
        self.name, self.program, self.read_timeout = name, program, read_timeout
        self.model: LoadedModel | None = None
        self.environment: dict[str, str] = {}
        self._swap_lock = threading.Lock()

    def load(self, model_data: Path, version: str | None = None, environment: dict[str, str] | None = None) -> None:
        """Load `model_data` with its container `environment` set in this process, then swap it in."""
        with self._swap_lock:
            LOG.info("endpoint %s: loading %s (version %s)", self.name, model_data, version)
            wanted = serving_environment(environment)
            for key in self.environment.keys() - wanted.keys():
                os.environ.pop(key, None)
            os.environ.update(wanted)
            self.environment = wanted
            new = LoadedModel(Path(model_data), self.name, version, self.program)
            old, self.model = self.model, new
        if old is not None:
            old.retire()
        LOG.info("endpoint %s: now serving %s (version %s)", self.name, model_data, version)

    def close(self) -> None:
        if self.model is not None:
            self.model.retire()
            self.model = None


def _answer(request: Request, status: int, payload: bytes, content_type: str, started: float,
            headers: dict[str, str] | None = None, note: str = "") -> Response:
    LOG.info("%s %s %s %d %dB %.1fms%s", request.app.state.serving.name, request.method, request.url.path, status,
             len(payload), (time.perf_counter() - started) * 1000, f" ({note})" if note else "")
    return Response(payload, status, {"Content-Type": content_type, "x-amzn-RequestId": str(uuid.uuid4()),
                                      **(headers or {})})  # the type as the handler gave it (no charset added)


def _error(request: Request, error: EndpointError, started: float, headers: dict[str, str] | None = None) -> Response:
    runtime_model_error = error.code == "ModelError" and "name" in request.path_params
    return _answer(request, 424 if runtime_model_error else error.status, json.dumps(error.body()).encode(),
                   JSON_TYPE, started, {"x-amzn-ErrorType": error.code, **(headers or {})}, error.message)


class _Close(EndpointError):
    """An error after which the connection closes (the rest of the body is not read)."""


def _too_large(size: str, kind: type[EndpointError] = EndpointError) -> EndpointError:
    return kind(413, "ValidationError", f"Request body{size} is over the {MAX_PAYLOAD_BYTES} bytes limit of "
                "real-time inference.")


async def _read_body(request: Request, timeout: float) -> bytes:
    """The body within MAX_PAYLOAD_BYTES and `timeout` seconds; an oversized one is read away up to DRAIN_LIMIT."""
    length = request.headers.get("content-length")  # h11 has checked that it is one number
    if length is not None and int(length) > DRAIN_LIMIT:
        raise _too_large(f" of {length} bytes", _Close)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > DRAIN_LIMIT:
                    raise _too_large(" (chunked)", _Close)
                if size <= MAX_PAYLOAD_BYTES:
                    chunks.append(chunk)
    except TimeoutError:
        raise _Close(408, "RequestTimeout", f"the request body did not arrive within {timeout:g} s") from None
    except ClientDisconnect:  # nobody to answer: logged as one line
        raise _Close(400, "ValidationError", f"the client went away after {size} bytes of the body") from None
    if size > MAX_PAYLOAD_BYTES:
        raise _too_large(f" of {size} bytes")
    return b"".join(chunks)


async def _ping(request: Request) -> Response:
    started, model = time.perf_counter(), request.app.state.serving.model
    if model is None:
        return _error(request, EndpointError(503, "ServiceUnavailable", "no model loaded"), started)
    health = {"status": "Healthy", "endpoint": model.name, "version": model.version,
              "variant": getattr(model.model, "variant", None)}
    return _answer(request, 200, json.dumps(health).encode(), JSON_TYPE, started)


async def _invocations(request: Request) -> Response:
    started, serving = time.perf_counter(), request.app.state.serving
    runtime = "name" in request.path_params
    try:
        body = await _read_body(request, serving.read_timeout)
        if runtime and request.path_params["name"] != serving.name:
            raise EndpointError(400, "ValidationError",
                                f"Endpoint {request.path_params['name']} of account {ACCOUNT} not found.")
        model = serving.model
        if model is None:
            raise EndpointError(503, "ServiceUnavailable", "no model loaded")
        model.acquire()
        try:
            extra: dict[str, str] = {}  # what the handler set (the variant in the custom attributes)
            payload, content_type = await run_in_threadpool(
                model.invoke, body, request.headers.get("content-type"), request.headers.get("accept"),
                dict(request.headers), extra)
        finally:
            model.release()
    except _Close as error:
        return _error(request, error, started, {"Connection": "close"})
    except EndpointError as error:
        return _error(request, error, started)
    if runtime:
        extra["x-Amzn-Invoked-Production-Variant"] = "AllTraffic"
    return _answer(request, 200, payload, content_type, started, extra)


async def _swap(request: Request) -> Response:
    """PUT /local/model {"model_data", "version", "environment"}: load it, swap it in, then `on_swap`."""
    started, serving = time.perf_counter(), request.app.state.serving
    try:
        wanted = json.loads(await _read_body(request, serving.read_timeout))
        model_data, version, environment = wanted["model_data"], wanted.get("version"), wanted.get("environment")
    except (ValueError, KeyError, TypeError) as error:
        return _error(request, EndpointError(400, "ValidationError", f"expected model_data, version, environment: "
                                             f"{error}"), started)
    try:
        await run_in_threadpool(serving.load, Path(model_data), version, environment)
    except Exception as error:  # a broken artifact or handler: one line, the old model serves on
        return _error(request, EndpointError(422, "ModelLoadError", load_failure(error)), started)
    request.app.state.on_swap(wanted)
    return _answer(request, 200, json.dumps({"version": version}).encode(), JSON_TYPE, started)


def load_failure(error: BaseException) -> str:
    """The first line of a model's load error, with its type."""
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first.rstrip(':')}"


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's 404 and 405 (with the route's `Allow`) as the endpoint's JSON errors."""
    assert isinstance(exc, HTTPException)
    started, path = time.perf_counter(), request.url.path
    if exc.status_code == 405:
        allow = ", ".join(sorted((exc.headers or {}).get("Allow", "").split(", "), key=_METHODS.index))
        exc.headers = {"Allow": allow}
        error = EndpointError(405, "MethodNotAllowed", f"{request.method} {path}: use {allow}")
    elif exc.status_code == 404:
        error = EndpointError(404, "NotFound", f"no route {path}: use GET /ping, POST /invocations or "
                              f"POST /endpoints/{request.app.state.serving.name}/invocations")
    else:
        error = EndpointError(exc.status_code, HTTPStatus(exc.status_code).phrase.replace(" ", ""), str(exc.detail))
    return _error(request, error, started, dict(exc.headers or {}))


def build_app(serving: Serving, on_swap: Callable[[dict], Any] = lambda wanted: None,
              lifespan: Any = None) -> Starlette:
    """The endpoint's routes over `serving`; `on_swap(request)` runs after each model swap."""
    app = Starlette(
        routes=[
            Route("/ping", _ping, methods=["GET"]),
            Route("/invocations", _invocations, methods=["POST"]),
            Route("/endpoints/{name}/invocations", _invocations, methods=["POST"]),
            Route(MODEL_ROUTE, _swap, methods=["PUT"]),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )
    app.state.serving, app.state.on_swap = serving, on_swap
    return app


class LocalEndpoint:
    """A model served over HTTP by uvicorn from a background thread of this process."""

    def __init__(self, host: str = "127.0.0.1", program: str | None = None, read_timeout: float = READ_TIMEOUT) -> None:
        self.host, self.program, self.read_timeout = host, program, read_timeout
        self.serving: Serving | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._port = 0

    @property
    def name(self) -> str | None:
        return self.serving.name if self.serving else None

    @property
    def model(self) -> LoadedModel | None:
        return self.serving.model if self.serving else None

    def start(self, model_data: Path, name: str, port: int = 8080, version: str | None = None) -> str:
        """Take host:port (0 picks a free port), load the model, then serve it; returns the URL."""
        if self._server is not None:
            raise RuntimeError(f"endpoint {self.name} is already running at {self.url}")
        serving = Serving(name, self.program, self.read_timeout)
        sock = listen(name, self.host, port)
        try:
            serving.load(Path(model_data), version)
        except BaseException:
            sock.close()
            serving.close()
            raise
        server = uvicorn.Server(server_config(build_app(serving), self.read_timeout, lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"endpoint-{name}", daemon=True)
        thread.start()
        while not server.started and thread.is_alive():
            time.sleep(0.01)
        if not server.started:
            serving.close()
            raise EndpointStartError(f"endpoint {name}: the server did not start")
        self.serving, self._server, self._thread, self._port = serving, server, thread, sock.getsockname()[1]
        LOG.info("endpoint %s: serving %s at %s", name, model_data, self.url)
        return self.url

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("endpoint is not running")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def update(self, model_data: Path, version: str | None = None) -> None:
        """Load another model, then swap it in; requests keep going to the old one until the swap."""
        if self.serving is None:
            raise RuntimeError("endpoint is not running")
        self.serving.load(Path(model_data), version, self.serving.environment)

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
        """Stop accepting, let the requests in flight finish, close idle connections and unload the model."""
        if self._server is not None:
            self._server.should_exit = True
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None
        if self.serving is not None:
            self.serving.close()

    def __enter__(self) -> LocalEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
