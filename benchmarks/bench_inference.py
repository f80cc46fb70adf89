"""CPU inference: every variant the endpoint can serve against the handlers a user could pick instead.

Handlers, each alone in its own process (ONNX Runtime's worker threads spin after a call and slow whatever runs next
to them in the same process):
- blog: written like the original AWS blog's inference.py: one text per request, padded to 128, fp32;
- transformers-fp32: plain transformers, AutoTokenizer + AutoModelForSequenceClassification, a request's texts
  padded to its longest, under torch.inference_mode;
- onnxruntime-fp32, onnxruntime-int8: the standard export (torch.onnx.export, opset 17) on ONNX Runtime with its
  default session options and the same threads; int8 by onnxruntime.quantization.quantize_dynamic (QInt8);
- endpoint-torch-fp32 (the default), endpoint-torch-int8, endpoint-onnxruntime-fp32, endpoint-onnxruntime-int8:
  training/inference.py with INFERENCE_RUNTIME / INFERENCE_QUANTIZE, the graphs built by
  steps/evaluation/serving.py exactly as the Evaluate step builds them.
Every handler gets JSON request bodies and answers JSON. Each process first imports torch and transformers, as the
inference container's toolkit does before it calls model_fn.

Models: the MiniLM that `trainium-pipeline run --local` trained (--model, default the latest Approved local
version) and a bert-base-sized model (BertConfig(), random weights: speed only, no accuracy).

Measured per handler: cold start (model_fn to the first answer, each process started alone), p50 / p95 latency of
one review per request, texts per second for requests of 32 reviews, resident memory after the run, accuracy on
--rows labelled synthetic reviews (MiniLM), and the cost of one million predictions on --instance-type at its
configured price with `deploy.model_server_workers` processes each as fast as here. Requests go round-robin to
every process, a pause after each (so that spinning threads settle), so that machine noise hits every handler
alike. The table ends with the ratios of the served variant (the one the registered version's environment names)
to onnxruntime-int8.

    python benchmarks/bench_inference.py [--model PATH] [--models minilm bert-base] [--requests 150]
        [--batches 10] [--threads 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_scale import bert_base as random_bert_base  # noqa: E402
from bench_scale import load as import_file  # noqa: E402

PEERS = ("blog", "transformers-fp32", "onnxruntime-fp32", "onnxruntime-int8")
VARIANTS = ("endpoint-torch-fp32", "endpoint-torch-int8", "endpoint-onnxruntime-fp32", "endpoint-onnxruntime-int8")
JSON = "application/json"


# --- handlers: each returns call(texts) -> labels, through JSON request bodies ---------------------------------


def blog(model_dir: Path, threads: int) -> Any:
    """The blog's handler: one text per request, padded to max_length=128, fp32, torch.no_grad."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()

    def request(body: str) -> str:
        inputs = tokenizer(json.loads(body)["inputs"], padding="max_length", max_length=128, truncation=True,
                           return_tensors="pt")
        with torch.no_grad():
            probs = torch.nn.functional.softmax(model(**inputs).logits, dim=1)
        label = int(probs.argmax(dim=1)[0])
        return json.dumps({"label": model.config.id2label[label], "score": float(probs[0][label])})

    return lambda texts: [json.loads(request(json.dumps({"inputs": t})))["label"] for t in texts]


def plain_transformers(model_dir: Path, threads: int) -> Any:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()

    def call(texts: list[str]) -> list[str]:
        inputs = tokenizer(json.loads(json.dumps({"inputs": texts}))["inputs"], padding=True, truncation=True,
                           max_length=128, return_tensors="pt")
        with torch.inference_mode():
            probs = model(**inputs).logits.softmax(-1)
        answer = [{"label": model.config.id2label[int(p.argmax())], "score": float(p.max())} for p in probs]
        return [a["label"] for a in json.loads(json.dumps(answer))]

    return call


def plain_onnxruntime(model_dir: Path, graph: Path, threads: int) -> Any:
    import numpy as np
    import onnxruntime as ort
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    labels = AutoConfig.from_pretrained(str(model_dir)).id2label
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def call(texts: list[str]) -> list[str]:
        inputs = tokenizer(json.loads(json.dumps({"inputs": texts}))["inputs"], padding=True, truncation=True,
                           max_length=128, return_tensors="np")
        logits = session.run(None, {n: inputs[n].astype(np.int64) for n in names})[0]
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        answer = [{"label": labels[int(p.argmax())], "score": float(p.max())} for p in probs]
        return [a["label"] for a in json.loads(json.dumps(answer))]

    return call


def endpoint(model_dir: Path, runtime: str, quantize: str, threads: int) -> Any:
    """training/inference.py as the container calls it, on the variant the environment names."""
    os.environ.update(INFERENCE_RUNTIME=runtime, INFERENCE_QUANTIZE=quantize, INFERENCE_THREADS=str(threads))
    handler = import_file(model_dir / "code" / "inference.py", "inference")
    model = handler.model_fn(str(model_dir))
    if model.variant != f"{runtime}-{'int8' if quantize == 'int8' else 'fp32'}":
        raise RuntimeError(f"asked for {runtime} {quantize}, the handler serves {model.variant}")

    def call(texts: list[str]) -> list[str]:
        body = json.dumps({"inputs": texts})
        return [a["label"] for a in json.loads(handler.output_fn(handler.predict_fn(handler.input_fn(body, JSON),
                                                                                     model), JSON))]

    return call


def make_handler(name: str, model_dir: Path, peer_graphs: Path, threads: int) -> Any:
    if name == "blog":
        return blog(model_dir, threads)
    if name == "transformers-fp32":
        return plain_transformers(model_dir, threads)
    if name.startswith("onnxruntime-"):
        return plain_onnxruntime(model_dir, peer_graphs / f"{name.split('-')[1]}.onnx", threads)
    _, runtime, bits = name.split("-")
    return endpoint(model_dir, runtime, "int8" if bits == "int8" else "none", threads)


def worker(conn: Any, name: str, model_dir: str, peer_graphs: str, threads: int) -> None:
    """One handler in its own process: answers ("one" | "batch", texts) with seconds, ("labels", texts) with labels,
    ("rss",) with resident MB."""
    import psutil
    import torch
    import transformers  # noqa: F401  (imported by the container's toolkit before model_fn)

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    call = make_handler(name, Path(model_dir), Path(peer_graphs), threads)
    call(["the first answer after loading"])
    conn.send(time.perf_counter() - t0)
    while True:
        op, *rest = conn.recv()
        if op == "stop":
            return
        if op == "rss":
            conn.send(psutil.Process().memory_info().rss / 2**20)
        elif op == "labels":
            conn.send(call(rest[0]))
        else:
            t0 = time.perf_counter()
            call(rest[0])
            conn.send(time.perf_counter() - t0)


# --- models and graphs -----------------------------------------------------------------------------------------


def latest_local_model(root: Path) -> tuple[Path, dict[str, str]]:
    """The latest Approved version of the local registry: its model data and serving environment."""
    from pipeline.config import load_config
    from pipeline.local.registry import Registry

    cfg = load_config(ROOT / "pipeline.yaml")
    registry = root / "registry.sqlite"
    version = Registry(registry).latest_approved(cfg.pipeline.model_package_group) if registry.exists() else None
    if version is None:
        sys.exit(f"no Approved model in {registry}: run `trainium-pipeline run --local` first, or pass --model")
    return Path(version.model_data), dict(version.environment)


def served_variant(environment: dict[str, str]) -> str:
    """The handler name of the variant a registered environment serves (endpoint-onnxruntime-int8 without one)."""
    if not environment:
        return "endpoint-onnxruntime-int8"
    bits = "int8" if environment.get("INFERENCE_QUANTIZE") == "int8" else "fp32"
    return f"endpoint-{environment.get('INFERENCE_RUNTIME', 'torch')}-{bits}"


def unpack(path: Path, dest: Path) -> Path:
    if path.is_dir():
        shutil.copytree(path, dest)
    else:
        with tarfile.open(path) as archive:
            archive.extractall(dest, filter="data")
    shutil.copy(ROOT / "training" / "inference.py", dest / "code" / "inference.py")
    return dest


def bert_base(dest: Path, tokenizer_from: Path) -> Path:
    """bert-base's shape (BertConfig()), random weights, with the MiniLM's tokenizer (the same 30522 WordPieces)."""
    random_bert_base(dest, tokenizer_from)
    (dest / "code").mkdir()
    shutil.copy(ROOT / "training" / "inference.py", dest / "code" / "inference.py")
    return dest


def build_graphs(model_dir: Path, peer_dir: Path) -> None:
    """The endpoint's graphs (model_dir/onnx/, as the Evaluate step builds them) and the standard export's."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from steps.evaluation import serving

    serving.build(model_dir)
    peer_dir.mkdir()
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    inputs = AutoTokenizer.from_pretrained(str(model_dir))(["a review of a product"], return_tensors="pt")
    names = ["input_ids", "attention_mask", "token_type_ids"]  # in forward()'s order: the arguments are positional
    torch.onnx.export(model, tuple(inputs[n] for n in names), str(peer_dir / "fp32.onnx"), input_names=names,
                      output_names=["logits"], opset_version=17, dynamo=False,
                      dynamic_axes={**{n: {0: "batch", 1: "sequence"} for n in names}, "logits": {0: "batch"}})
    quantize_dynamic(str(peer_dir / "fp32.onnx"), str(peer_dir / "int8.onnx"), weight_type=QuantType.QInt8)


def reviews(count: int) -> list[tuple[str, int]]:
    from steps.tokenize import reviews as generator

    rng = random.Random("bench-inference")
    pairs = [generator.synthetic_review(rng, i % 2) for i in range(count)]
    return [(f"{title}. {content}" if title else content, i % 2) for i, (title, content) in enumerate(pairs)]


# --- measuring -------------------------------------------------------------------------------------------------


def measure(model_dir: Path, peer_dir: Path, args: argparse.Namespace, labelled: bool) -> dict[str, dict]:
    """Every handler on this model, each in its own process, round-robin."""
    data = reviews(args.rows)
    texts = [t for t, _ in data]
    context = multiprocessing.get_context("spawn")
    pipes, processes, cold = {}, [], {}
    for name in PEERS + VARIANTS:  # started one at a time: each cold start alone on the machine
        parent, child = context.Pipe()
        process = context.Process(target=worker, args=(child, name, str(model_dir), str(peer_dir), args.threads))
        process.start()
        processes.append(process)
        pipes[name], cold[name] = parent, parent.recv()

    def ask(name: str, *message: Any) -> Any:
        pipes[name].send(message)
        answer = pipes[name].recv()
        time.sleep(args.pause)
        return answer

    names = list(pipes)
    accuracy: dict[str, float | None] = dict.fromkeys(names)
    if labelled:
        for name in names:
            predicted = [label for s in range(0, len(texts), 32) for label in ask(name, "labels", texts[s:s + 32])]
            accuracy[name] = sum((p == "positive") == bool(y) for p, (_, y) in zip(predicted, data, strict=True))
            accuracy[name] /= len(data)
    latency: dict[str, list[float]] = {name: [] for name in names}
    busy = dict.fromkeys(names, 0.0)
    for i in range(10 + args.requests):  # 10 warm-up rounds
        for name in names[i % len(names):] + names[: i % len(names)]:  # a rotating order
            seconds = ask(name, "one", [texts[i % len(texts)]])
            if i >= 10:
                latency[name].append(seconds)
    for b in range(args.batches):
        batch = [texts[(b * 32 + j) % len(texts)] for j in range(32)]
        for name in names[b % len(names):] + names[: b % len(names)]:
            busy[name] += ask(name, "batch", batch)
    results = {}
    for name in names:
        ordered = sorted(latency[name])
        results[name] = {
            "p50_ms": ordered[len(ordered) // 2] * 1000,
            "p95_ms": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1000,
            "batch32_texts_per_sec": args.batches * 32 / busy[name],
            "cold_start_s": cold[name],
            "rss_mb": ask(name, "rss"),
            "accuracy": accuracy[name],
        }
        pipes[name].send(("stop",))
    for process in processes:
        process.join(timeout=60)
    return results


def report(title: str, handlers: dict[str, dict], served: str, price: float | None, workers: int,
           args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{title}: {args.threads} threads per process, {args.requests} single reviews, "
                        f"{args.batches} requests of 32")
    for column in ("handler", "p50 ms", "p95 ms", "texts/s (32)", "cold start s", "RSS MB", "accuracy",
                   f"$ / 1M ({args.instance_type})"):
        table.add_column(column, justify="left" if column == "handler" else "right")
    for name, r in handlers.items():
        cost = price / 3600 / (r["batch32_texts_per_sec"] * workers) * 1e6 if price else None
        r["cost_per_million_usd"] = cost
        table.add_row(name + (" (served)" if name == served else ""), f"{r['p50_ms']:.1f}", f"{r['p95_ms']:.1f}",
                      f"{r['batch32_texts_per_sec']:.1f}", f"{r['cold_start_s']:.2f}", f"{r['rss_mb']:.0f}",
                      "-" if r["accuracy"] is None else f"{r['accuracy']:.4f}",
                      "unknown" if cost is None else f"{cost:.3f}")
    Console().print(table)
    peer, ours = handlers["onnxruntime-int8"], handlers[served]
    print(f"{served} vs onnxruntime-int8: p50 {peer['p50_ms'] / ours['p50_ms']:.2f}x faster, batch-32 throughput "
          f"{ours['batch32_texts_per_sec'] / peer['batch32_texts_per_sec']:.2f}x (>= 1.00 is at least as fast)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="trained model.tar.gz or folder (default: latest local Approved)")
    p.add_argument("--root", type=Path, default=ROOT / ".local", help="local root of run --local")
    p.add_argument("--models", nargs="+", choices=("minilm", "bert-base"), default=["minilm", "bert-base"])
    p.add_argument("--served", help="the endpoint's variant (default: from the registered environment, else "
                                    "endpoint-onnxruntime-int8)")
    p.add_argument("--requests", type=int, default=150, help="single-review requests per handler")
    p.add_argument("--batches", type=int, default=10, help="requests of 32 reviews per handler")
    p.add_argument("--rows", type=int, default=400, help="labelled reviews for accuracy")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads of every handler")
    p.add_argument("--pause", type=float, default=0.02, help="seconds between two requests")
    p.add_argument("--instance-type", default="ml.c5.xlarge", help="instance whose price prices the predictions")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pipeline.config import load_config

    cfg = load_config(ROOT / "pipeline.yaml")
    price, workers = cfg.prices.price(args.instance_type), cfg.deploy.model_server_workers
    environment = {}
    if args.model is None:
        args.model, environment = latest_local_model(args.root.resolve())
    served = args.served or served_variant(environment)
    results: dict[str, Any] = {"threads": args.threads, "instance_type": args.instance_type, "price_per_hour": price,
                               "workers_per_instance": workers}
    with tempfile.TemporaryDirectory() as scratch:
        minilm = unpack(args.model, Path(scratch) / "minilm")
        for name in args.models:
            model_dir = minilm if name == "minilm" else bert_base(Path(scratch) / name, minilm)
            build_graphs(model_dir, Path(scratch) / f"{name}-peer")
            handlers = measure(model_dir, Path(scratch) / f"{name}-peer", args, labelled=name == "minilm")
            report(name, handlers, served, price, workers, args)
            results[name] = {"handlers": handlers, "served": served}
    if price:
        print(f"cost per 1M predictions = {price} USD/h / 3600 / ({workers} workers x texts/s at batch 32) x 1e6")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
