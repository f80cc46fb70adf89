"""`run --local` on a user's own labelled CSV files (docs/own-data.md): columns and labels of their own naming, the
label names found in the train split, carried through Tokenize, Train, Evaluate, the registry and the staging test
to the endpoint's answers.

The texts are the sample generator's reviews (so that the tiny model learns them in 120 steps, as in
test_local_e2e.py), in the columns `subject` / `body`, labelled `complaint` / `praise` in a column `queue`; the
three-class run adds questions (`question`).
"""

from __future__ import annotations

import csv
import json
import socket
import sys
from pathlib import Path

import boto3
import pytest
from fixtures_ml import build_model, build_tokenizer, run_overrides, sample_texts

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.local.backend import LocalBackend
from steps.tokenize import reviews

pytestmark = pytest.mark.slow  # a whole local run

ROOT = Path(__file__).resolve().parent.parent
NAMES = {0: "complaint", 1: "praise"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


QUESTIONS = ("How do I reset the {}?", "Where can I find the manual for the {}?", "Does the {} come with a cable?",
             "Is the {} waterproof?", "Can I return the {} after a month?")
THINGS = ("headphones", "screen", "battery", "charger", "phone case", "speaker", "lamp", "keyboard")


def write_tickets(folder: Path, questions: bool = False) -> Path:
    """train.csv (800 rows) and test.csv (80 rows): queue,subject,body; a few labels in other case and spacing; with
    `questions`, every third row a question instead."""
    for split, rows in (("train", 800), ("test", 80)):
        path = folder / f"{split}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["queue", "subject", "body"])
            for i, (label, title, content) in enumerate(reviews.sample_reviews(split, rows, 42)):
                name = NAMES[label]
                if questions and i % 3 == 2:
                    thing = THINGS[i % len(THINGS)]
                    name, title, content = "question", f"Question on the {thing}", " ".join(
                        q.format(thing) for q in QUESTIONS[i % 2::2])
                out.writerow([f" {name.upper()} " if i % 50 == 0 else name, title, content])
    return folder


def test_run_local_on_own_csv_columns_and_label_names(tmp_path):
    """Three classes found in the data (two-class own data differs only in the count: Tokenize's and Evaluate's tests
    hold both; the default two-class run is test_local_e2e.py's), through staging and promotion."""
    model = build_model(tmp_path / "model", build_tokenizer(tmp_path / "tokenizer", sample_texts()),
                        labels=("LABEL_0", "LABEL_1"))  # the base model's own head: the data's classes replace it
    data = write_tickets(tmp_path / "tickets", questions=True)
    names = ["complaint", "praise", "question"]
    overrides = run_overrides(
        model, 800, 120,
        f"local.overrides.data.source={data}",
        "data.text_columns=[subject, body]",
        "data.label_column=queue",
        "data.labels=null",
        "local.overrides.training.learning_rate=0.002",
        f"local.port={free_port()}",
        f"local.staging_port={free_port()}",
        "deploy.test.max_accuracy_drop=0.1",
        "deploy.test.p95_ms=60000",
        "evaluation.sample_size=10",
    )
    account = LocalBackend(load_config(ROOT / "pipeline.yaml", overrides, environ={}, local=True), tmp_path / "local")
    argv = sys.argv
    try:
        sys.argv = ["trainium-pipeline", "--config", str(ROOT / "pipeline.yaml"),
                    *[arg for o in overrides for arg in ("--set", o)],
                    "run", "--local", "--root", str(tmp_path / "local"), "-p", "AccuracyThreshold=0.0"]
        with pytest.raises(SystemExit) as exit_:
            main()
        assert exit_.value.code in (0, None)
        (execution,) = account.records()
        assert execution.status == "Succeeded", {n: r.status for n, r in execution.steps.items()}
        outputs = execution.steps["Tokenize"].properties["ProcessingOutputConfig"]["Outputs"]
        stats = json.loads((account.s3.path(outputs["stats"]["S3Output"]["S3Uri"]) / "stats.json").read_text())
        assert stats["labels"] == names  # found in the train split, sorted
        assert sum(stats["output"]["test"]["labels"].values()) == 80 and set(stats["output"]["test"]["labels"]) == set(
            names)
        assert stats["input"]["train"]["dropped_total"] == 0  # " COMPLAINT " is complaint
        outputs = execution.steps["Evaluate"].properties["ProcessingOutputConfig"]["Outputs"]
        report = json.loads((account.s3.path(outputs["evaluation"]["S3Output"]["S3Uri"]) / "evaluation.json")
                            .read_text())
        assert list(report["classification"]["per_class"]) == names
        assert "multiclass_classification_metrics" in report
        # better than chance (1/3): a die reaches 0.5 of 80 rows with P 0.001
        assert report["classification"]["accuracy"]["value"] >= 0.5, report["classification"]

        (version,) = account.registry.list("trainium-bert")
        metadata = version.customer_metadata
        assert metadata["label_count"] == "3" and metadata["staging_test"] == "pass", metadata

        runtime = boto3.client("sagemaker-runtime", endpoint_url=account.services.endpoint("production").where,
                               region_name="us-east-1")
        response = runtime.invoke_endpoint(
            EndpointName="trainium-bert", ContentType="application/json", Accept="application/json",
            Body=json.dumps({"inputs": ["Terrible. Broke after a week. Waste of money.",
                                        "Great headphones. The sound quality is excellent. Highly recommended.",
                                        {"text": "Question on the lamp", "text_pair": "Is the lamp waterproof?"}]}))
        answers = [p["label"] for p in json.loads(response["Body"].read())]
        assert set(answers) <= set(names)  # the endpoint answers the data's names
    finally:
        sys.argv = argv
        account.stop_endpoint()
