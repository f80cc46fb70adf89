"""The Executions panel: `start`, `run`, `retry`, `status`, `executions`, `runs`, `cost`; starting an execution (of
every step, or of selected steps with the outputs of another execution), saying its ARN, following it live, and the
summary at its end."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from pipeline import views
from pipeline.backend import Backend
from pipeline.cli.shared import EXECUTION, JSON, LOCAL, ROOT, console, errors
from pipeline.dag.parameters import parse_pairs
from pipeline.dag.selection import SelectionError, parse_steps
from pipeline.records import ExecutionView, OnUpdate

PANEL = "Executions"
PARAMS = Annotated[list[str] | None, typer.Option("--param", "-p", help="Pipeline parameter NAME=VALUE (repeatable).")]
LIMIT = Annotated[int, typer.Option(help="How many, newest first.", min=1)]
WAIT = Annotated[bool, typer.Option(help="Show live step statuses until the execution ends.")]
POLL = Annotated[float, typer.Option(help="Seconds between status polls with --wait.")]
STEPS = Annotated[
    list[str] | None,
    typer.Option("--steps", help="Run only these steps (comma-separated or repeated); see --from."),
]
FROM = Annotated[
    str | None,
    typer.Option("--from", help="With --steps: the execution (id or ARN) whose outputs the unselected steps they "
                                "depend on keep, and whose parameters are the defaults."),
]


def follow(begin: Callable[[OnUpdate], ExecutionView], wait: bool, verb: str = "started") -> ExecutionView:
    """Start something that runs an execution; say its ARN first, then (with `wait`) follow it live to its end."""
    started: list[str] = []

    def announce(view) -> None:
        if not started:
            started.append(view.arn)
            console.print(f"{verb} {view.arn}")

    with views.live(console, views.execution_table, enabled=wait) as update:
        view = begin(lambda v: (announce(v), update(v)))
    announce(view)
    return view


def selection(target: Backend, steps: list[str] | None, source: str | None, parameters: dict[str, str]) -> list[str]:
    """The parsed --steps (none: every step), checked with --from before anything starts or changes; says what
    will run."""
    if not (steps or source):
        return []
    if not steps:
        raise SelectionError("--from: expected --steps too (the steps to run with that execution's outputs)")
    names = parse_steps(steps)
    for line in views.selection_lines(target.check_selection(names, source, parameters)):
        console.print(line, markup=False, highlight=False)
    return names


def begin(target: Backend, names: list[str], source: str | None, parameters: dict[str, str], wait: bool,
          poll: float, use_cache: bool = True) -> ExecutionView:
    """Start an execution of the selected steps `names` (outputs of the others from `source`), or of all."""
    if names:
        return follow(lambda on_update: target.start_selected(
            names, source, parameters, wait=wait, use_cache=use_cache, on_update=on_update, poll=poll), wait)
    return follow(lambda on_update: target.start(
        parameters, wait=wait, use_cache=use_cache, on_update=on_update, poll=poll), wait)


def summarize(target: Backend, view: ExecutionView) -> None:
    """The summary of an execution that ended; exit 1 unless it succeeded."""
    views.print_summary(target.summary(view), console)
    if view.status != "Succeeded":
        raise typer.Exit(1)


def retry(
    ctx: typer.Context,
    execution: Annotated[str | None, typer.Argument(help="Execution id or ARN (default: latest).")] = None,
    wait: WAIT = False,
    poll: POLL = 30.0,
    local: Annotated[bool, typer.Option("--local", help="A local execution (runs to its end).")] = False,
    root: Annotated[Path | None, typer.Option(help="Folder of the local account (default local.root).")] = None,
) -> None:
    """Run a Failed or Stopped execution again, in place: steps that succeeded keep their outputs, failed and
    not-run steps run again, with the definition it ran (for transient failures; after a code change use
    start --steps ... --from)."""
    target = ctx.obj.backend(local, root)
    view = follow(lambda on_update: target.retry(execution, wait=wait, on_update=on_update, poll=poll), wait,
                  verb="retrying")
    if not (wait or local):
        console.print(f"follow it with: trainium-pipeline status {view.id}")
        return
    summarize(target, view)


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


def status(ctx: typer.Context, execution: EXECUTION = None, local: LOCAL = False, root: ROOT = None) -> None:
    """Steps, times and statuses of the latest (or given) execution, and its parameters."""
    views.print_status(ctx.obj.backend(local, root).execution(execution), console)


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


def runs(
    ctx: typer.Context,
    limit: LIMIT = 20,
    local: LOCAL = False,
    root: ROOT = None,
    as_json: JSON = False,
) -> None:
    """The executions' MLflow runs, newest first: key parameters and metrics side by side (mlflow ui shows all)."""
    from pipeline.config.tracking import experiment
    from pipeline.tracking.store import list_runs, store_uri

    cfg = ctx.obj.load(local)
    uri = store_uri(cfg, local, root)
    found = list_runs(uri, experiment(cfg), limit)
    if as_json:
        return views.print_json(found)
    console.print(views.runs_table(found, experiment(cfg), uri))

def cost(
    ctx: typer.Context,
    execution: EXECUTION = None,
    local: LOCAL = False,
    root: ROOT = None,
    as_json: JSON = False,
    serving: Annotated[bool, typer.Option("--serving", help="Instead: what a million requests cost on each serving "
                                                            "target (CPU, GPU, Inferentia2, serverless).")] = False,
    utilisation: Annotated[float, typer.Option(help="--serving: the share of an instance's throughput used.")] = 0.5,
) -> None:
    """What each job of an execution cost (instances x billable seconds x on-demand price), the total, and the
    training throughput and cost per million samples. --local: the would-be AWS cost of a local run's wall time.
    --serving: the price per million requests of each serving target, each figure with its source."""
    if serving:
        from pipeline.config.deploy import Serverless
        from pipeline.serving_cost import serving_costs

        cfg = ctx.obj.load(local)
        rows = serving_costs(cfg.prices.price, utilisation, (cfg.deploy.serverless or Serverless()).memory_mb)
        if as_json:
            sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        else:
            views.print_serving_costs(rows, console)
        return
    report = ctx.obj.backend(local, root).cost(execution)
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    else:
        views.print_cost(report, console)


def register(app: typer.Typer) -> None:
    for command in (start, run, retry, status):
        app.command(rich_help_panel=PANEL)(command)
    app.command("executions", rich_help_panel=PANEL)(list_executions)
    for command in (runs, cost):
        app.command(rich_help_panel=PANEL)(command)
