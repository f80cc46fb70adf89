"""Input readers of the tokenize step: every source as chunks of (standardized table, rows dropped while reading).

Sources (--source):
  sample | sample:N[:K]  deterministic synthetic reviews (N train rows, N/10 test rows; K classes), see reviews.py
  s3://...            files the platform staged into --input-dir
  a local folder      CSV / Parquet / JSON Lines / Arrow files (optionally .gz) under it, written as a path
                      (/data, ./data, ~/data: steps.contract.source_kind); a save_to_disk folder is one too
  NAME | OWNER/NAME   a Hub dataset for datasets.load_dataset (splits train/test)
A file belongs to the train split if its name has the word "train" or "training", to the test split if it has
"test", "testing", "eval" or "evaluation" (words between "-", "_", ".", spaces and digits, as Hugging Face datasets
finds splits: train-00000-of-00002.parquet is train, latest.csv is neither), else by its folders, deepest first;
files and folders whose name starts with "." or "_" are not data (_SUCCESS, _temporary/, .ipynb_checkpoints/,
_delta_log/), nor is save_to_disk's metadata (state.json...) beside its .arrow files. Each file needs the label column
and the (last) text column that the config names (`Columns`: data.label_column, data.text_columns); the first of two
text columns is optional. The default names also find their historical spellings: "polarity" for "label" (the
original release's coding: 1 negative, 2 positive), "text" or "review" for "content", "summary" for "title". A label
is one of the label names (data.labels, case and surrounding spaces ignored) or, where no name is a number, its index
(0, 1, ...; with two names also false / true); without data.labels the names are the train split's values, sorted
(as numbers where all are). CSV files need a header, except
the original release's train.csv / test.csv (polarity, title, text without one: a file whose first record is three
fields, the first 1 or 2, and no known column name); quoted fields may hold line breaks; LF, CRLF and a UTF-8 BOM
are fine.
Files are streamed, never loaded whole (except a .json file that holds one JSON array, and a gzipped Arrow file).

Rows in = physical records of the file. Every bad row is dropped and counted under the first of DROP_REASONS that
applies; the readers drop (and note where the first of each was, as "file line N: what"):
  malformed_row     a CSV record with the wrong number of fields (one row per physical line it spans, as it may
                    hold several rows), or a JSON line (or array element) that is not a JSON object
  unclosed_quote    a CSV quote that never closes: each line from its record to the end of the file (csv_records.py)
  oversized_row     a record or JSON line longer than MAX_ROW_BYTES
  invalid_encoding  a CSV record, JSON line or Parquet text value that is not valid UTF-8 (or Unicode)
and `validate` drops:
  invalid_label     a label that is missing or not one of the label names (or their indices)
  missing_content   no content value (null, or an unquoted empty CSV field)
  empty_text        title and content are both empty or whitespace
A standardized table has the columns label (as read) / title / content (strings; title may be all null).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import re
import shutil
import tempfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from steps.contract import StepError, sample_spec, source_kind
from steps.tokenize import reviews
from steps.tokenize.csv_records import BOM, READ_BYTES, RecordBlocks

log = logging.getLogger("preprocess")

RELEASE_COLUMNS = ["polarity", "title", "text"]  # the original release's CSV files, which have no header
CHUNK_ROWS = 8192  # rows per read / tokenize batch
DATA_SUFFIXES = (".csv", ".parquet", ".pq", ".jsonl", ".json", ".ndjson", ".arrow")
# A split's keywords in a file or folder name, as whole words between separators (Hugging Face datasets' rule):
# train-00000-of-00002.parquet, amazon_polarity_test.csv and training/ name a split; latest.csv, contest/ do not
SPLIT_KEYWORDS = {"train": {"train", "training"}, "test": {"test", "testing", "eval", "evaluation"}}
WORD_SEPARATORS = re.compile(r"[-._ 0-9]+")
# What Dataset(Dict).save_to_disk writes beside its .arrow files: metadata, not rows
SOURCE_KEY = "source"  # schema metadata of a standardized table: the file (or Hub split) it came from
SAVED_DATASET_METADATA = ("dataset_dict.json", "dataset_info.json", "state.json")
ARROW_FILE_MAGIC = b"ARROW1"  # the start of an Arrow IPC file (the stream format has none)
DEFAULT_SAMPLE_ROWS = 20_000
MAX_ROW_BYTES = 1 << 20  # a review is a few KB; a larger record is most likely broken quoting or a stray blob
DROP_REASONS = ("malformed_row", "unclosed_quote", "oversized_row", "invalid_encoding", "invalid_label",
                "missing_content", "empty_text")
ALIASES = {"label": ("polarity",), "content": ("text", "review"), "title": ("summary",)}  # the default names' other
# spellings (polarity: the original CSV release's 1 = negative / 2 = positive)
BOOLEAN_LABELS = ("false", "true")  # two labels may be written as booleans (pandas writes them so)


@dataclass(frozen=True)
class Columns:
    """The columns rows are read from (data.label_column, data.text_columns): the label, and one text or a pair (the
    first of a pair may be missing from a file, whose rows are then single texts)."""

    label: str = "label"
    text: tuple[str, ...] = ("title", "content")

    def candidates(self, name: str) -> tuple[str, ...]:
        return (name, *ALIASES.get(name, ()))

    def names(self) -> tuple[str, ...]:
        """Every column name that is read as text (CSV type inference off), in the spellings CSV headers use."""
        found = [n for name in (self.label, *self.text) for n in self.candidates(name)]
        return tuple(v for n in found for v in dict.fromkeys((n, n.lower(), n.title(), n.upper())))


@dataclass
class Drops:
    """Rows a reader dropped, by reason, and where the first of each reason was ("file line N: what")."""

    counts: dict[str, int] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def add(self, reason: str, rows: int = 1, note: str | None = None) -> None:
        if rows > 0:
            self.counts[reason] = self.counts.get(reason, 0) + rows
            if note is not None:
                self.notes.setdefault(reason, note)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def capped(self, rows: int) -> Drops:
        """The first `rows` of these drops (in the order of DROP_REASONS)."""
        counts = {}
        for reason in sorted(self.counts, key=DROP_REASONS.index):
            counts[reason] = min(self.counts[reason], rows - sum(counts.values()))
        counts = {k: v for k, v in counts.items() if v}
        return Drops(counts, {k: v for k, v in self.notes.items() if k in counts})


def sample_chunks(split: str, rows: int, seed: int, classes: int = 2) -> Iterator[tuple[pa.Table, Drops]]:
    """Deterministic synthetic reviews with exactly balanced labels: 0 / 1 for two classes, else their names."""
    generated, names = reviews.sample_reviews(split, rows, seed, classes), reviews.class_names(classes)
    while chunk := list(islice(generated, CHUNK_ROWS)):
        labels, titles, contents = (list(column) for column in zip(*chunk, strict=True))
        label = pa.array(labels, pa.int64()) if classes == 2 else pa.array([names[i] for i in labels], pa.string())
        yield pa.table({"label": label, "title": titles, "content": contents}), Drops()


def _pick(names: list[str], candidates: tuple[str, ...]) -> str | None:
    lower = {n.lower(): n for n in names}
    return next((lower[c] for c in candidates if c in lower), None)


def standardize(table: pa.Table, where: str, columns: Columns = Columns()) -> tuple[pa.Table, np.ndarray]:
    """Rename the source columns to label/title/content (title may be all null); raise if one is missing. Also the
    rows whose title or content is not valid UTF-8 (a Parquet file's bytes: CSV and JSON are checked as read)."""
    names = table.column_names
    label, content = _pick(names, columns.candidates(columns.label)), _pick(names, columns.candidates(columns.text[-1]))
    title = _pick(names, columns.candidates(columns.text[0])) if len(columns.text) == 2 else None
    if label is None or content is None:
        raise StepError(f"{where}: needs a label column ({'/'.join(columns.candidates(columns.label))}: "
                        f"data.label_column) and a text column ({'/'.join(columns.candidates(columns.text[-1]))}: "
                        f"data.text_columns); found columns {names}")
    release = label.lower() == "polarity" and columns.label.lower() != "polarity"
    standard = {"label": _release_labels(table[label]) if release else table[label]}
    invalid = np.zeros(len(table), bool)
    for name, src in (("title", title), ("content", content)):
        col = table[src] if src is not None else pa.nulls(len(table), pa.string())
        try:
            standard[name], bad = _text(col)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise StepError(f"{where}: column {src!r} of type {col.type} is not text: {e}") from e
        invalid |= bad
    return pa.table(standard), invalid


def _standardized(table: pa.Table, where: str, drops: Drops, columns: Columns) -> pa.Table:
    """`standardize`d, without the rows of invalid UTF-8 text, which go to `drops`."""
    table, invalid = standardize(table, where, columns)
    if invalid.any():
        drops.add("invalid_encoding", int(invalid.sum()),
                  f"{where}: a title or content value that is not valid UTF-8 (row {int(np.argmax(invalid)) + 1} "
                  "of a chunk)")
        table = table.filter(pa.array(~invalid))
    return table.replace_schema_metadata({SOURCE_KEY: where})  # for validate's notes


def _text(col: pa.ChunkedArray | pa.Array) -> tuple[pa.ChunkedArray | pa.Array, np.ndarray]:
    """A column as strings, and the rows whose value is not valid UTF-8 (made null there)."""
    bad = np.zeros(len(col), bool)
    string = pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
    try:
        if string:
            col.validate(full=True)
            return col, bad
        return pc.cast(col, pa.string()), bad
    except pa.ArrowInvalid:
        if not (string or pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
            raise
    values = []
    for i, value in enumerate(pc.cast(col, pa.large_binary()).to_pylist()):  # bytes: no UTF-8 check
        try:
            values.append(None if value is None else value.decode())
        except UnicodeDecodeError:
            bad[i] = True
            values.append(None)
    return pa.array(values, pa.string()), bad


def _release_labels(polarity: pa.ChunkedArray) -> pa.ChunkedArray:
    """The original release's polarity (1 negative, 2 positive) as labels 0/1; anything else stays invalid."""
    text = pc.utf8_trim_whitespace(pc.cast(polarity, pa.string()))
    return pc.if_else(pc.equal(text, "2"), "1", pc.if_else(pc.equal(text, "1"), "0", "invalid"))


def _headerless_release(names: list[str]) -> bool:
    """Whether a CSV "header" is the first record of the original release: polarity 1/2, title, text (a header's
    first name is never 1 or 2; its title may be any word, "Review" or "Text" too)."""
    return len(names) == 3 and names[0].strip() in ("1", "2")


def _csv_chunks(path: Path, columns: Columns) -> Iterator[tuple[pa.Table | None, Drops]]:
    """Blocks of whole, valid UTF-8 records (csv_records.py), each parsed by pyarrow."""
    malformed: list[str] = []

    def skip(row: Any) -> str:
        malformed.append(row.text)
        return "skip"

    parse = pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=skip)
    convert = pacsv.ConvertOptions(  # read as text: type inference is per block
        column_types=dict.fromkeys(columns.names(), pa.string()),
        strings_can_be_null=True, null_values=[""], quoted_strings_can_be_null=False)
    names = None
    with pa.input_stream(str(path), compression="gzip" if _gzipped(path) else None) as stream:
        for block in RecordBlocks(stream.read, MAX_ROW_BYTES, str(path)):
            drops = Drops(block.dropped, block.notes)
            if not block.data:
                yield None, drops
                continue
            table = pacsv.read_csv(pa.py_buffer(block.data), pacsv.ReadOptions(  # parsed in parallel pieces
                column_names=names, block_size=2 * MAX_ROW_BYTES), parse, convert)  # a record fits in two
            if names is None and _headerless_release(table.column_names):
                names = RELEASE_COLUMNS
                malformed.clear()
                table = pacsv.read_csv(pa.py_buffer(block.data), pacsv.ReadOptions(
                    column_names=names, block_size=2 * MAX_ROW_BYTES), parse, convert)
            names = names or table.column_names
            for text in malformed:
                at = block.data.find(text.encode()) if "malformed_row" not in drops.notes else -1
                where = f"{path} line {block.line_at(at)}" if at >= 0 else str(path)
                drops.add("malformed_row", text.count("\n") + 1, f"{where}: wrong number of fields "
                          f"({len(names)} in the header)")
            malformed.clear()
            yield table, drops


def _parquet_chunks(path: Path, columns: Columns) -> Iterator[tuple[pa.Table, Drops]]:
    """Row batches of a Parquet file; a gzipped one (.parquet.gz) is first unpacked to a temporary file, as Parquet
    is read from its end."""
    with tempfile.TemporaryFile() as unpacked:
        source: Any = path
        if _gzipped(path):
            with gzip.open(path, "rb") as packed:
                shutil.copyfileobj(packed, unpacked, READ_BYTES)
            source = unpacked
        for batch in pq.ParquetFile(source).iter_batches(batch_size=CHUNK_ROWS):
            yield pa.Table.from_batches([batch]), Drops()


def _arrow_chunks(path: Path, columns: Columns) -> Iterator[tuple[pa.Table, Drops]]:
    """Record batches of an Arrow IPC file: the stream format that datasets' save_to_disk and cache write, or the
    random-access file format (Feather v2). Memory-mapped; a gzipped one (.arrow.gz) is unpacked in memory."""
    with pa.input_stream(str(path), compression="gzip") if _gzipped(path) else pa.memory_map(str(path)) as stream:
        data = stream.read_buffer()
        if data[:len(ARROW_FILE_MAGIC)].to_pybytes() == ARROW_FILE_MAGIC:
            reader = pa.ipc.open_file(data)
            batches: Iterator[pa.RecordBatch] = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            batches = iter(pa.ipc.open_stream(data))
        for batch in batches:
            for start in range(0, batch.num_rows, CHUNK_ROWS):
                yield pa.Table.from_batches([batch.slice(start, CHUNK_ROWS)]), Drops()


def _jsonl_chunks(path: Path, columns: Columns) -> Iterator[tuple[pa.Table, Drops]]:
    """JSON Lines read line by line as bytes (or a .json file that is one JSON array, read whole)."""
    labels = tuple(name.lower() for name in columns.candidates(columns.label))
    opener = gzip.open if _gzipped(path) else open
    with opener(path, "rb") as f:
        head = f.read(1 << 16).removeprefix(BOM).lstrip()
        f.seek(0)
        rows = None
        if head.startswith(b"[") and path.name.lower().removesuffix(".gz").endswith(".json"):
            try:
                rows = json.loads(f.read().removeprefix(BOM))
            except json.JSONDecodeError:  # JSON Lines whose first line is an array: that line is a bad row
                f.seek(0)
        if isinstance(rows, list):
            for start in range(0, len(rows), CHUNK_ROWS):
                drops, kept = Drops(), []
                for i, row in enumerate(rows[start:start + CHUNK_ROWS], start):
                    bad = _bad_row(row)
                    if bad:
                        drops.add(bad[0], 1, f"{path} element {i}: {bad[1]}")
                    else:
                        kept.append(row)
                yield _rows_table(kept, labels), drops
            return
        rows, drops, number = [], Drops(), 0
        while line := f.readline(MAX_ROW_BYTES + 1):
            number += 1
            bad = None
            if len(line) > MAX_ROW_BYTES and not line.endswith(b"\n"):
                while (rest := f.readline(READ_BYTES)) and not rest.endswith(b"\n"):
                    pass
                bad = "oversized_row", f"a line of more than {MAX_ROW_BYTES} bytes"
            elif not line.strip():
                continue
            else:
                try:
                    row = json.loads(line.removeprefix(BOM).decode())
                    bad = _bad_row(row, b"\\ud" in line or b"\\uD" in line)  # a surrogate escape: check it
                    if not bad:
                        rows.append(row)
                except UnicodeDecodeError:
                    bad = "invalid_encoding", "not valid UTF-8"
                except json.JSONDecodeError:
                    bad = "malformed_row", "not a JSON object"
            if bad:
                drops.add(bad[0], 1, f"{path} line {number}: {bad[1]}")
            if len(rows) == CHUNK_ROWS:
                yield _rows_table(rows, labels), drops
                rows, drops = [], Drops()
        if rows or drops.total:
            yield _rows_table(rows, labels), drops


def _bad_row(row: Any, escaped_surrogates: bool = True) -> tuple[str, str] | None:
    """Why a parsed JSON row cannot be a row (not an object; a lone surrogate escape such as a cut emoji), or None."""
    if not isinstance(row, dict):
        return "malformed_row", "not a JSON object"
    if escaped_surrogates:
        try:
            json.dumps(row, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            return "invalid_encoding", "a lone surrogate escape, not valid Unicode"
    return None


def _rows_table(rows: list[dict], label_names: tuple[str, ...]) -> pa.Table:
    """Rows of JSON objects as a table of text columns (a label's Python objects as text, other values as JSON)."""
    names = sorted({k for row in rows for k in row})
    columns = {}
    for name in names:
        values = [row.get(name) for row in rows]
        if name.lower() in label_names:
            values = [None if v is None else str(int(v)) if isinstance(v, bool) else str(v) for v in values]
        else:
            values = [v if v is None or isinstance(v, str) else json.dumps(v) for v in values]
        columns[name] = pa.array(values, pa.string())
    return pa.table(columns) if columns else pa.table({"label": pa.array([], pa.string())})


def file_chunks(path: Path, columns: Columns = Columns()) -> Iterator[tuple[pa.Table | None, Drops]]:
    """Chunks of one data file as standardized tables (None if no row parsed), with the rows dropped."""
    name = path.name.lower().removesuffix(".gz")
    reader: Callable[[Path, Columns], Iterator[tuple[pa.Table | None, Drops]]]
    if name.endswith(".csv"):
        reader = _csv_chunks
    elif name.endswith((".parquet", ".pq")):
        reader = _parquet_chunks
    elif name.endswith(".arrow"):
        reader = _arrow_chunks
    else:
        reader = _jsonl_chunks
    try:
        for table, drops in reader(path, columns):
            if table is None or not len(table):
                yield None, drops
                continue
            yield _standardized(table, str(path), drops, columns), drops
    except StepError:
        raise
    except (OSError, ValueError, EOFError, zlib.error, pa.ArrowException) as e:  # EOFError: a cut gzip stream
        raise StepError(f"cannot read {path}: {type(e).__name__}: {e}") from e


def split_of(path: Path, root: Path) -> str | None:
    """train / test from the file name, then from its folders (deepest first): the first that holds a keyword of
    exactly one split as a whole word; None if none does.

    By hand, after datasets' rules (`datasets.data_files.get_data_patterns`): datasets is not in the processing
    image, and installing it (with its dependencies) into every job that reads local files, only to name splits,
    would cost each such job its install; it is installed for a Hub source alone (tests/test_images.py holds both)."""
    for part in reversed(path.relative_to(root).parts):
        words = set(WORD_SEPARATORS.split(part.lower()))
        found = [split for split, keywords in SPLIT_KEYWORDS.items() if words & keywords]
        if len(found) == 1:
            return found[0]
    return None


def _saved_dataset_metadata(path: Path) -> bool:
    """A metadata file of a save_to_disk folder: its name, beside .arrow files (a Dataset) or above folders of them
    (a DatasetDict's dataset_dict.json)."""
    return path.name in SAVED_DATASET_METADATA and (any(path.parent.glob("*.arrow"))
                                                    or any(path.parent.glob("*/*.arrow")))


def _gzipped(path: Path) -> bool:
    return path.name.lower().endswith(".gz")


def find_files(root: Path) -> dict[str, list[Path]]:
    """Data files under root, grouped by split; files of no split are listed in a warning."""
    if root.is_file():
        raise StepError(f"input folder {root} is a file: give the folder that holds it ({root.parent})")
    if not root.is_dir():
        raise StepError(f"input folder {root} does not exist")
    found: dict[str, list[Path]] = {"train": [], "test": []}
    skipped = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        name = path.name.lower().removesuffix(".gz")
        hidden = any(part.startswith((".", "_")) for part in path.relative_to(root).parts)
        if hidden or not name.endswith(DATA_SUFFIXES) or _saved_dataset_metadata(path):
            continue
        split = split_of(path, root)
        (found[split] if split else skipped).append(path)
    if skipped:
        log.warning("ignoring %d data files that name neither train nor test: %s", len(skipped),
                    ", ".join(str(p) for p in skipped[:5]))
    for split, paths in found.items():
        if not paths:
            raise StepError(f"no {split} files under {root} (CSV / Parquet / JSON Lines / Arrow files whose name "
                            f"or folder has the word {' or '.join(sorted(SPLIT_KEYWORDS[split]))}); found "
                            f"{len(skipped)} other data files")
    return found


def hub_chunks(name: str, split: str, columns: Columns = Columns()) -> Iterator[tuple[pa.Table, Drops]]:
    """Chunks of a Hub dataset split (the dataset is downloaded to the Arrow cache, then read in chunks)."""
    import datasets

    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:  # the Hub raises many kinds: report them all the same way
        hint = f" (the folder {name} here is written ./{name})" if Path(name).is_dir() else ""
        raise StepError(f"cannot load split {split!r} of Hub dataset {name!r}{hint}: {type(e).__name__}: {e}") \
            from e
    for start in range(0, len(ds), CHUNK_ROWS):
        table = ds.data.slice(start, CHUNK_ROWS)
        table = getattr(table, "table", table)  # datasets wraps pyarrow tables
        drops = Drops()
        yield _standardized(table, f"{name}[{split}]", drops, columns), drops


def source_chunks(args: argparse.Namespace) -> dict[str, Iterator[tuple[pa.Table | None, Drops]]]:
    """For train and test: an iterator of (standardized table, rows dropped while reading) chunks."""
    source, columns = args.source, Columns(args.label_column, tuple(args.text_columns))
    kind = source_kind(source)
    if kind == "sample":
        try:
            rows, classes = sample_spec(source)
            reviews.class_names(classes)
        except ValueError as e:
            raise StepError(f"--source {source}: {e}") from None
        rows = rows or DEFAULT_SAMPLE_ROWS
        return {"train": sample_chunks("train", rows, args.seed, classes),
                "test": sample_chunks("test", max(1, rows // 10), args.seed, classes)}
    if kind in ("s3", "folder"):
        root = Path(args.input_dir) if kind == "s3" else Path(source).expanduser()
        files = find_files(root)
        log.info("reading %s: %s", root, {k: [str(p.relative_to(root)) for p in v] for k, v in files.items()})
        return {split: (c for p in paths for c in file_chunks(p, columns)) for split, paths in files.items()}
    return {split: hub_chunks(source, split, columns) for split in ("train", "test")}


def limit_rows(chunks: Iterator[tuple[pa.Table | None, Drops]], limit: int | None) -> Iterator[tuple[Any, Drops]]:
    """Stop after `limit` input rows (rows dropped while reading count too)."""
    seen = 0
    for table, drops in chunks:
        if limit is not None:
            drops = drops.capped(limit - seen)
            if table is not None:
                table = table.slice(0, max(0, limit - seen - drops.total))
        seen += drops.total + (len(table) if table is not None else 0)
        yield table, drops
        if limit is not None and seen >= limit:
            return


def label_text(label: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Labels as trimmed text: booleans as 0 / 1, whole numbers without a fraction (1.0 is "1")."""
    if pa.types.is_boolean(label.type):
        label = pc.cast(label, pa.int8())
    if pa.types.is_floating(label.type):
        whole = pc.equal(pc.floor(label), label)
        ints = pc.cast(pc.if_else(whole, label, 0.0), pa.int64(), safe=False)
        return pc.if_else(whole, pc.cast(ints, pa.string()), pc.cast(label, pa.string()))
    return pc.utf8_trim_whitespace(pc.cast(label, pa.string()))


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def label_ids(label: pa.ChunkedArray | pa.Array, names: list[str]) -> np.ndarray:
    """Each row's label id (its index in `names`), -1 where it is none: a name (case ignored) or, where no name is a
    number, the index written as a number (1, 1.0; with two names also false / true)."""
    keys = [name.lower() for name in names]
    ids = list(range(len(names)))
    if not any(_number(name) for name in names):
        for i in range(len(names)):
            keys, ids = keys + [str(i), f"{i}.0"], ids + [i, i]
        if len(names) == 2:
            keys, ids = keys + list(BOOLEAN_LABELS), ids + [0, 1]
    text = pc.utf8_lower(label_text(label))
    index = pc.fill_null(pc.index_in(text, value_set=pa.array(keys, pa.string())), -1)
    return np.append(np.array(ids, np.int32), -1)[np.asarray(index.to_numpy(zero_copy_only=False), np.int64)]


def found_labels(chunks: Iterator[tuple[pa.Table | None, Drops]]) -> list[str]:
    """The label names of a split (data.labels unset): its distinct labels, sorted (as numbers where all are one).
    Labels are matched case-insensitively, so spellings that differ only in case are one label, named by its most
    frequent spelling."""
    spellings: Counter[str] = Counter()
    for table, _ in chunks:
        if table is not None:
            spellings.update(v for v in label_text(table["label"]).to_pylist() if v)
    named: dict[str, str] = {}
    for spelling, _ in sorted(spellings.items(), key=lambda item: (-item[1], item[0])):
        named.setdefault(spelling.lower(), spelling)
    names = list(named.values())
    return sorted(names, key=float) if all(_number(v) for v in names) else sorted(names)


def validate(table: pa.Table, names: list[str], unseen: str | None = None
             ) -> tuple[pa.Table, np.ndarray, dict[str, int], dict[str, str]]:
    """Keep rows with a label of `names` and some text: return them (label int32: the label's id), their row indices
    in the chunk, the drop count per reason and, per reason, where and what its first dropped row was. `unseen`: the
    split whose labels named the set (names found there): a label it lacks is refused, not counted as a bad row."""
    source = (table.schema.metadata or {}).get(SOURCE_KEY.encode(), b"the data").decode()
    ids = label_ids(table["label"], names)
    if unseen and (ids < 0).any():
        text = label_text(table["label"]).to_pylist()
        new = [v for v, i in zip(text, ids, strict=True) if i < 0 and v]
        if new:
            raise StepError(f"{source}: label {new[0]!r} does not occur in the {unseen} split, whose labels are "
                            f"{', '.join(names)} (list every label in data.labels to allow it)")
    bad_label = pa.array(ids < 0)
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
    notes = {}
    for reason, mask, what in (("invalid_label", bad_label, f"label {{!r}} is not one of {', '.join(names)}"),
                               ("missing_content", missing & ~bad_label, "no content (the column is empty)"),
                               ("empty_text", empty & ~missing & ~bad_label, "neither a title nor content")):
        if mask.any():
            row = int(np.argmax(mask))
            notes[reason] = f"{source} row {row + 1} of a chunk: " + what.format(table["label"][row].as_py())
    keep_mask = ~(bad_label | missing | empty)
    keep = pa.array(keep_mask)
    kept = pa.table({
        "label": pa.array(ids[keep_mask], pa.int32()),
        "title": pc.filter(pc.if_else(has_title, title, pa.scalar(None, pa.string())), keep),
        "content": pc.filter(table["content"], keep),
    })
    return kept, np.flatnonzero(keep_mask), counts, notes
