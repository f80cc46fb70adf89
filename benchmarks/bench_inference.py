"""CPU inference: training/inference.py (fp32 and int8) vs a handler written like the original AWS blog's.

The baseline handler (below, `Blog*`) classifies one text per request, pads every text to 128 tokens and runs fp32
under `torch.no_grad`, as the blog's inference.py does. Ours is the project's handler, called through the same
input_fn -> predict_fn -> output_fn path the container uses, once as fp32 and once with INFERENCE_QUANTIZE=int8.

Measured in one run, interleaved so that machine noise hits every handler alike:
- latency of one review per request: p50 / p95 / p99 over --requests requests;
- throughput for batches of --batch-size reviews: ours gets one request holding the batch, the baseline (one text per
  request) gets --batch-size requests; texts per second;
- accuracy of each handler on --rows labelled synthetic reviews (the same generator as `sample:N` data);
- cost of one million predictions on the endpoint's instance at its configured on-demand price, from the throughput.

The model is a trained one: --model (model.tar.gz or a folder), by default the latest Approved version of the local
registry that `trainium-pipeline run --local` fills. Run (about a minute on 2 cores):

    python benchmarks/bench_inference.py [--model PATH] [--requests 200] [--batch-size 32] [--threads N]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# --- the baseline: written like the blog's inference.py ------------------------------------------------------


def blog_model_fn(model_dir: str):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    model.eval()
    return model, tokenizer


def blog_input_fn(request_body, request_content_type):
    if request_content_type == "application/json":
        return json.loads(request_body)["inputs"]
    raise ValueError(f"unsupported content type {request_content_type}")


def blog_predict_fn(input_data, model_and_tokenizer):
    import torch

    model, tokenizer = model_and_tokenizer
    inputs = tokenizer(input_data, padding="max_length", max_length=128, truncation=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits
    probs = torch.nn.functional.softmax(logits, dim=1)
    label = int(probs.argmax(dim=1)[0])
    return {"label": model.config.id2label[label], "score": float(probs[0][label])}


def blog_output_fn(prediction, accept):
    return json.dumps(prediction)


# --- helpers ---------------------------------------------------------------------------------------------------


def latest_local_model(root: Path) -> Path:
    from pipeline.config import load_config
    from pipeline.local.registry import Registry

    cfg = load_config(ROOT / "pipeline.yaml")
    registry = root / "registry.sqlite"
    version = Registry(registry).latest_approved(cfg.pipeline.model_package_group) if registry.exists() else None
    if version is None:
        sys.exit(f"no Approved model in {registry}: run `trainium-pipeline run --local` first, or pass --model")
    return Path(version.model_data)


def model_folder(path: Path, scratch: Path) -> Path:
    if path.is_dir():
        return path
    with tarfile.open(path) as archive:
        archive.extractall(scratch, filter="data")
    return scratch


def import_file(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_handler(model_dir: Path, quantize: str):
    os.environ["INFERENCE_QUANTIZE"] = quantize
    module = import_file(ROOT / "training" / "inference.py", f"inference_{quantize}")
    return module, module.model_fn(str(model_dir))


def reviews(count: int, seed: str) -> list[tuple[str, int]]:
    generator = import_file(ROOT / "steps" / "reviews.py", "reviews_bench")
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        label = i % 2
        title, content = generator.synthetic_review(rng, label)
        rows.append((f"{title}. {content}" if title else content, label))
    return rows


def price_per_hour(instance_type: str) -> float | None:
    from pipeline.config import load_config

    return load_config(ROOT / "pipeline.yaml").prices.price(instance_type)


def percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    mean = statistics.fmean(ordered) * 1000
    return {"p50_ms": pick(0.50), "p95_ms": pick(0.95), "p99_ms": pick(0.99), "mean_ms": mean}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="model.tar.gz or model folder (default: latest local Approved)")
    p.add_argument("--root", type=Path, default=ROOT / ".local", help="local root of run --local")
    p.add_argument("--requests", type=int, default=200, help="single-review requests per handler")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=10, help="batches per handler for throughput")
    p.add_argument("--rows", type=int, default=400, help="labelled reviews for accuracy")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch intra-op threads")
    p.add_argument("--instance-type", default="ml.c5.xlarge", help="instance whose price prices the predictions")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()

    import torch

    os.environ["INFERENCE_THREADS"] = str(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as scratch:
        folder = model_folder(args.model or latest_local_model(args.root.resolve()), Path(scratch))
        fp32_module, fp32 = load_handler(folder, "none")
        int8_module, int8 = load_handler(folder, "int8")
        blog = blog_model_fn(str(folder))
    torch.set_num_threads(args.threads)

    def ours(module, model):
        def call(texts: list[str]) -> list[dict]:
            body = json.dumps({"inputs": texts if len(texts) > 1 else texts[0]})
            return json.loads(module.output_fn(module.predict_fn(module.input_fn(body, "application/json"), model),
                                               "application/json"))
        return call

    def baseline(texts: list[str]) -> list[dict]:
        out = []
        for text in texts:  # one request per text
            body = json.dumps({"inputs": text})
            out.append(json.loads(blog_output_fn(blog_predict_fn(blog_input_fn(body, "application/json"), blog),
                                                 "application/json")))
        return out

    handlers = {"blog baseline": baseline, "ours fp32": ours(fp32_module, fp32), "ours int8": ours(int8_module, int8)}
    data = reviews(args.rows, "bench-inference")
    texts = [t for t, _ in data]

    accuracy = {}
    for name, call in handlers.items():
        predicted = []
        for start in range(0, len(texts), args.batch_size):
            predicted += call(texts[start:start + args.batch_size])
        right = [(r["label"] == "positive") == bool(y) for r, (_, y) in zip(predicted, data, strict=True)]
        accuracy[name] = sum(right) / len(data)

    for call in handlers.values():  # warm up
        for text in texts[:10]:
            call([text])
    latency: dict[str, list[float]] = {name: [] for name in handlers}
    for i in range(args.requests):
        for name, call in handlers.items():
            t0 = time.perf_counter()
            call([texts[i % len(texts)]])
            latency[name].append(time.perf_counter() - t0)
    busy: dict[str, float] = dict.fromkeys(handlers, 0.0)
    for b in range(args.batches):
        batch = [texts[(b * args.batch_size + j) % len(texts)] for j in range(args.batch_size)]
        for name, call in handlers.items():
            t0 = time.perf_counter()
            call(batch)
            busy[name] += time.perf_counter() - t0

    price = price_per_hour(args.instance_type)
    results = {}
    base = "blog baseline"
    for name in handlers:
        throughput = args.batches * args.batch_size / busy[name]
        results[name] = {
            **percentiles(latency[name]),
            "throughput_per_s": throughput,
            "accuracy": accuracy[name],
            "cost_per_million_usd": price / 3600 / throughput * 1e6 if price else None,
        }
    for name in handlers:
        results[name]["p50_speedup"] = results[base]["p50_ms"] / results[name]["p50_ms"]
        results[name]["throughput_ratio"] = results[name]["throughput_per_s"] / results[base]["throughput_per_s"]
        results[name]["accuracy_delta_points"] = (results[name]["accuracy"] - results[base]["accuracy"]) * 100

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"CPU inference, {args.threads} threads, baseline = blog baseline "
                        f"({args.requests} single requests, {args.batches} batches of {args.batch_size}, "
                        f"{args.rows} rows for accuracy)")
    for column in ("handler", "p50 ms", "p95 ms", "p99 ms", "p50 speedup", "texts/s (batch)", "throughput ratio",
                   "accuracy", f"$ / 1M ({args.instance_type})"):
        table.add_column(column, justify="left" if column == "handler" else "right")
    for name, r in results.items():
        table.add_row(name, f"{r['p50_ms']:.1f}", f"{r['p95_ms']:.1f}", f"{r['p99_ms']:.1f}",
                      f"{r['p50_speedup']:.2f}x", f"{r['throughput_per_s']:.1f}", f"{r['throughput_ratio']:.2f}x",
                      f"{r['accuracy']:.4f}",
                      f"{r['cost_per_million_usd']:.2f}" if r["cost_per_million_usd"] is not None else "unknown")
    Console().print(table)
    if price:
        print(f"cost per 1M predictions = {price} USD/h / 3600 / throughput * 1e6, at the batch throughput measured "
              f"here with {args.threads} threads")
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "price_per_hour": price, "results": results},
                                        indent=2))


if __name__ == "__main__":
    main()
