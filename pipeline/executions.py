"""Start pipeline executions and show their steps, on SageMaker."""

from __future__ import annotations

import time
from datetime import datetime

from rich.console import Console
from rich.live import Live
from rich.table import Table

from pipeline.aws import Aws, explained

TERMINAL = {"Succeeded", "Failed", "Stopped"}
STATUS_STYLE = {
    "Succeeded": "green",
    "Failed": "red",
    "Stopped": "yellow",
    "Executing": "cyan",
    "Starting": "cyan",
    "Stopping": "yellow",
}


class ParameterError(ValueError):
    """A `--param` that the pipeline does not declare or whose value has the wrong type."""


def parse_parameters(pairs: list[str], declared: list[dict]) -> list[dict[str, str]]:
    """Check `NAME=VALUE` pairs against the definition's parameters; return StartPipelineExecution's form."""
    types = {p["Name"]: p["Type"] for p in declared}
    parsed = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ParameterError(f"--param {pair!r}: expected NAME=VALUE")
        if name not in types:
            raise ParameterError(f"--param {name}: unknown parameter; expected one of {', '.join(sorted(types))}")
        caster = {
            "Integer": int,
            "Float": float,
            "Boolean": lambda v: {"true": True, "false": False}[v.lower()],
        }
        try:
            caster.get(types[name], str)(value)
        except (ValueError, KeyError):
            raise ParameterError(f"--param {name}={value!r}: expected a {types[name]}") from None
        parsed.append({"Name": name, "Value": value})
    return parsed


def start(aws: Aws, pipeline: str, parameters: list[dict[str, str]]) -> str:
    """Start an execution with `parameters`; return its ARN."""
    with explained(f"start pipeline {pipeline}"):
        return aws.sagemaker.start_pipeline_execution(
            PipelineName=pipeline,
            PipelineExecutionDisplayName=f"cli-{datetime.now():%Y%m%d-%H%M%S}",
            PipelineParameters=parameters,
        )["PipelineExecutionArn"]


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if isinstance(value, datetime) else ""


def _duration(start, end) -> str:
    if not isinstance(start, datetime):
        return ""
    seconds = ((end if isinstance(end, datetime) else datetime.now(start.tzinfo)) - start).total_seconds()
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def execution_table(aws: Aws, arn: str) -> tuple[Table, dict, list[dict] | None]:
    """A table of an execution's steps, the execution's description and its steps."""
    with explained(f"describe execution {arn}"):
        execution = aws.sagemaker.describe_pipeline_execution(PipelineExecutionArn=arn)
        steps = aws.execution_steps(arn)
    status = execution["PipelineExecutionStatus"]
    table = Table(title=f"{arn.rsplit('/', 1)[-1]}  [{STATUS_STYLE.get(status, 'white')}]{status}[/]")
    for column in ("step", "status", "started", "duration", "reason"):
        table.add_column(column)
    if steps is None:
        table.add_row(
            "(steps not available from this endpoint)",
            status,
            _when(execution.get("CreationTime")),
            "",
            execution.get("FailureReason", ""),
        )
    for step in steps or []:
        s = step.get("StepStatus", "")
        table.add_row(
            step["StepName"],
            f"[{STATUS_STYLE.get(s, 'white')}]{s}[/]",
            _when(step.get("StartTime")),
            _duration(step.get("StartTime"), step.get("EndTime")),
            step.get("FailureReason", ""),
        )
    return table, execution, steps


def failure_reason(execution: dict, steps: list[dict] | None) -> str:
    for step in steps or []:
        if step.get("StepStatus") == "Failed":
            return f"step {step['StepName']} failed: {step.get('FailureReason', 'no reason given')}"
    return execution.get("FailureReason", "no reason given")


def wait(aws: Aws, arn: str, console: Console, poll_seconds: float = 30) -> dict:
    """Show a live table until the execution ends; return its final description."""
    table, execution, steps = execution_table(aws, arn)
    with Live(table, console=console, refresh_per_second=1) as live:
        while execution["PipelineExecutionStatus"] not in TERMINAL:
            time.sleep(poll_seconds)
            table, execution, steps = execution_table(aws, arn)
            live.update(table)
    execution["_steps"] = steps
    return execution


def executions_table(aws: Aws, pipeline: str, limit: int = 20) -> Table:
    with explained(f"list executions of {pipeline}"):
        found = aws.sagemaker.list_pipeline_executions(
            PipelineName=pipeline, SortBy="CreationTime", SortOrder="Descending", MaxResults=limit
        )["PipelineExecutionSummaries"]
    table = Table(title=f"executions of {pipeline}")
    for column in ("execution", "status", "started", "name"):
        table.add_column(column)
    for e in found:
        s = e.get("PipelineExecutionStatus", "")
        table.add_row(
            e["PipelineExecutionArn"].rsplit("/", 1)[-1],
            f"[{STATUS_STYLE.get(s, 'white')}]{s}[/]",
            _when(e.get("StartTime")),
            e.get("PipelineExecutionDisplayName", ""),
        )
    return table


def parameters_table(aws: Aws, arn: str) -> Table:
    with explained(f"list parameters of {arn}"):
        found = aws.sagemaker.list_pipeline_parameters_for_execution(PipelineExecutionArn=arn)["PipelineParameters"]
    table = Table(title="parameters")
    table.add_column("name")
    table.add_column("value")
    for p in found:
        table.add_row(p["Name"], p["Value"])
    return table
