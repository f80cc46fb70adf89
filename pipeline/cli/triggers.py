"""The Triggers panel: `triggers apply | list | delete` (the EventBridge rules of the `triggers` section)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from pipeline.cli.shared import console
from pipeline.sagemaker.aws import Aws

PANEL = "Triggers"
triggers_app = typer.Typer(help="EventBridge rules: deploy on approval, schedule, new data.", no_args_is_help=True)


@triggers_app.command("apply")
def triggers_apply(
    ctx: typer.Context,
    print_only: Annotated[bool, typer.Option("--print-only", help="Show the rules without creating them.")] = False,
) -> None:
    """Create or update the rules of the `triggers` section (idempotent); a rule turned off is deleted."""
    from pipeline.sagemaker import triggers
    cfg = ctx.obj.load()
    for row in triggers.apply(cfg, None if print_only else Aws(cfg.aws.region), print_only):
        console.print(f"{row['action']:>9}  {row['name']}")


@triggers_app.command("list")
def triggers_list(ctx: typer.Context) -> None:
    """The rules that apply made, with their targets."""
    from pipeline.sagemaker import triggers

    cfg = ctx.obj.load()
    console.print_json(json.dumps(triggers.list_(cfg, Aws(cfg.aws.region)), default=str))


@triggers_app.command("delete")
def triggers_delete(ctx: typer.Context) -> None:
    """Remove exactly the rules, targets and permission that apply made."""
    from pipeline.sagemaker import triggers

    cfg = ctx.obj.load()
    console.print(f"deleted: {', '.join(triggers.delete(cfg, Aws(cfg.aws.region))) or 'nothing'}")


def register(app: typer.Typer) -> None:
    app.add_typer(triggers_app, name="triggers", rich_help_panel=PANEL)
