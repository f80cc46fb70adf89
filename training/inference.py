"""SageMaker inference handler of the sentiment classifier, for the Hugging Face CPU inference container.

The training job ships this file as ``code/inference.py`` in model.tar.gz; the container (and the project's local
endpoint) call ``model_fn`` once, then ``input_fn`` -> ``predict_fn`` -> ``output_fn`` per request.

Requests (Content-Type):
    application/json   {"inputs": "text"}, {"inputs": ["text", ...]} (the Hugging Face convention; an optional
                       "parameters" object is accepted and ignored), or a bare JSON string or list of strings
    text/csv           one review per line (RFC 4180 quoting for reviews holding newlines or quotes)
    text/plain         the whole body is one review
Responses (Accept): application/json (default) is a list with one ``{"label": "positive"|"negative", "score": p}``
per input, in input order; application/jsonlines gives one such object per line. An input longer than the model's
maximum length is truncated to it (not an error) and its object says ``"truncated": true``.

Bad input raises ``InferenceError``: its message is the JSON ``{"error": CODE, "detail": ...}`` and its ``status``
the HTTP status (400, 406, 413, 415). The container answers any handler exception with 400 and the message; the
local endpoint uses ``status``. Nothing about a request can break the loaded model.

Speed: texts are tokenized without padding, sorted by length and run in micro-batches padded only to their own
longest text, under ``torch.inference_mode`` with intra-op threads set to the instance's CPUs divided by the model
server's workers. With ``INFERENCE_QUANTIZE=int8`` the Linear layers run as int8 (dynamic quantization); the
pipeline sets it only when the evaluation measured int8 within tolerance of fp32 on the test split.

Environment: INFERENCE_QUANTIZE (int8 | none, default none), INFERENCE_MAX_TEXTS (default 256),
INFERENCE_MAX_LENGTH (default the tokenizer's model_max_length, which train.py sets to the training length),
INFERENCE_MICRO_BATCH (default 8), INFERENCE_THREADS (default CPUs / SAGEMAKER_MODEL_SERVER_WORKERS).
"""

import csv
import io
import json
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

MAX_PAYLOAD_BYTES = 6 * 1024 * 1024  # SageMaker real-time inference's request limit
LABELS = ("negative", "positive")
JSON, JSONLINES, CSV, TEXT = "application/json", "application/jsonlines", "text/csv", "text/plain"
CHARS_PER_TOKEN_CUT = 32  # texts longer than max_length * this many characters are cut between words first


def _cut_point(text: str, limit: int) -> int:
    """Where to cut a long text: after the last non-alphanumeric character in text[limit // 2 : limit], so that no
    word is split (BERT's pre-tokenizer splits at spaces and punctuation); a longer alphanumeric run is one [UNK]
    for WordPiece either way."""
    for p in range(limit, limit // 2, -1):
        if not text[p - 1].isalnum():
            return p
    return limit


class InferenceError(ValueError):
    """A bad request: the message is JSON {"error", "detail"}; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(json.dumps({"error": error, "detail": detail}))
        self.status, self.error, self.detail = status, error, detail


def _env_int(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < minimum:
        raise ValueError(f"{name}={raw!r}: expected an integer >= {minimum}")
    return int(raw)


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """The int8 variant: every Linear layer dynamically quantized (weights int8, activations quantized per batch)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao, and still works
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def cpu_threads() -> int:
    """Intra-op threads: INFERENCE_THREADS, else this process's CPUs shared among the model server's workers."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return _env_int("INFERENCE_THREADS", max(1, cpus // _env_int("SAGEMAKER_MODEL_SERVER_WORKERS", 1)))


@dataclass
class Classifier:
    """The loaded model and what predicting needs."""

    tokenizer: Any  # a transformers fast tokenizer
    model: torch.nn.Module
    labels: tuple[str, ...]
    max_length: int
    max_texts: int
    micro_batch: int
    pad_id: int
    quantized: bool

    def encode(self, texts: list[str]) -> list[tuple[list[int], bool]]:
        """Token ids of each text (truncated to max_length) and whether it was truncated."""
        backend = self.tokenizer.backend_tokenizer
        limit = self.max_length * CHARS_PER_TOKEN_CUT
        # Tokenizing megabytes to keep max_length tokens is waste: cut long texts between words first. Words before
        # the cut tokenize the same, so if the cut text still overflows its first tokens are the full text's.
        cut = [t if len(t) <= limit else t[: _cut_point(t, limit)] for t in texts]
        encodings = backend.encode_batch(cut)
        result = []
        for text, short, enc in zip(texts, cut, encodings, strict=True):
            if len(short) < len(text) and not enc.overflowing:
                enc = backend.encode(text)
            result.append((enc.ids, bool(enc.overflowing)))
        return result

    def __call__(self, texts: list[str]) -> list[dict[str, Any]]:
        """Label and probability of each text, in input order."""
        encoded = self.encode(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i][0]))
        results: list[dict[str, Any]] = [{}] * len(texts)
        with torch.inference_mode():
            for start in range(0, len(order), self.micro_batch):
                rows = order[start : start + self.micro_batch]
                lengths = [len(encoded[i][0]) for i in rows]
                width = lengths[-1]
                ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
                for r, i in enumerate(rows):
                    ids[r, : lengths[r]] = torch.tensor(encoded[i][0], dtype=torch.long)
                mask = None  # no padding in this micro-batch: no mask to build or apply
                if lengths[0] != width:
                    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
                probs = self.model(input_ids=ids, attention_mask=mask).logits.float().softmax(-1)
                scores, best = probs.max(-1)
                for r, i in enumerate(rows):
                    result = {"label": self.labels[int(best[r])], "score": round(float(scores[r]), 6)}
                    if encoded[i][1]:
                        result["truncated"] = True
                    results[i] = result
        return results


def _labels(config: Any) -> tuple[str, ...]:
    names = tuple(str(config.id2label[i]) for i in range(config.num_labels))
    return LABELS if config.num_labels == 2 and all(n.startswith("LABEL_") for n in names) else names


def model_fn(model_dir: str) -> Classifier:
    """Load the tokenizer and model saved by train.py, set threads, quantize if asked, and warm up."""
    quantize = os.environ.get("INFERENCE_QUANTIZE", "none").strip().lower() or "none"
    if quantize not in ("int8", "none"):
        raise ValueError(f"INFERENCE_QUANTIZE={quantize!r}: expected int8 or none")
    torch.set_num_threads(cpu_threads())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{model_dir}: expected a fast tokenizer (tokenizer.json)")
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    limit = min(tokenizer.model_max_length, model.config.max_position_embeddings)
    max_length = min(_env_int("INFERENCE_MAX_LENGTH", limit, minimum=8), limit)
    tokenizer.backend_tokenizer.enable_truncation(max_length)
    tokenizer.backend_tokenizer.no_padding()
    if quantize == "int8":
        model = quantize_int8(model)
    classifier = Classifier(
        tokenizer=tokenizer,
        model=model,
        labels=_labels(model.config),
        max_length=max_length,
        max_texts=_env_int("INFERENCE_MAX_TEXTS", 256),
        micro_batch=_env_int("INFERENCE_MICRO_BATCH", 8),
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        quantized=quantize == "int8",
    )
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


def _texts_from_json(body: str) -> list[str]:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise InferenceError(400, "MalformedJSON", f"the body is not valid JSON: {str(e)[:200]}") from None
    if isinstance(payload, dict):
        unknown = sorted(set(payload) - {"inputs", "parameters"})
        if "inputs" not in payload or unknown:
            found = f"keys {unknown}" if unknown else "no inputs key"
            raise InferenceError(400, "InvalidInput", f'expected {{"inputs": "text" | ["text", ...]}}, found {found}')
        if "parameters" in payload and not isinstance(payload["parameters"], dict):
            raise InferenceError(400, "InvalidInput", "parameters must be a JSON object")
        payload = payload["inputs"]
    if isinstance(payload, str):
        return [payload]
    if not isinstance(payload, list):
        raise InferenceError(
            400, "InvalidInput", f"inputs must be a string or a list of strings, not {type(payload).__name__}"
        )
    for i, item in enumerate(payload):
        if not isinstance(item, str):
            raise InferenceError(400, "InvalidInput", f"inputs[{i}] is a {type(item).__name__}, expected a string")
    return payload


def _texts_from_csv(body: str) -> list[str]:
    try:
        rows = list(csv.reader(io.StringIO(body, newline="")))
    except csv.Error as e:
        raise InferenceError(400, "MalformedCSV", f"the body is not valid CSV: {e}") from None
    return [",".join(row) for row in rows if row]  # unquoted commas split a review: join it back


def input_fn(input_data: str | bytes | bytearray, content_type: str) -> list[str]:
    """Parse and check a request body; returns the texts to classify or raises InferenceError."""
    if len(input_data) > MAX_PAYLOAD_BYTES:
        raise InferenceError(
            413, "PayloadTooLarge", f"the body has {len(input_data)} bytes, over the {MAX_PAYLOAD_BYTES} bytes limit"
        )
    kind, charset = _media_type(content_type or JSON)
    if kind == JSON:
        texts = _texts_from_json(_decode(input_data, charset))
    elif kind == CSV:
        texts = _texts_from_csv(_decode(input_data, charset))
    elif kind == TEXT:
        texts = [_decode(input_data, charset)]
    else:
        raise InferenceError(415, "UnsupportedContentType", f"content type {kind!r}: use {JSON}, {CSV} or {TEXT}")
    if not texts:
        raise InferenceError(400, "EmptyInput", "no texts to classify")
    for i, text in enumerate(texts):
        if not text.strip():
            raise InferenceError(400, "EmptyInput", f"text {i} is empty")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InferenceError(400, "InvalidInput", f"text {i} holds a lone surrogate, not valid Unicode") from None
    return texts


def predict_fn(data: list[str], model: Classifier) -> list[dict[str, Any]]:
    """Classify the texts; one {"label", "score"} (plus "truncated": true when cut) per text, in order. More than
    INFERENCE_MAX_TEXTS texts is a 413."""
    if len(data) > model.max_texts:
        raise InferenceError(413, "TooManyTexts", f"{len(data)} texts in one request, the limit is {model.max_texts}")
    return model(data)


def output_fn(prediction: list[dict[str, Any]], accept: str) -> str:
    """Serialise as a JSON list, or JSON Lines when the Accept header asks for application/jsonlines."""
    offered = [_media_type(part)[0] for part in (accept or JSON).split(",")]
    for kind in offered:
        if kind in (JSON, "*/*", "application/*", ""):
            return json.dumps(prediction)
        if kind in (JSONLINES, "application/x-jsonlines", "application/jsonl"):
            return "".join(json.dumps(p) + "\n" for p in prediction)
    raise InferenceError(406, "UnsupportedAccept", f"accept {accept!r}: use {JSON} or {JSONLINES}")
