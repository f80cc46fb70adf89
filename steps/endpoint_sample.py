"""The endpoint test's labelled rows (steps/endpoint_check.py reads them), written by the Evaluate step next to
evaluation.json: the evaluation's stratified sample of the test split as text, one JSON object per line
{"text", "label", "prediction"} (plus "text_pair" for a row with a title: "text" is the title, "text_pair" the
content), the prediction being the evaluation's own (the one its accuracy counts), so that the endpoint's accuracy
on these rows compares with the evaluation's on the very same rows.

The split holds token ids only: each row is decoded with the model's own tokenizer (special tokens dropped), a pair
in its two parts (token type 0, token type 1), so that the endpoint encodes it as the Tokenize step did. Without a
tokenizer in the artifact no sample is written, and the endpoint test says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SAMPLE_FILE = "endpoint_sample.jsonl"
Decoder = Callable[[Sequence[int]], str]


def decoder(model_folder: Path) -> Decoder | None:
    """Token ids -> text with the tokenizer saved with the model; None when the artifact has no tokenizer."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_folder))
    except (OSError, ValueError):
        return None
    return lambda ids: " ".join(tokenizer.decode(list(ids), skip_special_tokens=True,
                                                 clean_up_tokenization_spaces=True).split())


def write(output_dir: str | Path, model_folder: Path, rows: Any, labels: Sequence[int],
          predictions: Sequence[int]) -> Path | None:
    """OUTPUT/endpoint_sample.jsonl from the sampled rows (a table with the split's `input_ids`), decoded with the
    tokenizer in `model_folder`; None (nothing written) when it has none."""
    decode = decoder(model_folder)
    if decode is None:
        print(f"no tokenizer in the model artifact: {SAMPLE_FILE} not written (the endpoint test will fail)")
        return None
    path = Path(output_dir) / SAMPLE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for ids, types, label, prediction in zip(rows["input_ids"].to_pylist(), rows["token_type_ids"].to_pylist(),
                                                 labels, predictions, strict=True):
            text = {"text": decode([i for i, t in zip(ids, types, strict=True) if t == 0])}
            if any(types):
                text["text_pair"] = decode([i for i, t in zip(ids, types, strict=True) if t == 1])
            out.write(json.dumps({**text, "label": int(label), "prediction": int(prediction)}) + "\n")
    return path
