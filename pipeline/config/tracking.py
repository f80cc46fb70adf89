"""The `tracking` section of the config: MLflow experiment tracking (docs/tracking.md)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from pipeline.config.base import MLFLOW_ARN, Section, pattern
from steps import contract


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


def tracking_prefix(cfg: Any) -> str:
    """The S3 folder of the tracking file (Train's and Evaluate's "tracking" input): one fixed key, so that
    tracking's settings are in no step's cache key."""
    return f"{cfg.s3_root}/{contract.TRACKING_INPUT}/"


def tracking_settings(cfg: Any) -> tuple[str, bytes]:
    """The tracking file that `upsert` writes (its S3 URI and content): the MLflow server (none on AWS without
    tracking.server_arn; the local runner points the steps at its own store), the experiment, and with a server the
    pipeline's ARN, from which a step finds its execution's own experiment (StartPipelineExecution's
    MlflowExperimentName)."""
    server = cfg.tracking.server_arn
    settings = {"uri": server or "", "experiment": experiment(cfg), **({"pipeline_arn": cfg.pipeline_arn} if server
                                                                      else {})}
    return tracking_prefix(cfg) + contract.TRACKING_FILE, json.dumps(settings, sort_keys=True).encode()
