"""`cost`: what each job of a pipeline execution cost, with the training throughput, on SageMaker or locally.

SageMaker: ListPipelineExecutionSteps -> each step's job ARN -> DescribeTrainingJob (BillableTimeInSeconds) or
DescribeProcessingJob (ProcessingEndTime - ProcessingStartTime) -> x InstanceCount x the configured price.
Local: the runner's execution record (wall time per step) priced as if the step had run on its instance type.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from pipeline.aws import Aws, AwsError, explained, split_s3_uri
from pipeline.config import Prices
from pipeline.contract import MODEL_ARCHIVE, OUTPUT_ARCHIVE, STATS_FILE, STATS_METRICS, job_output
from pipeline.dag.expressions import Context, ExpressionError, evaluate
from pipeline.dag.graph import flatten_steps
from pipeline.prices import JobCost, per_million, processing_job_cost, training_job_cost

if TYPE_CHECKING:
    from pipeline.local.session import LocalAccount

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


def output_tarball_uri(described: dict) -> str:
    """Where SageMaker puts a training job's output.tar.gz (the SM_OUTPUT_DATA_DIR contents)."""
    return job_output(described["OutputDataConfig"]["S3OutputPath"], described["TrainingJobName"], OUTPUT_ARCHIVE)


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
    on-demand rate of the instance type the step names in the definition that execution ran. Nothing was billed."""
    chosen = account.find(execution_id)
    steps = flatten_steps(account.ran_definition(chosen)["Steps"])
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
            tarball = account.s3.path(model.removesuffix(MODEL_ARCHIVE) + OUTPUT_ARCHIVE)
            training = merge_stats(stats_from_tarball(tarball.read_bytes()) if tarball.exists() else None, {})
    notes = [
        "local run: nothing was billed; each cost is the step's wall time on this machine priced at the on-demand "
        "rate of the instance type the step names (a different machine: not a prediction of the AWS bill)",
        NOT_INCLUDED,
    ]
    return ExecutionCost(chosen.id, "local", prices.currency, jobs, training, notes)
