"""The tuned peer of the Train step: the plain PyTorch loop a user could write instead (bench_train_peer.py runs it).

Hugging Face BERT with SDPA attention, bf16 autocast (CUDA), AdamW(fused=True), gradient clipping and a linear
schedule like train.py, optionally torch.compile; the whole data set on the device, every row padded to the
maximum length. Prints one JSON line: steady-state samples/s (the log intervals after the first), the seconds the
first interval took beyond that rate (compile and warm-up), model TFLOP/s counted from each row's real length
(train.py's Throughput and model_flops, as for train.py) and peak device memory.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from train import BatchTokens, Throughput  # noqa: E402  (both contenders are measured by the same code)

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--model", required=True)
p.add_argument("--data", required=True, help="a Parquet split (input_ids, token_type_ids, label)")
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--steps", type=int, default=300)
p.add_argument("--log-interval", type=int, default=50)
p.add_argument("--max-length", type=int, default=128)
p.add_argument("--compile", action="store_true")
args = p.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.backends.cuda.matmul.allow_tf32 = True
torch.manual_seed(0)
table = pq.read_table(args.data)
rows = [r[: args.max_length] for r in table.column("input_ids").to_pylist()]
types = [r[: args.max_length] for r in table.column("token_type_ids").to_pylist()]
lengths = np.array([len(r) for r in rows])
input_ids = torch.zeros(len(rows), args.max_length, dtype=torch.long)
token_type_ids = torch.zeros_like(input_ids)
for i, (r, t) in enumerate(zip(rows, types, strict=True)):
    input_ids[i, : len(r)], token_type_ids[i, : len(t)] = torch.tensor(r), torch.tensor(t)
attention_mask = (torch.arange(args.max_length)[None, :] < torch.tensor(lengths)[:, None]).long()
labels = torch.tensor(table.column("label").to_numpy().astype(np.int64))
data = [t.to(device) for t in (input_ids, token_type_ids, attention_mask, labels)]

model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=2, attn_implementation="sdpa")
model.to(device).train()
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01, fused=True)
schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / args.steps)
step_model = torch.compile(model) if args.compile else model
order = torch.randperm(len(rows) // args.batch_size * args.batch_size, device=device).view(-1, args.batch_size)
order_host = order.cpu().numpy()
throughput = Throughput(model.config, world_size=1)
for step in range(args.steps):
    ids, tts, mask, y = (t[order[step % len(order)]] for t in data)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = step_model(input_ids=ids, token_type_ids=tts, attention_mask=mask).logits
    loss = F.cross_entropy(logits.float(), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)
    throughput.add(args.batch_size, BatchTokens.of(lengths[order_host[step % len(order)]], args.max_length))
    if (step + 1) % args.log_interval == 0:
        loss.item()  # the host sync that closes the interval
        throughput.interval()
stats = throughput.stats()
print(json.dumps({
    **{k: stats[k] for k in ("samples_per_sec", "warmup_s", "model_tflops_per_sec")},
    "peak_device_memory_gb": torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else None,
    "padding_efficiency": float(lengths.mean() / args.max_length),
    "device": device.type,
}))
