"""Command line: `trainium-pipeline COMMAND` (or `python -m pipeline COMMAND`): config -> backend -> view."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from pipeline import terminal, views
from pipeline.backend import Backend
from pipeline.commands import bootstrap, compare, triggers_app
from pipeline.dag.parameters import parse_pairs
from pipeline.executing import FROM, POLL, STEPS, WAIT, begin, retry, selection, summarize
from pipeline.lifecycle_commands import endpoints, print_changes, promote
from pipeline.records import VersionView
from pipeline.terminal import LOCAL, ROOT, Options, console, errors
from steps.contract import APPROVAL_STATUSES, APPROVED, REJECTED

app = typer.Typer(
    help="Fine-tune BERT on AWS Trainium with SageMaker Pipelines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
models_app = typer.Typer(help="Model versions in the registry: list, describe, approve, reject.", no_args_is_help=True)
config_app = typer.Typer(help="The effective config: every key, its value and where it came from.",
                         no_args_is_help=True)
# `--help` lists the commands by what they act on
EXECUTIONS, MODELS, ENDPOINTS, TRIGGERS, ACCOUNT = "Executions", "Models", "Endpoints", "Triggers", "Account"
app.command(rich_help_panel=EXECUTIONS)(retry)
app.add_typer(models_app, name="models", rich_help_panel=MODELS)
app.command(rich_help_panel=ENDPOINTS)(endpoints)
app.command(rich_help_panel=ENDPOINTS)(promote)
app.add_typer(triggers_app, name="triggers", rich_help_panel=TRIGGERS)
app.command(rich_help_panel=ACCOUNT)(bootstrap)
app.command(rich_help_panel=ACCOUNT)(compare)
app.add_typer(config_app, name="config", rich_help_panel=ACCOUNT)

ApprovalStatus = Enum("ApprovalStatus", {s: s for s in APPROVAL_STATUSES}, type=str)  # --status's choices
EXECUTION = Annotated[str | None, typer.Argument(help="Execution id or ARN (default: latest).")]
PARAMS = Annotated[list[str] | None, typer.Option("--param", "-p", help="Pipeline parameter NAME=VALUE (repeatable).")]
LIMIT = Annotated[int, typer.Option(help="How many, newest first.", min=1)]
JSON = Annotated[bool, typer.Option("--json", help="Print the records as JSON (for scripts).")]


@app.callback()
def _options(
    ctx: typer.Context,
    config: Annotated[Path, typer.Option("--config", "-c", help="Config file.")] = Path("pipeline.yaml"),
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config key, e.g. --set training.epochs=2.")
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of any failure.")] = False,
) -> None:
    terminal.debug = debug
    ctx.obj = Options(config, tuple(set_ or []))


@app.command(rich_help_panel=ACCOUNT)
def definition(
    ctx: typer.Context, out: Annotated[Path | None, typer.Option(help="Write the JSON here instead of stdout.")] = None
) -> None:
    """Print (or write) the pipeline definition JSON. Offline and byte-identical for the same config."""
    from pipeline.definition import definition as build

    text = build(ctx.obj.load())
    if out:
        out.write_text(text)
        errors.print(f"wrote {out} ({len(text.encode())} bytes)")
    else:
        sys.stdout.write(text)


@config_app.command("show")
def config_show(ctx: typer.Context, local: LOCAL = False, as_json: JSON = False) -> None:
    """Every key of the effective config (--local: with the local profile) as `key = JSON value  # where from`:
    default, the file, the local profile, an environment variable or --set."""
    from pipeline.config import effective, load_config

    sources: dict[str, str] = {}
    rows = effective(load_config(ctx.obj.config, ctx.obj.sets, local=local, sources=sources), sources)
    if as_json:
        return views.print_json({key: {"value": value, "source": source} for key, value, source in rows})
    for key, value, source in rows:
        console.print(f"{key} = {json.dumps(value)}  # {source}", markup=False, highlight=False)


@app.command(rich_help_panel=ACCOUNT)
def upsert(ctx: typer.Context, local: LOCAL = False, root: ROOT = None) -> None:
    """Check the definition, upload step code to content-hashed keys, create or update the pipeline."""
    target = ctx.obj.backend(local, root)
    views.print_upsert(target.upsert(), target.cfg.deploy.lambda_function_name, console)


@app.command(rich_help_panel=EXECUTIONS)
def start(
    ctx: typer.Context,
    param: PARAMS = None,
    wait: WAIT = False,
    poll: POLL = 30.0,
    local: LOCAL = False,
    root: ROOT = None,
    steps: STEPS = None,
    from_: FROM = None,
) -> None:
    """Start an execution of the upserted pipeline, or of --steps of it (locally: run it to its end)."""
    target, parameters = ctx.obj.backend(local, root), parse_pairs(param or [])
    view = begin(target, selection(target, steps, from_, parameters), from_, parameters, wait, poll)
    if wait and view.status != "Succeeded":
        errors.print(f"execution {view.status.lower()}: {view.failure_reason}", markup=False)
        raise typer.Exit(1)


@app.command(rich_help_panel=EXECUTIONS)
def run(
    ctx: typer.Context,
    local: LOCAL = False,
    param: PARAMS = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Run every step, reusing nothing (local).")] = False,
    root: ROOT = None,
    steps: STEPS = None,
    from_: FROM = None,
) -> None:
    """The whole pipeline (or --steps of it): upsert, start, follow it live, then the summary."""
    target, parameters = ctx.obj.backend(local, root), parse_pairs(param or [])
    target.check(parameters)  # a bad --param (or --steps) changes nothing, not even the upserted pipeline
    names = selection(target, steps, from_, parameters)
    views.print_upsert(target.upsert(), target.cfg.deploy.lambda_function_name, console)
    summarize(target, begin(target, names, from_, parameters, wait=True, poll=30.0, use_cache=not no_cache))


@app.command(rich_help_panel=EXECUTIONS)
def status(ctx: typer.Context, execution: EXECUTION = None, local: LOCAL = False, root: ROOT = None) -> None:
    """Steps, times and statuses of the latest (or given) execution, and its parameters."""
    views.print_status(ctx.obj.backend(local, root).execution(execution), console)


@app.command("executions", rich_help_panel=EXECUTIONS)
def list_executions(
    ctx: typer.Context,
    limit: LIMIT = 20,
    local: LOCAL = False,
    root: ROOT = None,
    as_json: JSON = False,
) -> None:
    """The pipeline's executions, newest first."""
    target = ctx.obj.backend(local, root)
    found = target.executions(limit)
    if as_json:
        return views.print_json(found)
    console.print(views.executions_table(found, target.cfg.pipeline.name))


@app.command(rich_help_panel=EXECUTIONS)
def runs(
    ctx: typer.Context,
    limit: LIMIT = 20,
    local: LOCAL = False,
    root: ROOT = None,
    as_json: JSON = False,
) -> None:
    """The executions' MLflow runs, newest first: key parameters and metrics side by side (mlflow ui shows all)."""
    from pipeline.config_tracking import experiment
    from pipeline.tracking.store import list_runs, store_uri

    cfg = ctx.obj.load(local)
    uri = store_uri(cfg, local, root)
    found = list_runs(uri, experiment(cfg), limit)
    if as_json:
        return views.print_json(found)
    console.print(views.runs_table(found, experiment(cfg), uri))


@app.command(rich_help_panel=ENDPOINTS)
def serve(
    ctx: typer.Context,
    version: Annotated[int | None, typer.Option(help="Model version (default: latest Approved).")] = None,
    port: Annotated[int | None, typer.Option(help="Port on 127.0.0.1 (default local.port).")] = None,
    stop: Annotated[bool, typer.Option(
        "--stop", help="Stop the local endpoints (staging and production) left running by run --local.")] = False,
    root: ROOT = None,
) -> None:
    """Serve a local model version on 127.0.0.1 in the foreground (Ctrl-C stops), or --stop the background one."""
    target = ctx.obj.backend(local=True, root=root)
    if stop:
        stopped = target.stop_endpoint()
        console.print(f"local endpoints {'stopped' if stopped else 'were not running'}")
        return

    def ready(url: str, chosen: VersionView) -> None:
        console.print(f"serving version {chosen.version} at {url} (Ctrl-C stops)")

    target.serve(version, port, on_ready=ready)


@app.command(rich_help_panel=EXECUTIONS)
def cost(
    ctx: typer.Context,
    execution: EXECUTION = None,
    local: LOCAL = False,
    root: ROOT = None,
    as_json: JSON = False,
) -> None:
    """What each job of an execution cost (instances x billable seconds x on-demand price), the total, and the
    training throughput and cost per million samples. --local: the would-be AWS cost of a local run's wall time."""
    report = ctx.obj.backend(local, root).cost(execution)
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    else:
        views.print_cost(report, console)


@models_app.command("list")
def models_list(
    ctx: typer.Context,
    local: LOCAL = False,
    status_filter: Annotated[
        ApprovalStatus | None, typer.Option("--status", help="Only versions with this status.")
    ] = None,
    root: ROOT = None,
    as_json: JSON = False,
) -> None:
    """Versions, newest first: status, accuracy, created."""
    target = ctx.obj.backend(local, root)
    versions = target.versions(status_filter.value if status_filter else None)
    if as_json:
        return views.print_json(versions)
    console.print(views.versions_table(versions, target.cfg.pipeline.model_package_group))


@models_app.command("describe")
def models_describe(ctx: typer.Context, version: int, local: LOCAL = False, root: ROOT = None) -> None:
    """The full description of a version."""
    console.print_json(json.dumps(ctx.obj.backend(local, root).describe_version(version), default=str))


def _set_status(target: Backend, version: int, status: str, note: str) -> None:
    approval = target.set_status(version, status, note)
    console.print(f"model version {approval.version.version}: {approval.version.status}")
    print_changes(approval.changes)


NOTE = Annotated[str, typer.Option(help="Approval note.")]


@models_app.command("approve")
def models_approve(ctx: typer.Context, version: int, note: NOTE = "", local: LOCAL = False, root: ROOT = None) -> None:
    """Approve a version: it goes to the staging endpoint and is tested there (as approval in Studio does)."""
    _set_status(ctx.obj.backend(local, root), version, APPROVED, note)


@models_app.command("reject")
def models_reject(ctx: typer.Context, version: int, note: NOTE = "", local: LOCAL = False, root: ROOT = None) -> None:
    """Reject a version; an endpoint serving it goes back to the newest other Approved version that passed its test."""
    _set_status(ctx.obj.backend(local, root), version, REJECTED, note)


@app.command(rich_help_panel=ENDPOINTS)
def deploy(ctx: typer.Context, version: int, local: LOCAL = False, root: ROOT = None) -> None:
    """Deploy an Approved version to the staging endpoint and test it there (production: promote)."""
    print_changes(ctx.obj.backend(local, root).deploy(version))


def main() -> None:
    """Entry point: expected errors are one line and a non-zero exit (see pipeline.terminal.run)."""
    terminal.run(app)
