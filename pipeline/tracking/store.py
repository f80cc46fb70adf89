"""The MLflow stores the CLI reads: the local one under local.root (SQLite, no server) and SageMaker managed MLflow by
ARN (through the sagemaker-mlflow plugin, which the SageMaker SDK brings). Runs are read, listed and tagged here."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import UserError
from steps import contract

STORE_FILE = "mlflow.db"  # under local.root
# the columns of `runs`: the parameters and metrics a comparison needs (params of Train, metrics of both steps)
KEY_PARAMS = ("learning_rate", "batch_size", "epochs", "world_size", "serving_variant")
KEY_METRICS = ("train_loss", "samples_per_sec", "warmup_s", "val_accuracy", "test_accuracy", "eval_f1")


class TrackingError(UserError, RuntimeError):
    """No store to read, or the store cannot be read: one line."""


def local_uri(root: Path) -> str:
    """The tracking URI of the local account's store (what `mlflow ui --backend-store-uri` takes)."""
    return f"sqlite:///{Path(root).resolve() / STORE_FILE}"


def store_uri(cfg: Any, local: bool, root: Path | None = None) -> str:
    """The store `runs` reads: the local one (which must exist), else the configured server."""
    if local:
        folder = Path(root or cfg.local.root)
        if not (folder / STORE_FILE).exists():
            raise TrackingError(f"no MLflow store in {folder} yet: `run --local` creates it")
        return local_uri(folder)
    if not cfg.tracking.server_arn:
        raise TrackingError("tracking.server_arn: not set; expected the ARN of a SageMaker managed MLflow tracking "
                            "server (bootstrap can create one), or use --local")
    return cfg.tracking.server_arn


@dataclass
class RunRow:
    """One execution's run, as `runs` lists it."""

    run_id: str
    execution: str
    status: str
    started: str
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def client(uri: str) -> Any:
    """An MlflowClient of `uri`, quiet (MLflow logs each schema migration of a new local store). For an ARN, `uri`
    also becomes the process's tracking URI: the sagemaker-mlflow plugin signs each request for that one, not for
    the client's."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    import mlflow
    from mlflow.tracking import MlflowClient

    if uri.startswith("arn:"):
        mlflow.set_tracking_uri(uri)
    return MlflowClient(uri)


def list_runs(uri: str, experiment: str, limit: int = 20) -> list[RunRow]:
    """The experiment's runs, newest first."""
    try:
        mlflow = client(uri)
        found = mlflow.get_experiment_by_name(experiment)
        runs = mlflow.search_runs([found.experiment_id], max_results=limit,
                                  order_by=["start_time DESC"]) if found else []
    except Exception as e:  # a store that cannot be opened, a server that refuses or cannot be reached
        raise TrackingError(f"cannot read the MLflow runs at {uri}: {type(e).__name__}: {str(e)[:300]}") from None
    rows = []
    for run in runs:
        data, info = run.data, run.info
        rows.append(RunRow(info.run_id, data.tags.get(contract.EXECUTION_TAG, info.run_name or ""), info.status,
                           _iso(info.start_time), dict(data.params), dict(data.metrics), dict(data.tags)))
    return rows


def end_open_run(uri: str, experiment: str, execution: str, status: str) -> None:
    """Mark the execution's run `status` (FAILED, KILLED) if it is still RUNNING: a step that ended it could not (killed
    outright). Best effort: the execution's own record says how it ended either way."""
    try:
        mlflow = client(uri)
        found = mlflow.get_experiment_by_name(experiment)
        runs = mlflow.search_runs([found.experiment_id], f"tags.`{contract.EXECUTION_TAG}` = '{execution}'",
                                  max_results=1) if found else []
        if runs and runs[0].info.status == "RUNNING":
            mlflow.set_terminated(runs[0].info.run_id, status)
    except Exception as e:  # a store that cannot be opened: nothing to end
        logging.getLogger(__name__).warning("could not end the MLflow run of %s: %s", execution, e)


def _iso(millis: int | None) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(millis / 1000, timezone.utc).isoformat(timespec="seconds") if millis else ""


def tag_version(uri: str, run_id: str, version: int, arn: str) -> str | None:
    """Tag the run with the model version registered from it; a warning line when that fails (never an error: the
    version carries the run id either way)."""
    if not run_id or run_id == contract.UNTRACKED:
        return None
    try:
        mlflow = client(uri)
        mlflow.set_tag(run_id, "model_version", str(version))
        mlflow.set_tag(run_id, "model_package_arn", arn)
    except Exception as e:
        return f"warning: could not tag MLflow run {run_id} with model version {version}: {type(e).__name__}: {e}"
    return None
