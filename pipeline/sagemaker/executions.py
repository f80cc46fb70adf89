"""Pipeline executions on SageMaker: start one (all steps or selected ones), retry one, describe it as an
ExecutionView, wait for it to end."""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from pipeline.dag.requests import validate
from pipeline.dag.selection import Source
from pipeline.records import ExecutionView, OnUpdate, StepView
from pipeline.sagemaker.aws import Aws, explained

TERMINAL = {"Succeeded", "Failed", "Stopped", "CompletedWithFailures"}  # PipelineExecutionStatus's ends
STEP_TYPES = {  # ListPipelineExecutionSteps says a step's type through its Metadata key
    "ProcessingJob": "Processing",
    "TrainingJob": "Training",
    "Condition": "Condition",
    "RegisterModel": "RegisterModel",
    "Lambda": "Lambda",
    "Fail": "Fail",
}


def _token() -> str:
    return uuid.uuid4().hex  # ClientRequestToken: 32 to 128 characters; one per command, so a resent call is one


def start(aws: Aws, pipeline: str, parameters: list[dict[str, str]], selective: dict | None = None) -> str:
    """Start an execution with `parameters` (StartPipelineExecution's form), of the steps `selective` selects
    (its SelectiveExecutionConfig) or all; return its ARN. The request is checked against botocore's model first."""
    request = {
        "PipelineName": pipeline,
        "PipelineExecutionDisplayName": f"cli-{datetime.now():%Y%m%d-%H%M%S}",
        "PipelineParameters": parameters,
        "ClientRequestToken": _token(),
    }
    if selective:
        request["SelectiveExecutionConfig"] = selective
    validate(request, "StartPipelineExecution", f"start pipeline {pipeline}")
    with explained(f"start pipeline {pipeline}"):
        return aws.sagemaker.start_pipeline_execution(**request)["PipelineExecutionArn"]


def retry(aws: Aws, arn: str) -> str:
    """RetryPipelineExecution: the same execution (same ARN) runs its failed and not-run steps again."""
    request = {"PipelineExecutionArn": arn, "ClientRequestToken": _token()}
    validate(request, "RetryPipelineExecution", f"retry execution {arn}")
    with explained(f"retry execution {arn}"):
        return aws.sagemaker.retry_pipeline_execution(**request)["PipelineExecutionArn"]


def ran_definition(aws: Aws, arn: str) -> dict:
    """The definition execution `arn` ran (its pipeline version's), whatever the pipeline has been updated to."""
    with explained(f"read the definition of execution {arn}"):
        described = aws.sagemaker.describe_pipeline_definition_for_execution(PipelineExecutionArn=arn)
    return json.loads(described["PipelineDefinition"])


def source(aws: Aws, arn: str) -> tuple[Source, dict[str, str]]:
    """Execution `arn` as the source of a selective run: its status, its steps' statuses, its parameters."""
    view = describe(aws, arn)
    steps = None if view.steps is None else {s.name: s.status for s in view.steps}
    return Source(view.id, view.pipeline, view.status, steps), view.parameters


def _when(value) -> str:
    return value.isoformat(timespec="seconds") if isinstance(value, datetime) else str(value or "")


def _seconds(start, end) -> float | None:
    if not isinstance(start, datetime):
        return None
    return ((end if isinstance(end, datetime) else datetime.now(start.tzinfo)) - start).total_seconds()


def step_view(step: dict) -> StepView:
    metadata = step.get("Metadata", {})
    cache = step.get("CacheHitResult", {}).get("SourcePipelineExecutionArn")
    reused = step.get("SelectiveExecutionResult", {}).get("SourcePipelineExecutionArn", "")
    return StepView(
        name=step["StepName"],
        status=step.get("StepStatus", ""),
        type=next((kind for key, kind in STEP_TYPES.items() if key in metadata), ""),
        started=_when(step.get("StartTime")),
        seconds=_seconds(step.get("StartTime"), step.get("EndTime")),
        note=step.get("FailureReason", "") or ("cache hit" if cache else ""),
        details=metadata,
        attempts=step.get("AttemptCount", 0),
        reused_from=reused.rsplit("/", 1)[-1],
    )


def describe(aws: Aws, arn: str, with_parameters: bool = True) -> ExecutionView:
    """An execution with its steps (None where the endpoint cannot list them) and its parameters."""
    with explained(f"describe execution {arn}"):
        execution = aws.sagemaker.describe_pipeline_execution(PipelineExecutionArn=arn)
        steps = aws.execution_steps(arn)
        pages = aws.sagemaker.get_paginator("list_pipeline_parameters_for_execution").paginate(
            PipelineExecutionArn=arn) if with_parameters else []
        parameters = [p for page in pages for p in page.get("PipelineParameters", [])]
    selective = execution.get("SelectiveExecutionConfig", {})
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
        selective_from=selective.get("SourcePipelineExecutionArn", "").rsplit("/", 1)[-1],
        selected_steps=[s["StepName"] for s in selective.get("SelectedSteps", [])],
    )


def failure_reason(execution: dict, steps: list[dict] | None) -> str:
    if execution.get("PipelineExecutionStatus") not in ("Failed", "Stopped"):
        return ""
    for step in steps or []:
        if step.get("StepStatus") == "Failed":
            return f"step {step['StepName']} failed: {step.get('FailureReason', 'no reason given')}"
    return execution.get("FailureReason", "no reason given")


STALE_POLLS = 10  # after a retry, descriptions that still show the old status (the service is eventually consistent)


def wait(aws: Aws, arn: str, on_update: OnUpdate, poll_seconds: float = 30, stale: str = "") -> ExecutionView:
    """Describe the execution every `poll_seconds` until it ends, passing each description to `on_update`. `stale`:
    the status it had before a retry, not taken for its end in the first few descriptions."""
    view = describe(aws, arn)
    for _ in range(STALE_POLLS if stale else 0):
        if view.status != stale:
            break
        time.sleep(min(poll_seconds, 5))
        view = describe(aws, arn)
    on_update(view)
    while view.status not in TERMINAL:
        time.sleep(poll_seconds)
        view = describe(aws, arn)
        on_update(view)
    return view


def recent(aws: Aws, pipeline: str, limit: int = 20) -> list[ExecutionView]:
    """The newest executions of `pipeline`, each described with its steps (ListPipelineExecutions says nothing of
    selective runs and retries), without their parameters."""
    with explained(f"list executions of {pipeline}"):
        pages = aws.sagemaker.get_paginator("list_pipeline_executions").paginate(  # MaxResults is 100 at most
            PipelineName=pipeline, SortBy="CreationTime", SortOrder="Descending",
            PaginationConfig={"MaxItems": limit, "PageSize": min(limit, 100)})
        found = [e for page in pages for e in page["PipelineExecutionSummaries"]][:limit]
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(lambda e: describe(aws, e["PipelineExecutionArn"], with_parameters=False), found))
