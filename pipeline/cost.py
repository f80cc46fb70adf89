"""`cost`: what each job of a pipeline execution cost, with the training throughput, on SageMaker or locally.

SageMaker: ListPipelineExecutionSteps -> each step's job ARN -> DescribeTrainingJob (BillableTimeInSeconds) or
DescribeProcessingJob (ProcessingEndTime - ProcessingStartTime) -> x InstanceCount x the configured price.
Local: the runner's execution record (wall time per step) priced as if the step had run on its instance type.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from rich.markup import escape
from rich.table import Table

from pipeline.aws import Aws, AwsError, explained, split_s3_uri
from pipeline.config import Prices
from pipeline.prices import PRICING_URL, JobCost, per_million, processing_job_cost, training_job_cost

if TYPE_CHECKING:
    from pipeline.local.session import LocalAccount

STATS_FILE = "training_stats.json"
NOT_INCLUDED = (
    "not included: the endpoint (billed per instance-hour while InService), storage volumes, S3, data transfer"
)


@dataclass
class TrainingStats:
    """Throughput and quality of one training job, from training_stats.json or the job's final metrics."""

    samples: float | None = None
    samples_per_sec: float | None = None
    final_loss: float | None = None
    val_accuracy: float | None = None
    test_accuracy: float | None = None
    source: str = "none"

    def to_dict(self) -> dict:
        return {
            "samples": self.samples,
            "samples_per_sec": self.samples_per_sec,
            "final_loss": self.final_loss,
            "val_accuracy": self.val_accuracy,
            "test_accuracy": self.test_accuracy,
            "source": self.source,
        }


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
        found.final_loss = stats.get("train_loss")
        found.val_accuracy = stats.get("val_accuracy")
        found.test_accuracy = stats.get("test_accuracy")
        sources.append(STATS_FILE)
    filled = False
    for attribute, metric in (
        ("samples_per_sec", "train:samples_per_sec"),
        ("final_loss", "train:loss"),
        ("val_accuracy", "validation:accuracy"),
        ("test_accuracy", "test:accuracy"),
    ):
        if getattr(found, attribute) is None and metric in metrics:
            setattr(found, attribute, metrics[metric])
            filled = True
    if filled:
        sources.append("final metrics")
    found.source = " + ".join(sources) or "none"
    return found


def output_tarball_uri(described: dict) -> str:
    """Where SageMaker puts a training job's output.tar.gz (the SM_OUTPUT_DATA_DIR contents)."""
    root = described["OutputDataConfig"]["S3OutputPath"].rstrip("/")
    return f"{root}/{described['TrainingJobName']}/output/output.tar.gz"


def sagemaker_training_stats(aws: Aws, described: dict) -> TrainingStats:
    """Stats of a SageMaker training job: its output.tar.gz in S3, else its FinalMetricDataList."""
    metrics = {m["MetricName"]: m["Value"] for m in described.get("FinalMetricDataList", [])}
    stats = None
    if described.get("OutputDataConfig", {}).get("S3OutputPath"):
        bucket, key = split_s3_uri(output_tarball_uri(described))
        try:
            stats = stats_from_tarball(aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404", "AccessDenied", "NoSuchBucket"):
                raise
    return merge_stats(stats, metrics)


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


def _job_name(arn: str) -> str:
    return arn.rsplit("/", 1)[-1]


def sagemaker_costs(aws: Aws, arn: str, prices: Prices) -> ExecutionCost:
    """Costs of the job steps of a SageMaker pipeline execution."""
    with explained(f"list steps of {arn}"):
        steps = aws.execution_steps(arn)
    if steps is None:
        raise AwsError(f"list steps of {arn}: ListPipelineExecutionSteps is not available from this endpoint")
    jobs: list[JobCost] = []
    training: TrainingStats | None = None
    for step in steps:
        metadata = step.get("Metadata", {})
        cache = step.get("CacheHitResult", {}).get("SourcePipelineExecutionArn")
        if "TrainingJob" in metadata:
            name = _job_name(metadata["TrainingJob"]["Arn"])
            with explained(f"describe training job {name}"):
                described = aws.sagemaker.describe_training_job(TrainingJobName=name)
            instance = described["ResourceConfig"]["InstanceType"]
            job = training_job_cost(described, prices.price(instance), step["StepName"])
            if not cache:
                with explained(f"read the training stats of {name}"):
                    training = sagemaker_training_stats(aws, described)
        elif "ProcessingJob" in metadata:
            name = _job_name(metadata["ProcessingJob"]["Arn"])
            with explained(f"describe processing job {name}"):
                described = aws.sagemaker.describe_processing_job(ProcessingJobName=name)
            instance = described["ProcessingResources"]["ClusterConfig"]["InstanceType"]
            job = processing_job_cost(described, prices.price(instance), step["StepName"])
        else:
            continue
        if cache:
            job.cached = True
            job.note = f"cache hit: the job ran (and was billed) in execution {_job_name(cache)}"
        jobs.append(job)
    notes = [
        "training: BillableTimeInSeconds (with managed spot, savings = 1 - billable / training time); "
        "processing: ProcessingEndTime - ProcessingStartTime (processing jobs report no billable time)",
        NOT_INCLUDED,
    ]
    return ExecutionCost(_job_name(arn), "sagemaker", prices.currency, jobs, training, notes)


def local_costs(account: LocalAccount, execution_id: str | None, prices: Prices) -> ExecutionCost:
    """Would-be AWS costs of a local execution: each job step's wall time on this machine, priced at the
    on-demand rate of the instance type the step names in the definition. Nothing here was billed."""
    from pipeline.local.expressions import Context, ExpressionError, evaluate
    from pipeline.local.runner import ExecutionNotFound
    from pipeline.upsert import flatten_steps

    found = account.executions()
    chosen = next((e for e in found if execution_id in (None, e.id, e.arn)), None)
    if chosen is None:
        raise ExecutionNotFound(f"no local execution {execution_id}" if execution_id else "no local executions yet")
    steps = flatten_steps(account.definition()["Steps"])
    ctx = Context(parameters=chosen.parameters, execution={})
    jobs: list[JobCost] = []
    training: TrainingStats | None = None
    for name, record in chosen.steps.items():
        if record.type not in ("Training", "Processing") or not record.started:
            continue
        args = steps.get(name, {}).get("Arguments", {})
        resources: Any = args.get("ResourceConfig") or args.get("ProcessingResources", {}).get("ClusterConfig", {})
        try:
            resources = evaluate(resources, ctx, f"step {name}")
        except ExpressionError:
            resources = {}
        instance = str(resources.get("InstanceType", "?"))
        properties = record.properties
        running = record.status == "Executing"
        note = "cache hit: no job ran" if record.cached else ("still running" if running else record.reason[:80])
        job = JobCost(
            step=name,
            job=properties.get("TrainingJobName") or properties.get("ProcessingJobName") or "",
            kind=record.type,
            instance_type=instance,
            count=int(resources.get("InstanceCount", 1)),
            seconds=None if running else record.seconds,
            basis="local wall time",
            price=prices.price(instance),
            status=record.status,
            cached=record.cached,
            note=note,
        )
        jobs.append(job)
        model = properties.get("ModelArtifacts", {}).get("S3ModelArtifacts", "")
        if record.type == "Training" and model and not record.cached:
            tarball = account.s3.path(model.rsplit("/", 1)[0] + "/output.tar.gz")
            training = merge_stats(stats_from_tarball(tarball.read_bytes()) if tarball.exists() else None, {})
    notes = [
        "local run: nothing was billed; each cost is the step's wall time on this machine priced at the on-demand "
        "rate of the instance type the step names (a different machine: not a prediction of the AWS bill)",
        NOT_INCLUDED,
    ]
    return ExecutionCost(chosen.id, "local", prices.currency, jobs, training, notes)


def money(value: float | None, currency: str = "USD") -> str:
    if value is None:
        return "unknown"
    symbol = "$" if currency == "USD" else f"{currency} "
    return f"{symbol}{value:,.4f}" if value < 1 else f"{symbol}{value:,.2f}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{rest:02d}s" if hours else f"{minutes}m{rest:02d}s"


BASIS = {
    "BillableTimeInSeconds": "billable",
    "ProcessingEndTime - ProcessingStartTime": "run time",
    "local wall time": "local wall",
}


def cost_table(report: ExecutionCost) -> Table:
    """The per-job table of `cost`."""
    label = "cost (if billed)" if report.where == "local" else "cost"
    where = "local execution" if report.where == "local" else "execution"
    table = Table(title=f"{where} {report.execution}: cost at on-demand prices ({report.currency})")
    for column in ("step", "job", "instance", "count", "seconds", "basis", "price/h", label, "spot savings", "note"):
        table.add_column(column, justify="right" if column in ("count", "seconds", "price/h", label) else "left")
    for job in report.jobs:
        savings = f"{job.savings:.0%} (on-demand {money(job.on_demand_cost, report.currency)})" if job.spot else ""
        if job.spot and job.savings is None:
            savings = "spot (savings unknown)"
        table.add_row(
            escape(job.step),
            escape(job.job),
            job.instance_type,
            str(job.count),
            "unknown" if job.seconds is None else f"{job.seconds:,.0f}",
            BASIS.get(job.basis, job.basis),
            money(job.price, report.currency) if job.price is not None else "[yellow]unknown[/]",
            money(job.cost, report.currency) if job.cost is not None else "[yellow]unknown[/]",
            savings,
            escape(job.note),
        )
    unknown = report.unknown
    total = money(report.total, report.currency)
    table.add_section()
    table.add_row(
        "total",
        "",
        "",
        "",
        "",
        "",
        "",
        f"{total}" if not unknown else f"[yellow]>= {total}[/]",
        "",
        f"+ {len(unknown)} job(s) of unknown cost: {', '.join(j.step for j in unknown)}" if unknown else "",
    )
    return table


def throughput_lines(report: ExecutionCost) -> list[str]:
    """The training throughput and cost per million samples, in words."""
    stats = report.training
    if stats is None:
        return ["training throughput: no training job ran in this execution (or its step was a cache hit)"]
    rate = "unknown" if stats.samples_per_sec is None else f"{stats.samples_per_sec:,.1f} samples/s"
    samples = "unknown" if stats.samples is None else f"{stats.samples:,.0f}"
    per_m = report.cost_per_million_samples
    return [
        f"training throughput: {rate}; samples trained: {samples} (from {stats.source})",
        f"training cost per million samples: {money(per_m, report.currency)}"
        + ("" if per_m is not None else " (needs the training cost and the sample count)"),
    ]


def print_report(report: ExecutionCost, console: Any) -> None:
    """The table, the throughput lines and the notes."""
    console.print(cost_table(report))
    for line in throughput_lines(report):
        console.print(line)
    for note in report.notes:
        console.print(f"note: {note}", style="dim")
    console.print(f"note: prices are the `prices` section of the config; check them at {PRICING_URL}", style="dim")


def to_json(report: ExecutionCost) -> str:
    return json.dumps(report.to_dict(), indent=2, default=str)
