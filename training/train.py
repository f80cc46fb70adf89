"""Fine-tune a BERT-style encoder for text classification, its classes named by the data (the pipeline's Train step).

Launched by torchrun (in the Train job, launch.py starts it through the SageMaker training toolkit's launcher):

    torchrun --nnodes 1 --nproc_per_node 2 train.py --model-id sentence-transformers/all-MiniLM-L6-v2 \\
        --epochs 1 --batch-size 32 --train-dir data/train --validation-dir data/validation --test-dir data/test \\
        --model-dir out/model --checkpoint-dir out/checkpoints

Device: XLA (Trainium NeuronCores) when torch_xla imports, else CUDA, else CPU; process group xla, nccl or gloo.
`--backend native`: TorchNeuron's device "neuron" (beta, trn2/trn3) with the CUDA/CPU loop (DDP, torch.compile with
Neuron's backend over the fixed length buckets). Data parallel: one process per device; DDP on CUDA/CPU (none for a
single process), gradient all-reduce in the step on XLA. On CUDA/CPU the model runs PyTorch's fused attention (SDPA:
flash attention for a batch without padding, known on the host) and a fused AdamW, and on CUDA it is compiled
(`--compile auto`) with dynamic shapes, so dynamic padding costs one graph, not one per length.

Batches. The training order is a pure function of (seed, epoch): the epoch's permutation is cut into
mega-batches of 64 batches, each mega-batch is sorted by length and cut into batches (so a batch holds similar
lengths), the batches are shuffled, and rank r takes its contiguous share. Partial batches are dropped. On
CUDA/CPU a batch is padded to its longest row (dynamic padding); on XLA to the next of a few fixed lengths
(32, 64, 128, ..., max length), so the number of compiled graphs is bounded by the number of buckets.

Randomness. Dropout is reseeded at each optimizer step from (seed, step, rank), so a resumed run replays
exactly the same masks without having to gather every rank's generator state into the checkpoint.

Checkpoints. Every --checkpoint-interval steps, every --checkpoint-minutes, and when SIGTERM arrives (the clock and
the flag are agreed between ranks at the next log interval; on CPU and CUDA the flag also every STOP_CHECK_SECONDS
or so between them, since torchrun kills its workers 30 s after it forwards a SIGTERM), rank 0 writes
``slot-K/checkpoint.pt`` (model, optimizer, scheduler, step) into one of KEEP_CHECKPOINTS fixed slots (the oldest),
then the ``COMPLETE`` marker with the step, size and SHA-256. Fixed names keep the S3 copy bounded: SageMaker's
checkpoint sync uploads new and changed files but never deletes in S3 what is deleted here, so new names per step
would pile up there. A start resumes from the newest slot whose file matches its marker and skips the batches that
step consumed, so an interrupted and resumed run ends with the same weights as an uninterrupted one (exactly, on
CPU). After a SIGTERM checkpoint the script exits with 143. A finished training writes ``TRAINING`` = finished
beside the slots: a later job given the same folder (the Train step's folder is per training, not per execution)
starts afresh and marks the old slots stale (rewritten, not deleted, for the same reason).

Timing. The first --log-interval steps are the warm-up (compilation, allocator and data-loader start); the
stats report the steady-state rate of the later intervals (none for a run of one interval) and the seconds the
warm-up took beyond that rate separately, plus the model FLOP rate counted from each row's real length (model_flops
below); the loop's wall time leaves out the scoring after it (scoring_s).

Scoring. At the end, every rank scores its share of the validation and test splits; the per-row logits (one per
class) are summed across ranks, so rank 0 holds the whole split. The test split's
predictions go into the model artifact (predictions/test.parquet, rows in the split's file order), from which
the Evaluate step takes the whole-test-split metrics without scoring 400k reviews on a CPU.

XLA specifics: MpDeviceLoader, no host sync inside the step (the loss is summed on device and read every
--log-interval steps), bf16 autocast (compiled with --auto-cast=none so that only autocast decides precision),
the Neuron compile cache at $NEURON_COMPILE_CACHE_URL or else inside the checkpoint folder, the EFA settings of
multi-node jobs (see neuron_environment), the fp32 gradient all-reduce of Neuron's BERT sample, and
``--precompile True`` for neuron_parallel_compile (the compile pass launch.py runs ahead of training when the cache
lacks the run's graphs): every graph of the run traced once (see precompile), no checkpoint and no model saved.
"""

import argparse
import hashlib
import json
import logging
import math
import os
import resource
import shutil
import signal
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
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

LABELS_KEY = "labels"  # Tokenize's shards name their labels in their schema metadata (steps/contract.py LABELS_KEY)
UNNAMED_LABELS = ["negative", "positive"]  # the names of shards that name none (an earlier Tokenize's, hand-made)
SLOT_PREFIX = "slot-"
MARKER = "COMPLETE"
TRAINING_STATE = "TRAINING"  # "finished" once a training in this folder ended, "running" while one goes on
KEEP_CHECKPOINTS = 2
BATCHES_PER_MEGABATCH = 64
STATS_FILE = "training_stats.json"
STOP_CHECK_SECONDS = 5.0  # CPU/CUDA: how often (about) ranks agree on a SIGTERM between log read-outs
TRACKED_STATS = ("samples_per_sec", "samples_per_sec_with_warmup", "warmup_s", "model_tflops_per_sec", "tokens_per_sec",
                 "padding_efficiency", "wall_time_s", "val_accuracy", "test_accuracy", "compile_count", "compile_s",
                 "peak_device_memory_gb")  # training_stats.json keys logged as the final metrics of the MLflow run
PREDICTIONS_FILE = "predictions/test.parquet"
TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])
# Instance types whose multi-node collectives go over EFA (the toolkit itself only knows trn1.32xlarge).
EFA_INSTANCE_TYPES = ("ml.trn1.32xlarge", "ml.trn1n.32xlarge", "ml.trn2.48xlarge")
NEURON_CC_FLAGS = ("--model-type=transformer", "--auto-cast=none", "--retry_failed_compilation")


def str2bool(value: str) -> bool:
    """Parse SageMaker's stringified booleans (True/False, true/false, 1/0)."""
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Hyperparameters as SageMaker passes them (`--key value`); unknown keys are warned about and ignored.

    Those the Train step passes are required: their defaults live in the config alone (pipeline/config/training.py;
    `pipeline.definition.step_arguments(cfg, "Train")` gives the whole command line for a config)."""
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    given = p.add_argument_group("passed by the Train step (required)")
    given.add_argument("--model-id", required=True)
    given.add_argument("--batch-size", type=int, required=True, help="per device")
    given.add_argument("--grad-accum", type=int, required=True)
    given.add_argument("--max-length", type=int, required=True)
    given.add_argument("--seed", type=int, required=True)
    given.add_argument("--weight-decay", type=float, required=True)
    given.add_argument("--bf16", required=True, choices=["True", "False", "auto", "true", "false"])
    given.add_argument("--backend", required=True, choices=["xla", "native"],
                       help="xla: PyTorch/XLA when torch_xla imports (else CUDA, else CPU); native: TorchNeuron's "
                            "device 'neuron' with torch.compile(backend='neuron') (beta, trn2/trn3)")
    given.add_argument("--epochs", type=int, required=True)
    given.add_argument("--max-steps", type=int, required=True,
                       help="optimizer steps, overriding --epochs; -1: no limit")
    given.add_argument("--learning-rate", type=float, required=True)
    given.add_argument("--lr-global-batch", type=int, required=True,
                       help="the global batch --learning-rate is set for (training.learning_rate auto): a run at "
                            "another one (an execution's instance type, count or batch size) scales it by the "
                            "square-root rule; 0: the rate as given")
    given.add_argument("--warmup-ratio", type=float, required=True)
    given.add_argument("--log-interval", type=int, required=True)
    given.add_argument("--checkpoint-interval", type=int, required=True, help="0 disables periodic checkpoints")
    given.add_argument("--checkpoint-minutes", type=float, required=True,
                       help="also checkpoint when this many minutes passed since the last one (checked at each log "
                            "interval); 0 disables")
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="0 disables clipping")
    p.add_argument("--compile", default="auto", choices=["True", "False", "auto", "true", "false"],
                   help="torch.compile the model; auto: on CUDA and TorchNeuron")
    p.add_argument("--precompile", type=str2bool, default=False)
    p.add_argument("--num-workers", type=int, default=-1, help="DataLoader workers; -1: 0 on CPU, 2 elsewhere")
    p.add_argument("--train-dir", default=env("SM_CHANNEL_TRAIN", "/opt/ml/input/data/train"))
    p.add_argument("--validation-dir", default=env("SM_CHANNEL_VALIDATION", "/opt/ml/input/data/validation"))
    p.add_argument("--test-dir", default=env("SM_CHANNEL_TEST", "/opt/ml/input/data/test"), help="scored at the end")
    p.add_argument("--model-dir", default=env("SM_MODEL_DIR", "/opt/ml/model"))
    p.add_argument("--output-data-dir", default=env("SM_OUTPUT_DATA_DIR", "/opt/ml/output/data"))
    p.add_argument("--checkpoint-dir", default=os.path.join(env("SAGEMAKER_BASE_DIR", "/opt/ml"), "checkpoints"))
    args, unknown = p.parse_known_args(argv)
    if args.max_steps == 0 or args.max_steps < -1:
        p.error(f"--max-steps {args.max_steps}: expected a number of optimizer steps >= 1, or -1 for no limit")
    for name in ("epochs", "batch_size", "grad_accum", "log_interval"):
        if getattr(args, name) < 1:  # epochs 0 would save an untrained model and exit 0
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected a whole number >= 1")
    if unknown:
        print(f"warning: ignoring unknown arguments {unknown}", file=sys.stderr, flush=True)
    return args


# -----------------------------------------------------------------------------
# data


class TokenizedSplit:
    """A Parquet split (input_ids, token_type_ids, label) held as flat numpy arrays plus row offsets, in the
    Parquet files' narrow types (int32 ids, int8 types and labels: a quarter of int64 on each of the host's ranks);
    `collate` widens a batch to the int64 tensors the model takes."""

    def __init__(self, folder: str, max_length: int):
        files = sorted(Path(folder).glob("*.parquet"))
        if not files:
            raise FileNotFoundError(f"no .parquet files in {folder}")
        table = pq.read_table(files, columns=None)
        ids = table.column("input_ids").combine_chunks()
        self.offsets = np.asarray(ids.offsets, dtype=np.int64)
        self.input_ids = np.asarray(ids.values).astype(np.int32, copy=False)
        self.token_type_ids = None
        if "token_type_ids" in table.column_names:
            types = table.column("token_type_ids").combine_chunks()
            if not np.array_equal(np.asarray(types.offsets), self.offsets):
                raise ValueError(f"{folder}: token_type_ids and input_ids rows differ in length")
            self.token_type_ids = np.asarray(types.values).astype(np.int8, copy=False)
        metadata = table.schema.metadata or {}
        self.names = json.loads(metadata[LABELS_KEY.encode()]) if LABELS_KEY.encode() in metadata else UNNAMED_LABELS
        labels = table.column("label").to_numpy()
        if len(labels) and (labels.min() < 0 or labels.max() >= len(self.names)):
            bad = sorted({int(v) for v in labels[(labels < 0) | (labels >= len(self.names))][:1000]})
            raise ValueError(f"{folder}: labels {bad[:5]}: expected ids 0 to {len(self.names) - 1} of "
                             f"{', '.join(self.names)}, as Tokenize writes")
        self.labels = labels.astype(np.int8 if len(self.names) <= 127 else np.int32, copy=False)
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

    def __init__(self, split: TokenizedSplit, batches: list[np.ndarray], pad_lengths: list[int], rows: int | None):
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


def bucket_probes(split: TokenizedSplit, buckets: list[int] | None, batch_size: int,
                  first: np.ndarray | None = None) -> list[np.ndarray]:
    """For neuron_parallel_compile: one batch of `split` per length bucket it fills, starting with the bucket of
    batch `first` (this rank's first real batch: in training the step that also creates AdamW's state, in scoring
    the batch whose graph holds more than the forward pass), then that bucket again (its steady-state graph), so
    every graph of the real run is traced once. The same number of batches on every rank."""
    bucket_ids = np.searchsorted(buckets, split.lengths) if buckets else np.zeros(len(split), np.int64)
    order = list(np.unique(bucket_ids))
    if first is not None:
        lead = bucket_ids[first].max()
        order = [lead] + [b for b in order if b != lead]
    probes = [np.resize(np.flatnonzero(bucket_ids == b), batch_size) for b in order]
    return probes + probes[:1]


# -----------------------------------------------------------------------------
# device, process group and the Neuron environment


def neuron_environment(environ: dict[str, str], checkpoint_dir: Path) -> dict[str, str]:
    """Variables this run needs on Trainium, leaving any the job already sets alone.

    NEURON_CC_FLAGS: --model-type=transformer (the public trn1 BERT sample and optimum-neuron), --auto-cast=none
    (precision comes from torch.autocast alone, as the Neuron migration guide requires instead of XLA_DOWNCAST_BF16),
    --retry_failed_compilation (the BERT sample's: a compile cut short, by a spot reclaim say, is cached as failed and
    would otherwise be skipped by every later job sharing the cache) and the compile cache. Multi-node on an EFA
    instance type: FI_PROVIDER=efa with device RDMA and fork safety (the DataLoader forks workers), which the
    training toolkit sets for trn1.32xlarge only, not trn1n / trn2. Several instances of a Trainium type without EFA
    (trn1.2xlarge) are refused: the collectives between them have no transport."""
    flags = environ.get("NEURON_CC_FLAGS", "")
    cache = environ.get("NEURON_COMPILE_CACHE_URL") or str(checkpoint_dir / "neuron-compile-cache")
    for flag in (*NEURON_CC_FLAGS, f"--cache_dir={cache}"):
        if flag.split("=")[0] not in flags:
            flags = f"{flags} {flag}".strip()
    wanted = {"NEURON_CC_FLAGS": flags}
    hosts, instance_type = json.loads(environ.get("SM_HOSTS") or "[]"), environ.get("SM_CURRENT_INSTANCE_TYPE", "")
    if len(hosts) > 1 and instance_type.startswith("ml.trn") and instance_type not in EFA_INSTANCE_TYPES:
        raise ValueError(f"{len(hosts)} instances of {instance_type}: Neuron's collectives between instances need "
                         f"EFA, which only {', '.join(EFA_INSTANCE_TYPES)} have; train on one instance or on those")
    if len(hosts) > 1 and instance_type in EFA_INSTANCE_TYPES:
        wanted.update(FI_PROVIDER="efa", FI_EFA_USE_DEVICE_RDMA="1", FI_EFA_FORK_SAFE="1")
    return {k: v for k, v in wanted.items() if k == "NEURON_CC_FLAGS" or k not in environ}


def inductor_environment(environ: dict[str, str], checkpoint_dir: Path) -> dict[str, str]:
    """torch.compile's cache (Inductor's FX graphs, AOTAutograd's and Triton's kernels) in the checkpoint folder,
    which SageMaker keeps in S3: a job restarted after a spot reclaim, or a retried Train step, loads its compiled
    graphs instead of compiling them again. A TORCHINDUCTOR_CACHE_DIR the job sets is left alone."""
    if "TORCHINDUCTOR_CACHE_DIR" in environ:
        return {}
    return {"TORCHINDUCTOR_CACHE_DIR": str(checkpoint_dir / "inductor-cache")}


@dataclass
class Runtime:
    """Where this process runs: device, rank, world size, precision, and the few calls that differ by device."""

    device: torch.device
    device_type: str  # xla | neuron | cuda | cpu
    rank: int
    world_size: int
    distributed: bool
    bf16: bool
    compile: bool

    @property
    def sdpa(self) -> bool:
        """PyTorch's fused attention (off XLA, where the library's default attention stays)."""
        return not self.xla

    @property
    def master(self) -> bool:
        return self.rank == 0

    @property
    def xla(self) -> bool:
        return self.device_type == "xla"

    @property
    def fixed_shapes(self) -> bool:
        """Batches padded to a few fixed lengths and row counts: compiled graphs are per shape (XLA, Neuron)."""
        return self.device_type in ("xla", "neuron")

    def compile_options(self) -> dict:
        """torch.compile's arguments: dynamic shapes on CUDA/CPU (dynamic padding, one graph); Neuron's backend over
        the fixed length buckets."""
        return {"backend": "neuron", "dynamic": False} if self.device_type == "neuron" else {"dynamic": True}

    def autocast(self):
        return torch.autocast(self.device_type, dtype=torch.bfloat16) if self.bf16 else nullcontext()

    def log(self, message: str) -> None:
        if self.master:
            print(message, flush=True)

    def barrier(self, tag: str) -> None:
        if self.distributed:
            xm.rendezvous(tag) if self.xla else dist.barrier()

    def mark_step(self) -> None:
        """Cut the XLA graph here (a no-op elsewhere)."""
        if self.xla:
            torch_xla.sync() if hasattr(torch_xla, "sync") else xm.mark_step()

    def reseed(self, seed: int) -> None:
        """Dropout masks become a function of (seed, step, rank)."""
        xm.set_rng_state(seed, device=self.device) if self.xla else torch.manual_seed(seed)

    def end(self, code: int = 0) -> None:
        """Wait for every rank and leave the process group; a Gloo rank (CPU) then ends its process at once with exit
        code `code`, its output flushed, without finalizing the interpreter. Gloo's worker threads free a finished
        collective's tensors after it returns, and need the GIL to do so: a group that outlives
        destroy_process_group (torch._dynamo, which the first optimizer imports, holds every group that exists then)
        aborts the rank at interpreter exit ("terminate called without an active exception", pytorch/pytorch#179291),
        and one that DDP's reducer frees, GIL held, deadlocks. Every file the run writes is closed by then."""
        self.barrier("done")
        if not self.distributed:
            return
        gloo = dist.get_backend() == "gloo"
        dist.destroy_process_group()
        if gloo:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def all_reduce_sum(self, values: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(values, np.float32)).to(self.device)
        if self.distributed:
            dist.all_reduce(t)
        return t.cpu().numpy()


def neuron_available() -> bool:
    """Whether TorchNeuron's device "neuron" is this process's accelerator. torch_neuronx is imported first, as
    Neuron's torch-distributed guide does: it registers the device "neuron" and the distributed backend "neuron"."""
    try:
        import torch_neuronx  # noqa: F401
    except ImportError:
        return False
    accelerator = getattr(torch, "accelerator", None)
    return bool(accelerator and accelerator.is_available() and accelerator.current_accelerator().type == "neuron")


def device_type_for(backend: str, xla: bool, neuron: bool, cuda: bool) -> str:
    """xla | neuron | cuda | cpu: where this run trains, from --backend and what this machine has."""
    if backend == "native":
        if not neuron:
            raise ValueError("--backend native: no TorchNeuron device 'neuron' here (trn2/trn3 with an image that "
                             "ships TorchNeuron)")
        return "neuron"
    return "xla" if xla else "cuda" if cuda else "cpu"


def compile_choice(requested: str, device_type: str) -> bool:
    """--compile: True or False, or auto: on for CUDA and TorchNeuron, off for the CPU; refused on XLA, which
    compiles every graph already."""
    compiled = requested.lower() == "true" or (requested.lower() == "auto" and device_type in ("cuda", "neuron"))
    if compiled and device_type == "xla":
        raise ValueError("--compile True: XLA compiles every graph already "
                         "(torch.compile is for CUDA, CPU and TorchNeuron)")
    return compiled


def setup(args: argparse.Namespace) -> Runtime:
    """Pick the device, join the process group, and set the device's environment."""
    distributed = "RANK" in os.environ
    kind = device_type_for(args.backend, torch_xla is not None, args.backend == "native" and neuron_available(),
                           torch.cuda.is_available())
    if kind == "neuron":  # the CUDA path's loop on TorchNeuron: DDP through torch.distributed
        device_type = "neuron"
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = torch.device("neuron", local_rank)
        torch.accelerator.set_device_index(local_rank)
        if distributed:
            dist.init_process_group(backend="neuron")  # as Neuron's torch-distributed guide joins the group
    elif kind == "xla":
        os.environ.update(neuron_environment(dict(os.environ), Path(args.checkpoint_dir)))
        device_type = "xla"
        if distributed:
            dist.init_process_group("xla", init_method="xla://")
        device = torch_xla.device() if hasattr(torch_xla, "device") else xm.xla_device()
    elif kind == "cuda":
        device_type = "cuda"
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # the fp32 remainder
        if distributed:
            dist.init_process_group("nccl", device_id=device)
    else:
        device_type, device = "cpu", torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:  # N processes x all-core thread pools thrash a small CPU
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
        if distributed:
            dist.init_process_group("gloo")
    bf16 = args.bf16.lower() == "true" or (args.bf16.lower() == "auto" and device_type != "cpu")
    compiled = compile_choice(args.compile, device_type)
    if compiled and device_type in ("cuda", "cpu"):
        os.environ.update(inductor_environment(dict(os.environ), Path(args.checkpoint_dir)))
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    return Runtime(device, device_type, rank, world, distributed, bf16, compiled)


# -----------------------------------------------------------------------------
# model helpers


def load_model(model_id: str, rt: Runtime, seed: int, names: list[str]) -> torch.nn.Module:
    """The pretrained encoder with a fresh head for the labels `names` (saved with the model, so the endpoint answers
    them) drawn from `seed`, so every rank starts from the same
    weights whatever its generator held (so XLA, which has no DDP to broadcast them, needs no broadcast either);
    PyTorch's fused attention (SDPA) off XLA."""
    attention = {"attn_implementation": "sdpa"} if rt.sdpa else {}
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(
        model_id, num_labels=len(names), id2label=dict(enumerate(names)),
        label2id={name: i for i, name in enumerate(names)}, ignore_mismatched_sizes=True,  # a head of other classes
        **attention
    )
    model.config.problem_type = "single_label_classification"
    model.to(rt.device)
    return model


def attention_bias(attention_mask: torch.Tensor, sdpa: bool) -> torch.Tensor:
    """A precomputed attention mask, so transformers skips its "is there any padding?" check (a host sync)."""
    if TRANSFORMERS_MAJOR < 5:  # 4.x: a 3D 0/1 mask goes through get_extended_attention_mask
        return attention_mask[:, None, :]
    if sdpa:  # a 4D mask is used as is: boolean (True: attend) for SDPA
        return attention_mask[:, None, None, :].bool()
    return (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min  # eager: additive


def forward(rt: Runtime, model: torch.nn.Module, batch: dict[str, torch.Tensor], padded: bool = True) -> torch.Tensor:
    """The logits of one batch; `padded` False (a batch without padding, known on the host) passes no mask, which
    lets SDPA take its flash-attention kernel."""
    mask = attention_bias(batch["attention_mask"], rt.sdpa) if padded or not rt.sdpa else None
    return model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=mask).logits


@dataclass(frozen=True)
class BatchTokens:
    """What a batch holds, from the host's lengths: real tokens, padded tokens, and the sum of squared lengths
    (the attention term of model_flops)."""

    real: int
    padded: int
    squares: int

    @classmethod
    def of(cls, lengths: np.ndarray, pad_to: int) -> "BatchTokens":
        return cls(int(lengths.sum()), len(lengths) * pad_to, int((lengths.astype(np.int64) ** 2).sum()))


def scaled_rate(learning_rate: float, for_global_batch: int, global_batch: int) -> float:
    """`learning_rate`, set for `for_global_batch` samples per step (0: as given), at `global_batch` by the
    square-root rule that training.learning_rate auto follows (pipeline/config/devices.py)."""
    if not for_global_batch or global_batch == for_global_batch:
        return learning_rate
    return learning_rate * math.sqrt(global_batch / for_global_batch)


def model_flops(config, real_tokens: float, squares: float) -> float:
    """Training FLOPs (forward + backward = 3x forward) of rows with these token counts, from the
    encoder's matmuls: per layer and token 24h^2 + 12hi (projections and feed-forward; 72h^2 for bert-base, i=4h),
    plus 12h per token per row length (attention scores and values). bert-base at length s: 72Lh^2s + 12Lhs^2."""
    layers, h, i = config.num_hidden_layers, config.hidden_size, config.intermediate_size
    return layers * ((24 * h * h + 12 * h * i) * real_tokens + 12 * h * squares)


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Linear warmup then linear decay; never exactly 0 (a constant 0 would be a different XLA graph)."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def save_state(rt: Runtime, state: dict, path: Path) -> None:
    """torch.save of `state` (nested dicts and lists of tensors) with every tensor on the host: on XLA through
    xm.save, in one device-to-host transfer of all tensors together, not one per tensor."""
    if rt.xla:
        xm.save(state, path, master_only=False)  # the caller is the one rank that saves
    else:
        torch.save(to_cpu(state), path)


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
# checkpoints: a ring of KEEP_CHECKPOINTS fixed slots


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def complete_checkpoints(checkpoint_dir: Path) -> list[tuple[int, Path]]:
    """(step, slot) of every slot with a marker, oldest step first."""
    found = []
    for slot in checkpoint_dir.glob(f"{SLOT_PREFIX}*"):
        try:
            found.append((int(json.loads((slot / MARKER).read_text())["step"]), slot))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(found)


def save_checkpoint(checkpoint_dir: Path, step: int, state: dict, keep: Path | None = None,
                    save: Callable[[dict, Path], None] = torch.save) -> Path:
    """Overwrite the oldest (or an empty) slot other than `keep`: marker removed, checkpoint written, then the new
    marker. `keep` is the slot of the checkpoint this run resumed from or saved last, the newest known to be good: a
    newer slot that failed to load may look newer, and overwriting the good one would leave nothing if this save is
    cut short too. `save` writes the file (save_state in training)."""
    used = {slot.name: s for s, slot in complete_checkpoints(checkpoint_dir)}
    names = [f"{SLOT_PREFIX}{k}" for k in range(KEEP_CHECKPOINTS)]
    slot = checkpoint_dir / min((n for n in names if keep is None or n != keep.name), key=lambda n: used.get(n, -1))
    slot.mkdir(parents=True, exist_ok=True)
    (slot / MARKER).unlink(missing_ok=True)
    path = slot / "checkpoint.pt"
    save(state, path)
    marker = {"step": step, "bytes": path.stat().st_size, "sha256": _sha256(path)}
    (slot / f".{MARKER}").write_text(json.dumps(marker))
    os.replace(slot / f".{MARKER}", slot / MARKER)
    return slot


def finished_before(checkpoint_dir: Path) -> bool:
    """Whether a training in this folder already finished (its checkpoints are not this one's to resume)."""
    try:
        return (checkpoint_dir / TRAINING_STATE).read_text().strip() == "finished"
    except OSError:
        return False


def mark_training(checkpoint_dir: Path, state: str, stale_slots: bool = False) -> None:
    """Write the folder's training state; `stale_slots`: also rewrite every slot's marker so that no slot of a
    finished training is resumed (rewritten, not deleted: SageMaker's sync would bring a deleted file back)."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    if stale_slots:
        for slot in checkpoint_dir.glob(f"{SLOT_PREFIX}*"):
            if (slot / MARKER).exists():
                (slot / MARKER).write_text(json.dumps({"stale": "the checkpoint of a finished training"}))
    (checkpoint_dir / TRAINING_STATE).write_text(state + "\n")


def load_latest_checkpoint(checkpoint_dir: Path) -> tuple[dict, Path] | None:
    """The newest checkpoint whose file matches its marker (size and SHA-256) and loads, and its slot; else None."""
    for step, slot in reversed(complete_checkpoints(checkpoint_dir)):
        path = slot / "checkpoint.pt"
        try:
            marker = json.loads((slot / MARKER).read_text())
            if path.stat().st_size != marker["bytes"] or _sha256(path) != marker["sha256"]:
                raise ValueError("does not match its marker (half written or half synced)")
            state = torch.load(path, map_location="cpu", weights_only=True)
            if state.get("step") != step:
                raise ValueError(f"holds step {state.get('step')}, its marker says {step}")
            return state, slot
        except Exception as e:  # a truncated or stale checkpoint: try the previous one
            print(f"warning: skipping checkpoint {slot}: {e}", file=sys.stderr, flush=True)
    return None


# -----------------------------------------------------------------------------
# scoring and artifacts


def make_loader(rt: Runtime, split: TokenizedSplit, batches: list[np.ndarray], rows: int | None, workers: int):
    """A loader of collated batches (on the device for XLA) and the tokens of each batch."""
    buckets = length_buckets(split.max_length) if rt.fixed_shapes else None
    multiple = 16 if rt.device_type == "cuda" else 1  # bf16 tensor-core tiles and the attention kernels' alignment
    pads = [pad_length(int(split.lengths[b].max()), buckets, multiple) for b in batches]
    loader = torch.utils.data.DataLoader(
        BatchDataset(split, batches, pads, rows), batch_size=None, shuffle=False, num_workers=workers,
        pin_memory=rt.device_type == "cuda",
    )
    tokens = [BatchTokens.of(split.lengths[b], p) for b, p in zip(batches, pads, strict=True)]
    return (pl.MpDeviceLoader(loader, rt.device) if rt.xla else loader), tokens


def score(
    rt: Runtime, model: torch.nn.Module, split: TokenizedSplit, batches: list[np.ndarray], rows: int | None,
    workers: int,
) -> np.ndarray:
    """The logits (rows x classes) of every row of `split` that `batches` names on any rank; each rank scores its
    own batches and the logits are summed across ranks (rows no rank scored stay 0)."""
    model.eval()
    loader, _ = make_loader(rt, split, batches, rows, workers)
    scored = []
    with torch.no_grad(), rt.autocast():
        for batch in loader:
            padded = has_padding(rt, batch)
            batch = {k: v.to(rt.device, non_blocking=True) for k, v in batch.items()}
            scored.append(forward(rt, model, batch, padded).float())  # stays on the device: no host sync per batch
    rt.mark_step()
    full = np.zeros((len(split), len(split.names)), np.float32)
    for rows_of_batch, logits in zip(batches, scored, strict=True):
        full[rows_of_batch] = logits.cpu().numpy()[: len(rows_of_batch)]
    return rt.all_reduce_sum(full)


def write_predictions(path: Path, split: TokenizedSplit, logits: np.ndarray) -> None:
    """The test split's labels, predicted labels and logits (one per class), one row per test row in the split's
    order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    classes = logits.shape[1]
    table = pa.table(
        {
            "label": pa.array(split.labels.astype(np.int32)),
            "prediction": pa.array(logits.argmax(axis=1).astype(np.int32)),
            "logits": pa.FixedSizeListArray.from_arrays(pa.array(logits.astype(np.float32).ravel()), classes),
        }
    )
    pq.write_table(table, path)


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


def load_split(folder: str, max_length: int) -> TokenizedSplit | None:
    """The split in `folder`, or None when the channel is absent or has no rows (Tokenize writes one empty file for
    an empty split: its accuracy is unknown, not NaN)."""
    if not (Path(folder).is_dir() and any(Path(folder).glob("*.parquet"))):
        return None
    split = TokenizedSplit(folder, max_length)
    return split if len(split) else None


# -----------------------------------------------------------------------------
# one optimizer step and its read-outs


def has_padding(rt: Runtime, batch: dict[str, torch.Tensor]) -> bool:
    """Whether a batch has padding, read on the host (XLA batches are already on the device: always True)."""
    return rt.xla or not bool(batch["attention_mask"].all())


def micro_step(rt: Runtime, model: torch.nn.Module, batch: dict[str, torch.Tensor], grad_accum: int,
               sync: bool) -> torch.Tensor:
    """Forward and backward of one micro-batch, its gradients scaled for accumulation (`sync`: DDP all-reduces
    them now); its loss, left on the device."""
    padded = has_padding(rt, batch)
    batch = {k: v.to(rt.device, non_blocking=True) for k, v in batch.items()}
    with nullcontext() if sync else model.no_sync():
        with rt.autocast():
            loss = F.cross_entropy(forward(rt, model, batch, padded).float(), batch["labels"])
        (loss / grad_accum).backward()
    return loss.detach()


def reduce_gradients(rt: Runtime, optimizer) -> None:
    """XLA: average the fp32 gradients across ranks, as Neuron's BERT sample does (xm.reduce_gradients: what
    xm.optimizer_step does, split off to clip in between)."""
    if rt.world_size > 1:
        xm.reduce_gradients(optimizer)


def optimizer_step(rt: Runtime, model: torch.nn.Module, optimizer, scheduler, max_grad_norm: float) -> None:
    if rt.xla:
        reduce_gradients(rt, optimizer)
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def read_out(rt: Runtime, loss_sum: torch.Tensor, stop_requested: bool, checkpoint_due: bool, seconds: float = 0.0
             ) -> tuple[float, bool, bool, float]:
    """The loss summed over all ranks since the last read-out, whether any rank was asked to stop, whether any
    rank's checkpoint clock ran out, and the ranks' mean of `seconds` (the interval's length), all agreed by every
    rank: the one host sync of the loop every --log-interval steps (on CPU/CUDA also see agreed_stop)."""
    rt.mark_step()
    flags = torch.tensor([float(stop_requested), float(checkpoint_due), seconds]).to(rt.device)
    stats = torch.cat([loss_sum.reshape(1), flags])
    if rt.distributed:
        dist.all_reduce(stats)
    loss_total, stops, due, seconds_sum = stats.cpu().tolist()
    return loss_total, stops > 0, due > 0, seconds_sum / rt.world_size


def agreed_stop(rt: Runtime, requested: bool) -> bool:
    """Whether any rank was asked to stop (a one-number all-reduce and host sync, between read-outs on CPU/CUDA)."""
    return bool(rt.all_reduce_sum(np.array([float(requested)]))[0] > 0)


def stop_check_steps(rt: Runtime, seconds: float, steps: int) -> int:
    """Optimizer steps between stop checks, from the last interval's agreed length (the same on every rank): about
    STOP_CHECK_SECONDS apart, and never on XLA (its extra graph; the neuronx image forwards no SIGTERM anyway)."""
    if rt.xla:
        return 0
    return max(1, int(STOP_CHECK_SECONDS * steps / seconds)) if seconds > 0 and steps else 1


class Throughput:
    """Samples, model FLOPs and seconds of each log interval, all ranks together (this rank's rows x world size).
    The first interval is the warm-up; the steady-state rate is that of the later ones."""

    def __init__(self, config, world_size: int):
        self.config, self.world_size = config, world_size
        self.intervals: list[tuple[int, float, float]] = []  # (samples, FLOPs, seconds)
        self.samples = 0
        self.start = self.interval_start = self.end = time.time()
        self.interval_samples, self.interval_flops = 0, 0.0

    def add(self, rows: int, tokens: BatchTokens) -> None:
        self.interval_samples += rows * self.world_size
        self.interval_flops += model_flops(self.config, tokens.real, tokens.squares) * self.world_size

    def elapsed(self) -> float:
        """Seconds since the current interval began."""
        return time.time() - self.interval_start

    def interval(self) -> float:
        """Close the current interval (at a read-out, after the host sync); its samples/s."""
        now = self.end = time.time()
        seconds, samples = now - self.interval_start, self.interval_samples
        if samples:
            self.intervals.append((samples, self.interval_flops, seconds))
            self.samples += samples
        self.interval_start, self.interval_samples, self.interval_flops = now, 0, 0.0
        return samples / seconds if seconds > 0 else 0.0

    def steady(self) -> list[tuple[int, float, float]]:
        """The intervals after the first (the warm-up); none in a run of one interval."""
        return self.intervals[1:]

    def steady_rate(self) -> float:
        samples, seconds = sum(i[0] for i in self.steady()), sum(i[2] for i in self.steady())
        return samples / seconds if seconds > 0 else 0.0

    def stats(self) -> dict:
        """samples_per_sec: steady state (None in a run of one log interval: it has no steady state); warmup_s: what
        the first interval took beyond the steady rate (compiling, warming up); wall_time_s and
        samples_per_sec_with_warmup: the whole loop (scoring after it not included), as billed."""
        wall = self.end - self.start
        rate = self.steady_rate()
        flops, seconds = sum(i[1] for i in self.steady()), sum(i[2] for i in self.steady())
        first = self.intervals[0] if len(self.intervals) > 1 else None
        return {
            "samples": self.samples,
            "wall_time_s": round(wall, 3),
            "samples_per_sec": rate or None,
            "samples_per_sec_with_warmup": self.samples / wall if wall > 0 else None,
            "warmup_s": round(max(0.0, first[2] - first[0] / rate), 3) if first and rate else None,
            "steady_state_samples": sum(i[0] for i in self.steady()) if first else 0,
            "model_tflops_per_sec": flops / seconds / 1e12 if seconds > 0 else None,
        }


def compile_figures(rt: Runtime) -> dict[str, float | None]:
    """The graphs this process compiled and the seconds it spent compiling them: XLA's metrics, or torch.compile's
    (Dynamo's graph count and its compile wall time, backward graphs included); None without a compiler."""
    if rt.xla:
        count, nanoseconds = met.metric_data("CompileTime")[:2]
        return {"compile_count": count, "compile_s": nanoseconds / 1e9}
    if rt.compile:
        from torch._dynamo.utils import calculate_time_spent, counters

        spent = calculate_time_spent()
        return {"compile_count": counters["stats"]["unique_graphs"],
                "compile_s": spent.get("total_wall_time", spent.get("entire_frame_compile", 0.0))}
    return {"compile_count": None, "compile_s": None}


def write_stats(rt: Runtime, output_data_dir: str, stats: dict) -> None:
    if rt.master:
        Path(output_data_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_data_dir) / STATS_FILE).write_text(json.dumps(stats, indent=2))
        rt.log(f"training_stats={json.dumps(stats)}")


def track(args: argparse.Namespace, rt: Runtime, stats: dict) -> None:
    """The run's parameters, loss and throughput per log interval and final metrics (training_stats.json's) to the
    execution's MLflow run (best effort: see tracking.py)."""
    channel = os.environ.get("SM_CHANNEL_TRACKING")  # the job's "tracking" channel: where the server is
    if not (channel or os.environ.get("MLFLOW_TRACKING_URI")):  # untracked (a run of this file outside its bundle)
        return
    import tracking  # steps/tracking.py, which the training bundle holds beside this script

    params = {k: v for k, v in vars(args).items() if not k.endswith("_dir")}
    tracking.Tracker("Train", settings_dir=channel).log(
        metrics={k: stats.get(k) for k in TRACKED_STATS},
        params={**params, "device": rt.device_type, "world_size": rt.world_size, "bf16": rt.bf16},
        curves={"train_loss": [(i["step"], i["loss"]) for i in stats["intervals"]],
                "interval_samples_per_sec": [(i["step"], i["samples_per_sec"]) for i in stats["intervals"]]},
    )


# -----------------------------------------------------------------------------
# main's seams: resume, the loop (which a --precompile run walks too), scoring, the stats


class Checkpointer:
    """Saves the training state to the checkpoint ring (rank 0 writes, every rank waits) and keeps the clock of
    --checkpoint-minutes; `slot` is the last complete checkpoint's, which the next save keeps."""

    def __init__(self, rt: Runtime, checkpoint_dir: Path, model: torch.nn.Module, optimizer, scheduler,
                 slot: Path | None):
        self.rt, self.checkpoint_dir, self.model = rt, checkpoint_dir, model
        self.optimizer, self.scheduler, self.slot = optimizer, scheduler, slot
        self.last = time.monotonic()

    def minutes(self) -> float:
        return (time.monotonic() - self.last) / 60

    def save(self, step: int) -> None:
        rt = self.rt
        rt.mark_step()
        if rt.master:
            state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                     "scheduler": self.scheduler.state_dict(), "step": step, "world_size": rt.world_size}
            self.slot = save_checkpoint(self.checkpoint_dir, step, state, keep=self.slot,
                                        save=lambda data, path: save_state(rt, data, path))
            rt.log(f"saved checkpoint {self.slot} at step={step}")
        rt.barrier("checkpoint")
        self.last = time.monotonic()


def resume(rt: Runtime, checkpoint_dir: Path, model: torch.nn.Module, optimizer, scheduler
           ) -> tuple[int, Path | None]:
    """Load the latest complete checkpoint, unless the ones there are of a finished training (then start afresh),
    and mark the folder's training running: the step to go on from and the checkpoint's slot."""
    fresh = finished_before(checkpoint_dir)  # every rank reads it before rank 0 rewrites it
    loaded = None if fresh else load_latest_checkpoint(checkpoint_dir)
    rt.barrier("training state")
    if rt.master:
        mark_training(checkpoint_dir, "running", stale_slots=fresh)
    if fresh:
        rt.log("the checkpoints here are of a finished training: starting afresh")
    if loaded is None:
        return 0, None
    state, slot = loaded
    if state["world_size"] != rt.world_size:
        rt.log(
            f"warning: checkpoint written with world size {state['world_size']}, now {rt.world_size}: "
            "the data order after resumption differs from an uninterrupted run"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    rt.log(f"resumed from checkpoint at step={state['step']}")
    return state["step"], slot


@dataclass
class Schedule:
    """The micro-batches the loop walks: `epoch_batches(epoch)` gives an epoch's (this rank's row indices of
    `split`), of which each `grad_accum` make one of `steps_per_epoch` optimizer steps, until `total_steps`."""

    split: TokenizedSplit
    epoch_batches: Callable[[int], list[np.ndarray]]
    steps_per_epoch: int
    total_steps: int


@dataclass
class Walked:
    """What the loop leaves: the step it reached, the last interval's loss, each read-out's step, loss and
    samples/s, XLA's compile count after each epoch, and this rank's real and padded tokens."""

    step: int
    last_loss: float | None = None
    intervals: list[dict] = field(default_factory=list)
    compiles_per_epoch: list[int] = field(default_factory=list)
    real_tokens: int = 0
    padded_tokens: int = 0


def train_loop(args: argparse.Namespace, rt: Runtime, model: torch.nn.Module, optimizer, scheduler,
               schedule: Schedule, step: int, throughput: Throughput, stop: dict, workers: int, ddp: bool,
               checkpointer: Checkpointer | None) -> Walked:
    """From `step` to the schedule's end: a read-out every --log-interval steps (the loss, the stop flag and the
    checkpoint clock, agreed by all ranks), checkpoints at --checkpoint-interval and on the clock, and on SIGTERM a
    checkpoint and exit 143. Without a checkpointer (a --precompile run) nothing is saved."""
    walked = Walked(step)
    loss_sum = torch.zeros(()).to(rt.device)
    interval_steps, stopping, checkpoint_due = 0, False, False
    check_every = stop_check_steps(rt, 0.0, 0)  # every step until the first read-out has timed one
    per_epoch, accum = schedule.steps_per_epoch, args.grad_accum
    model.train()
    while step < schedule.total_steps:
        epoch = step // per_epoch
        batches = schedule.epoch_batches(epoch)[(step % per_epoch) * accum : per_epoch * accum]
        loader, tokens = make_loader(rt, schedule.split, batches, args.batch_size, workers)
        for micro, (batch_tokens, batch) in enumerate(zip(tokens, loader, strict=True)):
            if micro % accum == 0:
                rt.reseed((args.seed * 1_000_003 + step * rt.world_size + rt.rank) % 2**31)
            last_micro = (micro + 1) % accum == 0
            loss_sum += micro_step(rt, model, batch, accum, sync=last_micro or not ddp)
            throughput.add(len(batch["labels"]), batch_tokens)
            walked.real_tokens += batch_tokens.real
            walked.padded_tokens += batch_tokens.padded
            if not last_micro:
                continue
            optimizer_step(rt, model, optimizer, scheduler, args.max_grad_norm)
            step += 1
            interval_steps += 1
            if step % args.log_interval == 0 or step == schedule.total_steps:
                clock = checkpointer is not None and 0 < args.checkpoint_minutes <= checkpointer.minutes()
                loss_total, stopping, checkpoint_due, seconds = read_out(rt, loss_sum, stop["requested"], clock,
                                                                         throughput.elapsed())
                check_every = stop_check_steps(rt, seconds, interval_steps)
                walked.last_loss = loss_total / (interval_steps * accum * rt.world_size)
                rate = throughput.interval()
                walked.intervals.append({"step": step, "loss": walked.last_loss, "samples_per_sec": rate})
                rt.log(f"step={step} epoch={epoch} loss={walked.last_loss:.4f} samples_per_sec={rate:.1f} "
                       f"lr={scheduler.get_last_lr()[0]:.1e}")
                loss_sum = torch.zeros(()).to(rt.device)
                interval_steps = 0
            elif check_every and interval_steps % check_every == 0:
                stopping = agreed_stop(rt, stop["requested"])
            interval_due = args.checkpoint_interval > 0 and step % args.checkpoint_interval == 0
            if checkpointer is not None and (stopping or checkpoint_due or interval_due):
                checkpointer.save(step)
                checkpoint_due = False
            if stopping:
                rt.log(f"stopping on SIGTERM at step={step}")
                rt.end(143)
                sys.exit(143)
            if step >= schedule.total_steps:
                break
        if rt.xla:
            walked.compiles_per_epoch.append(met.metric_data("CompileTime")[0])
    throughput.interval()  # steps after the last read-out (a stop at the step limit reads out, so none)
    walked.step = step
    return walked


def precompile(args: argparse.Namespace, rt: Runtime, model: torch.nn.Module, optimizer, scheduler,
               train: TokenizedSplit, scored: dict[str, TokenizedSplit], buckets: list[int] | None, stop: dict,
               workers: int) -> dict:
    """For neuron_parallel_compile: trace every graph of the real run once and keep nothing it trains: the loop of
    the real run over one accumulation cycle per length bucket (see bucket_probes), then for each split in `scored`
    one evaluation batch per length bucket it fills, the bucket of this rank's first evaluation batch first (the
    first batch's graph holds more than the forward pass) and again at the end (its plain graph), and the all-reduce
    of its logits (the split's real size), and the token counts' all-reduce. No checkpoint, no model saved. The
    stats of the run."""
    first = train_batches(train.lengths, args.batch_size, args.seed, 0, rt.rank, rt.world_size)[0]
    probes = bucket_probes(train, buckets, args.batch_size, first)
    micro = [probe for probe in probes for _ in range(args.grad_accum)]
    schedule = Schedule(train, lambda epoch: micro, len(probes), len(probes))
    walked = train_loop(args, rt, model, optimizer, scheduler, schedule, 0, Throughput(model.config, rt.world_size),
                        stop, workers, ddp=False, checkpointer=None)
    for split in scored.values():
        own = eval_batches(split.lengths, args.batch_size, rt.rank, rt.world_size)
        score(rt, model, split, bucket_probes(split, buckets, args.batch_size, own[0] if own else None),
              args.batch_size if rt.fixed_shapes else None, workers)
    rt.all_reduce_sum(np.zeros(2))
    rt.log(f"precompile: traced {walked.step} optimizer steps over {len(probes) - 1} length bucket(s) and "
           f"{', '.join(scored) or 'no'} evaluation")
    return {
        "device": rt.device_type,
        "world_size": rt.world_size,
        "bf16": rt.bf16,
        "precompile": True,
        "steps": walked.step,
        **compile_figures(rt),
        "length_buckets": buckets,
    }


def score_splits(args: argparse.Namespace, rt: Runtime, model: torch.nn.Module,
                 splits: dict[str, TokenizedSplit | None], workers: int
                 ) -> tuple[dict[str, float | None], dict[str, np.ndarray]]:
    """Each split's accuracy (None where there is no split) and logits, every rank scoring its share."""
    rows = args.batch_size if rt.fixed_shapes else None
    accuracy: dict[str, float | None] = dict.fromkeys(splits)
    logits: dict[str, np.ndarray] = {}
    for name, split in splits.items():
        if split is None:
            continue
        batches = eval_batches(split.lengths, args.batch_size, rt.rank, rt.world_size)
        logits[name] = score(rt, model, split, batches, rows, workers)
        accuracy[name] = float(np.mean(logits[name].argmax(axis=1) == split.labels))
        rt.log(f"{name}_accuracy={accuracy[name]:.4f}")
    return accuracy, logits


def run_stats(rt: Runtime, walked: Walked, throughput: Throughput, resumed_from: int, scoring_s: float,
              accuracy: dict[str, float | None], test_rows: int | None, buckets: list[int] | None) -> dict:
    """training_stats.json: what the run did (steps, throughput, tokens, memory, compiles) and scored."""
    tokens = np.array([walked.real_tokens, walked.padded_tokens], np.float64)
    real_tokens, padded_tokens = rt.all_reduce_sum(tokens).tolist()
    steady = throughput.steady_rate()
    return {
        "device": rt.device_type,
        "world_size": rt.world_size,
        "bf16": rt.bf16,
        "precompile": False,
        "steps": walked.step - resumed_from,
        "global_step": walked.step,
        "resumed_from_step": resumed_from or None,
        **throughput.stats(),
        "scoring_s": round(scoring_s, 3),
        "tokens_per_sec": steady * real_tokens / throughput.samples if throughput.samples and steady else None,
        "padding_efficiency": real_tokens / padded_tokens if padded_tokens else None,
        "peak_device_memory_gb": torch.cuda.max_memory_allocated() / 1e9 if rt.device_type == "cuda" else None,
        "peak_host_memory_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        "train_loss": walked.last_loss,
        "val_accuracy": accuracy["val"],
        "test_accuracy": accuracy["test"],
        "test_rows": test_rows,
        **compile_figures(rt),
        "compile_count_per_epoch": walked.compiles_per_epoch if rt.xla else None,
        "length_buckets": buckets,
        "intervals": walked.intervals,
    }


# -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    checkpoint_dir = Path(args.checkpoint_dir)
    rt = setup(args)
    stop = {"requested": False}
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.update(requested=True))
    rt.log(f"device={rt.device_type} world_size={rt.world_size} bf16={rt.bf16} transformers={transformers.__version__}")

    # data
    train = TokenizedSplit(args.train_dir, args.max_length)
    splits = {name: load_split(folder, args.max_length)
              for name, folder in (("val", args.validation_dir), ("test", args.test_dir))}
    buckets = length_buckets(args.max_length) if rt.fixed_shapes else None
    workers = args.num_workers if args.num_workers >= 0 else (0 if rt.device_type == "cpu" else 2)

    def epoch_batches(epoch: int) -> list[np.ndarray]:
        return train_batches(train.lengths, args.batch_size, args.seed, epoch, rt.rank, rt.world_size)

    steps_per_epoch = len(epoch_batches(0)) // args.grad_accum
    if steps_per_epoch == 0:
        raise ValueError(
            f"{len(train)} training rows are too few for batch size {args.batch_size} x "
            f"{rt.world_size} devices x {args.grad_accum} accumulation steps"
        )
    total_steps = args.max_steps if args.max_steps > 0 else args.epochs * steps_per_epoch
    warmup_steps = int(args.warmup_ratio * total_steps)

    # model, optimizer, schedule
    global_batch = args.batch_size * rt.world_size * args.grad_accum
    learning_rate = scaled_rate(args.learning_rate, args.lr_global_batch, global_batch)
    if learning_rate != args.learning_rate:
        rt.log(f"learning rate {args.learning_rate:.3g} is set for global batch {args.lr_global_batch}; at this "
               f"run's {global_batch}: {learning_rate:.3g} (square-root rule)")
        args.learning_rate = learning_rate  # what the stats and the tracked parameters report
    raw_model = load_model(args.model_id, rt, args.seed, train.names)
    decay = [p for p in raw_model.parameters() if p.ndim >= 2]
    no_decay = [p for p in raw_model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.learning_rate, **({"fused": True} if rt.device_type in ("cpu", "cuda") else {}),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, warmup_steps, total_steps))
    if args.precompile:
        scored = {name: split for name, split in splits.items() if split is not None}
        write_stats(rt, args.output_data_dir, precompile(args, rt, raw_model, optimizer, scheduler, train, scored,
                                                         buckets, stop, workers))
        rt.end()
        return

    # resume, then the loop
    resumed_from, slot = resume(rt, checkpoint_dir, raw_model, optimizer, scheduler)
    checkpointer = Checkpointer(rt, checkpoint_dir, raw_model, optimizer, scheduler, slot)
    ddp = not rt.xla and rt.world_size > 1
    model = raw_model
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[rt.device.index] if rt.device_type in ("cuda", "neuron") else None
        )
    if rt.compile:
        model = torch.compile(model, **rt.compile_options())
    rt.log(f"steps_per_epoch={steps_per_epoch} total_steps={total_steps} warmup_steps={warmup_steps}")
    throughput = Throughput(raw_model.config, rt.world_size)
    schedule = Schedule(train, epoch_batches, steps_per_epoch, total_steps)
    walked = train_loop(args, rt, model, optimizer, scheduler, schedule, resumed_from, throughput, stop, workers, ddp,
                        checkpointer)

    # scoring, the stats, the artifacts
    scoring_started = time.time()
    accuracy, logits = score_splits(args, rt, raw_model, splits, workers)
    test = splits["test"]
    stats = run_stats(rt, walked, throughput, resumed_from, time.time() - scoring_started, accuracy,
                      len(test) if test is not None else None, buckets)
    write_stats(rt, args.output_data_dir, stats)
    if rt.master:
        save_model(raw_model.to("cpu"), args.model_id, Path(args.model_dir), args.max_length)
        if "test" in logits:
            write_predictions(Path(args.model_dir) / PREDICTIONS_FILE, test, logits["test"])
        rt.log(f"saved model to {args.model_dir}")
        track(args, rt, stats)
        mark_training(checkpoint_dir, "finished")
    rt.end()


if __name__ == "__main__":
    main()
