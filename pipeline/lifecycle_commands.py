"""The lifecycle's commands beside `models approve / reject` and `deploy`: `promote N` and `endpoints`, and how a
lifecycle command reports (one line per thing done; a failed deploy exits 1 with its line)."""

from __future__ import annotations

from typing import Annotated

import typer

from pipeline import views
from pipeline.errors import UserError
from pipeline.records import Changes
from pipeline.terminal import LOCAL, ROOT, console


class LifecycleFailed(UserError, RuntimeError):
    """A deploy of a lifecycle command failed (what served before still serves): its one line."""


def print_changes(done: Changes) -> None:
    """Print what the lifecycle did; raise LifecycleFailed (exit 1, one line) when a deploy failed."""
    views.print_changes(Changes([line for line in done.lines if line != done.failure]), console)
    if done.failure:
        raise LifecycleFailed(done.failure)


def promote(
    ctx: typer.Context,
    version: Annotated[int, typer.Argument(help="Model version whose staging test passed.")],
    local: LOCAL = False,
    root: ROOT = None,
) -> None:
    """Deploy a version to the production endpoint (blue/green); refused unless its staging test passed."""
    print_changes(ctx.obj.backend(local, root).promote(version))


def endpoints(ctx: typer.Context, local: LOCAL = False, root: ROOT = None) -> None:
    """The staging and production endpoints: version served, status, instances, scaling bounds, last test."""
    target = ctx.obj.backend(local, root)
    console.print(views.endpoints_table(target.endpoints()))
    if local:
        console.print("there is no scaling locally: each local endpoint is one process", style="dim")
