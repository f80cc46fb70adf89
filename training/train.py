"""Fine-tune a BERT-style encoder for binary sentiment classification (the pipeline's Train step).

Launched by torchrun, as the SageMaker training toolkit does for ``torch_distributed``:

    torchrun --nnodes 1 --nproc_per_node 2 train.py --model-id sentence-transformers/all-MiniLM-L6-v2 \\
        --epochs 1 --batch-size 32 --train-dir data/train --validation-dir data/validation \\
        --model-dir out/model --checkpoint-dir out/checkpoints

Device: XLA (Trainium NeuronCores) when torch_xla imports, else CUDA, else CPU; process group xla, nccl or
gloo. Data parallel: one process per device; DDP on CUDA/CPU, gradient all-reduce in the step on XLA.

Batches. The training order is a pure function of (seed, epoch): the epoch's permutation is cut into
mega-batches of 64 batches, each mega-batch is sorted by length and cut into batches (so a batch holds similar
lengths), the batches are shuffled, and rank r takes its contiguous share. Partial batches are dropped. On
CUDA/CPU a batch is padded to its longest row (dynamic padding); on XLA to the next of a few fixed lengths
(32, 64, 128, ..., max length), so the number of compiled graphs is bounded by the number of buckets.

Randomness. Dropout is reseeded at each optimizer step from (seed, step, rank), so a resumed run replays
exactly the same masks without having to gather every rank's generator state into the checkpoint.

Checkpoints. Every --checkpoint-interval steps, and when SIGTERM arrives (the flag is agreed between ranks at
the next log interval), rank 0 writes ``step-XXXXXXXX/checkpoint.pt`` (model, optimizer, scheduler, step) into
a temporary folder, renames it, then writes the ``COMPLETE`` marker. A start resumes from the newest complete
checkpoint and skips the batches that step already consumed, so an interrupted and resumed run ends with the
same weights as an uninterrupted one (exactly, on CPU). After a SIGTERM checkpoint the script exits with 143.

XLA specifics: MpDeviceLoader, no host sync inside the step (the loss is summed on device and read every
--log-interval steps), bf16 autocast, the Neuron compile cache at $NEURON_COMPILE_CACHE_URL or else inside the
checkpoint folder (which SageMaker keeps in S3 between jobs), and ``--precompile True`` for
neuron_parallel_compile: one accumulation cycle per length bucket, no checkpoint and no model saved.
"""

import argparse
import json
import math
import os
import shutil
import signal
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
import torch.nn.functional as F
import transformers
from transformers import AutoModelForSequenceClassification, AutoTokenizer

try:
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.distributed.xla_backend  # noqa: F401  (registers the "xla" process group backend)
except ImportError:
    torch_xla = None

ID2LABEL = {0: "negative", 1: "positive"}
LABEL2ID = {name: i for i, name in ID2LABEL.items()}
CHECKPOINT_PREFIX = "step-"
MARKER = "COMPLETE"
BATCHES_PER_MEGABATCH = 64
KEEP_CHECKPOINTS = 2
TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])


def str2bool(value: str) -> bool:
    """Parse SageMaker's stringified booleans (True/False, true/false, 1/0)."""
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Hyperparameters as SageMaker passes them (`--key value`); unknown keys are warned about and ignored."""
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-id", default="sentence-transformers/all-MiniLM-L6-v2")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=-1, help="optimizer steps; overrides --epochs when > 0")
    p.add_argument("--batch-size", type=int, default=32, help="per device")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--warmup-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="0 disables clipping")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--checkpoint-interval", type=int, default=500, help="0 disables periodic checkpoints")
    p.add_argument("--bf16", default="auto", choices=["True", "False", "auto", "true", "false"])
    p.add_argument("--precompile", type=str2bool, default=False)
    p.add_argument(
        "--num-workers", type=int, default=-1, help="DataLoader workers; -1: 0 on CPU, 2 elsewhere"
    )
    p.add_argument("--train-dir", default=env("SM_CHANNEL_TRAIN", "/opt/ml/input/data/train"))
    p.add_argument("--validation-dir", default=env("SM_CHANNEL_VALIDATION", "/opt/ml/input/data/validation"))
    p.add_argument(
        "--test-dir", default=env("SM_CHANNEL_TEST", "/opt/ml/input/data/test"), help="scored at the end, if present"
    )
    p.add_argument("--model-dir", default=env("SM_MODEL_DIR", "/opt/ml/model"))
    p.add_argument("--output-data-dir", default=env("SM_OUTPUT_DATA_DIR", "/opt/ml/output/data"))
    p.add_argument("--checkpoint-dir", default=os.path.join(env("SAGEMAKER_BASE_DIR", "/opt/ml"), "checkpoints"))
    args, unknown = p.parse_known_args(argv)
    if unknown:
        print(f"warning: ignoring unknown arguments {unknown}", file=sys.stderr, flush=True)
    return args


# -----------------------------------------------------------------------------
# data


class TokenizedSplit:
    """A Parquet split (input_ids, token_type_ids, label) held as flat numpy arrays plus row offsets."""

    def __init__(self, folder: str, max_length: int):
        files = sorted(Path(folder).glob("*.parquet"))
        if not files:
            raise FileNotFoundError(f"no .parquet files in {folder}")
        table = pq.read_table(files, columns=None)
        ids = table.column("input_ids").combine_chunks()
        self.offsets = np.asarray(ids.offsets, dtype=np.int64)
        self.input_ids = np.asarray(ids.values, dtype=np.int64)
        self.token_type_ids = None
        if "token_type_ids" in table.column_names:
            types = table.column("token_type_ids").combine_chunks()
            if not np.array_equal(np.asarray(types.offsets), self.offsets):
                raise ValueError(f"{folder}: token_type_ids and input_ids rows differ in length")
            self.token_type_ids = np.asarray(types.values, np.int64)
        self.labels = table.column("label").to_numpy().astype(np.int64)
        self.lengths = np.minimum(np.diff(self.offsets), max_length)
        self.max_length = max_length

    def __len__(self) -> int:
        return len(self.labels)

    def row(self, i: int, values: np.ndarray) -> np.ndarray:
        """Row i of `values`, truncated to max_length while keeping its final ([SEP]) token."""
        start, end = self.offsets[i], self.offsets[i + 1]
        if end - start <= self.max_length:
            return values[start:end]
        return np.concatenate([values[start : start + self.max_length - 1], values[end - 1 : end]])

    def collate(self, indices: np.ndarray, pad_to: int, rows: int) -> dict[str, torch.Tensor]:
        """A (rows, pad_to) batch; rows beyond len(indices) are padding rows with label -1."""
        input_ids = np.zeros((rows, pad_to), np.int64)
        token_type_ids = np.zeros((rows, pad_to), np.int64)
        attention_mask = np.zeros((rows, pad_to), np.int64)
        labels = np.full(rows, -1, np.int64)
        for r, i in enumerate(indices):
            n = self.lengths[i]
            input_ids[r, :n] = self.row(i, self.input_ids)
            if self.token_type_ids is not None:
                token_type_ids[r, :n] = self.row(i, self.token_type_ids)
            attention_mask[r, :n] = 1
            labels[r] = self.labels[i]
        return {
            "input_ids": torch.from_numpy(input_ids),
            "token_type_ids": torch.from_numpy(token_type_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "labels": torch.from_numpy(labels),
        }


class BatchDataset(torch.utils.data.Dataset):
    """Item i is the whole collated batch i, so DataLoader workers do the padding."""

    def __init__(
        self, split: TokenizedSplit, batches: list[np.ndarray], pad_lengths: list[int], rows: int | None
    ):
        self.split, self.batches, self.pad_lengths, self.rows = split, batches, pad_lengths, rows

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.split.collate(self.batches[i], self.pad_lengths[i], self.rows or len(self.batches[i]))


def length_buckets(max_length: int) -> list[int]:
    """Fixed sequence lengths for XLA: 32, 64, ... below max_length, then max_length."""
    buckets, n = [], 32
    while n < max_length:
        buckets.append(n)
        n *= 2
    return buckets + [max_length]


def pad_length(longest: int, buckets: list[int] | None, multiple: int) -> int:
    """Padded length of a batch whose longest row has `longest` tokens."""
    if buckets:
        return next(b for b in buckets if b >= longest)
    return math.ceil(longest / multiple) * multiple


def train_batches(
    lengths: np.ndarray, batch_size: int, seed: int, epoch: int, rank: int, world_size: int
) -> list[np.ndarray]:
    """This rank's batches of one epoch: a pure function of (seed, epoch), length-grouped in mega-batches."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    mega = batch_size * BATCHES_PER_MEGABATCH
    batches = []
    for start in range(0, len(order), mega):
        chunk = order[start : start + mega]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk) - batch_size + 1, batch_size)]
    batches = [batches[i] for i in rng.permutation(len(batches))]
    per_rank = len(batches) // world_size
    return batches[rank * per_rank : (rank + 1) * per_rank]


def eval_batches(lengths: np.ndarray, batch_size: int, rank: int, world_size: int) -> list[np.ndarray]:
    """This rank's share of the evaluation rows, sorted by length (every row is seen exactly once)."""
    order = np.argsort(-lengths, kind="stable")
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return batches[rank::world_size]


# -----------------------------------------------------------------------------
# model helpers


def attention_bias(attention_mask: torch.Tensor) -> torch.Tensor:
    """A precomputed attention mask, so transformers skips its "is there any padding?" check (a host sync)."""
    if TRANSFORMERS_MAJOR >= 5:  # a 4D additive mask is used as is
        return (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    return attention_mask[:, None, :]  # 4.x: a 3D 0/1 mask goes through get_extended_attention_mask


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup then linear decay; never exactly 0 (a constant 0 would be a different XLA graph)."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def to_cpu(obj):
    """A copy of a (nested) state dict with every tensor on the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


# -----------------------------------------------------------------------------
# checkpoints


def complete_checkpoints(checkpoint_dir: Path) -> list[Path]:
    """Complete checkpoint folders, oldest first."""
    found = [d for d in checkpoint_dir.glob(f"{CHECKPOINT_PREFIX}*") if (d / MARKER).exists()]
    return sorted(found, key=lambda d: int(d.name[len(CHECKPOINT_PREFIX) :]))


def save_checkpoint(checkpoint_dir: Path, step: int, state: dict) -> Path:
    """Write the checkpoint atomically: temporary folder, rename, then the marker; keep the newest few."""
    final = checkpoint_dir / f"{CHECKPOINT_PREFIX}{step:08d}"
    tmp = checkpoint_dir / f".tmp-{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(final, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(state, tmp / "checkpoint.pt")
    os.replace(tmp, final)
    size = (final / "checkpoint.pt").stat().st_size
    (final / f".{MARKER}").write_text(json.dumps({"step": step, "bytes": size}))
    os.replace(final / f".{MARKER}", final / MARKER)
    for old in complete_checkpoints(checkpoint_dir)[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_latest_checkpoint(checkpoint_dir: Path) -> dict | None:
    """The newest complete checkpoint that loads (its size matches the marker), else None."""
    for folder in reversed(complete_checkpoints(checkpoint_dir)):
        path = folder / "checkpoint.pt"
        try:
            if path.stat().st_size != json.loads((folder / MARKER).read_text())["bytes"]:
                raise ValueError("size differs from marker")
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # a truncated or half-synced checkpoint: try the previous one
            print(f"warning: skipping checkpoint {folder}: {e}", file=sys.stderr, flush=True)
    return None


# -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    checkpoint_dir = Path(args.checkpoint_dir)

    # device and process group
    use_xla = torch_xla is not None
    if use_xla:
        cache = os.environ.get("NEURON_COMPILE_CACHE_URL") or str(checkpoint_dir / "neuron-compile-cache")
        if "--cache_dir" not in os.environ.get("NEURON_CC_FLAGS", ""):
            os.environ["NEURON_CC_FLAGS"] = (
                f"{os.environ.get('NEURON_CC_FLAGS', '')} --cache_dir={cache}".strip()
            )
    distributed = "RANK" in os.environ
    if use_xla:
        device_type = "xla"
        if distributed:
            dist.init_process_group("xla", init_method="xla://")
        device = torch_xla.device() if hasattr(torch_xla, "device") else xm.xla_device()
    elif torch.cuda.is_available():
        device_type = "cuda"
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        if distributed:
            dist.init_process_group("nccl", device_id=device)
    else:
        device_type, device = "cpu", torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:  # N processes x all-core thread pools thrash a small CPU
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
        if distributed:
            dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1
    master = rank == 0
    bf16 = args.bf16.lower() == "true" or (args.bf16.lower() == "auto" and device_type in ("xla", "cuda"))
    autocast = torch.autocast(device_type, dtype=torch.bfloat16) if bf16 else nullcontext()

    def log(message: str) -> None:
        if master:
            print(message, flush=True)

    def barrier(tag: str) -> None:
        if distributed:
            xm.rendezvous(tag) if use_xla else dist.barrier()

    def mark_step() -> None:  # cut the XLA graph here (a no-op elsewhere)
        if use_xla:
            torch_xla.sync() if hasattr(torch_xla, "sync") else xm.mark_step()

    def reseed(seed: int) -> None:  # dropout masks become a function of (seed, step, rank)
        xm.set_rng_state(seed, device=device) if use_xla else torch.manual_seed(seed)

    def all_reduce_sum(values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float32).to(device)
        if distributed:
            dist.all_reduce(t)
        return t.cpu().tolist()

    stop = {"requested": False}
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.update(requested=True))
    log(f"device={device_type} world_size={world_size} bf16={bf16} transformers={transformers.__version__}")

    # data
    train = TokenizedSplit(args.train_dir, args.max_length)
    validation, test = (
        TokenizedSplit(d, args.max_length) if Path(d).is_dir() and any(Path(d).glob("*.parquet")) else None
        for d in (args.validation_dir, args.test_dir)
    )
    buckets = length_buckets(args.max_length) if use_xla else None
    multiple = 8 if device_type == "cuda" else 1
    num_workers = args.num_workers if args.num_workers >= 0 else (0 if device_type == "cpu" else 2)

    def make_loader(split: TokenizedSplit, batches: list[np.ndarray], rows: int | None):
        pads = [pad_length(int(split.lengths[b].max()), buckets, multiple) for b in batches]
        loader = torch.utils.data.DataLoader(
            BatchDataset(split, batches, pads, rows), batch_size=None, shuffle=False, num_workers=num_workers
        )
        tokens = [(int(split.lengths[b].sum()), len(b) * p) for b, p in zip(batches, pads, strict=True)]
        return (pl.MpDeviceLoader(loader, device) if use_xla else loader), tokens

    micro_per_epoch = len(train_batches(train.lengths, args.batch_size, args.seed, 0, rank, world_size))
    steps_per_epoch = micro_per_epoch // args.grad_accum
    if steps_per_epoch == 0:
        raise ValueError(
            f"{len(train)} training rows are too few for batch size {args.batch_size} x "
            f"{world_size} devices x {args.grad_accum} accumulation steps"
        )
    total_steps = args.max_steps if args.max_steps > 0 else args.epochs * steps_per_epoch
    warmup_steps = int(args.warmup_ratio * total_steps)

    # model, optimizer, schedule
    model = AutoModelForSequenceClassification.from_pretrained(
        args.model_id, num_labels=2, id2label=ID2LABEL, label2id=LABEL2ID
    )
    model.config.problem_type = "single_label_classification"
    model.to(device)
    raw_model = model
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.learning_rate,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, warmup_steps, total_steps)
    )

    step = 0
    resumed_from = None
    if not args.precompile:
        if master:
            for stale in checkpoint_dir.glob(f".tmp-{CHECKPOINT_PREFIX}*"):
                shutil.rmtree(stale, ignore_errors=True)
        state = load_latest_checkpoint(checkpoint_dir)
        if state is not None:
            if state["world_size"] != world_size:
                log(
                    f"warning: checkpoint written with world size {state['world_size']}, now {world_size}: "
                    "the data order after resumption differs from an uninterrupted run"
                )
            raw_model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            step = resumed_from = state["step"]
            log(f"resumed from checkpoint at step={step}")
            del state
    ddp = device_type != "xla" and distributed
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device_type == "cuda" else None
        )

    def checkpoint() -> None:
        mark_step()
        if master:
            state = {
                "model": to_cpu(raw_model.state_dict()),
                "optimizer": to_cpu(optimizer.state_dict()),
                "scheduler": scheduler.state_dict(),
                "step": step,
                "world_size": world_size,
            }
            path = save_checkpoint(checkpoint_dir, step, state)
            log(f"saved checkpoint {path}")
        barrier("checkpoint")

    # training loop
    log(f"steps_per_epoch={steps_per_epoch} total_steps={total_steps} warmup_steps={warmup_steps}")
    if args.precompile:
        # one accumulation cycle per bucket (plus the first one again, whose first run initialised AdamW)
        bucket_ids = np.searchsorted(buckets, train.lengths) if buckets else np.zeros(len(train), np.int64)
        probes = [np.resize(np.flatnonzero(bucket_ids == b), args.batch_size) for b in np.unique(bucket_ids)]
        probes.append(probes[0])
        total_steps = len(probes)
    model.train()
    loss_sum = torch.zeros(()).to(device)
    interval_steps, interval_start = 0, time.time()
    samples = real_tokens = padded_tokens = 0
    last_loss, stopping = None, False
    compiles_per_epoch = []
    train_start = time.time()
    while step < total_steps:
        epoch = step // steps_per_epoch
        if args.precompile:
            batches = [p for p in probes for _ in range(args.grad_accum)]
        else:
            batches = train_batches(train.lengths, args.batch_size, args.seed, epoch, rank, world_size)
            batches = batches[(step % steps_per_epoch) * args.grad_accum : steps_per_epoch * args.grad_accum]
        loader, tokens = make_loader(train, batches, args.batch_size)
        for micro, ((real, padded), batch) in enumerate(zip(tokens, loader, strict=True)):
            if micro % args.grad_accum == 0:
                reseed((args.seed * 1_000_003 + step * world_size + rank) % 2**31)
            last_micro = (micro + 1) % args.grad_accum == 0
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with model.no_sync() if ddp and not last_micro else nullcontext():
                with autocast:
                    logits = model(
                        input_ids=batch["input_ids"],
                        token_type_ids=batch["token_type_ids"],
                        attention_mask=attention_bias(batch["attention_mask"]),
                    ).logits
                    loss = F.cross_entropy(logits.float(), batch["labels"])
                (loss / args.grad_accum).backward()
            loss_sum += loss.detach()
            samples += len(batch["labels"]) * world_size
            real_tokens += real
            padded_tokens += padded
            if not last_micro:
                continue
            if use_xla:
                xm.reduce_gradients(optimizer)  # what xm.optimizer_step does, split to clip in between
            if args.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            interval_steps += 1

            if step % args.log_interval == 0 or step == total_steps:
                mark_step()
                stats = torch.stack([loss_sum, torch.tensor(float(stop["requested"])).to(device)])
                if distributed:
                    dist.all_reduce(stats)
                loss_total, stops = stats.cpu().tolist()
                stopping = stops > 0  # agreed by all ranks, unlike the local flag the signal handler sets
                last_loss = loss_total / (interval_steps * args.grad_accum * world_size)
                elapsed = time.time() - interval_start
                sps = interval_steps * args.grad_accum * args.batch_size * world_size / elapsed
                log(
                    f"step={step} epoch={epoch} loss={last_loss:.4f} samples_per_sec={sps:.1f} "
                    f"lr={scheduler.get_last_lr()[0]:.1e}"
                )
                loss_sum = torch.zeros(()).to(device)
                interval_steps, interval_start = 0, time.time()
            if args.precompile:
                if step >= total_steps:
                    break
                continue
            if stopping or (args.checkpoint_interval > 0 and step % args.checkpoint_interval == 0):
                checkpoint()
            if stopping:
                log(f"stopping on SIGTERM at step={step}")
                sys.exit(143)
            if step >= total_steps:
                break
        if use_xla:
            compiles_per_epoch.append(met.metric_data("CompileTime")[0])
    train_time = time.time() - train_start

    # validation (and test, when a test channel is given)
    def split_accuracy(split: TokenizedSplit, name: str) -> float:
        """Accuracy over `split`, each rank scoring its share of the batches; logged as `<name>_accuracy=`."""
        raw_model.eval()
        rows = args.batch_size if use_xla else None
        if args.precompile:
            batches = probes[:-1]
        else:
            batches = eval_batches(split.lengths, args.batch_size, rank, world_size)
        loader, _ = make_loader(train if args.precompile else split, batches, rows)
        correct, count = (
            torch.zeros((), dtype=torch.long).to(device),
            torch.zeros((), dtype=torch.long).to(device),
        )
        with torch.no_grad(), autocast:
            for batch in loader:
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                logits = raw_model(
                    input_ids=batch["input_ids"],
                    token_type_ids=batch["token_type_ids"],
                    attention_mask=attention_bias(batch["attention_mask"]),
                ).logits
                valid = batch["labels"] >= 0
                correct += ((logits.argmax(-1) == batch["labels"]) & valid).sum()
                count += valid.sum()
        mark_step()
        correct_total, count_total = all_reduce_sum([float(correct.cpu()), float(count.cpu())])
        accuracy = correct_total / max(1.0, count_total)
        log(f"{name}_accuracy={accuracy:.4f}")
        return accuracy

    val_accuracy = split_accuracy(validation, "val") if validation is not None else None
    test_accuracy = split_accuracy(test, "test") if test is not None and not args.precompile else None

    # artifacts
    real_tokens, padded_tokens = all_reduce_sum([float(real_tokens), float(padded_tokens)])
    stats = {
        "device": device_type,
        "world_size": world_size,
        "bf16": bf16,
        "precompile": args.precompile,
        "steps": step - (resumed_from or 0),
        "global_step": step,
        "resumed_from_step": resumed_from,
        "samples": samples,
        "wall_time_s": round(train_time, 3),
        "samples_per_sec": samples / train_time if train_time else None,
        "tokens_per_sec": real_tokens / train_time if train_time else None,
        "padding_efficiency": real_tokens / padded_tokens if padded_tokens else None,
        "train_loss": last_loss,
        "val_accuracy": val_accuracy,
        "test_accuracy": test_accuracy,
        "compile_count": met.metric_data("CompileTime")[0] if use_xla else None,
        "compile_count_per_epoch": compiles_per_epoch if use_xla else None,
        "length_buckets": buckets,
    }
    if master:
        Path(args.output_data_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.output_data_dir) / "training_stats.json").write_text(json.dumps(stats, indent=2))
        log(f"training_stats={json.dumps(stats)}")
    if master and not args.precompile:
        save_model(raw_model.to("cpu"), args.model_id, Path(args.model_dir), args.max_length)
        log(f"saved model to {args.model_dir}")
    barrier("done")
    if distributed:
        dist.destroy_process_group()


def save_model(model: torch.nn.Module, model_id: str, model_dir: Path, max_length: int) -> None:
    """save_pretrained (safetensors) plus tokenizer and the inference handler in code/.

    The tokenizer's model_max_length becomes the training length, which the handler truncates requests to."""
    model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_id)
    tokenizer.model_max_length = max_length
    tokenizer.save_pretrained(model_dir)
    here = Path(__file__).resolve().parent
    (model_dir / "code").mkdir(exist_ok=True)
    shutil.copy(here / "inference.py", model_dir / "code" / "inference.py")
    shutil.copy(here / "inference_requirements.txt", model_dir / "code" / "requirements.txt")


if __name__ == "__main__":
    main()
