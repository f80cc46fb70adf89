"""Command line: `trainium-pipeline COMMAND` (or `python -m pipeline COMMAND`): config -> backend -> view.

One module per panel of `--help`: `executions`, `models`, `endpoints`, `triggers`, `account`; `shared` holds the
consoles, the global options and how a command fails."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli import account, endpoints, executions, models, shared, triggers
from pipeline.cli.shared import Options, console

app = typer.Typer(
    help="Fine-tune BERT on AWS Trainium with SageMaker Pipelines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
for panel in (executions, models, endpoints, triggers, account):  # `--help` lists the commands by what they act on
    panel.register(app)


@app.callback()
def _options(
    ctx: typer.Context,
    config: Annotated[Path, typer.Option("--config", "-c", help="Config file.")] = Path("pipeline.yaml"),
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config key, e.g. --set training.epochs=2.")
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of any failure.")] = False,
) -> None:
    shared.debug = debug
    ctx.obj = Options(config, tuple(set_ or []))


def main() -> None:
    """Entry point: expected errors are one line and a non-zero exit (see pipeline.cli.shared.run)."""
    shared.run(app)


__all__ = ["app", "console", "main"]
