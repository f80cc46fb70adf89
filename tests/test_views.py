"""What the CLI prints: tables that cut no cell at 80 columns or piped, and `--json` on every listing command."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from test_lifecycle_local import Account

from pipeline import views
from pipeline.cli.endpoints import endpoints_table
from pipeline.records import ExecutionView, StageView, StepView, VersionView
from pipeline.tracking.store import RunRow

EXECUTION = ExecutionView(
    id="20261207051339-626645", arn="arn:aws:sagemaker:local:000000000000:pipeline/trainium-bert/execution/x",
    pipeline="trainium-bert", status="Succeeded", started="2026-12-07T05:13:39+00:00",
    ended="2026-12-07T05:14:10+00:00", display_name="run --local", parameters={"AccuracyThreshold": "0.8"},
    steps=[StepView(name="Evaluate", type="Processing", status="Failed", started="2026-12-07T05:14:10+00:00",
                    seconds=0.1, attempts=1, note="exit code 1: evaluate.py: broken on purpose")],
)
RUN = RunRow(run_id="0123abcd", execution="20261207051339-626645", status="FINISHED", started="2026-12-07",
             params={"learning_rate": "0.0001", "batch_size": "32", "epochs": "1", "world_size": "2",
                     "serving_variant": "onnxruntime-int8"},
             metrics={"train_loss": 0.31, "samples_per_sec": 1234.5, "warmup_s": 42.0, "val_accuracy": 0.91,
                      "test_accuracy": 0.905, "eval_f1": 0.9},
             tags={"model_version": "3"})


def render(renderable: object, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return out.getvalue()


@pytest.mark.parametrize("renderable", [
    views.executions_table([EXECUTION], "trainium-bert"),
    views.execution_table(EXECUTION),
    views.runs_table([RUN], "trainium-bert", "sqlite:////home/me/project/.local/mlflow.db"),
    endpoints_table([StageView(stage="production", endpoint="trainium-bert", version=3, status="InService",
                               instances="1 x ml.c5.xlarge", scaling="1-4 (70 invocations/instance/min)",
                               test="PASS on 200 rows: accuracy 0.9100", where="http://127.0.0.1:8080")]),
], ids=["executions", "status", "runs", "endpoints"])
def test_no_cell_is_cut_at_80_columns(renderable):
    """Piped output is rendered 80 columns wide: a table that does not fit becomes one block per row."""
    narrow, wide = render(renderable, 80), render(renderable, 400)
    assert "…" not in narrow and "…" not in wide
    assert all(len(line) <= 80 for line in narrow.splitlines())
    assert "┃" in wide  # wide enough: the table itself
    cells = [cell for row in renderable.rows for cell in row if cell and "[" not in cell]
    assert all(cell in " ".join(narrow.split()) for cell in cells), narrow


def test_a_table_that_fits_stays_a_table():
    versions = [VersionView(version=1, status="Approved", accuracy=0.91, created="2026-12-07")]
    assert "┃" in render(views.versions_table(versions, "trainium-bert"), 80)


def test_every_listing_command_has_json(tmp_path, capsys, no_network):
    """`executions`, `models list` and `endpoints` with --json print what the table shows, for scripts."""
    account = Account(tmp_path)
    account.register(status="Approved")
    assert account.cli(capsys, "deploy", "1")[0] == 0
    try:
        for command, check in (
            (("models", "list"), lambda found: [(v["version"], v["status"]) for v in found] == [(1, "Approved")]),
            (("endpoints",), lambda found: {s["stage"]: s["version"] for s in found}["staging"] == 1),
            (("executions",), lambda found: found == []),  # `runs --json`: tests/test_local_e2e.py
        ):
            code, out, err = account.cli(capsys, *command, "--json")
            assert code == 0, err
            assert check(json.loads(out)), out
    finally:
        account.backend.stop_endpoint()
