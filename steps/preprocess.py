"""Tokenize step: read reviews, validate them, tokenize them, write Parquet shards and stats.

Sources (--source):
  sample | sample:N   deterministic synthetic reviews (N train rows, N/10 test rows)
  s3://...            files the platform staged into --input-dir
  a local folder      CSV / Parquet / JSON Lines files (optionally .gz) under it
  anything else       a Hub dataset name for datasets.load_dataset (splits train/test)
A file belongs to the train split if its path names "train", to the test split if it names "test" (the file
name is checked first, then its folders, deepest first). Each file needs a label column and a content column
("content", "text" or "review"); a title column ("title" or "summary") is optional. CSV files need a header.

Validation: every bad row is dropped and counted under its first failing reason, in this order:
  malformed_row    a CSV row with the wrong number of fields, or a JSON line that does not parse
  invalid_label    a label that is missing, unparsable or not 0/1 ("negative"/"positive" are accepted too)
  missing_content  no content value (null, or an unquoted empty CSV field)
  empty_text       title and content are both empty or whitespace
If the bad share of a split exceeds --max-bad-share, the step fails (after writing stats.json).

Tokenization rule (the model's fast tokenizer, no padding):
  * with a title: the sentence pair "[CLS] title [SEP] content [SEP]" (token_type_ids 0 for the first three
    parts, 1 for content and the last [SEP]). If it is longer than --max-length, only the content is cut
    (truncation="only_second"), so a long review keeps its title. Only when the title leaves no room for
    content (title tokens + 3 >= max_length) are both cut longest-first.
  * without a title (empty or whitespace): the single sequence "[CLS] content [SEP]", token_type_ids all 0.

The validation split is taken from the valid train rows: a row goes to validation when a seeded hash of its
position in the train input is below --validation-share, so the choice does not depend on chunk sizes and the
share is met on average (not exactly). Output: OUTPUT/{train,validation,test}/part-NNNNN.parquet with columns
input_ids list<int32>, token_type_ids list<int8>, label int8, length int32; OUTPUT/stats/stats.json.
Everything streams in chunks, so memory does not grow with the size of the input.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

log = logging.getLogger("preprocess")

SPLITS = ("train", "validation", "test")
DROP_REASONS = ("malformed_row", "invalid_label", "missing_content", "empty_text")
SCHEMA = pa.schema([
    ("input_ids", pa.list_(pa.int32())),
    ("token_type_ids", pa.list_(pa.int8())),
    ("label", pa.int8()),
    ("length", pa.int32()),
])
LABEL_COLUMNS = ("label",)
CONTENT_COLUMNS = ("content", "text", "review")
TITLE_COLUMNS = ("title", "summary")
CHUNK_ROWS = 8192  # rows per read / tokenize batch
ROWS_PER_SHARD = 250_000
DATA_SUFFIXES = (".csv", ".parquet", ".pq", ".jsonl", ".json", ".ndjson")
DEFAULT_SAMPLE_ROWS = 20_000


class StepError(Exception):
    """A problem with the input or the arguments, reported as one clear line."""


# ----------------------------------------------------------------------------------------------------------
# synthetic reviews

PRODUCTS = {
    "headphones": ["sound quality", "battery life", "noise cancelling", "ear cushions", "connection"],
    "blender": ["motor", "lid", "blades", "cleanup", "noise level"],
    "novel": ["plot", "characters", "writing", "ending", "pacing"],
    "running shoes": ["fit", "cushioning", "sizing", "stitching", "grip"],
    "coffee maker": ["coffee", "carafe", "timer", "water tank", "temperature"],
    "phone case": ["fit", "buttons", "grip", "color", "drop protection"],
    "board game": ["rules", "artwork", "replay value", "pieces", "box"],
    "documentary": ["narration", "picture quality", "soundtrack", "story", "editing"],
    "backpack": ["zippers", "straps", "fabric", "pockets", "stitching"],
    "air fryer": ["basket", "timer", "temperature control", "cleanup", "size"],
    "e-reader": ["screen", "battery life", "page turns", "light", "software"],
    "cookbook": ["recipes", "photos", "instructions", "index", "ingredients list"],
}
GOOD = ["great", "excellent", "fantastic", "solid", "impressive", "reliable", "sturdy", "wonderful", "superb",
        "well made", "comfortable", "easy to use", "better than expected", "top notch"]
BAD = ["poor", "terrible", "flimsy", "disappointing", "awful", "cheap", "useless", "unreliable",
       "frustrating", "mediocre", "badly made", "worse than expected", "a letdown", "annoying"]
INTENSIFIERS = ["", "", "really ", "very ", "truly ", "pretty ", "absolutely "]
GOOD_OVERALL = ["Worth every penny.", "Five stars from me.", "I would buy it again in a heartbeat.",
                "Highly recommended.", "My whole family loves it.", "Best purchase I made this year.",
                "It does exactly what it promises.", "I am very happy with it."]
BAD_OVERALL = ["Waste of money.", "One star, and that is generous.", "I returned it the next day.",
               "Do not buy this.", "I regret this purchase.", "Customer service never answered my emails.",
               "It stopped working after {n} {unit}.", "Save your money and look elsewhere."]
GOOD_NEGATED = ["I have no complaints about the {aspect}.", "Not a single problem with the {aspect} so far.",
                "The {aspect} {be} not bad at all.", "I never had an issue with the {aspect}.",
                "You won't be disappointed by the {aspect}."]
BAD_NEGATED = ["The {aspect} {be} not {good}.", "I can't say the {aspect} {be} {good}.",
               "The {aspect} never worked properly.", "Nothing about the {aspect} is {good}.",
               "I would not call the {aspect} {good}."]
NEUTRAL = ["I bought this for my {who}.", "It arrived in {n} days.", "I have been using it for {n} {unit}.",
           "The packaging was plain.", "I ordered the {color} one.", "It came with a short manual.",
           "I read a lot of reviews before ordering.", "This is my second one."]
GOOD_TITLES = ["Great {product}", "Love it", "Five stars", "Exactly what I needed", "Better than expected",
               "Highly recommend", "Works perfectly", "So happy with this {product}"]
BAD_TITLES = ["Disappointed", "Broke after a week", "Not as described", "Save your money", "Not great",
              "Do not buy", "Poor quality {product}", "What a letdown"]
NEUTRAL_TITLES = ["{Product} review", "Mixed feelings", "It's okay", "Some thoughts", "Read before buying"]
FILL = {"who": ["son", "daughter", "wife", "husband", "mother", "office", "dorm room", "best friend"],
        "unit": ["days", "weeks", "months"], "color": ["black", "blue", "red", "white", "green", "grey"]}


def _fill(rng: random.Random, template: str, product: str, aspect: str) -> str:
    return template.format(
        product=product, Product=product.capitalize(), aspect=aspect, n=rng.randint(2, 11),
        be="are" if aspect.endswith("s") else "is",
        good=rng.choice(GOOD), who=rng.choice(FILL["who"]), unit=rng.choice(FILL["unit"]),
        color=rng.choice(FILL["color"]))


def _sentence(rng: random.Random, positive: bool, product: str, aspects: list[str]) -> str:
    """One sentence of the given polarity: a plain judgement, a negation, or an overall verdict."""
    aspect = rng.choice(aspects)
    kind = rng.random()
    if kind < 0.45:
        adj = rng.choice(GOOD if positive else BAD)
        text = "The {aspect} {be} " + ("" if " " in adj else rng.choice(INTENSIFIERS)) + adj + "."
    elif kind < 0.75:
        text = rng.choice(GOOD_NEGATED if positive else BAD_NEGATED)
    else:
        text = rng.choice(GOOD_OVERALL if positive else BAD_OVERALL)
    return _fill(rng, text, product, aspect)


def synthetic_review(rng: random.Random, label: int) -> tuple[str, str]:
    """A (title, content) review: mostly clear, some mixed, a few ambiguous, with negations and fillers."""
    product = rng.choice(sorted(PRODUCTS))
    aspects = PRODUCTS[product]
    kind = rng.random()
    n = rng.choice([1, 2, 2, 3, 3, 4, 4, 5, 6, 8]) if rng.random() > 0.05 else rng.randint(12, 30)
    if kind < 0.70:  # clear
        polarities = [label == 1] * n
    elif kind < 0.93:  # mixed: the label wins, with one or two sentences the other way
        k = min(n, rng.randint(1, 2))
        polarities = [label == 1] * (n + 1) + [label != 1] * k
    else:  # ambiguous: as much praise as criticism, the label is not in the text
        half = max(1, n // 2)
        polarities = [True] * half + [False] * half
    rng.shuffle(polarities)
    sentences: list[str] = []
    for p in polarities:
        for _ in range(3):  # avoid saying the same thing twice, within reason
            text = _sentence(rng, p, product, aspects)
            if text not in sentences:
                break
        sentences.append(text)
    for i in range(1, len(sentences)):
        if polarities[i] != polarities[i - 1] and rng.random() < 0.6:
            sentences[i] = rng.choice(["But ", "However, ", "On the other hand, "]) + \
                sentences[i][0].lower() + sentences[i][1:]
    for _ in range(rng.choice([0, 0, 1, 1, 2])):
        sentences.insert(rng.randint(0, len(sentences)), _fill(rng, rng.choice(NEUTRAL), product, aspects[0]))
    t = rng.random()
    if t < 0.1:
        title = ""
    elif kind >= 0.70 and t < 0.4:
        title = _fill(rng, rng.choice(NEUTRAL_TITLES), product, aspects[0])
    else:
        title = _fill(rng, rng.choice(GOOD_TITLES if label == 1 else BAD_TITLES), product, aspects[0])
    return title, " ".join(sentences)


def sample_chunks(split: str, rows: int, seed: int) -> Iterator[tuple[pa.Table, int]]:
    """Deterministic synthetic reviews with exactly balanced labels (within each pair of rows)."""
    rng = random.Random(f"sample-{split}-{seed}")
    first = 0
    for start in range(0, rows, CHUNK_ROWS):
        labels, titles, contents = [], [], []
        for i in range(start, min(rows, start + CHUNK_ROWS)):
            if i % 2 == 0:
                first = int(rng.random() < 0.5)
            label = first if i % 2 == 0 else 1 - first
            title, content = synthetic_review(rng, label)
            labels.append(label)
            titles.append(title)
            contents.append(content)
        table = pa.table({"label": pa.array(labels, pa.int64()), "title": titles, "content": contents})
        yield table, 0


# ----------------------------------------------------------------------------------------------------------
# reading files and Hub datasets


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


# ----------------------------------------------------------------------------------------------------------
# validation and tokenization


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


class Encoder:
    """The model's fast tokenizer, applied with the module's truncation rule, parallel over all cores."""

    def __init__(self, model_id: str, max_length: int) -> None:
        from tokenizers import Tokenizer
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(model_id, use_fast=True)
        except Exception as e:  # missing folder, no network, bad files: all end here
            raise StepError(f"cannot load the tokenizer of {model_id!r}: {type(e).__name__}: {e}") from e
        if not getattr(tok, "is_fast", False):
            raise StepError(f"{model_id!r} has no fast tokenizer (tokenizer.json)")
        if max_length < 4:
            raise StepError(f"--max-length {max_length} is too small (at least 4)")
        if max_length > tok.model_max_length:
            log.warning("--max-length %d exceeds the model's limit %d", max_length, tok.model_max_length)
        spec = tok.backend_tokenizer.to_str()
        self.pair_tok, self.cut_both_tok = Tokenizer.from_str(spec), Tokenizer.from_str(spec)
        for t, strategy in ((self.pair_tok, "only_second"), (self.cut_both_tok, "longest_first")):
            t.no_padding()
            t.enable_truncation(max_length, strategy=strategy)
        self.max_length = max_length
        self.sep_id = tok.sep_token_id
        self.derive_types: bool | None = None if self.sep_id is not None else False

    def encode(self, titles: list[str | None], contents: list[str]) -> list:
        """Encodings of (title, content) pairs, or of content alone where the title is None."""
        pairs = [i for i, t in enumerate(titles) if t is not None]
        singles = [i for i, t in enumerate(titles) if t is None]
        out: list = [None] * len(titles)
        self._encode_into(out, self.cut_both_tok, singles, [contents[i] for i in singles])
        try:
            self._encode_into(out, self.pair_tok, pairs, [(titles[i], contents[i]) for i in pairs])
        except Exception:  # only_second cannot cut enough: some title leaves no room for content
            lens = [len(e) for e in self.cut_both_tok.encode_batch([titles[i] for i in pairs],
                                                                   add_special_tokens=False)]
            long = [i for i, n in zip(pairs, lens, strict=True) if n + 3 >= self.max_length]
            rest = sorted(set(pairs) - set(long))
            for tok, idx in ((self.cut_both_tok, long), (self.pair_tok, rest)):
                self._encode_into(out, tok, idx, [(titles[i], contents[i]) for i in idx])
        return out

    @staticmethod
    def _encode_into(out: list, tok: Any, idx: list[int], inputs: list) -> None:
        if idx:
            encode_batch = getattr(tok, "encode_batch_fast", None) or tok.encode_batch  # fast: no offsets
            for i, e in zip(idx, encode_batch(inputs), strict=True):
                out[i] = e

    def to_table(self, encodings: list, labels: pa.Array, is_pair: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """The output table of a chunk and, per row, whether it was truncated."""
        ids = [e.ids for e in encodings]
        lengths = np.fromiter(map(len, ids), np.int32, len(ids))
        offsets = np.zeros(len(ids) + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        flat_ids = np.fromiter(chain.from_iterable(ids), np.int32, int(offsets[-1]))
        flat_types = self.type_ids(flat_ids, offsets, is_pair, encodings)
        truncated = np.zeros(len(ids), bool)
        for i in np.flatnonzero(lengths == self.max_length):  # only full rows can have been cut
            truncated[i] = bool(encodings[i].overflowing)
        table = pa.Table.from_arrays([
            pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat_ids)),
            pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat_types)),
            labels,
            pa.array(lengths),
        ], schema=SCHEMA)
        return table, truncated

    def type_ids(self, flat_ids: np.ndarray, offsets: np.ndarray, is_pair: np.ndarray,
                 encodings: list) -> np.ndarray:
        """Flat token_type_ids. BERT-style pairs are 0 up to the first [SEP] and 1 after it: derived from the
        ids with numpy, which saves a Python list per row. Rows with an unexpected [SEP] count (the text
        itself held "[SEP]") take the tokenizer's own type_ids, and so do all rows if the first chunk shows
        that the tokenizer does not follow that pattern."""
        if self.derive_types is False:
            return np.fromiter(chain.from_iterable(e.type_ids for e in encodings), np.int8, len(flat_ids))
        n = len(encodings)
        row = np.repeat(np.arange(n), np.diff(offsets))
        pos = np.arange(len(flat_ids)) - offsets[row]
        sep = flat_ids == self.sep_id
        first_sep = np.full(n, np.iinfo(np.int32).max)
        sep_rows, first = np.unique(row[sep], return_index=True)
        first_sep[sep_rows] = pos[sep][first]
        types = (is_pair[row] & (pos > first_sep[row])).astype(np.int8)
        odd = np.flatnonzero(is_pair & (np.bincount(row[sep], minlength=n) != 2))
        for i in odd:
            types[offsets[i]:offsets[i + 1]] = encodings[i].type_ids
        if self.derive_types is None:  # first chunk: check the pattern against the tokenizer
            exact = np.fromiter(chain.from_iterable(e.type_ids for e in encodings), np.int8, len(flat_ids))
            self.derive_types = bool(np.array_equal(types, exact))
            return exact
        return types


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function (uint64 in, well-mixed uint64 out)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def validation_mask(positions: np.ndarray, share: float, seed: int) -> np.ndarray:
    """True for the rows (by input position) that go to validation: element i of a SplitMix64 stream seeded
    with `seed`, as a uniform number in [0, 1), is below the share."""
    gamma = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        start = _mix64(np.array([seed % (1 << 64)], np.uint64) * gamma)[0]
        x = _mix64(start + (positions.astype(np.uint64) + np.uint64(1)) * gamma)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53) < share


# ----------------------------------------------------------------------------------------------------------
# output


@dataclass
class SplitWriter:
    """Writes one split as Parquet shards of at most rows_per_shard rows and keeps its statistics."""

    folder: Path
    max_length: int
    rows_per_shard: int = ROWS_PER_SHARD
    rows: int = 0
    truncated: int = 0
    shards: int = 0
    labels: list[int] = field(default_factory=lambda: [0, 0])
    hist: np.ndarray = field(init=False)  # count of rows per token length
    _writer: pq.ParquetWriter | None = field(default=None, init=False)
    _in_shard: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for old in self.folder.glob("part-*.parquet"):  # shards of an earlier run would mix in
            old.unlink()
        self.hist = np.zeros(self.max_length + 1, np.int64)

    def write(self, table: pa.Table, truncated: np.ndarray) -> None:
        self.rows += len(table)
        self.truncated += int(truncated.sum())
        lengths = table["length"].to_numpy()
        self.hist += np.bincount(lengths, minlength=self.max_length + 1)[: self.max_length + 1]
        ones = int(pc.sum(table["label"]).as_py() or 0)
        self.labels[0] += len(table) - ones
        self.labels[1] += ones
        while len(table):
            if self._writer is None or self._in_shard >= self.rows_per_shard:
                self._open()
            n = min(len(table), self.rows_per_shard - self._in_shard)
            self._writer.write_table(table.slice(0, n))
            self._in_shard += n
            table = table.slice(n)

    def _open(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = pq.ParquetWriter(self.folder / f"part-{self.shards:05d}.parquet", SCHEMA)
        self.shards += 1
        self._in_shard = 0

    def close(self) -> None:
        """Finish the last shard; an empty split still gets one (empty) shard, so readers find a file."""
        if self._writer is None:
            self._open()
        self._writer.close()

    def stats(self) -> dict[str, Any]:
        n, cum = self.rows, np.cumsum(self.hist)
        # nearest-rank percentiles of the exact length histogram
        pct = {f"p{q}": int(np.searchsorted(cum, max(1, int(np.ceil(q / 100 * n))))) if n else 0
               for q in (50, 90, 95, 99)}
        pct["max"] = int(np.flatnonzero(self.hist).max()) if n else 0
        pct["mean"] = round(float((self.hist * np.arange(len(self.hist))).sum() / n), 2) if n else 0.0
        return {"rows": n, "shards": self.shards, "labels": {"0": self.labels[0], "1": self.labels[1]},
                "token_length": pct, "truncated": self.truncated,
                "truncated_share": round(self.truncated / n, 6) if n else 0.0}


@dataclass
class Chunk:
    """One chunk of a source split after validation; encodings is filled in by a worker thread."""

    rows: int  # input rows, malformed ones included
    dropped: dict[str, int]
    kept: pa.Table | None = None
    kept_index: np.ndarray | None = None  # row index of each kept row among the chunk's parsed rows
    parsed: int = 0  # rows that parsed (the chunk's table length)
    job: Any = None


def encoded(chunks: Iterator[tuple[pa.Table | None, int]], encoder: Encoder) -> Iterator[tuple[Chunk, list]]:
    """Validated chunks with their encodings. The next chunk is tokenized in a thread (the tokenizer
    releases the GIL) while the caller converts and writes the current one."""
    with ThreadPoolExecutor(1) as pool:
        pending: deque[Chunk] = deque()
        for table, malformed in chunks:
            chunk = Chunk(rows=malformed, dropped={"malformed_row": malformed})
            if table is not None:
                chunk.kept, chunk.kept_index, counts = validate(table)
                chunk.dropped.update(counts)
                chunk.rows += len(table)
                chunk.parsed = len(table)
                if len(chunk.kept):
                    chunk.job = pool.submit(encoder.encode, chunk.kept["title"].to_pylist(),
                                            chunk.kept["content"].to_pylist())
            pending.append(chunk)
            if len(pending) > 1:
                done = pending.popleft()
                yield done, done.job.result() if done.job else []
        while pending:
            done = pending.popleft()
            yield done, done.job.result() if done.job else []


def process_split(name: str, chunks: Iterator, encoder: Encoder, writers: dict[str, SplitWriter],
                  args: argparse.Namespace) -> dict[str, Any]:
    """Validate, tokenize and write one source split (train also feeds validation); return its input stats."""
    rows_in, position, dropped = 0, 0, dict.fromkeys(DROP_REASONS, 0)
    t0 = last_log = time.perf_counter()
    cpu0 = time.process_time()
    for chunk, encodings in encoded(chunks, encoder):
        for reason, n in chunk.dropped.items():
            dropped[reason] += n
        if encodings:
            is_pair = chunk.kept["title"].is_valid().to_numpy(zero_copy_only=False)
            table, truncated = encoder.to_table(encodings, chunk.kept["label"].combine_chunks(), is_pair)
            if name == "train" and args.validation_share > 0:
                to_val = validation_mask(position + chunk.kept_index, args.validation_share, args.seed)
                for split, mask in (("validation", to_val), ("train", ~to_val)):
                    idx = np.flatnonzero(mask)
                    if len(idx):
                        writers[split].write(table.take(pa.array(idx)), truncated[idx])
            else:
                writers[name].write(table, truncated)
        rows_in += chunk.rows
        position += chunk.parsed
        if time.perf_counter() - last_log > 30:
            last_log = time.perf_counter()
            log.info("%s: %d rows read, %.0f rows/s", name, rows_in, rows_in / (last_log - t0))
    bad, seconds, cpu = sum(dropped.values()), time.perf_counter() - t0, time.process_time() - cpu0
    return {"rows_in": rows_in, "rows_out": rows_in - bad, "dropped": dropped, "dropped_total": bad,
            "bad_share": round(bad / rows_in, 6) if rows_in else 0.0,
            "seconds": round(seconds, 3), "cpu_seconds": round(cpu, 3)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of the step (see the contract)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default="amazon_polarity",
                   help="sample[:N], s3://... (staged in --input-dir), a local folder, or a Hub dataset name")
    p.add_argument("--model-id", required=True, help="Hub id or local folder of the model's tokenizer")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--validation-share", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--max-bad-share", type=float, default=0.01)
    p.add_argument("--input-dir", default="/opt/ml/processing/input/data")
    p.add_argument("--output-dir", default="/opt/ml/processing/output")
    p.add_argument("--max-rows-per-split", type=int, default=None, help="read at most N rows of each split")
    p.add_argument("--num-proc", type=int, default=None, help="tokenizer threads (default: all cores)")
    p.add_argument("--rows-per-shard", type=int, default=ROWS_PER_SHARD)
    args = p.parse_args(argv)
    if not 0 <= args.validation_share < 1:
        p.error("--validation-share must be in [0, 1)")
    if not 0 <= args.max_bad_share <= 1:
        p.error("--max-bad-share must be in [0, 1]")
    return args


def cpu_count() -> int:
    """Cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole step; returns the statistics (also written to OUTPUT/stats/stats.json)."""
    t0 = time.perf_counter()
    threads = args.num_proc or cpu_count()
    set_env = os.environ.__setitem__ if args.num_proc else os.environ.setdefault
    set_env("RAYON_NUM_THREADS", str(threads))  # read once, when the tokenizer's thread pool starts
    set_env("TOKENIZERS_PARALLELISM", "true" if threads > 1 else "false")
    out = Path(args.output_dir)
    encoder = Encoder(args.model_id, args.max_length)
    sources = source_chunks(args)
    writers = {s: SplitWriter(out / s, args.max_length, args.rows_per_shard) for s in SPLITS}
    stats: dict[str, Any] = {
        "source": args.source, "model_id": args.model_id, "max_length": args.max_length,
        "validation_share": args.validation_share, "seed": args.seed, "max_bad_share": args.max_bad_share,
        "tokenizer_threads": threads, "input": {}, "output": {},
    }
    failures = []
    try:
        for name in ("train", "test"):
            chunks = limit_rows(sources[name], args.max_rows_per_split)
            info = process_split(name, chunks, encoder, writers, args)
            stats["input"][name] = info
            log.info("%s: %s", name, json.dumps(info))
            if info["rows_out"] == 0:
                failures.append(f"{name}: no valid rows (of {info['rows_in']})")
            elif info["bad_share"] > args.max_bad_share:
                reasons = ", ".join(f"{k}={v}" for k, v in info["dropped"].items() if v)
                failures.append(f"{name}: {info['dropped_total']} of {info['rows_in']} rows are bad "
                                f"({info['bad_share']:.2%}: {reasons}), more than --max-bad-share "
                                f"{args.max_bad_share:.2%}")
    finally:
        for w in writers.values():
            w.close()
    stats["output"] = {s: w.stats() for s, w in writers.items()}
    stats["seconds"] = round(time.perf_counter() - t0, 3)
    rows = sum(i["rows_in"] for i in stats["input"].values())
    stats["rows_per_second"] = round(rows / stats["seconds"], 1) if stats["seconds"] else 0.0
    if failures:
        stats["error"] = "; ".join(failures)
    (out / "stats").mkdir(parents=True, exist_ok=True)
    (out / "stats" / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    if failures:
        raise StepError("; ".join(failures))
    return stats


def main(argv: list[str] | None = None) -> int:
    """Run the step; exit status 1 with a one-line message on bad input."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stdout)
    args = parse_args(argv)
    try:
        stats = run(args)
    except StepError as e:
        print(f"preprocess failed: {e}", file=sys.stderr)
        return 1
    log.info("done in %.1f s: %s", stats["seconds"],
             {s: v["rows"] for s, v in stats["output"].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

