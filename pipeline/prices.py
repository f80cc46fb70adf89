"""On-demand prices per instance-hour and the cost arithmetic of SageMaker jobs.

The defaults are approximate SageMaker on-demand list prices in us-east-1 (USD per instance-hour, the same for
training and processing for these types), as last checked in 2025. Prices change and differ by region: check
them at PRICING_URL and override them in the `prices` section of pipeline.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PRICING_URL = "https://aws.amazon.com/sagemaker/pricing/"
PRICES_AS_OF = "2025"
PRICES_REGION = "us-east-1"

DEFAULT_PRICES: dict[str, float] = {
    # Trainium
    "ml.trn1.2xlarge": 1.5435,
    "ml.trn1.32xlarge": 24.725,
    "ml.trn1n.32xlarge": 28.497,
    # NVIDIA A100 and A10G
    "ml.p4d.24xlarge": 37.688,
    "ml.g5.xlarge": 1.408,
    "ml.g5.2xlarge": 1.515,
    "ml.g5.4xlarge": 2.03,
    "ml.g5.8xlarge": 3.06,
    "ml.g5.12xlarge": 7.09,
    "ml.g5.16xlarge": 5.12,
    "ml.g5.24xlarge": 10.18,
    "ml.g5.48xlarge": 20.36,
    # NVIDIA T4: the GPU serving row of `cost --serving`
    "ml.g4dn.xlarge": 0.736,
    # CPU: processing (Tokenize, Evaluate) and the endpoint
    "ml.m5.xlarge": 0.23,
    "ml.m5.2xlarge": 0.461,
    "ml.m5.4xlarge": 0.922,
    "ml.c5.xlarge": 0.204,
}

# SageMaker Serverless Inference: USD per second of a request's duration per 1024 MB of the endpoint's memory (billed
# by the millisecond), and per GB of data in and out. From AWS's own sample (its ml.c5.xlarge price is the one
# above): aws-samples/sagemaker-serverless-inference-benchmarking@cb0028576fe60e4704526a46368cbd53851eebc7:
# src/sm_serverless_benchmarking/cost_constants.py (2022-09); check PRICING_URL.
SERVERLESS_PER_GB_SECOND = 0.00002
SERVERLESS_PER_GB_DATA = 0.016


@dataclass
class JobCost:
    """What one job cost: `seconds` billed on `count` instances at `price` per instance-hour.

    `cost` is None when the price or the billed seconds are unknown (never 0 for "unknown").
    With managed spot, `training_seconds` is the run time and `savings` = 1 - seconds / training_seconds.
    """

    step: str
    job: str
    kind: str  # Training | Processing
    instance_type: str
    count: int
    seconds: float | None
    basis: str  # how `seconds` was measured
    price: float | None
    training_seconds: float | None = None
    spot: bool = False
    status: str = ""
    note: str = ""
    cached: bool = False

    @property
    def cost(self) -> float | None:
        if self.cached:
            return 0.0
        if self.price is None or self.seconds is None:
            return None
        return self.count * self.seconds / 3600 * self.price

    @property
    def savings(self) -> float | None:
        """Managed spot savings, AWS's definition: 1 - billable / training time."""
        if not self.spot or not self.training_seconds or self.seconds is None:
            return None
        return 1 - self.seconds / self.training_seconds

    @property
    def on_demand_cost(self) -> float | None:
        """What the same run time would have cost without managed spot."""
        if self.cached or self.price is None:
            return 0.0 if self.cached else None
        seconds = self.training_seconds if self.spot and self.training_seconds else self.seconds
        return None if seconds is None else self.count * seconds / 3600 * self.price

    def to_dict(self) -> dict:
        return {
            "step": self.step,
            "job": self.job,
            "kind": self.kind,
            "status": self.status,
            "instance_type": self.instance_type,
            "instance_count": self.count,
            "seconds": self.seconds,
            "basis": self.basis,
            "price_per_hour": self.price,
            "cost": self.cost,
            "spot": self.spot,
            "training_seconds": self.training_seconds,
            "spot_savings": self.savings,
            "on_demand_cost": self.on_demand_cost,
            "cached": self.cached,
            "note": self.note,
        }


def _seconds_between(start, end) -> float | None:
    if start is None or end is None:
        return None
    return (end - start).total_seconds()


def training_job_cost(described: dict, price: float | None, step: str = "") -> JobCost:
    """The cost of a DescribeTrainingJob response: BillableTimeInSeconds x InstanceCount x price."""
    resources = described.get("ResourceConfig", {})
    status = described.get("TrainingJobStatus", "")
    billable = described.get("BillableTimeInSeconds")
    note = ""
    if billable is None:
        note = "still running" if status in ("InProgress", "Stopping") else "billable time not reported"
    trained = described.get("TrainingTimeInSeconds")
    return _job_cost(
        (step, described["TrainingJobName"], "Training", resources, status, note, price),
        seconds=float(billable) if billable is not None else None,
        basis="BillableTimeInSeconds",
        training_seconds=float(trained) if trained is not None else None,
        spot=bool(described.get("EnableManagedSpotTraining")),
    )


def processing_job_cost(described: dict, price: float | None, step: str = "") -> JobCost:
    """The cost of a DescribeProcessingJob response: processing jobs report no billable time, so the
    run time ProcessingEndTime - ProcessingStartTime is what is billed."""
    cluster = described.get("ProcessingResources", {}).get("ClusterConfig", {})
    status = described.get("ProcessingJobStatus", "")
    seconds = _seconds_between(described.get("ProcessingStartTime"), described.get("ProcessingEndTime"))
    note = ""
    if seconds is None and status in ("InProgress", "Stopping"):
        note = "still running"
    elif seconds is None and "ProcessingStartTime" not in described:
        seconds, note = 0.0, "never started"  # e.g. failed while provisioning: nothing ran
    elif seconds is None:
        note = "no end time reported"
    job = (step, described["ProcessingJobName"], "Processing", cluster, status, note, price)
    return _job_cost(job, seconds=seconds, basis="ProcessingEndTime - ProcessingStartTime")


def _job_cost(job: tuple, **billing: Any) -> JobCost:
    """A JobCost from (step, job name, kind, resources with InstanceType/InstanceCount, status, note, price)."""
    step, name, kind, resources, status, note, price = job
    instance_type, count = resources.get("InstanceType", "?"), int(resources.get("InstanceCount", 1))
    return JobCost(step=step, job=name, kind=kind, instance_type=instance_type, count=count, price=price,
                   status=status, note=note, **billing)


def per_million(cost: float | None, samples: float | None) -> float | None:
    """Cost per million training samples; None when either is unknown or there were no samples."""
    if cost is None or not samples:
        return None
    return cost / samples * 1e6
