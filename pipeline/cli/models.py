"""The Models panel: `models list | describe | approve | reject` (the registry)."""

from __future__ import annotations

import json
from enum import Enum
from typing import Annotated

import typer

from pipeline import views
from pipeline.backend import Backend
from pipeline.cli.endpoints import print_changes
from pipeline.cli.shared import JSON, LOCAL, ROOT, console
from steps.contract import APPROVAL_STATUSES, APPROVED, REJECTED

PANEL = "Models"
models_app = typer.Typer(help="Model versions in the registry: list, describe, approve, reject.", no_args_is_help=True)
ApprovalStatus = Enum("ApprovalStatus", {s: s for s in APPROVAL_STATUSES}, type=str)  # --status's choices


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


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models", rich_help_panel=PANEL)
