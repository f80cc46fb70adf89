"""What a million requests cost on each serving target (`cost --serving`): instance-hour price / (requests per
second per instance x 3600 x utilisation) x 1e6.

Every throughput figure says where it comes from: the CPU one was measured on this project's 2-core development
machine (not on an ml.c5.xlarge), the GPU and Inferentia2 ones are their vendors' published BERT-base figures
(sequence length 128, batch 1, one request a time). Serverless Inference bills a request's duration times its memory
instead of hours. A price the config does not know is shown as unknown, as in
`cost`. Hand-written: no library or AWS API gives a model's throughput per instance type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.prices import SERVERLESS_PER_GB_DATA, SERVERLESS_PER_GB_SECOND


@dataclass(frozen=True)
class Throughput:
    """One serving target's requests per second per instance for BERT-base, and where the figure comes from."""

    target: str
    instance_type: str
    requests_per_second: float
    source: str


# bench_inference.py, 2026-12-03 (docs/benchmarks.md): the served variant of a bert-base-sized model answered one
# review in 16.2 ms (p50) with 2 threads, on a 2-core machine; deploy.model_server_workers (2) processes
CPU_P50_MS, CPU_WORKERS = 16.2, 2
THROUGHPUTS = (
    Throughput("cpu", "ml.c5.xlarge", CPU_WORKERS * 1000 / CPU_P50_MS,
               "measured on this project's 2-core development machine, not on an ml.c5.xlarge: the served "
               f"variant's one-review p50 of {CPU_P50_MS} ms x {CPU_WORKERS} workers (benchmarks/bench_inference.py, "
               "2026-12-03, docs/benchmarks.md)"),
    Throughput("gpu", "ml.g4dn.xlarge", 91.93,
               "published: NVIDIA Tesla T4, BERT-base, seq 128, batch 1, FP16 (TensorFlow, no TensorRT): 91.93 "
               "sentences/s (FP32, served when fp16 loses accuracy: 54.28); NVIDIA/DeepLearningExamples@"
               "729963dd47e7c8bd462ad10bfac7a7b0b604e6dd:TensorFlow/LanguageModeling/BERT/README.md. No A10G (ml.g5) "
               "figure is published"),
    Throughput("neuron", "ml.inf2.xlarge", 1998.21,
               "published: bert-base-uncased, inf2.xlarge, seq 128, batch 1, BF16 matmul autocast (deploy.neuron's "
               "defaults), Neuron 2.26.0: 1,998.21 inferences/s; aws-neuron/aws-neuron-sdk@"
               "81ce03ae261e12925e53437a0f690478e6366155:about-neuron/benchmarks/inf2/latency_data_encoder.csv"),
)


def cost_per_million(price_per_hour: float | None, requests_per_second: float, utilisation: float) -> float | None:
    """USD per million requests at `utilisation` of the instance's throughput; None without a price."""
    if price_per_hour is None:
        return None
    return price_per_hour / (requests_per_second * 3600 * utilisation) * 1e6


REQUEST_BYTES = 2048  # a review in and its answer out, as Serverless Inference bills data processing


def serverless_row(memory_mb: int) -> dict:
    """Serverless Inference with `memory_mb`: billed only while a request runs, so at full utilisation; a request
    lasts the CPU figure's one-review time (an assumption: AWS does not say how many vCPUs a memory size gets)."""
    seconds = CPU_P50_MS / 1000
    hourly = SERVERLESS_PER_GB_SECOND * memory_mb / 1024 * 3600  # an hour of requests back to back
    data = REQUEST_BYTES / 1024**3 * SERVERLESS_PER_GB_DATA * 1e6
    return {"target": "serverless", "instance_type": f"serverless {memory_mb} MB", "requests_per_second":
            round(1 / seconds, 2), "price_per_hour": round(hourly, 4), "utilisation": 1.0,
            "cost_per_million": cost_per_million(hourly, 1 / seconds, 1.0) + data,
            "source": f"the CPU figure's {CPU_P50_MS} ms per review (measured on this project's 2-core development "
                      f"machine) billed at {SERVERLESS_PER_GB_SECOND} USD per GB-second, plus {REQUEST_BYTES} bytes "
                      f"of data per request at {SERVERLESS_PER_GB_DATA} USD per GB (pipeline/prices.py: AWS's "
                      "serverless benchmarking sample, 2022); idle time costs nothing, a request after idle waits "
                      "for a cold start (seconds, by AWS)"}


def serving_costs(price: Callable[[str], float | None], utilisation: float, serverless_mb: int) -> list[dict]:
    """One row per target: its figure, its source, the instance's price (`price`: the config's prices) and the cost
    per million requests; then Serverless Inference with `serverless_mb` of memory."""
    if not 0 < utilisation <= 1:
        raise ValueError(f"--utilisation {utilisation}: expected a share of the throughput in (0, 1]")
    rows = []
    for figure in THROUGHPUTS:
        hourly = price(figure.instance_type)
        rows.append({"target": figure.target, "instance_type": figure.instance_type,
                     "requests_per_second": round(figure.requests_per_second, 2), "price_per_hour": hourly,
                     "utilisation": utilisation,
                     "cost_per_million": cost_per_million(hourly, figure.requests_per_second, utilisation),
                     "source": figure.source})
    return [*rows, serverless_row(serverless_mb)]
