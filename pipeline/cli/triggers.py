"""The Triggers panel: `triggers apply | list | delete` (the EventBridge rules of the pipeline stack)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from pipeline import views
from pipeline.cli.shared import console, errors
from pipeline.sagemaker.aws import Aws

PANEL = "Triggers"
triggers_app = typer.Typer(help="EventBridge rules: deploy on approval, schedule, new data.", no_args_is_help=True)


def _deploy(ctx: typer.Context, on: bool) -> None:
    from pipeline.sagemaker import pipeline_stack
    from pipeline.sagemaker.stacks import Waiting
    from pipeline.sagemaker.triggers import plan

    cfg = ctx.obj.load()
    waiting = Waiting(on_event=lambda event: errors.print(views.stack_event(event), markup=False, highlight=False))
    result = pipeline_stack.deploy(cfg, Aws(cfg.aws.region), triggers=on, waiting=waiting)
    console.print(f"stack {result.stack_name} {result.action}")
    console.print(f"rules {'on' if on else 'off'}: {', '.join(rule['Name'] for rule in plan(cfg))}")


@triggers_app.command("apply")
def triggers_apply(
    ctx: typer.Context,
    print_only: Annotated[bool, typer.Option("--print-only", help="Print the stack's template; deploy nothing.")]
    = False,
) -> None:
    """Deploy the pipeline stack with the rules of the `triggers` section and the lifecycle on (idempotent); a rule
    turned off in the config is deleted."""
    if print_only:
        from pipeline.sagemaker import pipeline_stack, triggers

        cfg = ctx.obj.load()
        triggers.check_parameters(cfg)
        sys.stdout.write(pipeline_stack.template(cfg) + "\n")
        return
    _deploy(ctx, on=True)


@triggers_app.command("list")
def triggers_list(ctx: typer.Context) -> None:
    """The rules that exist now, with their targets."""
    from pipeline.sagemaker import triggers

    cfg = ctx.obj.load()
    console.print_json(json.dumps(triggers.list_(cfg, Aws(cfg.aws.region)), default=str))


@triggers_app.command("delete")
def triggers_delete(ctx: typer.Context) -> None:
    """Turn the rules off: the pipeline stack keeps the deploy Lambda (a stack with nothing left is deleted)."""
    _deploy(ctx, on=False)


def register(app: typer.Typer) -> None:
    app.add_typer(triggers_app, name="triggers", rich_help_panel=PANEL)
