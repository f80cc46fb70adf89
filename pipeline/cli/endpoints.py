"""The Endpoints panel: `deploy`, `promote`, `endpoints`, `serve`; how a lifecycle command reports (one line per
thing done; a failed deploy exits 1 with its line) and renders."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from pipeline.cli.shared import JSON, LOCAL, ROOT, console
from pipeline.errors import UserError
from pipeline.records import Changes, StageView, VersionView
from pipeline.views import FittedTable, print_json, styled, table

PANEL = "Endpoints"


class LifecycleFailed(UserError, RuntimeError):
    """A deploy of a lifecycle command failed (what served before still serves): its one line."""


def print_changes(done: Changes) -> None:
    """Print what the lifecycle did; raise LifecycleFailed (exit 1, one line) when a deploy failed."""
    for line in done.lines:
        if line != done.failure:
            console.print(line, markup=False, highlight=False)
    if done.failure:
        raise LifecycleFailed(done.failure)


def endpoints_table(stages: list[StageView]) -> FittedTable:
    """Per stage: endpoint, the version it serves, status, instances, scaling bounds, the last test."""
    rows = [[s.stage, escape(s.endpoint), str(s.version or "-"), styled(s.status), s.instances, escape(s.scaling),
             escape(s.test), escape(s.where)] for s in stages]
    columns = ["stage", "endpoint", "version", "status", "instances", "scaling", "last test", "where"]
    return table("endpoints", columns, rows)


def promote(
    ctx: typer.Context,
    version: Annotated[int, typer.Argument(help="Model version whose staging test passed.")],
    local: LOCAL = False,
    root: ROOT = None,
) -> None:
    """Deploy a version to the production endpoint (blue/green); refused unless its staging test passed."""
    print_changes(ctx.obj.backend(local, root).promote(version))


def endpoints(ctx: typer.Context, local: LOCAL = False, root: ROOT = None, as_json: JSON = False) -> None:
    """The staging and production endpoints: version served, status, instances, scaling bounds, last test."""
    target = ctx.obj.backend(local, root)
    found = target.endpoints()
    if as_json:
        return print_json(found)
    console.print(endpoints_table(found))
    for line in getattr(target, "endpoint_lines", []):  # local: what was recovered, registry mismatches
        console.print(line, markup=False, highlight=False)
    if local:
        console.print("there is no scaling locally: each local endpoint is one worker process", style="dim")


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

def deploy(ctx: typer.Context, version: int, local: LOCAL = False, root: ROOT = None) -> None:
    """Deploy an Approved version to the staging endpoint and test it there (production: promote)."""
    print_changes(ctx.obj.backend(local, root).deploy(version))


def register(app: typer.Typer) -> None:
    for command in (deploy, promote, endpoints, serve):
        app.command(rich_help_panel=PANEL)(command)
