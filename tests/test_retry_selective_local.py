"""`retry --local` and `run --local --steps ... --from` end to end: the real definition, step scripts, training toolkit
and torchrun. A training interrupted by Ctrl-C resumes from its checkpoints on retry; an Evaluate broken by a bad code
object fails, is fixed and retried without Tokenize or Train running again; a selective run of Evaluate gives a new
report and registers nothing unless RegisterModel is selected.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures_ml import build_model, build_tokenizer, ctrl_c_reaches_it
from test_local_e2e import cli as e2e_cli
from test_local_e2e import free_port

from pipeline.code import bundles
from pipeline.config import load_config
from pipeline.local.backend import LocalBackend
from pipeline.local.execution import Execution

pytestmark = pytest.mark.slow  # whole local runs, interrupted and retried

ROOT = Path(__file__).resolve().parent.parent
BROKEN = b'raise SystemExit("evaluate.py: broken on purpose")\n'
CHANGED = ("--set", "evaluation.sample_size=12")  # Evaluate's arguments change: another definition


@pytest.fixture(scope="module")
def setup(tmp_path_factory, no_network_module):
    folder = tmp_path_factory.mktemp("iterate")
    model = build_model(folder / "model", build_tokenizer(folder / "tokenizer"))
    training = {"model_id": model, "epochs": 20, "max_steps": 60, "checkpoint_interval": 2, "batch_size": 8,
                "max_length": 64, "log_interval": 1}  # long enough to be interrupted after its first checkpoint
    overrides = [f"local.overrides.training.{key}={value}" for key, value in training.items()] + [
        "local.overrides.data.source=sample:240",
        "local.overrides.registry.approval_status=PendingManualApproval",  # nothing deployed
        "evaluation.sample_size=10",
        "evaluation.accuracy_threshold=0.0",
        f"local.port={free_port()}",
    ]
    account = LocalBackend(load_config(ROOT / "pipeline.yaml", overrides, environ={}, local=True), folder / "local")
    sets = [arg for o in overrides for arg in ("--set", o)] + ["--root", str(folder / "local")]
    yield account, sets
    account.stop_endpoint()


def cli(capsys, *args: str) -> tuple[int, str]:
    """The CLI in-process, tables wide enough for one line per row."""
    from pipeline import cli as module

    width, module.console.width = module.console.width, 250
    try:
        return e2e_cli(capsys, *args)
    finally:
        module.console.width = width


def local(sets: list[str], command: str, *args: str, changed: tuple[str, ...] = ()) -> list[str]:
    """The arguments of `command --local` with the module's config, then the `changed` --set options."""
    return [*sets[:-2], *changed, command, "--local", *sets[-2:], *args]


def evaluate_code(account: LocalBackend) -> Path:
    return account.s3.path(bundles()["evaluation"].s3_prefix(account.cfg.s3_root) + "steps/evaluation/evaluate.py")


def report(account: LocalBackend, execution: Execution) -> dict:
    outputs = execution.steps["Evaluate"].properties["ProcessingOutputConfig"]["Outputs"]
    return json.loads((account.s3.path(outputs["evaluation"]["S3Output"]["S3Uri"]) / "evaluation.json").read_text())


def interrupted_run(account: LocalBackend, sets: list[str]) -> Execution:
    """`run --local` in its own process, Ctrl-C (SIGINT) as soon as the Train step has a complete checkpoint."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pipeline", "--config", str(ROOT / "pipeline.yaml"), *local(sets, "run")]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=ctrl_c_reaches_it)
    markers = account.layout.executions(account.pipeline)
    deadline = time.monotonic() + 600
    while not list(markers.glob("*/Train/opt_ml/checkpoints/slot-*/COMPLETE")) and time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[0]
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 1, out
    (execution,) = account.records()
    assert execution.status == "Stopped", out
    return execution


def test_an_interrupted_training_resumes_on_retry_and_a_fixed_evaluate_reruns_alone(setup, capsys):
    account, sets = setup
    account.upsert()
    code_object = evaluate_code(account)
    original = code_object.read_bytes()
    code_object.write_bytes(BROKEN)  # a bad artifact: the definition stays the same, so a retry is allowed

    stopped = interrupted_run(account, sets)
    assert stopped.status == "Stopped", {n: (r.status, r.reason) for n, r in stopped.steps.items()}
    assert {n: r.status for n, r in stopped.steps.items() if n in ("Tokenize", "Train", "Evaluate")} == {
        "Tokenize": "Succeeded", "Train": "Stopped", "Evaluate": "NotStarted"
    }
    checkpoints = account.s3.path(account.cfg.checkpoint_s3_uri)
    (kept,) = {marker.parent.parent for marker in checkpoints.rglob("slot-*/COMPLETE")}  # kept for the retry, in
    assert stopped.id not in str(kept)  # the training's folder (CheckpointConfig is a cache key attribute)
    folder = account.layout.execution(account.pipeline, stopped.id)

    code, out = cli(capsys, *local(sets, "retry"))  # Train resumes, then Evaluate fails on the bad code object
    assert code == 1, out
    assert f"retrying {stopped.arn}" in out
    first = account.record(stopped.id)
    train = first.steps["Train"]
    assert (first.status, train.status, train.attempts, first.retries) == ("Failed", "Succeeded", 2, 1)
    assert train.log == str(folder / "Train.attempt-2.log")
    resumed = int(re.search(r"resumed from checkpoint at step=(\d+)", Path(train.log).read_text()).group(1))
    assert 2 <= resumed < 60
    assert "resumed from checkpoint" not in (folder / "Train.log").read_text()
    assert not kept.exists() and not (folder / "Train" / "opt_ml" / "checkpoints").exists()  # cleaned
    assert first.steps["Tokenize"].attempts == 1
    assert (first.steps["Evaluate"].status, first.steps["Evaluate"].attempts) == ("Failed", 1)
    assert "broken on purpose" in first.steps["Evaluate"].reason

    # the code and config now make another definition: a retry would re-run the old one, so it is refused
    code, out = cli(capsys, *local(sets, "retry", changed=CHANGED))
    assert code == 1 and "(changed: Evaluate)" in out
    steps = "Evaluate,AccuracyGate,RegisterModel,AccuracyTooLow,ApprovedGate,Deploy"
    assert f"start --steps {steps} --from {first.id}" in out
    assert account.record(first.id).retries == 1  # nothing ran

    code_object.write_bytes(original)  # fixed
    kept = {name: Path(first.steps[name].log) for name in ("Tokenize", "Train")}
    before = {name: (log.stat().st_mtime_ns, log.read_text()) for name, log in kept.items()}
    code, out = cli(capsys, *local(sets, "retry", first.id))
    assert code == 0, out
    done = account.record(first.id)
    assert (done.id, done.status, done.retries) == (first.id, "Succeeded", 2)
    attempts = {name: (step.status, step.attempts) for name, step in done.steps.items()}
    assert attempts == {
        "Tokenize": ("Succeeded", 1), "Train": ("Succeeded", 2), "Evaluate": ("Succeeded", 2),
        "AccuracyGate": ("Succeeded", 1), "RegisterModel": ("Succeeded", 1), "AccuracyTooLow": ("Skipped", 0),
        "ApprovedGate": ("Succeeded", 1), "Deploy": ("Skipped", 0),
    }
    assert {name: (log.stat().st_mtime_ns, log.read_text()) for name, log in kept.items()} == before  # not run
    assert done.steps["Train"].properties == first.steps["Train"].properties
    assert "registered: trainium-bert version 1 (PendingManualApproval)" in out
    assert (folder / "Evaluate.log").exists() and (folder / "Evaluate.attempt-2.log").exists()

    code, out = cli(capsys, *local(sets, "executions"))
    assert code == 0 and "retried 2x" in out
    code, out = cli(capsys, *local(sets, "status"))
    assert code == 0 and "(retried 2x)" in out


def test_a_selective_run_of_evaluate_gives_a_new_report_and_registers_nothing_unless_selected(setup, capsys):
    account, sets = setup
    (source,) = account.records()
    code, out = cli(capsys, *local(sets, "run", "--steps", "Evaluate", "--from", source.id, changed=CHANGED))
    assert code == 0, out
    assert "selected: Evaluate" in out and f"outputs of {source.id}: Tokenize, Train" in out
    assert "not selected, so not run: AccuracyGate, RegisterModel, AccuracyTooLow, ApprovedGate, Deploy" in out
    selective = account.record(None)
    assert selective.id != source.id and selective.status == "Succeeded"
    assert (selective.selective_from, selective.selected_steps) == (source.id, ["Evaluate"])
    assert list(selective.steps) == ["Tokenize", "Train", "Evaluate"]
    for name in ("Tokenize", "Train"):
        reused = selective.steps[name]
        assert (reused.reused_from, reused.attempts, reused.log) == (source.id, 0, "")
        assert reused.properties == source.steps[name].properties
    evaluate = selective.steps["Evaluate"]
    assert evaluate.attempts == 1 and not evaluate.cached
    new, old = report(account, selective), report(account, source)
    assert f"/executions/{selective.id}/evaluation" in evaluate.properties["ProcessingOutputConfig"]["Outputs"][
        "evaluation"]["S3Output"]["S3Uri"]
    assert (new["check"]["sample_size"], old["check"]["sample_size"]) == (12, 10)
    assert new["binary_classification_metrics"]["accuracy"] == old["binary_classification_metrics"]["accuracy"]
    assert len(account.registry.list("trainium-bert")) == 1  # RegisterModel was not selected

    code, out = cli(capsys, *local(sets, "status", selective.id))
    assert code == 0 and f"(selective from {source.id}: Evaluate)" in out
    assert out.count(f"reused from {source.id}") == 2

    code, out = cli(capsys, *local(sets, "start", "--steps", "Evaluate,AccuracyGate,RegisterModel", "--from",
                                   source.id, changed=CHANGED))
    assert code == 0, out
    registered = account.record(None)
    assert registered.selected_steps == ["Evaluate", "AccuracyGate", "RegisterModel"]
    assert registered.steps["Evaluate"].cached  # the same inputs as the selective run above: a cache hit
    assert "Deploy" not in registered.steps and "ApprovedGate" not in registered.steps
    latest, first = account.registry.list("trainium-bert")
    assert latest.version == 2 and latest.customer_metadata["pipeline_execution"] == registered.arn
    # what Evaluate packed (the source's trained model and its serving variant), from the Evaluate step it reused
    assert registered.steps["Train"].reused_from == source.id
    serving = registered.steps["Evaluate"].properties["ProcessingOutputConfig"]["Outputs"]["serving"]["S3Output"]
    assert latest.model_data.endswith(serving["S3Uri"].split("://", 1)[1] + "/model.tar.gz"), latest.model_data
    assert first.model_data.endswith("/serving/model.tar.gz") and first.model_data != latest.model_data

    code, out = cli(capsys, *local(sets, "run", "--steps", "Evaluate", "--from", "no-such-execution"))
    assert code == 1 and "no local execution no-such-execution" in out


def test_after_an_edit_to_the_deploy_lambda_a_run_takes_every_job_step_from_the_cache(setup, capsys, monkeypatch,
                                                                                       tmp_path):
    """The Lambda's code is in no job's code location: editing it re-runs no step (its own bundle changes alone)."""
    import shutil

    from pipeline.code import bundles

    account, sets = setup
    project = tmp_path / "project"
    for folder in ("steps", "training"):
        shutil.copytree(ROOT / folder, project / folder, ignore=shutil.ignore_patterns("__pycache__"))
    with (project / "steps" / "deploy" / "handler.py").open("a") as handler:
        handler.write("# edited\n")
    assert bundles(project)["deploy"].sha256 != bundles()["deploy"].sha256
    monkeypatch.setattr("pipeline.code.PROJECT_ROOT", project)
    code, out = cli(capsys, *local(sets, "run"))
    assert code == 0, out
    latest = account.record(re.search(r"started (\S+)", out).group(1))  # not the newest by start time: the
    assert latest.status == "Succeeded"  # execution that `start` above left running may have started after it
    assert [name for name in ("Tokenize", "Train", "Evaluate") if not latest.steps[name].cached] == []
