"""Checkpoint write on the CPU: train.py's save_checkpoint (SHA-256 computed while writing) against the previous
way (torch.save to the path, then the file read again for its SHA-256), on a state the size of a model plus its
AdamW moments (bert-base: 110 M parameters, about 1.3 GB). Each way --repeats times, alternating; the medians.

    python benchmarks/bench_checkpoint.py [--parameters 110e6] [--repeats 3]
"""

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

TRAIN = Path(__file__).resolve().parents[1] / "training" / "train.py"


def load_train():
    spec = importlib.util.spec_from_file_location("train", TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def previous_way(train, folder: Path, step: int, state: dict) -> None:
    """torch.save to the path, then a second read of the file for the marker's SHA-256."""
    path = folder / "checkpoint.pt"
    torch.save(state, path)
    json.dumps({"step": step, "bytes": path.stat().st_size, "sha256": train._sha256(path)})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parameters", type=float, default=110e6)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    train = load_train()
    n = int(args.parameters) // 3
    state = {"model": {"w": torch.randn(n)}, "optimizer": {"m": torch.randn(n), "v": torch.randn(n)}, "step": 1}
    times: dict[str, list[float]] = {"previous": [], "save_checkpoint": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for step in range(args.repeats):
            start = time.perf_counter()
            previous_way(train, folder, step, state)
            times["previous"].append(time.perf_counter() - start)
            start = time.perf_counter()
            train.save_checkpoint(folder, step, state)
            times["save_checkpoint"].append(time.perf_counter() - start)
    gb = 4 * 3 * n / 1e9
    for name, seconds in times.items():
        print(f"{name:16s} {statistics.median(seconds):7.2f} s  ({gb:.2f} GB)")


if __name__ == "__main__":
    main()
