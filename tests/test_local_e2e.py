"""`run --local` end to end: the real definition, step scripts, training toolkit + torchrun, registry, the staging
endpoint with its endpoint test, promotion to the production endpoint; then the lifecycle commands on its artifact.

A tiny random BERT (its tokenizer trained on the sample generator's vocabulary) stands in for MiniLM, so that the
whole pipeline runs in a few minutes on two cores, and still learns: 120 steps on 760 sample reviews score about 0.91
on the 80 test rows here, and label clear reviews right on both endpoints. The endpoint test's accuracy bound allows
one of its 10 rows to flip (its checks are tested in test_endpoint_check.py and test_endpoint_sample.py).
"""

from __future__ import annotations

import json
import socket
import sys
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

import boto3
import pyarrow.parquet as pq
import pytest
from fixtures_ml import build_model, build_tokenizer, run_overrides, sample_texts

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.local.backend import LocalBackend

pytestmark = pytest.mark.slow  # whole local runs

ROOT = Path(__file__).resolve().parent.parent
TEST_ROWS = 80  # sample:800 has 800 // 10 test rows, balanced
# Better than chance on TEST_ROWS balanced rows: P(accuracy >= 0.7) for a coin is 0.0002 (measured here: 0.91).
BETTER_THAN_CHANCE = 0.7
CLEAR = {  # unmistakable reviews in the generator's own words (steps/tokenize/reviews.py), and their labels
    "Great headphones. The sound quality is excellent. Highly recommended.": "positive",
    "Excellent. Works perfectly. Highly recommended.": "positive",
    "Terrible. Broke after a week. Waste of money.": "negative",
    "Disappointed. The screen is awful and the software is useless. Do not buy this.": "negative",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("e2e")
    model = build_model(folder / "model", build_tokenizer(folder / "tokenizer", sample_texts()))
    overrides = run_overrides(
        model, 800, 120,
        "local.overrides.training.learning_rate=0.002",  # 0.005 left the tiny model at chance: 1 of 8 split/seed pairs
        f"local.port={free_port()}",
        f"local.staging_port={free_port()}",
        "local.processes=2",
        "deploy.test.max_accuracy_drop=0.1",
        "deploy.challenge.tolerance=0.2",  # 10 sample rows: two equal models' interval is +-0.16
        "deploy.test.p95_ms=60000",
        "evaluation.sample_size=10",  # fewer than the test rows: the gate must still see all of them
    )
    account = LocalBackend(load_config(ROOT / "pipeline.yaml", overrides, environ={}, local=True), folder / "local")
    yield folder, overrides, account
    account.stop_endpoint()


def cli(capsys, *args: str, split: bool = False) -> tuple[int, Any]:
    """Run the CLI in-process with the shipped config: (exit code, stdout + stderr, or (stdout, stderr) if split)."""
    argv, sys.argv = sys.argv, ["trainium-pipeline", "--config", str(ROOT / "pipeline.yaml"), *args]
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0
    finally:
        sys.argv = argv
    out, err = capsys.readouterr()
    return code, (out, err) if split else out + err


def test_run_local_registers_deploys_and_serves(setup, capsys):
    folder, overrides, account = setup
    sets = [arg for o in overrides for arg in ("--set", o)]
    code, out = cli(capsys, *sets, "run", "--local", "--root", str(folder / "local"), "-p", "AccuracyThreshold=0.0")
    assert code == 0, out
    (execution,) = account.records()
    assert execution.status == "Succeeded"
    assert {n: r.status for n, r in execution.steps.items()} == {
        "Tokenize": "Succeeded",
        "Train": "Succeeded",
        "Evaluate": "Succeeded",
        "AccuracyGate": "Succeeded",
        "RegisterModel": "Succeeded",
        "ApprovedGate": "Succeeded",
        "Deploy": "Succeeded",
        "AccuracyTooLow": "Skipped",
    }
    outputs = execution.steps["Evaluate"].properties["ProcessingOutputConfig"]["Outputs"]
    report = json.loads((account.s3.path(outputs["evaluation"]["S3Output"]["S3Uri"]) / "evaluation.json").read_text())
    accuracy = report["binary_classification_metrics"]["accuracy"]["value"]
    classification = report["classification"]  # by label name, for the gate's macro-F1
    assert classification["accuracy"]["value"] == accuracy and 0 < classification["macro_f1"]["value"] <= 1
    assert sum(c["support"] for c in classification["per_class"].values()) == TEST_ROWS
    assert accuracy >= BETTER_THAN_CHANCE, report["binary_classification_metrics"]
    # The gate's accuracy is that of the whole test split, from the Train step's predictions in the artifact;
    # only a sample is scored again on CPU.
    with tarfile.open(account.s3.path(execution.steps["Train"].properties["ModelArtifacts"]["S3ModelArtifacts"])) as t:
        predictions = pq.read_table(t.extractfile("predictions/test.parquet")).to_pydict()
    test_rows = len(predictions["label"])
    positives = sum(predictions["label"])
    assert report["dataset"] == {"rows": test_rows, "positives": positives, "predictions": "train step",
                                 "per_class": {"negative": test_rows - positives, "positive": positives}}
    assert test_rows == TEST_ROWS and report["check"]["sample_size"] == 10 and report["check"]["passed"]
    assert sum(predictions["label"]) == TEST_ROWS // 2  # balanced: always guessing one label scores 0.5
    whole = sum(p == label for p, label in zip(predictions["prediction"], predictions["label"], strict=True))
    assert accuracy == pytest.approx(whole / test_rows)
    assert f"accuracy on the test split: {accuracy:.4f}" in out
    assert "registered: trainium-bert version 1 (Approved)" in out
    assert "loss, throughput and confusion matrix: " in out and "summary.png" in out
    model_data = account.s3.path(execution.steps["Train"].properties["ModelArtifacts"]["S3ModelArtifacts"])
    assert model_data.name == "model.tar.gz" and model_data.exists()

    (version,) = account.registry.list("trainium-bert")
    assert version.status == "Approved" and version.accuracy == pytest.approx(accuracy)
    assert version.customer_metadata["training_job"] == execution.steps["Train"].properties["TrainingJobName"]
    assert (version.customer_metadata["label_count"], version.customer_metadata["label_digest"]) == (
        "2", report["labels"]["digest"])  # the classes, by count and digest (their names are in the artifact)
    # the endpoint serves the variant the evaluation chose, through the model's environment
    assert report["inference"]["quantize"] in ("int8", "none")
    assert version.environment["INFERENCE_QUANTIZE"] == report["inference"]["quantize"]
    assert version.environment["INFERENCE_RUNTIME"] == report["inference"]["runtime"]
    assert version.model_data.endswith("/serving/model.tar.gz")  # Evaluate's serving artifact
    assert version.environment["INFERENCE_MAX_TEXTS"] == "256"
    spec = version.describe()["InferenceSpecification"]  # as the definition's RegisterModel step gave them
    assert spec["SupportedContentTypes"] == ["application/json", "text/csv", "text/plain"]
    assert spec["SupportedResponseMIMETypes"] == ["application/json", "application/jsonlines"]

    # The Deploy step: staging, the endpoint test on Evaluate's labelled sample, then (auto-promote) production.
    metadata = account.registry.get("trainium-bert", 1).customer_metadata
    assert metadata["staging_test"] == "pass" and metadata["staging_test_errors"] == "0", \
        {k: v for k, v in metadata.items() if k.startswith("staging")}
    assert metadata["staging_test_rows"] == "10" and "promoted_at" in metadata  # Evaluate's sample: 10 rows
    assert "staging test of version 1 on trainium-bert-staging: PASS on 10 rows" in out
    assert "production trainium-bert: version 1 created" in out
    url = account.services.endpoint("production").where
    assert f"curl -s {url}/invocations" in out
    with urllib.request.urlopen(f"{url}/ping", timeout=10) as ping:
        assert ping.status == 200
    for stage, name in (("staging", "trainium-bert-staging"), ("production", "trainium-bert")):
        runtime = boto3.client("sagemaker-runtime", endpoint_url=account.services.endpoint(stage).where,
                               region_name="us-east-1")
        response = runtime.invoke_endpoint(
            EndpointName=name,
            ContentType="application/json",
            Accept="application/json",
            Body=json.dumps({"inputs": list(CLEAR)}),
        )
        predictions = json.loads(response["Body"].read())
        assert [p["label"] for p in predictions] == list(CLEAR.values()), (stage, predictions)
        assert all(0.5 <= p["score"] <= 1.0 for p in predictions)


def test_the_run_is_one_mlflow_run_holding_what_the_step_files_hold(setup, capsys):
    """`run --local` (the test above) logged one run to the local store: the Train step's parameters, loss curve and
    throughput, Evaluate's metrics and serving variant, equal to training_stats.json and evaluation.json; the
    registered version and the run name each other; the summary drew its PNG; `runs --local` lists the run."""
    from mlflow.tracking import MlflowClient

    from pipeline.tracking.store import local_uri

    folder, overrides, account = setup
    (execution,) = account.records()
    client = MlflowClient(local_uri(folder / "local"))
    experiment = client.get_experiment_by_name("trainium-bert")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == execution.id and run.info.status == "FINISHED"
    model = account.s3.path(execution.steps["Train"].properties["ModelArtifacts"]["S3ModelArtifacts"])
    with tarfile.open(model.with_name("output.tar.gz")) as t:
        stats = json.load(t.extractfile("training_stats.json"))
    outputs = execution.steps["Evaluate"].properties["ProcessingOutputConfig"]["Outputs"]
    report = json.loads((account.s3.path(outputs["evaluation"]["S3Output"]["S3Uri"]) / "evaluation.json").read_text())
    metrics, params, tags = run.data.metrics, run.data.params, run.data.tags

    hyperparameters = execution.steps["Train"].properties["HyperParameters"]
    final = execution.steps["Train"].properties["FinalMetricDataList"]  # the job's MetricDefinitions over its log
    assert final["test:accuracy"]["Value"] == pytest.approx(stats["test_accuracy"], abs=1e-3)
    for key in ("learning-rate", "batch-size", "epochs", "max-steps", "seed", "max-length", "log-interval"):
        assert params[key.replace("-", "_")] == hyperparameters[key], key
    assert params["world_size"] == "2" and params["learning_rate"] == "0.002"
    curve = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train_loss")]
    assert curve == [(i["step"], i["loss"]) for i in stats["intervals"]] and len(curve) >= 2
    throughput = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "interval_samples_per_sec")]
    assert throughput == [(i["step"], i["samples_per_sec"]) for i in stats["intervals"]]
    for key in ("samples_per_sec", "samples_per_sec_with_warmup", "warmup_s", "model_tflops_per_sec", "val_accuracy",
                "test_accuracy"):
        assert metrics[key] == stats[key], key
    assert stats["samples_per_sec"] > 0 and stats["warmup_s"] >= 0

    bcm = report["binary_classification_metrics"]
    assert {k: metrics[f"eval_{k}"] for k in ("accuracy", "f1", "auc")} == {k: bcm[k]["value"] for k in
                                                                             ("accuracy", "f1", "auc")}
    inference = report["inference"]
    assert params["serving_variant"] == tags["serving.variant"] == inference["variant"]
    assert tags["serving.int8"] == str(inference["quantize"] == "int8").lower()

    assert report["tracking"]["run_id"] == run.info.run_id
    (version,) = account.registry.list("trainium-bert")
    assert version.customer_metadata["mlflow_run_id"] == run.info.run_id
    assert tags["model_version"] == str(version.version) and tags["model_package_arn"] == version.arn

    plot = account.layout.execution(execution.pipeline, execution.id) / "summary.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out = cli(capsys, *[a for o in overrides for a in ("--set", o)], "runs", "--local", "--root",
                    str(folder / "local"))
    assert code == 0, out
    assert execution.id in out.replace("\n", "")  # the table may fold long cells
    code, out = cli(capsys, *[a for o in overrides for a in ("--set", o)], "runs", "--local", "--json", "--root",
                    str(folder / "local"))
    assert code == 0, out
    (listed,) = json.loads(out)
    assert listed["run_id"] == run.info.run_id and listed["execution"] == execution.id
    assert listed["tags"]["model_version"] == str(version.version)


def test_gate_else_branch_fails_with_the_message_and_registers_nothing(setup):
    folder, overrides, account = setup
    execution = account.run({"AccuracyThreshold": "1.0"})
    assert execution.status == "Failed"
    steps = execution.steps
    assert steps["Tokenize"].cached and steps["Train"].cached and steps["Evaluate"].cached
    assert steps["RegisterModel"].status == "Skipped" and steps["Deploy"].status == "Skipped"
    assert steps["AccuracyTooLow"].status == "Failed"
    assert steps["AccuracyTooLow"].reason.startswith("Accuracy ")
    assert steps["AccuracyTooLow"].reason.endswith("is below the threshold 1.0 - the model was not registered.")
    assert len(account.registry.list("trainium-bert")) == 1
    (version,) = account.registry.list("trainium-bert")
    assert steps["AccuracyTooLow"].reason == (  # the whole-split accuracy, as registered by the first run
        f"Accuracy {version.accuracy} is below the threshold 1.0 - the model was not registered."
    )


def broken_copy(model_data: Path, folder: Path) -> Path:
    """The artifact with a handler whose predict_fn raises: it loads, and answers every request with an error."""
    with tarfile.open(model_data) as archive:
        archive.extractall(folder, filter="data")
    with (folder / "code" / "inference.py").open("a") as handler:
        handler.write("\n\ndef predict_fn(data, model):\n    raise RuntimeError('a broken model')\n")
    target = folder.parent / f"{folder.name}.tar.gz"
    with tarfile.open(target, "w:gz") as archive:
        for path in sorted(folder.iterdir()):
            archive.add(path, arcname=path.name)
    return target


def test_lifecycle_commands_on_the_run_s_artifact(setup, capsys):
    folder, overrides, account = setup
    sets = [arg for o in overrides for arg in ("--set", o)]
    local = ["--local", "--root", str(folder / "local")]
    first = account.registry.get("trainium-bert", 1)
    same = {"metrics": first.metrics_source, "environment": first.environment,  # the run's label set: compared
            "customer_metadata": {"label_digest": first.customer_metadata["label_digest"]}}
    copy = account.registry.register("trainium-bert", first.model_data, approval_status="PendingManualApproval", **same)
    code, out = cli(capsys, *sets, "models", "approve", str(copy.version), *local)
    assert code == 0 and f"production trainium-bert: version {copy.version} updated" in out, out
    assert f"version {copy.version} scores accuracy +0.0000 against production version 1 on the same 10 rows" in out
    broken = broken_copy(Path(first.model_data), folder / "broken")
    bad = account.registry.register("trainium-bert", broken, approval_status="PendingManualApproval", **same)
    code, out = cli(capsys, *sets, "models", "approve", str(bad.version), *local)
    assert code == 0 and f"staging test of version {bad.version} on trainium-bert-staging: FAIL" in out, out
    assert "a broken model" in out and "promoted" not in out
    code, out = cli(capsys, *sets, "promote", str(bad.version), *local)
    assert code == 1 and f"version {bad.version} has not passed its staging test: it failed" in out
    assert account.services.endpoint("production").version == copy.version  # never reached production
    code, out = cli(capsys, *sets, "models", "reject", str(copy.version), *local)
    assert code == 0 and f"version {copy.version} is no longer Approved: back to version 1" in out, out
    assert account.services.endpoint("production").version == 1
    code, out = cli(capsys, *sets, "endpoints", *local)
    assert code == 0 and "there is no scaling locally" in out
    assert [(v.stage, v.version) for v in account.endpoints()] == [("staging", bad.version), ("production", 1)]
