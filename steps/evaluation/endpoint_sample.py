"""The endpoint test's labelled rows (steps/endpoint_check.py reads them), written by the Evaluate step next to
evaluation.json: the evaluation's stratified sample of the test split as text, one JSON object per line
{"text", "label", "prediction"} (plus "text_pair" for a row with a title: "text" is the title, "text_pair" the
content), the prediction being the evaluation's own (the one its accuracy counts), so that the endpoint's accuracy
on these rows compares with the evaluation's on the very same rows.

The split holds token ids only: each row is decoded with the model's own tokenizer ([CLS], [SEP] and padding dropped),
a pair in its two parts (token type 0, token type 1), and kept only if its text encodes back to exactly its tokens,
so that the endpoint is tested on the very input the evaluation scored. Without a tokenizer in the artifact no sample
is written, and the endpoint test says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAMPLE_FILE = "endpoint_sample.jsonl"


@dataclass
class Codec:
    """Token ids -> text and text -> token ids with the tokenizer saved with the model."""

    tokenizer: Any

    def decode(self, ids: Sequence[int]) -> str:
        """The text of a segment: [CLS], [SEP] and padding dropped, [UNK] kept (it encodes back to itself)."""
        t = self.tokenizer
        ids = [i for i in ids if i not in {t.cls_token_id, t.sep_token_id, t.pad_token_id}]
        return " ".join(t.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=True).split())

    def encodes_back(self, text: str, pair: str | None, ids: Sequence[int]) -> bool:
        """Whether the endpoint, encoding text (and pair) as the Tokenize step did, gets exactly `ids`."""
        return self.tokenizer(text, pair)["input_ids"] == list(ids)


def codec(model_folder: Path) -> Codec | None:
    """The Codec of the tokenizer saved with the model; None when the artifact has none."""
    from transformers import AutoTokenizer

    try:
        return Codec(AutoTokenizer.from_pretrained(str(model_folder)))
    except (OSError, ValueError):
        return None


def write(output_dir: str | Path, model_folder: Path, rows: Any, labels: Sequence[int],
          predictions: Sequence[int]) -> Path | None:
    """OUTPUT/endpoint_sample.jsonl from the sampled rows (a table with the split's `input_ids` and
    `token_type_ids`), decoded with the tokenizer in `model_folder`; None (nothing written) when it has none. A row
    whose text does not encode back to its tokens is left out (and counted in the log): the endpoint would be tested
    on another input than the evaluation scored."""
    tokens = codec(model_folder)
    if tokens is None:
        print(f"no tokenizer in the model artifact: {SAMPLE_FILE} not written (the endpoint test will fail)")
        return None
    path = Path(output_dir) / SAMPLE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    written = left_out = 0
    with path.open("w", encoding="utf-8") as out:
        for ids, types, label, prediction in zip(rows["input_ids"].to_pylist(), rows["token_type_ids"].to_pylist(),
                                                 labels, predictions, strict=True):
            text = tokens.decode([i for i, t in zip(ids, types, strict=True) if t == 0])
            pair = tokens.decode([i for i, t in zip(ids, types, strict=True) if t == 1]) if any(types) else None
            if not tokens.encodes_back(text, pair, ids):
                left_out += 1
                continue
            row = {"text": text, **({"text_pair": pair} if pair is not None else {})}
            out.write(json.dumps({**row, "label": int(label), "prediction": int(prediction)}) + "\n")
            written += 1
    print(f"{SAMPLE_FILE}: {written} of {written + left_out} sampled rows for the endpoint test"
          + (f" ({left_out} left out: their text does not encode back to their tokens)" if left_out else ""))
    return path
