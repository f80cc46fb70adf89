"""`cost` on SageMaker: ListPipelineExecutionSteps -> each step's job ARN -> DescribeTrainingJob
(BillableTimeInSeconds) or DescribeProcessingJob (ProcessingEndTime - ProcessingStartTime) -> x InstanceCount x the
configured price; the training stats from the job's output.tar.gz."""

from __future__ import annotations

from botocore.exceptions import ClientError

from pipeline.config import Prices
from pipeline.cost import NOT_INCLUDED, ExecutionCost, TrainingStats, merge_stats, stats_from_tarball
from pipeline.prices import JobCost, processing_job_cost, training_job_cost
from pipeline.sagemaker.aws import Aws, AwsError, explained, split_s3_uri
from steps.contract import OUTPUT_ARCHIVE, job_output


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
