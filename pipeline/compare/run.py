"""compare on SageMaker: find the tokenized data, upload the code, create the jobs, follow them, and a
`Comparison` that runs these in the order the command needs."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

from pipeline.compare.plan import CompareError, Plan, check_instance_types, data_step, plan, tokenized_at, train_step
from pipeline.compare.report import Report, report
from pipeline.config import Config
from pipeline.sagemaker.aws import Aws, AwsError, explained

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
    from pipeline.sagemaker.upsert import check_model_reachable, upload_code  # lazily: the CLI imports compare

    check_model_reachable(cfg)
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


def instance_types(values: list[str]) -> list[str]:
    """`-i A B C` or `-i A,B,C` (or both) as one list."""
    return [name for value in values for name in value.split(",") if name]


class Comparison:
    """One `compare`: plan and start the jobs (or take jobs that ran), then follow them to the report."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    @cached_property
    def aws(self) -> Aws:
        """Made on first use: planning with --data and --dry-run calls no AWS API."""
        return Aws(self.cfg.aws.region)

    def plan(self, types: list[str], data: str | None, **sizes: int | None) -> Plan:
        """The job requests, from the Train step of the configured definition: on `data`, else on the data the
        newest Succeeded execution tokenized; `sizes`: max_steps, global_batch, max_device_batch."""
        from pipeline.definition import definition

        check_instance_types(types)
        tokenized = tokenized_at(data) if data else None
        dag = json.loads(definition(self.cfg))
        return plan(self.cfg, dag, types, tokenized or latest_tokenized(self.aws, self.cfg, dag), **sizes)

    def start(self, planned: Plan, out: Path) -> list[str]:
        """Start the planned jobs and keep their requests in `out`/requests.json; their names."""
        names = start(self.aws, self.cfg, planned)
        out.mkdir(parents=True, exist_ok=True)
        (out / "requests.json").write_text(json.dumps(planned.to_dict(), indent=2) + "\n")
        return names

    def report(self, names: list[str], *, follow: bool, poll: float, on_update: Callable[[list[dict]], None]) -> Report:
        """The report of the jobs `names`, once they have all ended (`follow`), or as they are now."""
        described = wait(self.aws, names, on_update, poll) if follow else describe(self.aws, names)
        return report(self.aws, self.cfg, described)
