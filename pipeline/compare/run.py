"""compare on SageMaker: find the tokenized data, upload the code, create the jobs, follow them."""

from __future__ import annotations

import time
from collections.abc import Callable

from pipeline.aws import Aws, AwsError, explained
from pipeline.compare.plan import CompareError, Plan, data_step, train_step
from pipeline.config import Config

TERMINAL = {"Completed", "Failed", "Stopped"}


def latest_tokenized(aws: Aws, cfg: Config, definition: dict, scan: int = 20) -> dict[str, str]:
    """Output folders of the data step (Tokenize) of the newest Succeeded execution."""
    step_name = data_step(train_step(definition))
    with explained(f"list executions of {cfg.pipeline.name}"):
        summaries = aws.sagemaker.list_pipeline_executions(
            PipelineName=cfg.pipeline.name, SortBy="CreationTime", SortOrder="Descending", MaxResults=scan
        )["PipelineExecutionSummaries"]
    for summary in summaries:
        if summary.get("PipelineExecutionStatus") != "Succeeded":
            continue
        arn = summary["PipelineExecutionArn"]
        with explained(f"list steps of {arn}"):
            steps = aws.execution_steps(arn)
        if steps is None:
            raise AwsError("cannot list execution steps from this endpoint; pass --data s3://.../executions/ID")
        for step in steps:
            job = step.get("Metadata", {}).get("ProcessingJob", {}).get("Arn")
            if step["StepName"] == step_name and job:
                name = job.rsplit("/", 1)[-1]
                with explained(f"describe processing job {name}"):
                    described = aws.sagemaker.describe_processing_job(ProcessingJobName=name)
                outputs = described.get("ProcessingOutputConfig", {}).get("Outputs", [])
                return {o["OutputName"]: o["S3Output"]["S3Uri"] for o in outputs if "S3Output" in o}
    raise CompareError(
        f"no Succeeded execution of {cfg.pipeline.name} with a {step_name} step among the newest {scan}; "
        "run the pipeline first or pass --data s3://.../executions/ID"
    )


def start(aws: Aws, cfg: Config, planned: Plan) -> list[str]:
    """Upload the training code (content-hashed, skipped when present) and create the jobs; return their names."""
    from pipeline.records import Upserted
    from pipeline.upsert import upload_code

    upload_code(cfg, aws, Upserted(action="", pipeline_arn=""))
    names = []
    for request in planned.requests:
        with explained(f"create training job {request['TrainingJobName']}"):
            aws.sagemaker.create_training_job(**request)
        names.append(request["TrainingJobName"])
    return names


def describe(aws: Aws, names: list[str]) -> list[dict]:
    found = []
    for name in names:
        with explained(f"describe training job {name}"):
            found.append(aws.sagemaker.describe_training_job(TrainingJobName=name))
    return found


def wait(aws: Aws, names: list[str], on_update: Callable[[list[dict]], None], poll_seconds: float = 60) -> list[dict]:
    """Describe the jobs every `poll_seconds` until all have ended, passing each description to `on_update`."""
    described = describe(aws, names)
    on_update(described)
    while any(job["TrainingJobStatus"] not in TERMINAL for job in described):
        time.sleep(poll_seconds)
        described = describe(aws, names)
        on_update(described)
    return described
