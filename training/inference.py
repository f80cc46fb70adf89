"""SageMaker inference handler of the sentiment classifier, for the Hugging Face inference container (CPU or GPU), which
(as the local endpoint) calls ``model_fn`` once, then ``input_fn`` -> ``predict_fn`` -> ``output_fn`` per request.

Requests: application/json {"inputs": "text" | [text, ...]} (the Hugging Face convention; "parameters" is accepted
and ignored) or a bare string or list, where a text is a string or a {"text": title, "text_pair": content} pair
(encoded as the Tokenize step encodes training rows: a blank title leaves the content alone; a pair alone is one
input); text/csv, one review per line (RFC 4180 quoting), or the Hugging Face toolkit's CSV (a header naming an
"inputs" column, whose values are the reviews); text/plain, one review. Responses (Accept, UTF-8):
application/json (default), a list of ``{"label": NAME, "score", "probabilities": {NAME: p, ...}}`` in input order
(the model's label names, every class's probability), with ``"top_k": [{"label", "score"}, ...]`` the k likeliest
where the JSON request's parameters ask (``{"inputs": ..., "parameters": {"top_k": k}}``, Hugging Face's name);
application/jsonlines (when it is the only type the Accept header names), the same a line each; text/csv, a header
``label,score,truncated,probability:NAME...`` and a row per text. A text over the maximum length is truncated and
says ``"truncated": true``. Bad input raises ``InferenceError``: message the JSON ``{"error": CODE,
"detail": ...}``, ``status`` the HTTP status (400, 406, 413, 415; the container answers 400 with the message). No
request can break the loaded model.

On a GPU (the inference image's GPU build on an ml.g* / ml.p* instance) the model runs on CUDA in the precision
INFERENCE_GPU_PRECISION names (fp16 where the evaluation found no accuracy loss beyond its tolerance, else fp32),
variant torch-fp16-cuda or torch-fp32-cuda, whatever CPU variant the environment names. On Inferentia2 (the Neuron
build, with INFERENCE_NEURON_BATCH_SIZE, INFERENCE_NEURON_SEQUENCE_LENGTH and INFERENCE_NEURON_CAST set)
optimum-neuron compiles the model with those static shapes when the first model-server worker starts (the others load
its result), variant neuron-bf16 or neuron-fp32. On the CPU, variants, named by the environment the
pipeline registers (the evaluation's choice): INFERENCE_RUNTIME=torch
(default), with INFERENCE_QUANTIZE=int8 its Linear layers dynamically quantized; INFERENCE_RUNTIME=onnxruntime runs
the evaluation's fused graph (onnx/model-{int8,fp32}.onnx) on ONNX Runtime from the image, else from the artifact's
code/packages/ (nothing is downloaded). A variant that cannot run here falls back to torch fp32, in the log.

Speed: the Rust tokenizer encodes without padding; texts sorted by length run in micro-batches padded to their own
longest (one at a time for int8, whose activation scales are per batch, so that an answer never depends on the rest
of its request); intra-op threads = the CPUs divided by the model server's workers. Settings: INFERENCE_MAX_TEXTS
(256), INFERENCE_MAX_LENGTH (the tokenizer's model_max_length, the training length), INFERENCE_MICRO_BATCH (8, 1 for
int8), INFERENCE_THREADS.
"""

import csv
import fcntl
import importlib
import importlib.util
import io
import json
import logging
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

LOG = logging.getLogger(__name__)
MAX_PAYLOAD_BYTES = 6 * 1024 * 1024  # SageMaker real-time inference's request limit
csv.field_size_limit(max(csv.field_size_limit(), MAX_PAYLOAD_BYTES))  # a review may be a whole body (then truncated)
VARIANT_ATTRIBUTE = "inference-variant"  # in an answer's CustomAttributes: the variant that served it
LABELS = ("negative", "positive")
JSON, JSONLINES, CSV, TEXT = "application/json", "application/jsonlines", "text/csv", "text/plain"
JSONLINES_TYPES = (JSONLINES, "application/x-jsonlines", "application/jsonl")
CHARS_PER_TOKEN_CUT = 32  # texts longer than max_length * this many characters are cut between words first
RUNTIMES, QUANTIZATIONS = ("torch", "onnxruntime"), ("none", "int8")
PRECISIONS = ("fp32", "fp16")  # of the torch model (fp16: on a GPU, and in the evaluation's check of it)
NEURON_CASTS = ("bf16", "fp32")
NEURON_DEVICES = Path("/dev")  # where an Inferentia2 instance shows its Neuron devices (neuron0, ...)
# where the first worker of an Inferentia2 instance writes the compiled model for the others
NEURON_COMPILED = Path(os.environ.get("INFERENCE_NEURON_COMPILED_DIR", "/tmp/neuron-compiled"))
PACKAGES_DIR = "code/packages"  # runtimes the image may lack, put there by the evaluation
MICRO_BATCH = {"none": 8, "int8": 1}  # texts per forward pass (int8: one, see above; about 13% less throughput)
# (input_ids, attention_mask | None, token_type_ids | None) -> logits: int64 [rows, width] in, float [rows, labels] out
Forward = Callable[..., np.ndarray]
Text = str | tuple[str, str]  # a review, or a (title, content) pair


def onnx_path(model_dir: str | Path, quantize: str) -> Path:
    """Where the evaluation puts the ONNX graph of a variant: onnx/model-int8.onnx or onnx/model-fp32.onnx."""
    return Path(model_dir) / "onnx" / f"model-{'int8' if quantize == 'int8' else 'fp32'}.onnx"


def _cut(text: str, limit: int) -> str:
    """A text over `limit` characters cut after the last non-alphanumeric character in text[limit // 2 : limit], so
    that no word is split (BERT's pre-tokenizer splits at spaces and punctuation; a longer alphanumeric run is one
    [UNK] for WordPiece either way)."""
    for p in range(limit, limit // 2, -1) if len(text) > limit else ():
        if not text[p - 1].isalnum():
            return text[:p]
    return text[:limit]


class InferenceError(ValueError):
    """A bad request: the message is JSON {"error", "detail"}; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(json.dumps({"error": error, "detail": detail}))
        self.status, self.error, self.detail = status, error, detail


class RuntimeUnavailable(RuntimeError):
    """The asked-for variant cannot run here (no graph file, no runtime that loads it)."""


def _env_int(name: str, default: int, minimum: int = 1) -> int:
    if not (raw := os.environ.get(name, "").strip()):
        return default
    if not raw.isdigit() or int(raw) < minimum:
        raise ValueError(f"{name}={raw!r}: expected an integer >= {minimum}")
    return int(raw)


def _env_choice(name: str, choices: tuple[str, ...]) -> str:
    if (value := os.environ.get(name, "").strip().lower() or choices[0]) not in choices:
        raise ValueError(f"{name}={value!r}: expected {' or '.join(choices)}")
    return value


def quantize_int8(model: Any) -> Any:
    """The torch int8 variant: every Linear layer dynamically quantized (weights int8, activations per batch)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao, and still works
        from torch.ao.quantization import quantize_dynamic
        return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def cpu_threads() -> int:
    """Intra-op threads: INFERENCE_THREADS, else this process's CPUs shared among the model server's workers."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return _env_int("INFERENCE_THREADS", max(1, cpus // _env_int("SAGEMAKER_MODEL_SERVER_WORKERS", 1)))


def import_onnxruntime(model_dir: str | Path) -> Any:
    """onnxruntime from the image, else the copy in the artifact's code/packages/ (appended to sys.path, so that
    nothing the image ships is shadowed)."""
    try:
        return importlib.import_module("onnxruntime")
    except ImportError as missing:
        packages = Path(model_dir) / PACKAGES_DIR
        if not (packages / "onnxruntime").is_dir():
            raise RuntimeUnavailable(f"onnxruntime is not installed and {PACKAGES_DIR}/ has no copy") from missing
    sys.path.append(str(packages))
    importlib.invalidate_caches()
    try:
        return importlib.import_module("onnxruntime")
    except ImportError as e:  # built for another Python or platform than this image's
        sys.path.remove(str(packages))
        raise RuntimeUnavailable(f"the onnxruntime in {PACKAGES_DIR}/ does not load here: {e}") from e


def onnx_forward(path: Path, threads: int, ort: Any) -> tuple[Forward, Any]:
    """An ONNX Runtime CPU session on the graph (`threads` intra-op threads, no inter-op pool, every optimization)
    and its Forward (inputs it lacks are filled in: all-ones mask, zero token types)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    inputs = {i.name: np.int32 if "int32" in i.type else np.int64 for i in session.get_inputs()}

    def forward(ids: np.ndarray, mask: np.ndarray | None, types: np.ndarray | None) -> np.ndarray:
        given = {"input_ids": ids, "attention_mask": np.ones_like(ids) if mask is None else mask,
                 "token_type_ids": np.zeros_like(ids) if types is None else types}
        return session.run(None, {name: given[name].astype(dtype, copy=False) for name, dtype in inputs.items()})[0]

    return forward, session


def torch_forward(model: Any, device: str = "cpu") -> Forward:
    """The Forward of a transformers sequence classifier on `device`, under torch.inference_mode."""
    import torch

    def forward(ids: np.ndarray, mask: np.ndarray | None, types: np.ndarray | None) -> np.ndarray:
        with torch.inference_mode():
            given = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            inputs = {k: torch.from_numpy(v).to(device) for k, v in given.items() if v is not None}
            return model(**inputs).logits.float().cpu().numpy()

    return forward


@dataclass
class Classifier:
    """The loaded variant and what predicting needs."""

    tokenizer: Any  # a tokenizers.Tokenizer, truncating at max_length, never padding
    pair_tokenizer: Any  # the same, cutting only the content of a pair (as the Tokenize step does)
    forward: Forward
    model: Any  # the torch module or the onnxruntime session behind `forward`
    labels: tuple[str, ...]
    max_length: int
    max_texts: int
    micro_batch: int
    pad_id: int
    runtime: str
    quantize: str

    device: str = "cpu"
    precision: str = ""  # fp16, or the Neuron model's cast (bf16, fp32); else fp32 or int8 by `quantize`

    @property
    def variant(self) -> str:  # e.g. onnxruntime-int8, torch-fp32, torch-fp32-cuda, neuron-bf16
        name = f"{self.runtime}-{self.precision or ('int8' if self.quantize == 'int8' else 'fp32')}"
        return f"{name}-{self.device}" if self.device == "cuda" else name

    def _encode(self, text: Text) -> Any:  # a pair is cut in its content, as the Tokenize step does
        if isinstance(text, str):
            return self.tokenizer.encode(text)
        try:
            return self.pair_tokenizer.encode(*text)
        except Exception:  # only_second cannot cut enough
            return self.tokenizer.encode(*text)

    def encode(self, texts: list[Text]) -> list[tuple[list[int], list[int], bool]]:
        """Token ids and token types of each text (truncated to max_length), and whether it was truncated."""
        limit = self.max_length * CHARS_PER_TOKEN_CUT
        # Tokenizing megabytes to keep max_length tokens is waste: cut long texts between words first. Words before
        # the cut tokenize the same, so if the cut text still overflows its first tokens are the full text's.
        result = []
        for text in texts:
            short = _cut(text, limit) if isinstance(text, str) else (_cut(text[0], limit), _cut(text[1], limit))
            enc = self._encode(short)
            enc = enc if short == text or enc.overflowing else self._encode(text)
            result.append((enc.ids, enc.type_ids, bool(enc.overflowing)))
        return result

    def batch(self, rows: list[tuple[list[int], list[int], bool]]) -> tuple[np.ndarray, ...]:
        """Rows padded to the longest: token ids, attention mask and token types (None: all ones, all zeros)."""
        lengths = np.array([len(ids) for ids, _, _ in rows])
        ids = np.full((len(rows), int(lengths.max())), self.pad_id, dtype=np.int64)
        types = np.zeros_like(ids)
        for r, (row, row_types, _) in enumerate(rows):
            ids[r, : len(row)], types[r, : len(row)] = row, row_types
        mask = np.arange(ids.shape[1])[None, :] < lengths[:, None]
        return ids, None if mask.all() else mask.astype(np.int64), types if types.any() else None

    def __call__(self, texts: list[Text], top_k: int | None = None) -> list[dict[str, Any]]:
        """Label and probabilities of each text, in input order (with `top_k`, the k likeliest labels too)."""
        encoded = self.encode(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i][0]))
        results: list[dict[str, Any]] = [{}] * len(texts)
        for start in range(0, len(order), self.micro_batch):
            rows = order[start : start + self.micro_batch]
            logits = self.forward(*self.batch([encoded[i] for i in rows])).astype(np.float64)
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            for r, i in enumerate(rows):
                best = int(probs[r].argmax())
                truncated = {"truncated": True} if encoded[i][2] else {}
                scores = [round(float(p), 6) for p in probs[r]]
                results[i] = {"label": self.labels[best], "score": scores[best],
                              "probabilities": dict(zip(self.labels, scores, strict=True)), **truncated}
                if top_k:
                    likeliest = sorted(range(len(scores)), key=lambda k: -scores[k])[:top_k]
                    results[i]["top_k"] = [{"label": self.labels[k], "score": scores[k]} for k in likeliest]
        return results


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _labels(config: dict[str, Any]) -> tuple[str, ...]:
    id2label = {int(k): str(v) for k, v in (config.get("id2label") or {}).items()}
    names = tuple(id2label.get(i, f"LABEL_{i}") for i in range(max(len(id2label), 2)))
    return LABELS if len(names) == 2 and all(n.startswith("LABEL_") for n in names) else names


def _tokenizer(model_dir: Path, config: dict[str, Any]) -> tuple[Any, int, int]:
    """The fast tokenizer saved with the model (tokenizer.json), its length limit and its padding id."""
    from tokenizers import Tokenizer
    if not (model_dir / "tokenizer.json").is_file():
        raise ValueError(f"{model_dir}: expected a fast tokenizer (tokenizer.json)")
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    settings = _read_json(model_dir / "tokenizer_config.json")
    limit = min(int(settings.get("model_max_length") or 1e9), int(config.get("max_position_embeddings") or 1e9))
    pad = settings.get("pad_token")
    pad_id = tokenizer.token_to_id(str(pad.get("content") if isinstance(pad, dict) else pad))
    return tokenizer, limit, int(pad_id if pad_id is not None else config.get("pad_token_id") or 0)


def _variant(model_dir: Path, runtime: str, quantize: str, threads: int, device: str,
             precision: str = "fp32") -> tuple[Forward, Any]:
    if runtime == "onnxruntime":
        path = onnx_path(model_dir, quantize)
        if not path.is_file():
            raise RuntimeUnavailable(f"the artifact has no {path.relative_to(model_dir)}")
        ort = import_onnxruntime(model_dir)
        try:
            return onnx_forward(path, threads, ort)
        except Exception as e:  # onnxruntime's own error types: a graph this runtime cannot run
            raise RuntimeUnavailable(f"onnxruntime {ort.__version__} cannot load {path.name}: {e}") from e
    import torch
    from transformers import AutoModelForSequenceClassification
    torch.set_num_threads(threads)
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    dtype = torch.float16 if precision == "fp16" else torch.float32
    model = quantize_int8(model) if quantize == "int8" else model.to(torch.device(device), dtype)
    return torch_forward(model, device), model


@dataclass(frozen=True)
class NeuronShapes:
    """The static shapes and cast an Inferentia2 endpoint compiles the model with (the INFERENCE_NEURON_* settings)."""

    batch_size: int
    sequence_length: int
    cast: str

    @classmethod
    def from_env(cls) -> "NeuronShapes | None":
        """The INFERENCE_NEURON_* settings; None when the environment is not an Inferentia2 target's."""
        if not os.environ.get("INFERENCE_NEURON_BATCH_SIZE", "").strip():
            return None
        return cls(_env_int("INFERENCE_NEURON_BATCH_SIZE", 1), _env_int("INFERENCE_NEURON_SEQUENCE_LENGTH", 128, 8),
                   _env_choice("INFERENCE_NEURON_CAST", NEURON_CASTS))


def neuron_available() -> bool:
    """optimum-neuron (the Neuron inference image) and a Neuron device (an Inferentia2 instance)."""
    return (importlib.util.find_spec("optimum") is not None and importlib.util.find_spec("optimum.neuron") is not None
            and any(NEURON_DEVICES.glob("neuron[0-9]*")))


def compile_for_neuron(model_dir: Path, shapes: NeuronShapes) -> Any:
    """The model compiled by optimum-neuron for `shapes`, once per instance: under a file lock, the first model-server
    worker exports it (neuronx-cc) and saves it under NEURON_COMPILED; the others load what it saved. The Hub's
    compile cache is not consulted (an endpoint may have no internet)."""
    from optimum.neuron import NeuronModelForSequenceClassification

    compiled = NEURON_COMPILED / f"batch{shapes.batch_size}-length{shapes.sequence_length}-{shapes.cast}"
    compiled.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{compiled}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (compiled / "config.json").is_file():
            return NeuronModelForSequenceClassification.from_pretrained(str(compiled))
        cast = {"auto_cast": "matmul", "auto_cast_type": "bf16"} if shapes.cast == "bf16" else {"auto_cast": None}
        LOG.info("inference: compiling for Neuron: batch %d, sequence length %d, %s", shapes.batch_size,
                 shapes.sequence_length, shapes.cast)
        model = NeuronModelForSequenceClassification.from_pretrained(
            str(model_dir), export=True, batch_size=shapes.batch_size, sequence_length=shapes.sequence_length,
            disable_neuron_cache=True, **cast)
        partial = compiled.with_name(f"{compiled.name}.partial")
        model.save_pretrained(str(partial))
        partial.rename(compiled)  # whole or absent for the next worker
        return model


def neuron_forward(model: Any, token_types: bool) -> Forward:
    """The Forward of an optimum-neuron classifier, which pads each batch to its compiled shapes and back (all-ones
    mask and, for models with token types, zero types filled in)."""
    import torch

    def forward(ids: np.ndarray, mask: np.ndarray | None, types: np.ndarray | None) -> np.ndarray:
        given = {"input_ids": ids, "attention_mask": np.ones_like(ids) if mask is None else mask,
                 "token_type_ids": (np.zeros_like(ids) if types is None else types) if token_types else None}
        with torch.inference_mode():
            return model(**{k: torch.from_numpy(v) for k, v in given.items() if v is not None}).logits.float().numpy()

    return forward


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def load(model_dir: str | Path, runtime: str = "torch", quantize: str = "none", threads: int | None = None,
         max_length: int | None = None, device: str = "cpu", neuron: NeuronShapes | None = None,
         precision: str = "fp32") -> Classifier:
    """The classifier of model_dir as the `runtime` / `quantize` variant on the CPU, torch in `precision` on `device`
    cuda (fp16 also on the CPU, where the evaluation scores it), or compiled for `neuron`'s shapes on `device` neuron;
    RuntimeUnavailable if it cannot run here."""
    if runtime not in RUNTIMES or quantize not in QUANTIZATIONS or precision not in PRECISIONS:
        raise ValueError(f"unknown variant {runtime}/{quantize}/{precision}: expected a runtime of {RUNTIMES}, of "
                         f"{QUANTIZATIONS}, of {PRECISIONS}")
    if precision == "fp16" and (runtime, quantize) != ("torch", "none") and device == "cpu":
        raise ValueError(f"fp16 is a precision of the torch model, not of {runtime}/{quantize}")
    model_dir = Path(model_dir)
    config = _read_json(model_dir / "config.json")
    tokenizer, limit, pad_id = _tokenizer(model_dir, config)
    max_length = min(neuron.sequence_length if device == "neuron" and neuron else max_length or limit, limit)
    tokenizer.enable_truncation(max_length)
    tokenizer.no_padding()
    pair_tokenizer = type(tokenizer).from_str(tokenizer.to_str())
    pair_tokenizer.enable_truncation(max_length, strategy="only_second")
    max_texts = _env_int("INFERENCE_MAX_TEXTS", 256)
    if device == "neuron" and neuron:  # the compiled shapes: micro-batches of its batch size
        model = compile_for_neuron(model_dir, neuron)
        return Classifier(tokenizer, pair_tokenizer, neuron_forward(model, "type_vocab_size" in config), model,
                          _labels(config), max_length, max_texts, neuron.batch_size, pad_id, "neuron", "none", device,
                          neuron.cast)
    if device != "cpu":  # a GPU: torch in `precision` on it, whatever CPU variant the evaluation chose
        runtime, quantize = "torch", "none"
    forward, model = _variant(model_dir, runtime, quantize, threads or cpu_threads(), device, precision)
    return Classifier(tokenizer, pair_tokenizer, forward, model, _labels(config), max_length, max_texts,
                      _env_int("INFERENCE_MICRO_BATCH", MICRO_BATCH[quantize]), pad_id, runtime, quantize, device,
                      "fp16" if precision == "fp16" else "")


def model_fn(model_dir: str) -> Classifier:
    """Load the variant the environment names (torch fp32 if it cannot run here, saying why), and warm up."""
    runtime = _env_choice("INFERENCE_RUNTIME", RUNTIMES)
    quantize = _env_choice("INFERENCE_QUANTIZE", QUANTIZATIONS)
    max_length = _env_int("INFERENCE_MAX_LENGTH", 0, minimum=8) or None
    neuron = NeuronShapes.from_env()
    # the Neuron build of the image on Inferentia2, the GPU build on a GPU instance
    device = "neuron" if neuron and neuron_available() else "cuda" if cuda_available() else "cpu"
    if neuron and device != "neuron":
        LOG.info("inference: an Inferentia2 target's environment without optimum-neuron and a Neuron device here "
                 "(run --local, or another instance type): serving on the %s", device.upper())
    if device != "cpu" and (runtime, quantize) != ("torch", "none"):
        LOG.info("inference: INFERENCE_RUNTIME=%s INFERENCE_QUANTIZE=%s is the evaluation's CPU variant: serving "
                 "the %s's", runtime, quantize, device)
    precision = _env_choice("INFERENCE_GPU_PRECISION", PRECISIONS) if device == "cuda" else "fp32"
    try:
        classifier = load(model_dir, runtime, quantize, max_length=max_length, device=device, neuron=neuron,
                          precision=precision)
    except RuntimeUnavailable as e:
        LOG.warning("inference: INFERENCE_RUNTIME=%s INFERENCE_QUANTIZE=%s cannot run here (%s): serving torch fp32",
                    runtime, quantize, e)
        classifier = load(model_dir, "torch", "none", max_length=max_length)
    LOG.info("inference: serving %s (%d threads, micro-batches of %d, max length %d)", classifier.variant,
             cpu_threads(), classifier.micro_batch, classifier.max_length)
    classifier(["warm up", "warm up the model with two texts of different lengths"])
    return classifier


def _media_type(value: str | None) -> tuple[str, str | None]:
    """`type/subtype` in lower case and the charset parameter, if any."""
    kind, *params = (value or "").split(";")
    charsets = [p.split("=", 1)[1].strip(' "').lower() for p in params if p.strip().lower().startswith("charset=")]
    return kind.strip().lower(), charsets[0] if charsets else None


def _decode(data: str | bytes | bytearray, charset: str | None) -> str:
    if isinstance(data, str):
        return data
    try:
        return bytes(data).decode(charset or "utf-8")
    except LookupError:
        raise InferenceError(415, "UnsupportedCharset", f"charset {charset!r} is not supported: use utf-8") from None
    except UnicodeDecodeError as e:
        raise InferenceError(400, "InvalidEncoding", f"the body is not valid {charset or 'utf-8'}: {e}") from None


class Texts(list):
    """The texts of a request, and what its parameters ask for (top_k: the k likeliest labels of each)."""

    top_k: int | None = None


def _top_k(parameters: dict[str, Any]) -> int | None:
    top_k = parameters.get("top_k")
    if top_k is not None and not (isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= 1):
        raise InferenceError(400, "InvalidInput", f"parameters.top_k is {json_type(top_k)}: expected a whole number "
                             ">= 1")
    return top_k


def _texts_from_json(body: str) -> Texts:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise InferenceError(400, "MalformedJSON", f"the body is not valid JSON: {str(e)[:200]}") from None
    if isinstance(payload, dict):
        unknown = sorted(set(payload) - {"inputs", "parameters"})
        if "inputs" not in payload or unknown:
            found = f"keys {unknown}" if unknown else "no inputs key"
            raise InferenceError(400, "InvalidInput", f'expected {{"inputs": "text" | [text, ...]}}, found {found}')
        if "parameters" in payload and not isinstance(payload["parameters"], dict):
            raise InferenceError(400, "InvalidInput", "parameters must be a JSON object")
        top_k = _top_k(payload.get("parameters") or {})
        payload = payload["inputs"]
    else:
        top_k = None
    pair = {"text", "text_pair"}
    if isinstance(payload, str) or isinstance(payload, dict) and set(payload) == pair:
        payload = [payload]  # one review, or one pair (as Hugging Face's text-classification pipeline takes it)
    if not isinstance(payload, list):
        raise InferenceError(400, "InvalidInput", f"inputs must be a string or an array, not {json_type(payload)}")
    for i, item in enumerate(payload):
        if not (isinstance(item, str) or isinstance(item, dict) and set(item) == pair
                and all(isinstance(v, str) for v in item.values())):
            raise InferenceError(400, "InvalidInput", f"inputs[{i}] is {json_type(item)}: expected a string "
                                 'or {"text": str, "text_pair": str}')
    texts = Texts(item if isinstance(item, str) else _pair(item["text"], item["text_pair"]) for item in payload)
    texts.top_k = top_k
    return texts


def json_type(value: Any) -> str:
    """How JSON names a parsed value's type, for error messages ("a number", "an object", "null")."""
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
             dict: "an object"}
    return names.get(type(value), type(value).__name__)


def _pair(title: str, content: str) -> Text:
    """A (title, content) pair as the Tokenize step encodes it: without a title (blank), the content alone."""
    return (title, content) if title.strip() else content


def _texts_from_csv(body: str) -> list[str]:
    """One review per record; with the Hugging Face toolkit's header (a field "inputs"), that column's values."""
    try:
        rows = [row for row in csv.reader(io.StringIO(body, newline=""), strict=True) if row]
    except csv.Error as e:  # an unmatched quote
        raise InferenceError(400, "MalformedCSV", f"the body is not valid CSV: {e}") from None
    header = [name.strip().lower() for name in rows[0]] if rows else []
    if "inputs" in header and len(header) > 1:
        if any(len(row) != len(header) for row in rows[1:]):
            raise InferenceError(400, "MalformedCSV", f"every row needs the header's {len(header)} fields (an "
                                 "unquoted comma splits a review: quote it)")
        return [row[header.index("inputs")] for row in rows[1:]]
    rows = rows[1:] if header == ["inputs"] else rows
    return [",".join(row) for row in rows]  # unquoted commas split a review: join it back


def input_fn(input_data: str | bytes | bytearray, content_type: str) -> Texts:
    """Parse and check a request body; returns the texts to classify (and what the request asks of the answers) or
    raises InferenceError."""
    if len(input_data) > MAX_PAYLOAD_BYTES:
        raise InferenceError(
            413, "PayloadTooLarge", f"the body has {len(input_data)} bytes, over the {MAX_PAYLOAD_BYTES} bytes limit"
        )
    kind, charset = _media_type(content_type or JSON)
    if kind == JSON:
        texts = _texts_from_json(_decode(input_data, charset))
    elif kind == CSV:
        texts = Texts(_texts_from_csv(_decode(input_data, charset)))
    elif kind == TEXT:
        texts = Texts([_decode(input_data, charset)])
    else:
        raise InferenceError(415, "UnsupportedContentType", f"content type {kind!r}: use {JSON}, {CSV} or {TEXT}")
    if not texts:
        raise InferenceError(400, "EmptyInput", "no texts to classify")
    for i, text in enumerate(texts):
        if not "".join((text,) if isinstance(text, str) else text).strip():
            raise InferenceError(400, "EmptyInput", f"text {i} is empty")
    for i, part in ((i, p) for i, t in enumerate(texts) for p in ((t,) if isinstance(t, str) else t)):
        try:
            part.encode("utf-8")
        except UnicodeEncodeError:
            raise InferenceError(400, "InvalidInput", f"text {i} holds a lone surrogate, not valid Unicode") from None
    return texts


def predict_fn(data: list[Text], model: Classifier, context: Any = None) -> list[dict[str, Any]]:
    """One {"label", "score", "probabilities"} (and "top_k" where asked, "truncated": true when cut) per text, in
    order; over INFERENCE_MAX_TEXTS: 413.
    The model server's `context` gets the variant: the response's CustomAttributes `inference-variant=<variant>`."""
    if len(data) > model.max_texts:
        raise InferenceError(413, "TooManyTexts", f"{len(data)} texts in one request, the limit is {model.max_texts}")
    if context is not None:
        context.set_response_header(0, "X-Amzn-SageMaker-Custom-Attributes", f"{VARIANT_ATTRIBUTE}={model.variant}")
    return model(data, getattr(data, "top_k", None))


def _csv(prediction: list[dict[str, Any]]) -> str:
    names = list(prediction[0]["probabilities"]) if prediction else []
    out = io.StringIO(newline="")
    rows = csv.writer(out, lineterminator="\n")
    rows.writerow(["label", "score", "truncated", *(f"probability:{name}" for name in names)])
    for p in prediction:
        rows.writerow([p["label"], p["score"], str(bool(p.get("truncated"))).lower(),
                       *(p["probabilities"][name] for name in names)])
    return out.getvalue()


def output_fn(prediction: list[dict[str, Any]], accept: str) -> str:
    """Serialise as a JSON list, or JSON Lines or CSV when the Accept header names that type alone (the container
    sends the Accept header back as the response's Content-Type, so a list or a wildcard answers JSON)."""
    offered = [_media_type(part) for part in (accept or JSON).split(",")]
    offered = [kind for kind, charset in offered if charset in (None, "utf-8", "utf8")]  # the answer is UTF-8
    if len(offered) == 1 and offered[0] in JSONLINES_TYPES:
        return "".join(json.dumps(p) + "\n" for p in prediction)
    if offered == [CSV]:
        return _csv(prediction)
    if any(kind in (JSON, "*/*", "application/*", "", *JSONLINES_TYPES) for kind in offered):
        return json.dumps(prediction)
    raise InferenceError(406, "UnsupportedAccept", f"accept {accept!r}: use {JSON}, {JSONLINES} or {CSV} (UTF-8)")
