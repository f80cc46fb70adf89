"""Training devices per instance type, and the per-device batch and learning rate that suit them (one home)."""

from __future__ import annotations

# Processes torchrun starts per instance: NeuronCores on Trainium, GPUs on p*/g* (as the DLC toolkit counts them).
DEVICES: dict[str, int] = {
    "ml.trn1.2xlarge": 2,
    "ml.trn1.32xlarge": 32,
    "ml.trn1n.32xlarge": 32,
    "ml.trn2.48xlarge": 64,
    "ml.p3.2xlarge": 1,
    "ml.p3.8xlarge": 4,
    "ml.p3.16xlarge": 8,
    "ml.p3dn.24xlarge": 8,
    "ml.p4d.24xlarge": 8,
    "ml.p4de.24xlarge": 8,
    "ml.p5.48xlarge": 8,
    "ml.p5e.48xlarge": 8,
    "ml.p5en.48xlarge": 8,
    **{f"ml.g5.{size}": 1 for size in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "ml.g5.12xlarge": 4,
    "ml.g5.24xlarge": 4,
    "ml.g5.48xlarge": 8,
    **{f"ml.g6.{size}": 1 for size in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "ml.g6.12xlarge": 4,
    "ml.g6.24xlarge": 4,
    "ml.g6.48xlarge": 8,
}

# Trainium types whose instances can train together: Neuron's collectives between instances need EFA (what
# training/train.py's EFA_INSTANCE_TYPES holds; a test keeps the two equal).
MULTI_NODE_NEURON_TYPES = ("ml.trn1.32xlarge", "ml.trn1n.32xlarge", "ml.trn2.48xlarge")

# Per-device batch by device kind. NeuronCore: the microbatch of Neuron's published BERT recipe. GPU: 256 (on an
# H200, benchmarks/bench_train_peer.py measured train.py at 5,543 samples/s at 256 against 16: ~300 at the former
# default). CPU (local runs, tests): 16.
DEVICE_BATCH_SIZE: dict[str, int] = {"neuron": 16, "gpu": 256, "cpu": 16}
# What `training.learning_rate: auto` passes to train.py, which scales it to the run's global batch (the one place that
# knows its world size): 5e-5 at a global batch of 512 (16 on each of the 32 NeuronCores of one
# ml.trn1.32xlarge), by the square root of the global batch ratio (the square-root rule for Adam: Malladi et al.,
# "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms", NeurIPS 2022).
REFERENCE_LEARNING_RATE = 5e-5
REFERENCE_GLOBAL_BATCH = 512


def device_kind(instance_type: str) -> str:
    """neuron (trn*/inf*), gpu (p*/g*) or cpu (any other type, and local runs)."""
    family = instance_type.removeprefix("ml.").split(".")[0]
    if family.startswith(("trn", "inf")):
        return "neuron"
    return "gpu" if family[:1] in ("p", "g") else "cpu"


def default_batch_size(instance_type: str) -> int:
    """The per-device batch `training.batch_size: auto` stands for on this instance type."""
    return DEVICE_BATCH_SIZE[device_kind(instance_type)]


def global_batch_size(instance_type: str, instance_count: int, batch_size: int, grad_accum: int) -> int:
    """Samples per optimizer step: devices x per-device batch x accumulation (an unknown type counts one device)."""
    return DEVICES.get(instance_type, 1) * instance_count * batch_size * grad_accum

