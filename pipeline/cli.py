"""Command line: `trainium-pipeline COMMAND` (or `python -m pipeline COMMAND`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from pipeline.aws import Aws, AwsError, explained
from pipeline.config import Config, ConfigError, load_config

app = typer.Typer(
    help="Fine-tune BERT on AWS Trainium with SageMaker Pipelines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(soft_wrap=True)
errors = Console(stderr=True, soft_wrap=True)


class State:
    config_path: Path = Path("pipeline.yaml")
    overrides: list[str] = []

    def config(self) -> Config:
        return load_config(self.config_path, self.overrides)


state = State()


@app.callback()
def _options(
    config: Annotated[Path, typer.Option("--config", "-c", help="Config file.")] = Path("pipeline.yaml"),
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a config key, e.g. --set training.epochs=2 (repeatable)."),
    ] = None,
) -> None:
    state.config_path = config
    state.overrides = list(set_ or [])


def _definition_json(cfg: Config) -> str:
    from pipeline.definition import definition

    return definition(cfg)


def _execution_arn(cfg: Config, aws: Aws, execution: str | None) -> str:
    if execution and execution.startswith("arn:"):
        return execution
    if execution:
        return (
            f"arn:aws:sagemaker:{cfg.aws.region}:{cfg.aws.account}:pipeline/"
            f"{cfg.pipeline.name.lower()}/execution/{execution}"
        )
    with explained(f"list executions of {cfg.pipeline.name}"):
        arn = aws.latest_execution_arn(cfg.pipeline.name)
    if not arn:
        raise AwsError(f"pipeline {cfg.pipeline.name} has no executions yet (run: trainium-pipeline start)")
    return arn


@app.command()
def definition(
    out: Annotated[Path | None, typer.Option(help="Write the JSON here instead of stdout.")] = None,
) -> None:
    """Print (or write) the pipeline definition JSON. Offline and byte-identical for the same config."""
    text = _definition_json(state.config())
    if out:
        out.write_text(text)
        errors.print(f"wrote {out} ({len(text.encode())} bytes)")
    else:
        sys.stdout.write(text)


@app.command()
def upsert() -> None:
    """Upload step code to content-hashed S3 keys and create or update the pipeline."""
    from pipeline.upsert import upsert as do_upsert

    cfg = state.config()
    report = do_upsert(cfg, _definition_json(cfg), Aws(cfg.aws.region))
    console.print(f"code: {len(report.uploaded)} object(s) uploaded, {len(report.skipped)} already there")
    console.print(f"pipeline {cfg.pipeline.name} {report.action}: {report.pipeline_arn}")
    for kind in ("added", "removed", "changed"):
        if report.steps.get(kind):
            console.print(f"  steps {kind}: {', '.join(report.steps[kind])}")
    if not any(report.steps.values()):
        console.print("  no step changed")


@app.command()
def start(
    param: Annotated[
        list[str] | None,
        typer.Option("--param", "-p", help="Pipeline parameter NAME=VALUE (repeatable), e.g. Epochs=3."),
    ] = None,
    wait: Annotated[bool, typer.Option(help="Show live step statuses until the execution ends.")] = False,
    poll: Annotated[float, typer.Option(help="Seconds between status polls with --wait.")] = 30.0,
) -> None:
    """Start an execution of the pipeline (upsert it first)."""
    from pipeline import executions

    cfg = state.config()
    declared = json.loads(_definition_json(cfg))["Parameters"]
    parameters = executions.parse_parameters(list(param or []), declared)
    aws = Aws(cfg.aws.region)
    arn = executions.start(aws, cfg.pipeline.name, parameters)
    console.print(f"started {arn}")
    if wait:
        execution = executions.wait(aws, arn, console, poll)
        status = execution["PipelineExecutionStatus"]
        if status != "Succeeded":
            errors.print(f"execution {status.lower()}: {executions.failure_reason(execution, execution['_steps'])}")
            raise typer.Exit(1)


@app.command()
def status(
    execution: Annotated[str | None, typer.Argument(help="Execution id or ARN (default: latest).")] = None,
) -> None:
    """Steps, times and statuses of the latest (or given) execution, and its parameters."""
    from pipeline import executions

    cfg = state.config()
    aws = Aws(cfg.aws.region)
    arn = _execution_arn(cfg, aws, execution)
    table, _, _ = executions.execution_table(aws, arn)
    console.print(table)
    console.print(executions.parameters_table(aws, arn))


@app.command("executions")
def list_executions(limit: Annotated[int, typer.Option(help="How many, newest first.")] = 20) -> None:
    """The pipeline's executions, newest first."""
    from pipeline import executions

    cfg = state.config()
    console.print(executions.executions_table(Aws(cfg.aws.region), cfg.pipeline.name, limit))


def main() -> None:
    """Entry point: expected errors print one line and exit 2 (config) or 1 (AWS, parameters)."""
    from pipeline.executions import ParameterError

    try:
        app()
    except ConfigError as e:
        errors.print(f"config error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except (AwsError, ParameterError) as e:
        errors.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)
