"""The SageMaker inference handler contract: loading model.tar.gz and calling its handlers as the container does.

model.tar.gz is untarred as is (files at the archive root), `<model_dir>/code` goes first on sys.path and
`inference` (or $SAGEMAKER_PROGRAM) is imported from it. Its `model_fn`/`input_fn`/`predict_fn`/`output_fn` (or
`transform_fn` alone) are called with the toolkit's contract: `input_fn` gets a `str` only for exactly
`application/json` or `text/csv` (else a `bytearray`), a missing or `*/*` Accept becomes `application/json`, and a
handler taking one extra trailing parameter receives a context. Handler exceptions become 400 `ModelError`s, as the
toolkit answers every one (its PredictionException), whatever status the exception names.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

LOG = logging.getLogger("pipeline.local.endpoint")
JSON_TYPE = "application/json"
UTF8_TYPES = ("application/json", "text/csv")  # the toolkit decodes exactly these content types to str
_HANDLER_ARITY = {"model_fn": 1, "input_fn": 2, "predict_fn": 2, "output_fn": 2, "transform_fn": 4}
_IMPORT_LOCK = threading.Lock()
_CODE_DIRS: set[str] = set()  # every code/ folder this process imported a handler from


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

        self.response_headers: dict[str, str] = {}

    def get_request_header(self, idx: int, key: str) -> str | None:
        return self.request_headers.get(key.lower())

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        """A header of the answer (the model server's Context.set_response_header)."""
        self.response_headers[key] = value


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
    """A handler exception as the answer: 400 ModelError as the toolkit gives; a JSON message {"error", "detail"}
    (training/inference.py's InferenceError) names the error in the body."""
    try:
        named = json.loads(str(exc))
    except ValueError:
        named = None
    if isinstance(named, dict) and isinstance(named.get("error"), str):
        detail = str(named.get("detail", ""))
        return EndpointError(400, "ModelError", f"{named['error']}: {detail}", detail, error=named["error"])
    return EndpointError(400, "ModelError", f"{stage} failed: {type(exc).__name__}: {exc}", str(exc))


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
        requirements = code_dir / "requirements.txt"
        lines = requirements.read_text().splitlines() if requirements.is_file() else []
        wanted = [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]
        if wanted:  # the container pip-installs them; here this Python's packages serve
            LOG.warning("endpoint %s: code/requirements.txt is not installed locally: %s", self.name, ", ".join(wanted))
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
        self, body: bytes, content_type: str | None, accept: str | None, headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> tuple[bytes, str]:
        """Run the handlers on one request body; returns the response body and its content type (and puts the
        headers the handlers set into `response_headers`)."""
        content_type = content_type or JSON_TYPE
        accept = JSON_TYPE if not accept or accept == "*/*" else accept
        context = Context(self.name, str(self.model_dir), headers)
        context.response_headers = response_headers if response_headers is not None else {}
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


def serving_environment(environment: dict[str, str] | None) -> dict[str, str]:
    """A model's container environment as the local endpoint applies it: one model server worker (this process)."""
    return {**(environment or {}), "SAGEMAKER_MODEL_SERVER_WORKERS": "1"}
