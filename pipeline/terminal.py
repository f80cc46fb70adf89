"""What the command modules share: the two consoles and the global options, which typer keeps in `ctx.obj`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from pipeline.backend import Backend, open_backend
from pipeline.config import Config, load_config

console = Console(soft_wrap=True)
errors = Console(stderr=True, soft_wrap=True)

LOCAL = Annotated[bool, typer.Option("--local", help="On this machine: local runner, registry and endpoint.")]
ROOT = Annotated[Path | None, typer.Option(help="Folder of the local account (default local.root).")]


@dataclass(frozen=True)
class Options:
    """The global options: `--config FILE` and the `--set KEY=VALUE` overrides."""

    config: Path = Path("pipeline.yaml")
    sets: tuple[str, ...] = ()

    def load(self, local: bool = False) -> Config:
        """The config of --config with the TRAINIUM_PIPELINE_* environment and the --set overrides (`local`: its
        local profile, the one `--local` commands use)."""
        return load_config(self.config, self.sets, local=local)

    def backend(self, local: bool, root: Path | None = None) -> Backend:
        return open_backend(self.load(local), local, root)
