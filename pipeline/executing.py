"""What `start`, `run` and `retry` share: starting an execution (of every step, or of selected steps with the outputs
of another execution), saying its ARN, following it live, and the summary at its end; and the `retry` command."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from pipeline import views
from pipeline.backend import Backend
from pipeline.dag.selection import SelectionError, parse_steps
from pipeline.records import ExecutionView, OnUpdate
from pipeline.terminal import console

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
