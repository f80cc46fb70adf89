"""What the command modules share: the two consoles and the config that the global options name."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from pipeline.config import Config, load_config

console = Console(soft_wrap=True)
errors = Console(stderr=True, soft_wrap=True)
options: dict = {"config": Path("pipeline.yaml"), "set": []}


def config() -> Config:
    """The config file of --config with the --set overrides (and the TRAINIUM_PIPELINE_* environment)."""
    return load_config(options["config"], options["set"])
