"""Tokenize step: read reviews, validate them, tokenize them, write Parquet shards and stats.

Sources (--source): sample[:N], s3://... (staged in --input-dir), a local folder or a Hub dataset: see readers.py.

Validation: rows in are the physical records of the input; every bad row is dropped and counted under its first
failing reason (readers.DROP_REASONS, see readers.py). If the bad share of a split exceeds --max-bad-share, the step
fails (after writing stats.json) with one line that says where the first row of each reading problem is.

Tokenization rule (the model's fast tokenizer, no padding):
  * with a title: the sentence pair "[CLS] title [SEP] content [SEP]" (token_type_ids 0 for the first three
    parts, 1 for content and the last [SEP]). If it is longer than --max-length, only the content is cut
    (truncation="only_second"), so a long review keeps its title. Only when the title leaves no room for
    content (title tokens + 3 >= max_length) are both cut longest-first.
  * without a title (empty or whitespace): the single sequence "[CLS] content [SEP]", token_type_ids all 0.

Labels: --labels names them in id order, or (null) the train split's labels do, sorted (a first pass reads them);
then a test label the train split lacks is refused, naming it. Every shard's schema metadata holds the names
(LABELS_KEY), from which train.py names the model's classes.

The validation split is taken from the valid train rows, stratified by label: of the k-th valid train row of a
class, a row goes to validation when floor((k + 1) * share + u) > floor(k * share + u), u a seeded offset of that
class, so each class gives --validation-share of its rows (to one row), spread evenly over the input, whatever the
chunk sizes. Output: OUTPUT/{train,validation,test}/part-NNNNN.parquet with columns
input_ids list<int32>, token_type_ids list<int8>, label int32, length int32, and in the test split also the row's
original text, title string (null without one) and content string, which the endpoint test sends as they are;
OUTPUT/stats/stats.json.
Everything streams in chunks, so memory does not grow with the size of the input.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from steps.contract import LABELS_KEY, SPLITS, TEXT_COLUMNS
from steps.tokenize.readers import DROP_REASONS, Drops, StepError, found_labels, limit_rows, source_chunks, validate

log = logging.getLogger("preprocess")

SCHEMA = pa.schema([
    ("input_ids", pa.list_(pa.int32())),
    ("token_type_ids", pa.list_(pa.int8())),
    ("label", pa.int32()),
    ("length", pa.int32()),
])
TEST_SCHEMA = pa.schema([*SCHEMA, *(pa.field(name, pa.string()) for name in TEXT_COLUMNS)])
ROWS_PER_SHARD = 250_000

# ----------------------------------------------------------------------------------------------------------
# tokenization


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
        if max_length > tok.model_max_length:  # rows longer than the model's positions would fail Train later
            raise StepError(f"--max-length {max_length} exceeds the model's limit {tok.model_max_length} "
                            "(its tokenizer's model_max_length): use at most that")
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


def validation_mask(labels: np.ndarray, seen: np.ndarray, share: float, seed: int) -> np.ndarray:
    """True for the rows (valid train rows in input order, by label id) that go to validation, stratified: the k-th
    row of class c goes when floor((k + 1) * share + u_c) > floor(k * share + u_c), u_c in [0, 1) drawn from `seed`
    and c (SplitMix64). `seen`: rows of each class before these; updated."""
    gamma = np.uint64(0x9E3779B97F4A7C15)
    mask = np.zeros(len(labels), bool)
    for c in np.unique(labels):
        rows = np.flatnonzero(labels == c)
        with np.errstate(over="ignore"):
            x = _mix64(np.array([seed % (1 << 64)], np.uint64) * gamma + np.uint64(c + 1) * gamma)[0]
        u = float(x >> np.uint64(11)) / float(1 << 53)
        k = seen[c] + np.arange(len(rows), dtype=np.float64)
        mask[rows] = np.floor((k + 1) * share + u) > np.floor(k * share + u)
        seen[c] += len(rows)
    return mask


# ----------------------------------------------------------------------------------------------------------
# output


@dataclass
class SplitWriter:
    """Writes one split as Parquet shards of at most rows_per_shard rows and keeps its statistics."""

    folder: Path
    max_length: int
    rows_per_shard: int = ROWS_PER_SHARD
    schema: pa.Schema = SCHEMA
    rows: int = 0
    truncated: int = 0
    shards: int = 0
    names: list[str] = field(kw_only=True)  # the label names, in id order
    labels: np.ndarray = field(init=False)  # rows per label id
    hist: np.ndarray = field(init=False)  # count of rows per token length
    _writer: pq.ParquetWriter | None = field(default=None, init=False)
    _in_shard: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for old in self.folder.glob("part-*.parquet"):  # shards of an earlier run would mix in
            old.unlink()
        self.hist = np.zeros(self.max_length + 1, np.int64)
        self.labels = np.zeros(len(self.names), np.int64)
        self.schema = self.schema.with_metadata({LABELS_KEY: json.dumps(self.names)})

    def write(self, table: pa.Table, truncated: np.ndarray) -> None:
        self.rows += len(table)
        self.truncated += int(truncated.sum())
        lengths = table["length"].to_numpy()
        self.hist += np.bincount(lengths, minlength=self.max_length + 1)[: self.max_length + 1]
        self.labels += np.bincount(table["label"].to_numpy(), minlength=len(self.names))
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
        self._writer = pq.ParquetWriter(self.folder / f"part-{self.shards:05d}.parquet", self.schema)
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
        return {"rows": n, "shards": self.shards,
                "labels": {name: int(count) for name, count in zip(self.names, self.labels, strict=True)},
                "token_length": pct, "truncated": self.truncated,
                "truncated_share": round(self.truncated / n, 6) if n else 0.0}


def with_text(table: pa.Table, kept: pa.Table) -> pa.Table:
    """The tokenized rows with their original title and content (`kept`: the validated rows, in the same order)."""
    for name in TEXT_COLUMNS:
        table = table.append_column(name, kept[name].combine_chunks().cast(pa.string()))
    return table


@dataclass
class Chunk:
    """One chunk of a source split after validation; encodings is filled in by a worker thread."""

    rows: int  # input rows, those dropped while reading included
    dropped: dict[str, int]
    notes: dict[str, str]  # reason -> where the first row dropped while reading is
    kept: pa.Table | None = None
    job: Any = None


def encoded(chunks: Iterator[tuple[pa.Table | None, Drops]], encoder: Encoder, names: list[str],
            unseen: str | None = None) -> Iterator[tuple[Chunk, list]]:
    """Validated chunks with their encodings. The next chunk is tokenized in a thread (the tokenizer
    releases the GIL) while the caller converts and writes the current one."""
    with ThreadPoolExecutor(1) as pool:
        pending: deque[Chunk] = deque()
        for table, drops in chunks:
            chunk = Chunk(rows=drops.total, dropped=dict(drops.counts), notes=drops.notes)
            if table is not None:
                chunk.kept, _, counts, notes = validate(table, names, unseen)
                chunk.dropped.update(counts)
                chunk.notes = notes | chunk.notes
                chunk.rows += len(table)
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
                  args: argparse.Namespace, names: list[str], unseen: str | None = None) -> dict[str, Any]:
    """Validate, tokenize and write one source split (train also feeds validation); return its input stats."""
    rows_in, dropped, notes = 0, dict.fromkeys(DROP_REASONS, 0), {}
    seen = np.zeros(len(names), np.int64)  # valid train rows of each class so far (the validation split's strata)
    t0 = last_log = time.perf_counter()
    cpu0 = time.process_time()
    for chunk, encodings in encoded(chunks, encoder, names, unseen):
        for reason, n in chunk.dropped.items():
            dropped[reason] += n
        notes = chunk.notes | notes
        if encodings:
            is_pair = chunk.kept["title"].is_valid().to_numpy(zero_copy_only=False)
            table, truncated = encoder.to_table(encodings, chunk.kept["label"].combine_chunks(), is_pair)
            if name == "train" and args.validation_share > 0:
                to_val = validation_mask(table["label"].to_numpy(), seen, args.validation_share, args.seed)
                for split, mask in (("validation", to_val), ("train", ~to_val)):
                    idx = np.flatnonzero(mask)
                    if len(idx):
                        writers[split].write(table.take(pa.array(idx)), truncated[idx])
            else:
                writers[name].write(with_text(table, chunk.kept) if name == "test" else table, truncated)
        rows_in += chunk.rows
        if time.perf_counter() - last_log > 30:
            last_log = time.perf_counter()
            log.info("%s: %d rows read, %.0f rows/s", name, rows_in, rows_in / (last_log - t0))
    bad, seconds, cpu = sum(dropped.values()), time.perf_counter() - t0, time.process_time() - cpu0
    return {"rows_in": rows_in, "rows_out": rows_in - bad, "dropped": dropped, "dropped_total": bad,
            "bad_share": round(bad / rows_in, 6) if rows_in else 0.0, "notes": notes,
            "seconds": round(seconds, 3), "cpu_seconds": round(cpu, 3)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of the step (see the contract)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    given = p.add_argument_group("passed by the Tokenize step (required: their defaults live in the config alone)")
    given.add_argument("--source", required=True,
                       help="sample[:N], s3://... (staged in --input-dir), a local folder, or a Hub dataset name")
    given.add_argument("--model-id", required=True, help="Hub id or local folder of the model's tokenizer")
    given.add_argument("--max-length", type=int, required=True)
    given.add_argument("--validation-share", type=float, required=True)
    given.add_argument("--seed", type=int, required=True)
    given.add_argument("--max-bad-share", type=float, required=True)
    given.add_argument("--text-columns", type=json.loads, required=True,
                       help='JSON list of one text column or a pair, e.g. ["title", "content"]')
    given.add_argument("--label-column", required=True)
    given.add_argument("--labels", type=json.loads, required=True,
                       help='JSON list of the label names in id order, or null: those of the train split')
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
    if not (isinstance(args.text_columns, list) and 1 <= len(args.text_columns) <= 2):
        p.error("--text-columns must be a JSON list of one or two column names")
    if args.labels is not None and not (isinstance(args.labels, list) and len(args.labels) >= 2):
        p.error("--labels must be null or a JSON list of two or more label names")
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
    names = [str(name) for name in args.labels or found_labels(limit_rows(source_chunks(args)["train"],
                                                                          args.max_rows_per_split))]
    if len(names) < 2:
        raise StepError(f"the train split's labels: {names or 'none'}: a classifier needs two or more classes")
    sources = source_chunks(args)
    writers = {s: SplitWriter(out / s, args.max_length, args.rows_per_shard, TEST_SCHEMA if s == "test" else SCHEMA,
                              names=names) for s in SPLITS}
    stats: dict[str, Any] = {
        "source": args.source, "model_id": args.model_id, "max_length": args.max_length,
        "validation_share": args.validation_share, "seed": args.seed, "max_bad_share": args.max_bad_share,
        "tokenizer_threads": threads, "labels": names, "input": {}, "output": {},
    }
    failures = []
    try:
        for name in ("train", "test"):
            chunks = limit_rows(sources[name], args.max_rows_per_split)
            info = process_split(name, chunks, encoder, writers, args, names,
                                 unseen="train" if name == "test" and not args.labels else None)
            stats["input"][name] = info
            log.info("%s: %s", name, json.dumps(info))
            where = "".join(f"; {note}" for note in info["notes"].values())
            reasons = ", ".join(f"{k}={v}" for k, v in info["dropped"].items() if v)
            if info["rows_out"] == 0:
                of = f"{info['rows_in']}: {reasons}" if reasons else info["rows_in"]
                failures.append(f"{name}: no valid rows (of {of}){where}")
            elif info["bad_share"] > args.max_bad_share:
                failures.append(f"{name}: {info['dropped_total']} of {info['rows_in']} rows are bad "
                                f"({info['bad_share']:.2%}: {reasons}), more than --max-bad-share "
                                f"{args.max_bad_share:.2%}{where}")
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

