"""Input readers of the tokenize step: every source as chunks of (standardized table, malformed rows).

Sources (--source):
  sample | sample:N   deterministic synthetic reviews (N train rows, N/10 test rows), see reviews.py
  s3://...            files the platform staged into --input-dir
  a local folder      CSV / Parquet / JSON Lines files (optionally .gz) under it
  anything else       a Hub dataset name for datasets.load_dataset (splits train/test)
A file belongs to the train split if its path names "train", to the test split if it names "test" (the file
name is checked first, then its folders, deepest first). Each file needs a label column and a content column
("content", "text" or "review"); a title column ("title" or "summary") is optional. CSV files need a header.
A standardized table has the string columns label / title / content (title may be all null); `validate` keeps
its valid rows and counts the others per drop reason (see preprocess.py).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import reviews

log = logging.getLogger("preprocess")

LABEL_COLUMNS = ("label",)
CONTENT_COLUMNS = ("content", "text", "review")
TITLE_COLUMNS = ("title", "summary")
CHUNK_ROWS = 8192  # rows per read / tokenize batch
DATA_SUFFIXES = (".csv", ".parquet", ".pq", ".jsonl", ".json", ".ndjson")
DEFAULT_SAMPLE_ROWS = 20_000


class StepError(Exception):
    """A problem with the input or the arguments, reported as one clear line."""


def sample_chunks(split: str, rows: int, seed: int) -> Iterator[tuple[pa.Table, int]]:
    """Deterministic synthetic reviews with exactly balanced labels (within each pair of rows)."""
    generated = reviews.sample_reviews(split, rows, seed)
    while chunk := list(islice(generated, CHUNK_ROWS)):
        labels, titles, contents = (list(column) for column in zip(*chunk, strict=True))
        yield pa.table({"label": pa.array(labels, pa.int64()), "title": titles, "content": contents}), 0


def _pick(names: list[str], candidates: tuple[str, ...]) -> str | None:
    lower = {n.lower(): n for n in names}
    return next((lower[c] for c in candidates if c in lower), None)


def standardize(table: pa.Table, where: str) -> pa.Table:
    """Rename the source columns to label/title/content (title may be all null); raise if one is missing."""
    names = table.column_names
    label, content, title = (_pick(names, LABEL_COLUMNS), _pick(names, CONTENT_COLUMNS),
                             _pick(names, TITLE_COLUMNS))
    if label is None or content is None:
        raise StepError(f"{where}: needs a label column ({'/'.join(LABEL_COLUMNS)}) and a content column "
                        f"({'/'.join(CONTENT_COLUMNS)}); found columns {names}")
    columns = {"label": table[label]}
    for name, src in (("title", title), ("content", content)):
        col = table[src] if src is not None else pa.nulls(len(table), pa.string())
        if not pa.types.is_string(col.type) and not pa.types.is_large_string(col.type):
            try:
                col = pc.cast(col, pa.string())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise StepError(f"{where}: column {src!r} of type {col.type} is not text: {e}") from e
        columns[name] = col
    return pa.table(columns)


def _csv_chunks(path: Path) -> Iterator[tuple[pa.Table, int]]:
    malformed = [0]

    def skip(row: Any) -> str:
        malformed[0] += 1
        return "skip"

    text_types = {variant: pa.string() for c in LABEL_COLUMNS + CONTENT_COLUMNS + TITLE_COLUMNS
                  for variant in (c, c.title(), c.upper())}  # read as text: type inference is per block
    reader = pacsv.open_csv(
        pa.input_stream(str(path), compression="detect"),
        read_options=pacsv.ReadOptions(block_size=4 << 20),
        parse_options=pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=skip),
        convert_options=pacsv.ConvertOptions(column_types=text_types, strings_can_be_null=True,
                                             null_values=[""], quoted_strings_can_be_null=False))
    for batch in reader:
        n, malformed[0] = malformed[0], 0
        yield pa.Table.from_batches([batch]), n
    if malformed[0]:
        yield pa.Table.from_batches([], reader.schema), malformed[0]


def _parquet_chunks(path: Path) -> Iterator[tuple[pa.Table, int]]:
    for batch in pq.ParquetFile(path).iter_batches(batch_size=CHUNK_ROWS):
        yield pa.Table.from_batches([batch]), 0


def _jsonl_chunks(path: Path) -> Iterator[tuple[pa.Table, int]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        head = f.read(1 << 16).lstrip()
        f.seek(0)
        if head.startswith("["):  # a JSON array rather than JSON Lines
            rows = json.load(f)
            for start in range(0, len(rows), CHUNK_ROWS):
                yield _rows_table(rows[start:start + CHUNK_ROWS]), 0
            return
        rows, bad = [], 0
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                bad += 1
            if len(rows) == CHUNK_ROWS:
                yield _rows_table(rows), bad
                rows, bad = [], 0
        if rows or bad:
            yield _rows_table(rows), bad


def _rows_table(rows: list[dict]) -> pa.Table:
    """Rows of JSON objects as a table of label (Python objects as text) / title / content columns."""
    names = sorted({k for row in rows for k in row})
    columns = {}
    for name in names:
        values = [row.get(name) for row in rows]
        if name.lower() in LABEL_COLUMNS:
            values = [None if v is None else str(int(v)) if isinstance(v, bool) else str(v) for v in values]
        else:
            values = [v if v is None or isinstance(v, str) else json.dumps(v) for v in values]
        columns[name] = pa.array(values, pa.string())
    return pa.table(columns) if columns else pa.table({"label": pa.array([], pa.string())})


def file_chunks(path: Path) -> Iterator[tuple[pa.Table | None, int]]:
    """Chunks of one data file as standardized tables (None if no row parsed), with their malformed rows."""
    name = path.name.lower().removesuffix(".gz")
    reader: Callable[[Path], Iterator[tuple[pa.Table, int]]]
    if name.endswith(".csv"):
        reader = _csv_chunks
    elif name.endswith((".parquet", ".pq")):
        reader = _parquet_chunks
    else:
        reader = _jsonl_chunks
    try:
        for table, malformed in reader(path):
            yield (standardize(table, str(path)) if len(table) else None), malformed
    except StepError:
        raise
    except (OSError, ValueError, UnicodeDecodeError, pa.ArrowException) as e:
        raise StepError(f"cannot read {path}: {type(e).__name__}: {e}") from e


def split_of(path: Path, root: Path) -> str | None:
    """train / test from the file name, then from its folders (deepest first); None if neither or both."""
    for part in reversed(path.relative_to(root).parts):
        part = part.lower()
        has_train, has_test = "train" in part, "test" in part
        if has_train != has_test:
            return "train" if has_train else "test"
    return None


def find_files(root: Path) -> dict[str, list[Path]]:
    """Data files under root, grouped by split; files of no split are listed in a warning."""
    if not root.is_dir():
        raise StepError(f"input folder {root} does not exist")
    found: dict[str, list[Path]] = {"train": [], "test": []}
    skipped = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        name = path.name.lower().removesuffix(".gz")
        if path.name.startswith((".", "_")) or not name.endswith(DATA_SUFFIXES):
            continue
        split = split_of(path, root)
        (found[split] if split else skipped).append(path)
    if skipped:
        log.warning("ignoring %d data files that name neither train nor test: %s", len(skipped),
                    ", ".join(str(p) for p in skipped[:5]))
    for split, paths in found.items():
        if not paths:
            raise StepError(f"no {split} files under {root} (CSV / Parquet / JSON Lines files whose path "
                            f"contains '{split}'); found {len(skipped)} other data files")
    return found


def hub_chunks(name: str, split: str) -> Iterator[tuple[pa.Table, int]]:
    """Chunks of a Hub dataset split (the dataset is downloaded to the Arrow cache, then read in chunks)."""
    import datasets

    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # the Hub raises many kinds: report them all the same way
        raise StepError(f"cannot load split {split!r} of Hub dataset {name!r}: {type(e).__name__}: {e}") \
            from e
    for start in range(0, len(ds), CHUNK_ROWS):
        table = ds.data.slice(start, CHUNK_ROWS)
        table = getattr(table, "table", table)  # datasets wraps pyarrow tables
        yield standardize(table, f"{name}[{split}]"), 0


def source_chunks(args: argparse.Namespace) -> dict[str, Iterator[tuple[pa.Table | None, int]]]:
    """For train and test: an iterator of (standardized table, malformed rows) chunks."""
    source = args.source
    if source == "sample" or source.startswith("sample:"):
        try:
            rows = int(source.partition(":")[2] or DEFAULT_SAMPLE_ROWS)
        except ValueError:
            raise StepError(f"--source {source}: expected sample or sample:N with N an integer") from None
        if rows < 1:
            raise StepError(f"--source {source}: N must be at least 1")
        return {"train": sample_chunks("train", rows, args.seed),
                "test": sample_chunks("test", max(1, rows // 10), args.seed)}
    if source.startswith("s3://") or Path(source).exists():
        root = Path(args.input_dir) if source.startswith("s3://") else Path(source)
        files = find_files(root)
        log.info("reading %s: %s", root, {k: [str(p.relative_to(root)) for p in v] for k, v in files.items()})
        return {split: (c for p in paths for c in file_chunks(p)) for split, paths in files.items()}
    return {split: hub_chunks(source, split) for split in ("train", "test")}


def limit_rows(chunks: Iterator[tuple[pa.Table | None, int]], limit: int | None) -> Iterator[tuple[Any, int]]:
    """Stop after `limit` input rows (malformed rows count too)."""
    seen = 0
    for table, malformed in chunks:
        if limit is not None:
            malformed = min(malformed, limit - seen)
            if table is not None:
                table = table.slice(0, max(0, limit - seen - malformed))
        seen += malformed + (len(table) if table is not None else 0)
        yield table, malformed
        if limit is not None and seen >= limit:
            return


def validate(table: pa.Table) -> tuple[pa.Table, np.ndarray, dict[str, int]]:
    """Keep rows with a 0/1 label and some text: return them (label int8), their row indices in the
    chunk and the drop count per reason."""
    label = table["label"]
    if pa.types.is_boolean(label.type):
        label = pc.cast(label, pa.int8())
    if pa.types.is_integer(label.type) or pa.types.is_floating(label.type):
        value = pc.cast(label, pa.float64())
        is_pos, is_neg = pc.equal(value, 1.0), pc.equal(value, 0.0)
    else:
        text = pc.utf8_lower(pc.utf8_trim_whitespace(pc.cast(label, pa.string())))
        is_pos = pc.is_in(text, value_set=pa.array(["1", "1.0", "positive"]))
        is_neg = pc.is_in(text, value_set=pa.array(["0", "0.0", "negative"]))
    bad_label = pc.invert(pc.fill_null(pc.or_(is_pos, is_neg), False))
    missing = pc.is_null(table["content"])
    title = pc.fill_null(table["title"], "")
    has_title = pc.not_equal(pc.utf8_trim_whitespace(title), "")
    empty = pc.and_(pc.invert(has_title),
                    pc.equal(pc.utf8_trim_whitespace(pc.fill_null(table["content"], "")), ""))
    bad_label, missing, empty = (np.asarray(a.to_numpy(zero_copy_only=False), bool)
                                 for a in (bad_label, missing, empty))
    counts = {"invalid_label": int(bad_label.sum()),
              "missing_content": int((missing & ~bad_label).sum()),
              "empty_text": int((empty & ~missing & ~bad_label).sum())}
    keep_mask = ~(bad_label | missing | empty)
    keep = pa.array(keep_mask)
    kept = pa.table({
        "label": pc.cast(pc.fill_null(pc.filter(is_pos, keep), False), pa.int8()),
        "title": pc.filter(pc.if_else(has_title, title, pa.scalar(None, pa.string())), keep),
        "content": pc.filter(table["content"], keep),
    })
    return kept, np.flatnonzero(keep_mask), counts
