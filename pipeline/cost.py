"""A cost report: what each job of an execution cost, with the training throughput (pipeline.views renders it).

Both backends compute one: pipeline.sagemaker.cost from the jobs SageMaker describes, pipeline.local.cost from a
local run's wall times.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline.prices import JobCost, per_million
from steps.contract import STATS_FILE, STATS_METRICS

NOT_INCLUDED = (
    "not included: the endpoint (billed per instance-hour while InService), storage volumes, S3, data transfer"
)


@dataclass
class TrainingStats:
    """Throughput and quality of one training job, from training_stats.json or the job's final metrics."""

    samples: float | None = None
    samples_per_sec: float | None = None  # steady state (after the first log interval)
    samples_per_sec_with_warmup: float | None = None  # the whole training loop
    warmup_s: float | None = None  # what the warm-up (compilation included) took beyond the steady rate
    compile_s: float | None = None  # compile time the run reported (XLA or torch.compile)
    final_loss: float | None = None
    val_accuracy: float | None = None
    test_accuracy: float | None = None
    source: str = "none"

    def to_dict(self) -> dict:
        return asdict(self)


def stats_from_tarball(data: bytes) -> dict | None:
    """training_stats.json from an output.tar.gz (what train.py wrote to SM_OUTPUT_DATA_DIR), or None."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():
                if Path(member.name).name == STATS_FILE and member.isfile():
                    return json.loads(tar.extractfile(member).read())
    except (tarfile.TarError, OSError, json.JSONDecodeError):
        return None
    return None


def merge_stats(stats: dict | None, metrics: dict[str, float]) -> TrainingStats:
    """training_stats.json first; the job's final metric values fill what it lacks."""
    found = TrainingStats()
    sources = []
    if stats:
        found.samples = stats.get("samples")
        found.samples_per_sec = stats.get("samples_per_sec")
        found.samples_per_sec_with_warmup = stats.get("samples_per_sec_with_warmup")
        found.warmup_s = stats.get("warmup_s")
        found.compile_s = stats.get("compile_s")
        found.final_loss = stats.get("train_loss")
        found.val_accuracy = stats.get("val_accuracy")
        found.test_accuracy = stats.get("test_accuracy")
        sources.append(STATS_FILE)
    filled = False
    attributes = {"train_loss": "final_loss"}  # training_stats.json key -> TrainingStats attribute
    for key, metric in STATS_METRICS.items():
        attribute = attributes.get(key, key)
        if getattr(found, attribute) is None and metric in metrics:
            setattr(found, attribute, metrics[metric])
            filled = True
    if filled:
        sources.append("final metrics")
    found.source = " + ".join(sources) or "none"
    return found


@dataclass
class ExecutionCost:
    """The jobs of one execution with their costs, and the training throughput."""

    execution: str
    where: str  # sagemaker | local
    currency: str
    jobs: list[JobCost]
    training: TrainingStats | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        """Sum of the known costs (see `unknown`)."""
        return sum(job.cost for job in self.jobs if job.cost is not None)

    @property
    def unknown(self) -> list[JobCost]:
        return [job for job in self.jobs if job.cost is None]

    @property
    def training_cost(self) -> float | None:
        costs = [job.cost for job in self.jobs if job.kind == "Training"]
        return None if not costs or any(c is None for c in costs) else sum(costs)

    @property
    def cost_per_million_samples(self) -> float | None:
        return per_million(self.training_cost, self.training.samples if self.training else None)

    def to_dict(self) -> dict:
        return {
            "execution": self.execution,
            "where": self.where,
            "currency": self.currency,
            "jobs": [job.to_dict() for job in self.jobs],
            "total": self.total,
            "total_complete": not self.unknown,
            "unknown_cost_steps": [job.step for job in self.unknown],
            "training": self.training.to_dict() if self.training else None,
            "training_cost": self.training_cost,
            "cost_per_million_samples": self.cost_per_million_samples,
            "notes": self.notes,
        }
