"""The `runs` table: one row per execution's MLflow run, key parameters and metrics side by side."""

from __future__ import annotations

from rich.table import Table

from pipeline.tracking.store import KEY_METRICS, KEY_PARAMS, RunRow

HEADERS = {  # short headers, so that a row fits a terminal
    "learning_rate": "lr", "batch_size": "batch", "epochs": "epochs", "world_size": "devices",
    "serving_variant": "serving", "train_loss": "loss", "samples_per_sec": "samples/s",
    "warmup_s": "warm-up s", "val_accuracy": "val acc", "test_accuracy": "test acc", "eval_f1": "f1",
}


def _number(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if metric in ("samples_per_sec", "warmup_s") else f"{value:.3f}"


def runs_table(rows: list[RunRow], experiment: str, where: str) -> Table:
    table = Table(title=f"MLflow runs of experiment {experiment} ({where})")
    table.add_column("execution", no_wrap=True)
    for column in (*KEY_PARAMS, *KEY_METRICS, "version"):
        table.add_column(HEADERS.get(column, column), overflow="fold")
    for row in rows:
        table.add_row(row.execution, *(row.params.get(p, "-") for p in KEY_PARAMS),
                      *(_number(m, row.metrics.get(m)) for m in KEY_METRICS), row.tags.get("model_version", "-"))
    return table
