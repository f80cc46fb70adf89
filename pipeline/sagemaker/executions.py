"""Pipeline executions on SageMaker: start one, describe it as an ExecutionView, wait for it to end."""

from __future__ import annotations

import time
from datetime import datetime

from pipeline.records import ExecutionView, OnUpdate, StepView
from pipeline.sagemaker.aws import Aws, explained

TERMINAL = {"Succeeded", "Failed", "Stopped"}
STEP_TYPES = {  # ListPipelineExecutionSteps says a step's type through its Metadata key
    "ProcessingJob": "Processing",
    "TrainingJob": "Training",
    "Condition": "Condition",
    "RegisterModel": "RegisterModel",
    "Lambda": "Lambda",
    "Fail": "Fail",
}


def start(aws: Aws, pipeline: str, parameters: list[dict[str, str]]) -> str:
    """Start an execution with `parameters` (StartPipelineExecution's form); return its ARN."""
    with explained(f"start pipeline {pipeline}"):
        return aws.sagemaker.start_pipeline_execution(
            PipelineName=pipeline,
            PipelineExecutionDisplayName=f"cli-{datetime.now():%Y%m%d-%H%M%S}",
            PipelineParameters=parameters,
        )["PipelineExecutionArn"]


def _when(value) -> str:
    return value.isoformat(timespec="seconds") if isinstance(value, datetime) else str(value or "")


def _seconds(start, end) -> float | None:
    if not isinstance(start, datetime):
        return None
    return ((end if isinstance(end, datetime) else datetime.now(start.tzinfo)) - start).total_seconds()


def step_view(step: dict) -> StepView:
    metadata = step.get("Metadata", {})
    cache = step.get("CacheHitResult", {}).get("SourcePipelineExecutionArn")
    return StepView(
        name=step["StepName"],
        status=step.get("StepStatus", ""),
        type=next((kind for key, kind in STEP_TYPES.items() if key in metadata), ""),
        started=_when(step.get("StartTime")),
        seconds=_seconds(step.get("StartTime"), step.get("EndTime")),
        note=step.get("FailureReason", "") or ("cache hit" if cache else ""),
        details=metadata,
    )


def describe(aws: Aws, arn: str, with_parameters: bool = True) -> ExecutionView:
    """An execution with its steps (None where the endpoint cannot list them) and its parameters."""
    with explained(f"describe execution {arn}"):
        execution = aws.sagemaker.describe_pipeline_execution(PipelineExecutionArn=arn)
        steps = aws.execution_steps(arn)
        parameters = (
            aws.sagemaker.list_pipeline_parameters_for_execution(PipelineExecutionArn=arn)["PipelineParameters"]
            if with_parameters
            else []
        )
    return ExecutionView(
        id=arn.rsplit("/", 1)[-1],
        arn=arn,
        pipeline=arn.split("/")[1] if "/" in arn else "",
        status=execution["PipelineExecutionStatus"],
        started=_when(execution.get("CreationTime")),
        ended=_when(execution.get("LastModifiedTime")) if execution["PipelineExecutionStatus"] in TERMINAL else "",
        steps=None if steps is None else [step_view(s) for s in steps],
        parameters={p["Name"]: p["Value"] for p in parameters},
        failure_reason=failure_reason(execution, steps),
        display_name=execution.get("PipelineExecutionDisplayName", ""),
    )


def failure_reason(execution: dict, steps: list[dict] | None) -> str:
    if execution.get("PipelineExecutionStatus") not in ("Failed", "Stopped"):
        return ""
    for step in steps or []:
        if step.get("StepStatus") == "Failed":
            return f"step {step['StepName']} failed: {step.get('FailureReason', 'no reason given')}"
    return execution.get("FailureReason", "no reason given")


def wait(aws: Aws, arn: str, on_update: OnUpdate, poll_seconds: float = 30) -> ExecutionView:
    """Describe the execution every `poll_seconds` until it ends, passing each description to `on_update`."""
    view = describe(aws, arn)
    on_update(view)
    while view.status not in TERMINAL:
        time.sleep(poll_seconds)
        view = describe(aws, arn)
        on_update(view)
    return view


def recent(aws: Aws, pipeline: str, limit: int = 20) -> list[ExecutionView]:
    """The newest executions of `pipeline`, without their steps."""
    with explained(f"list executions of {pipeline}"):
        found = aws.sagemaker.list_pipeline_executions(
            PipelineName=pipeline, SortBy="CreationTime", SortOrder="Descending", MaxResults=limit
        )["PipelineExecutionSummaries"]
    return [
        ExecutionView(
            id=e["PipelineExecutionArn"].rsplit("/", 1)[-1],
            arn=e["PipelineExecutionArn"],
            pipeline=pipeline,
            status=e.get("PipelineExecutionStatus", ""),
            started=_when(e.get("StartTime")),
            display_name=e.get("PipelineExecutionDisplayName", ""),
        )
        for e in found
    ]
