"""A local real-time endpoint: SageMaker's serving contract over HTTP on 127.0.0.1, standard library only.

Routes: `GET /ping` (200 once a model is loaded), `POST /invocations` (the container's own route) and
`POST /endpoints/<name>/invocations` (SageMaker Runtime's route), so that
`boto3.client("sagemaker-runtime", endpoint_url=url).invoke_endpoint(EndpointName=name, ...)` works unchanged.

The model is loaded as the Hugging Face CPU inference container loads it: model.tar.gz is untarred as is (files at the
archive root), `<model_dir>/code` goes first on sys.path and `inference` (or $SAGEMAKER_PROGRAM) is imported from it.
Its `model_fn`/`input_fn`/`predict_fn`/`output_fn` (or `transform_fn` alone) are called with the toolkit's contract:
`input_fn` gets a `str` only for exactly `application/json` or `text/csv` (else a `bytearray`), a missing or `*/*`
Accept becomes `application/json`, and a handler taking one extra trailing parameter receives a context. Differences
from the container: `code/requirements.txt` is not installed, a missing Content-Type is taken as `application/json`,
and a failing `model_fn` fails `start()`/`update()` instead of every request.

Errors are JSON `{"error": <code>, "message": ..., "detail": ...}` with the code in `x-amzn-ErrorType` too, which
botocore turns into a ClientError: a handler exception is 400 `ModelError` (the toolkit answers 400 with str(e)), an
unknown endpoint name is 400 `ValidationError`, a body over 6 MB is 413, an unknown path is 404.

Run in the foreground with `serve_forever()`, or detached with `start_background()` (which runs
`python -m pipeline.local.endpoint ... --state-file F` and returns once it serves) and `stop_background(F)`.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import unquote, urlsplit

LOG = logging.getLogger("pipeline.local.endpoint")
MAX_PAYLOAD_BYTES = 6 * 1024 * 1024  # SageMaker real-time inference's request limit
_DRAIN_LIMIT = 64 * 1024 * 1024  # an oversized body up to this size is read and dropped, beyond it unread
ACCOUNT = "000000000000"
JSON_TYPE = "application/json"
UTF8_TYPES = ("application/json", "text/csv")  # the toolkit decodes exactly these content types to str
ROOT = Path(__file__).resolve().parents[2]
_INVOKE_PATH = re.compile(r"/endpoints/([^/]+)/invocations")
_HANDLER_ARITY = {"model_fn": 1, "input_fn": 2, "predict_fn": 2, "output_fn": 2, "transform_fn": 4}
_IMPORT_LOCK = threading.Lock()
_CODE_DIRS: set[str] = set()  # every code/ folder this process imported a handler from
_DETACHED: dict[int, subprocess.Popen] = {}  # endpoints this process started: kept so that they are reaped quietly


class EndpointError(Exception):
    """An error answered as JSON with an HTTP status and an AWS error code."""

    def __init__(self, status: int, code: str, message: str, detail: str = "", error: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.detail = status, code, message, detail or message
        self.error = error or code  # the body's "error": a handler's own error name, else the AWS code

    def body(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"error": self.error, "message": self.message, "detail": self.detail}
        if self.code == "ModelError":  # the members of sagemaker-runtime's ModelError shape
            answer.update(OriginalStatusCode=self.status, OriginalMessage=self.detail)
        return answer


class Context:
    """What the toolkit passes as `context` to handlers that take one (a subset of the model server's Context)."""

    def __init__(self, model_name: str, model_dir: str, request_headers: dict[str, str] | None = None) -> None:
        self.model_name = model_name
        self.model_dir = model_dir
        self.request_headers = request_headers or {}
        self.system_properties = {"model_dir": model_dir, "gpu_id": None}

    def get_request_header(self, idx: int, key: str) -> str | None:
        return self.request_headers.get(key.lower())


# ---------------------------------------------------------------------------------------------------------------
# Loading a model the way the inference container does


def extract_model(model_data: Path, destination: Path) -> Path:
    """Untar model.tar.gz into `destination` as is (refusing members that would land outside it)."""
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(model_data) as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(destination, filter="data")
        else:  # pragma: no cover - Python before 3.10.12
            root = destination.resolve()
            for member in archive.getmembers():
                target = (root / member.name).resolve()
                if target != root and root not in target.parents or member.issym() or member.islnk():
                    raise ValueError(f"{model_data}: unsafe archive member {member.name!r}")
            archive.extractall(destination)
    return destination


def _import_handler(code_dir: Path, program: str) -> ModuleType | None:
    """Import `program` from `code_dir` with that folder first on sys.path, as the toolkit does."""
    if not ((code_dir / f"{program}.py").is_file() or (code_dir / program / "__init__.py").is_file()):
        return None
    with _IMPORT_LOCK:
        # Forget modules imported from earlier models' code/ folders so that this model's own files are used.
        for name, module in list(sys.modules.items()):
            origin = getattr(module, "__file__", None) or ""
            if name == program or any(origin.startswith(folder + os.sep) for folder in _CODE_DIRS):
                del sys.modules[name]
        _CODE_DIRS.add(str(code_dir))
        sys.path.insert(0, str(code_dir))
        importlib.invalidate_caches()
        return importlib.import_module(program)


def _takes_context(name: str, fn: Callable[..., Any]) -> bool:
    """The toolkit's rule: the usual parameter count, or one more for the context (defaults and **kwargs count)."""
    count, usual = len(inspect.signature(fn).parameters), _HANDLER_ARITY[name]
    if count not in (usual, usual + 1):
        raise TypeError(f"{name} takes {usual} or {usual + 1} arguments but {count} were given")
    return count == usual + 1


def _default_model_fn(model_dir: str) -> Any:
    """The toolkit's default: a transformers pipeline for $HF_TASK or the task of config.json's architecture."""
    from transformers import pipeline

    task = os.environ.get("HF_TASK")
    if not task:
        config_path = Path(model_dir) / "config.json"
        architectures = json.loads(config_path.read_text()).get("architectures", []) if config_path.is_file() else []
        suffixes = {
            "ForSequenceClassification": "text-classification",
            "ForTokenClassification": "ner",
            "ForQuestionAnswering": "question-answering",
            "ForMaskedLM": "fill-mask",
            "ForCausalLM": "text-generation",
        }
        task = next((t for a in architectures for s, t in suffixes.items() if a.endswith(s)), None)
        if task is None:
            raise ValueError("no code/inference.py, no HF_TASK and no known architecture in config.json")
    return pipeline(task=task, model=model_dir, device=-1)


def _default_input_fn(input_data: str | bytes | bytearray, content_type: str) -> Any:
    if content_type.split(";")[0].strip().lower() != JSON_TYPE:
        raise ValueError(f"content type {content_type} is not supported by the default handler")
    return json.loads(input_data)


def _default_predict_fn(data: Any, model: Any) -> Any:
    if not isinstance(data, dict):
        return model(data)
    inputs, parameters = data.pop("inputs", data), data.pop("parameters", None)
    return model(inputs, **parameters) if parameters else model(inputs)


def _default_output_fn(prediction: Any, accept: str) -> str:
    if accept.split(";")[0].strip().lower() != JSON_TYPE:
        raise ValueError(f"accept type {accept} is not supported by the default handler")
    return json.dumps(prediction, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))


def _handler_error(exc: Exception, stage: str) -> EndpointError:
    """A handler exception as the answer: 400 ModelError as the toolkit gives, unless the exception carries a 4xx
    `status` and a JSON message {"error", "detail"} (training/inference.py's InferenceError), which are used."""
    status = getattr(exc, "status", None)
    status = status if isinstance(status, int) and 400 <= status < 500 else 400
    try:
        named = json.loads(str(exc))
    except ValueError:
        named = None
    if isinstance(named, dict) and isinstance(named.get("error"), str):
        detail = str(named.get("detail", ""))
        return EndpointError(status, "ModelError", f"{named['error']}: {detail}", detail, error=named["error"])
    return EndpointError(status, "ModelError", f"{stage} failed: {type(exc).__name__}: {exc}", str(exc))


class LoadedModel:
    """One loaded model: its folder, handler functions and model object. Serves one request at a time."""

    def __init__(self, model_data: Path, name: str, version: str | None = None, program: str | None = None) -> None:
        self.model_data = Path(model_data).resolve()
        self.name = name
        self.version = version
        self._tmp: Path | None = None
        self._lock = threading.Lock()  # one request at a time, like one model-server worker
        self._refs = 0
        self._refs_lock = threading.Lock()
        self._retired = False
        started = time.perf_counter()
        if self.model_data.is_dir():
            self.model_dir = self.model_data
        else:
            self._tmp = Path(tempfile.mkdtemp(prefix=f"local-endpoint-{name}-"))
            self.model_dir = extract_model(self.model_data, self._tmp / "model")
        try:
            self._load(program or os.environ.get("SAGEMAKER_PROGRAM", "inference").removesuffix(".py"))
        except BaseException:
            self.close()
            raise
        LOG.info("endpoint %s: loaded %s in %.1fs", name, self.model_data, time.perf_counter() - started)

    def _load(self, program: str) -> None:
        code_dir = self.model_dir / "code"
        self.code_dir = str(code_dir)
        if (code_dir / "requirements.txt").is_file():
            LOG.warning("endpoint %s: code/requirements.txt is not installed locally", self.name)
        module = _import_handler(code_dir, program)
        found = {n: getattr(module, n) for n in _HANDLER_ARITY if callable(getattr(module, n, None))}
        if "transform_fn" in found and {"input_fn", "predict_fn", "output_fn"} & found.keys():
            raise ValueError("define transform_fn, or input_fn/predict_fn/output_fn, not both")
        self.handlers: dict[str, Callable[..., Any]] = {"model_fn": found.get("model_fn", _default_model_fn)}
        if "transform_fn" in found:
            self.handlers["transform_fn"] = found["transform_fn"]
        else:
            self.handlers["input_fn"] = found.get("input_fn", _default_input_fn)
            self.handlers["predict_fn"] = found.get("predict_fn", _default_predict_fn)
            self.handlers["output_fn"] = found.get("output_fn", _default_output_fn)
        self._context = {n: _takes_context(n, fn) for n, fn in self.handlers.items()}
        self.model = self._call("model_fn", str(self.model_dir), context=Context(self.name, str(self.model_dir)))

    def _call(self, name: str, *args: Any, context: Context) -> Any:
        return self.handlers[name](*args, *([context] if self._context[name] else []))

    def invoke(
        self, body: bytes, content_type: str | None, accept: str | None, headers: dict[str, str] | None = None
    ) -> tuple[bytes, str]:
        """Run the handlers on one request body; returns the response body and its content type."""
        content_type = content_type or JSON_TYPE
        accept = JSON_TYPE if not accept or accept == "*/*" else accept
        context = Context(self.name, str(self.model_dir), headers)
        stage = "input_fn"
        try:
            with self._lock:
                data: str | bytearray = body.decode("utf-8") if content_type in UTF8_TYPES else bytearray(body)
                if "transform_fn" in self.handlers:
                    stage = "transform_fn"
                    result = self._call("transform_fn", self.model, data, content_type, accept, context=context)
                else:
                    processed = self._call("input_fn", data, content_type, context=context)
                    stage = "predict_fn"
                    prediction = self._call("predict_fn", processed, self.model, context=context)
                    stage = "output_fn"
                    result = self._call("output_fn", prediction, accept, context=context)
                if isinstance(result, str):
                    return result.encode("utf-8"), accept
                if isinstance(result, (bytes, bytearray)):
                    return bytes(result), accept
                return json.dumps(result).encode("utf-8"), accept
        except UnicodeDecodeError as exc:
            message = f"the body is not valid UTF-8: {exc}"
            raise EndpointError(400, "ModelError", message, error="InvalidEncoding") from exc
        except Exception as exc:
            LOG.debug("endpoint %s: %s failed\n%s", self.name, stage, traceback.format_exc())
            raise _handler_error(exc, stage) from exc

    def acquire(self) -> LoadedModel:
        with self._refs_lock:
            self._refs += 1
        return self

    def release(self) -> None:
        with self._refs_lock:
            self._refs -= 1
            done = self._retired and self._refs == 0
        if done:
            self.close()

    def retire(self) -> None:
        """Close once the requests in flight on this model have finished."""
        with self._refs_lock:
            self._retired = True
            done = self._refs == 0
        if done:
            self.close()

    def close(self) -> None:
        """Take its code/ folder off sys.path and delete the folder it was untarred into."""
        with _IMPORT_LOCK:
            while getattr(self, "code_dir", None) in sys.path:
                sys.path.remove(self.code_dir)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


# ---------------------------------------------------------------------------------------------------------------
# The HTTP server


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    endpoint: LocalEndpoint


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

    def __init__(self, host: str = "127.0.0.1", program: str | None = None) -> None:
        self.host = host
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
            self._server = _Server((self.host, port), _Handler)
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


# ---------------------------------------------------------------------------------------------------------------
# Foreground and detached use


def _write_state(state_file: Path, state: dict[str, Any]) -> None:
    state_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = state_file.with_name(f".{state_file.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, state_file)


def _load_state(state_file: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(Path(state_file).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def serving_environment(environment: dict[str, str] | None) -> dict[str, str]:
    """A model's container environment as the local endpoint applies it: one model server worker (this process)."""
    return {**(environment or {}), "SAGEMAKER_MODEL_SERVER_WORKERS": "1"}


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
) -> None:
    """Serve in the foreground until Ctrl-C or SIGTERM; with `state_file`, record pid/port/version there.

    `environment` (the model's container environment) is set in this process before the handler loads."""
    os.environ.update(serving_environment(environment))
    endpoint = LocalEndpoint(host)
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        url = endpoint.start(Path(model_data), name, port, version)
        if state_file is not None:
            _write_state(
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
        if state_file is not None and (_load_state(Path(state_file)) or {}).get("pid") == os.getpid():
            Path(state_file).unlink(missing_ok=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        LOG.info("endpoint %s: stopped", name)


def _is_endpoint_process(pid: int) -> bool:
    """Whether `pid` is alive and runs this module (a pid from a stale state file may have been reused)."""
    if pid in _DETACHED and _DETACHED[pid].poll() is not None:
        del _DETACHED[pid]
        return False  # started and now reaped by this process
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False  # our own child, exited just now: reaped
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.parent.is_dir():
        try:
            return b"pipeline.local.endpoint" in cmdline.read_bytes()
        except OSError:
            return False
    try:  # no /proc (macOS)
        command = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True).stdout
        return "pipeline.local.endpoint" in command
    except OSError:
        return True


def read_state(state_file: Path) -> dict[str, Any] | None:
    """The state of the detached endpoint recorded in `state_file`, with "running" (is its process alive), or None."""
    state = _load_state(Path(state_file))
    if state is not None:
        state["running"] = isinstance(state.get("pid"), int) and _is_endpoint_process(state["pid"])
    return state


def stop_background(state_file: Path, timeout: float = 15.0) -> bool:
    """Stop the detached endpoint of `state_file` (SIGTERM, then SIGKILL); False when none was running."""
    state_file = Path(state_file)
    state = _load_state(state_file)
    if state is None:
        return False
    pid, stopped = state.get("pid"), False
    if isinstance(pid, int) and _is_endpoint_process(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _is_endpoint_process(pid):
            if time.monotonic() > deadline:
                os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))
                deadline = time.monotonic() + timeout
            time.sleep(0.05)
        stopped = True
        LOG.info("endpoint %s: stopped pid %d", state.get("name"), pid)
    state_file.unlink(missing_ok=True)
    return stopped


def start_background(
    model_data: Path,
    name: str,
    port: int = 8080,
    state_file: Path = Path("endpoint.json"),
    *,
    host: str = "127.0.0.1",
    version: str | None = None,
    log_file: Path | None = None,
    timeout: float = 180.0,
    environment: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Serve from a detached process that outlives this one; returns its state once it answers.

    A running endpoint recorded in `state_file` is stopped first (so a second start replaces the first). The
    process logs to `log_file` (default: the state file with suffix .log) and runs with `environment` (the model's
    container environment) added to this one's.
    """
    state_file = Path(state_file).resolve()
    stop_background(state_file)
    log_file = Path(log_file).resolve() if log_file else state_file.with_suffix(".log")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pipeline.local.endpoint",
        "--model-data",
        str(Path(model_data).resolve()),
        "--name",
        name,
        "--port",
        str(port),
        "--host",
        host,
        "--state-file",
        str(state_file),
    ]
    if version is not None:
        command += ["--model-version", str(version)]
    env = dict(os.environ, **serving_environment(environment))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    _DETACHED[process.pid] = process
    deadline = time.monotonic() + timeout
    while True:
        state = _load_state(state_file)
        if state is not None and state.get("pid") == process.pid and state.get("status") == "InService":
            return state | {"running": True, "log_file": str(log_file)}
        if process.poll() is not None:
            _DETACHED.pop(process.pid, None)
            tail = "".join(log_file.read_text(errors="replace").splitlines(keepends=True)[-15:])
            raise RuntimeError(
                f"endpoint {name} exited with code {process.returncode} before serving; end of {log_file}:\n{tail}"
            )
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            _DETACHED.pop(process.pid, None)
            raise TimeoutError(f"endpoint {name} did not start within {timeout:.0f}s; see {log_file}")
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.local.endpoint", description=__doc__.split("\n")[0])
    parser.add_argument("--model-data", type=Path, required=True, help="model.tar.gz or an untarred model folder")
    parser.add_argument("--name", required=True, help="endpoint name (the EndpointName of invoke_endpoint)")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model-version", help="label recorded in the state file, e.g. the model package version")
    parser.add_argument("--state-file", type=Path, help="JSON file recording pid, port and version while serving")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    serve_forever(
        args.model_data,
        args.name,
        args.port,
        args.host,
        version=args.model_version,
        state_file=args.state_file,
        on_ready=lambda url: print(f"endpoint {args.name} at {url}", flush=True),
    )


if __name__ == "__main__":
    main()
