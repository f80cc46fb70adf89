"""The endpoint test's labelled rows (steps/deploy/endpoint_check.py reads them), written by the Evaluate step next to
evaluation.json: the evaluation's stratified sample of the test split as text, one JSON object per line
{"text", "label", "prediction"} (plus "text_pair" for a row with a title: "text" is the title, "text_pair" the
content), label and prediction by name (the model's id2label: what the endpoint answers), the prediction being the
evaluation's own (the one its accuracy counts), so that the endpoint's accuracy
on these rows compares with the evaluation's on the very same rows.

The texts are the reviews as they came in: the Tokenize step keeps each test row's title and content beside its
tokens, so the endpoint is sent what a client would send, and encodes it as the Tokenize step did. A split without
them (not written by the Tokenize step) gets no sample, and the endpoint test says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from steps.contract import SAMPLE_FILE, TEXT_COLUMNS


def write(output_dir: str | Path, rows: Any, labels: Sequence[int], predictions: Sequence[int],
          names: Sequence[str]) -> Path | None:
    """OUTPUT/endpoint_sample.jsonl from the sampled rows (a table with the split's `title` and `content`); None
    (nothing written) when the rows have no text."""
    if not set(TEXT_COLUMNS) <= set(rows.column_names):
        print(f"the test split has no {' and '.join(TEXT_COLUMNS)} columns (the Tokenize step writes them): "
              f"{SAMPLE_FILE} not written (the endpoint test will fail)")
        return None
    path = Path(output_dir) / SAMPLE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    titles, contents = (rows[name].to_pylist() for name in TEXT_COLUMNS)
    with path.open("w", encoding="utf-8") as out:
        for title, content, label, prediction in zip(titles, contents, labels, predictions, strict=True):
            text = {"text": title, "text_pair": content} if title is not None else {"text": content}
            out.write(json.dumps({**text, "label": names[int(label)], "prediction": names[int(prediction)]}) + "\n")
    print(f"{SAMPLE_FILE}: {len(titles)} sampled rows for the endpoint test")
    return path
