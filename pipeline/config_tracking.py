"""The `tracking` section of the config: MLflow experiment tracking (docs/tracking.md)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from pipeline.config_base import MLFLOW_ARN, Section, pattern


class Tracking(Section):
    """One MLflow run per execution, logged by the Train and Evaluate steps: on AWS to SageMaker managed MLflow at
    `server_arn` (none: nothing is tracked there), with `run --local` to the store under local.root."""

    server_arn: str | None = Field(default=None, pattern=MLFLOW_ARN)
    experiment: str | None = Field(default=None, pattern=pattern(  # default: pipeline.name
        r"^[a-zA-Z0-9\-_./]{1,256}$", "an experiment name: 1 to 256 letters, digits and - _ . /"))
    create_server: bool = False  # bootstrap creates a tracking server (and writes its ARN into server_arn)


def experiment(cfg: Any) -> str:
    """The MLflow experiment of the pipeline's runs: tracking.experiment, else the pipeline's name."""
    return cfg.tracking.experiment or cfg.pipeline.name
