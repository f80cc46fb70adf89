"""compare's report: one row per training job (cost, throughput, quality) with ratios to the first job."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.config import Config
from pipeline.config.devices import DEVICES
from pipeline.cost import TrainingStats
from pipeline.prices import PRICING_URL, JobCost, per_million, training_job_cost
from pipeline.sagemaker.aws import Aws, explained
from pipeline.sagemaker.cost import sagemaker_training_stats

RATIOS = ("wall_seconds", "billable_seconds", "samples_per_sec", "cost", "cost_per_million_samples")


@dataclass
class Row:
    """One training job of the comparison."""

    job: JobCost
    wall_seconds: float | None
    stats: TrainingStats
    global_batch: int | None
    steps: int | None
    failure: str = ""
    ratios: dict[str, float | None] = field(default_factory=dict)

    @property
    def cost_per_million_samples(self) -> float | None:
        return per_million(self.job.cost, self.stats.samples)

    def value(self, key: str) -> float | None:
        return {
            "wall_seconds": self.wall_seconds,
            "billable_seconds": self.job.seconds,
            "samples_per_sec": self.stats.samples_per_sec,
            "cost": self.job.cost,
            "cost_per_million_samples": self.cost_per_million_samples,
        }[key]

    def to_dict(self) -> dict:
        return {
            "instance_type": self.job.instance_type,
            "instance_count": self.job.count,
            "job": self.job.job,
            "status": self.job.status,
            "failure_reason": self.failure,
            "wall_seconds": self.wall_seconds,
            "billable_seconds": self.job.seconds,
            "training_seconds": self.job.training_seconds,
            "spot": self.job.spot,
            "spot_savings": self.job.savings,
            "global_batch": self.global_batch,
            "steps": self.steps,
            "samples": self.stats.samples,
            "samples_per_sec": self.stats.samples_per_sec,
            "samples_per_sec_with_warmup": self.stats.samples_per_sec_with_warmup,
            "warmup_s": self.stats.warmup_s,
            "compile_s": self.stats.compile_s,
            "final_loss": self.stats.final_loss,
            "val_accuracy": self.stats.val_accuracy,
            "test_accuracy": self.stats.test_accuracy,
            "stats_source": self.stats.source,
            "price_per_hour": self.job.price,
            "cost": self.job.cost,
            "cost_per_million_samples": self.cost_per_million_samples,
            "ratios_to_first": self.ratios,
        }


@dataclass
class Report:
    currency: str
    rows: list[Row]
    notes: list[str]

    def to_dict(self) -> dict:
        return {
            "currency": self.currency,
            "baseline": self.rows[0].job.instance_type if self.rows else None,
            "jobs": [row.to_dict() for row in self.rows],
            "notes": self.notes,
        }


def _int(value: Any) -> int | None:
    try:
        return int(str(value).strip('"'))
    except (TypeError, ValueError):
        return None


def report(aws: Aws, cfg: Config, described: list[dict]) -> Report:
    """The side-by-side report of finished training jobs; ratios are to the first job."""
    rows = []
    for job in described:
        instance = job["ResourceConfig"]["InstanceType"]
        cost = training_job_cost(job, cfg.prices.price(instance))
        end = job.get("TrainingEndTime")
        wall = (end - job["CreationTime"]).total_seconds() if end and job.get("CreationTime") else None
        hp = job.get("HyperParameters", {})
        per_device, accum = _int(hp.get("batch-size")), _int(hp.get("grad-accum"))
        world = DEVICES.get(instance)
        global_batch = world * cost.count * per_device * accum if world and per_device and accum else None
        max_steps = _int(hp.get("max-steps"))
        with explained(f"read the training stats of {job['TrainingJobName']}"):
            stats = sagemaker_training_stats(aws, job)
        rows.append(
            Row(
                job=cost,
                wall_seconds=wall,
                stats=stats,
                global_batch=global_batch,
                steps=max_steps if max_steps and max_steps > 0 else None,
                failure=job.get("FailureReason", ""),
            )
        )
    for row in rows:
        for key in RATIOS:
            base, value = rows[0].value(key), row.value(key)
            row.ratios[key] = value / base if base and value is not None else None
    notes = [
        "wall time: CreateTrainingJob to the end of training (includes provisioning and image download); "
        "billable: BillableTimeInSeconds, what is charged",
        "cost: instance count x billable seconds x the on-demand price per instance-hour from the config "
        f"(`prices`); check prices at {PRICING_URL}",
        "samples/s, final loss, accuracies: train.py's training_stats.json (samples/s over the training loop; "
        "test and val accuracy: the trained model on the test and validation splits, scored by train.py at the end "
        "of training on the instance itself), else the job's final metrics",
        "cost per M samples: job cost / samples trained x 1e6 (compile, download and startup time included)",
    ]
    return Report(cfg.prices.currency, rows, notes)
