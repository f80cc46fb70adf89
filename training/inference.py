"""SageMaker Hugging Face inference-toolkit handler for the sentiment classifier.

Request: JSON ``{"inputs": "text"}`` or ``{"inputs": ["text", ...]}``.
Response: JSON list with one ``{"label": "positive"|"negative", "score": float}`` per input text.
"""

import json

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

MAX_BATCH = 64


def model_fn(model_dir: str) -> tuple:
    """Load the tokenizer and the model saved by train.py."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    model.eval()
    return tokenizer, model


def input_fn(input_data: str | bytes | bytearray, content_type: str) -> list[str]:
    """Parse the request body into a list of texts."""
    if content_type.split(";")[0].strip().lower() != "application/json":
        raise ValueError(f"unsupported content type {content_type!r}: send application/json")
    if isinstance(input_data, (bytes, bytearray)):
        input_data = input_data.decode("utf-8")
    payload = json.loads(input_data)
    texts = payload.get("inputs") if isinstance(payload, dict) else None
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ValueError('expected {"inputs": "text"} or {"inputs": ["text", ...]}')
    return texts


def predict_fn(data: list[str], model: tuple) -> list[dict]:
    """Classify each text; return its most likely label and that label's probability."""
    tokenizer, classifier = model
    max_length = min(tokenizer.model_max_length, classifier.config.max_position_embeddings)
    predictions = []
    for start in range(0, len(data), MAX_BATCH):
        encoded = tokenizer(
            data[start : start + MAX_BATCH],
            truncation=True,
            max_length=max_length,
            padding=True,
            return_tensors="pt",
        )
        with torch.no_grad():
            probs = classifier(**encoded).logits.softmax(-1)
        scores, ids = probs.max(-1)
        labels = [classifier.config.id2label[int(i)] for i in ids]
        predictions += [{"label": label, "score": float(s)} for label, s in zip(labels, scores, strict=True)]
    return predictions


def output_fn(prediction: list[dict], accept: str) -> str:
    """Serialise the predictions as JSON."""
    if accept and accept.split(";")[0].strip().lower() not in ("application/json", "*/*"):
        raise ValueError(f"unsupported accept type {accept!r}: use application/json")
    return json.dumps(prediction)
