"""The one home of the names and layouts that the pipeline, its step scripts and its readers agree on.

Every bundle of `steps` ships this module, so the steps and the deploy Lambda import it as `pipeline/` does.
training/ runs from its own bundle and keeps copies of what it needs; tests/test_contract.py checks those.
"""

from __future__ import annotations

import re

# Steps of the DAG
TOKENIZE, TRAIN, EVALUATE = "Tokenize", "Train", "Evaluate"
ACCURACY_GATE, REGISTER, APPROVED_GATE, DEPLOY, ACCURACY_TOO_LOW = (
    "AccuracyGate",
    "RegisterModel",
    "ApprovedGate",
    "Deploy",
    "AccuracyTooLow",
)
JOB_STEP_TYPES = ("Processing", "Training")

# Pipeline parameters (per execution), in the order the definition declares them
INPUT_DATA = "InputData"
TRAIN_INSTANCE_TYPE = "TrainInstanceType"
TRAIN_INSTANCE_COUNT = "TrainInstanceCount"
EPOCHS = "Epochs"
LEARNING_RATE = "LearningRate"
BATCH_SIZE = "BatchSize"
MAX_LENGTH = "MaxLength"
ACCURACY_THRESHOLD = "AccuracyThreshold"
MODEL_APPROVAL_STATUS = "ModelApprovalStatus"

# Tokenize's sources (data.source, the InputData parameter, --source), told apart by their spelling alone, so that a
# definition is the same on every machine: a Hub id is NAME or OWNER/NAME; a local folder is a path that cannot be
# one (/..., ./..., ../..., ~/..., or two / or more); a model id (training.model_id) follows the same rule
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def source_kind(source: str) -> str:
    """sample | s3 | hub | folder: what a data source (or a model id) names."""
    if source == "sample" or source.startswith("sample:"):
        return "sample"
    if source.startswith("s3://"):
        return "s3"
    return "hub" if HUB_ID.fullmatch(source) and ".." not in source else "folder"


class StepError(Exception):
    """A step's input or arguments are missing, unreadable or inconsistent: reported as one clear line, exit 1."""


def sample_spec(source: str) -> tuple[int | None, int]:
    """(rows or None for the default, classes) of a sample source: sample, sample:N or sample:N:K; ValueError saying
    what is expected."""
    parts = source.split(":")[1:]
    if len(parts) > 2 or not all(part.isdigit() for part in parts) or parts and int(parts[0]) < 1 or (
            len(parts) == 2 and int(parts[1]) < 2):
        raise ValueError("expected sample, sample:N or sample:N:K with N >= 1 train rows and K >= 2 classes")
    return (int(parts[0]) if parts else None), (int(parts[1]) if len(parts) == 2 else 2)


# Tokenize's outputs: the splits and its statistics
SPLITS = ("train", "validation", "test")
STATS_OUTPUT = "stats"
TOKENIZE_OUTPUTS = (*SPLITS, STATS_OUTPUT)
TEXT_COLUMNS = ("title", "content")  # the test split keeps each row's original text beside its tokens
LABELS_KEY = "labels"  # schema metadata of every tokenized shard: the label names in id order (JSON), read by train.py

# The processing container's file system
PROCESSING = "/opt/ml/processing"
CODE_DIR = f"{PROCESSING}/input/code"
DATA_DIR = f"{PROCESSING}/input/data"
OUTPUT_DIR = f"{PROCESSING}/output"
MODEL_DIR = f"{PROCESSING}/model"
TEST_DIR = f"{PROCESSING}/test"
TRAIN_DIR = f"{PROCESSING}/train"  # Evaluate's copy of the train split: the baseline's
EVALUATION_DIR = f"{PROCESSING}/evaluation"
ENTRY_POINT = "steps/run.py"  # run.py STEP (tokenize, evaluation): the entry point of both processing steps
CHECKPOINT_DIR = "/opt/ml/checkpoints"

# Evaluate's report, which the gate and the registry read
EVALUATION_OUTPUT = "evaluation"
REPORT_FILE = "evaluation.json"
PROPERTY_FILE = "EvaluationReport"
SAMPLE_FILE = "endpoint_sample.jsonl"  # beside the report: labelled test rows as text, for the endpoint test
ACCURACY_PATH = "classification.accuracy.value"  # any number of classes
BINARY_ACCURACY_PATH = "binary_classification_metrics.accuracy.value"  # where a report of an earlier Evaluate has it
GATE_METRICS = {"accuracy": ACCURACY_PATH, "macro_f1": "classification.macro_f1.value"}  # evaluation.gate_metric
BASELINE_MARGIN_PATH = "baseline.margin"  # the gate metric's lead over the TF-IDF baseline (evaluation.beat_baseline)
LABEL_COUNT_PATH = "labels.count"  # the model's classes: how many, and a digest of their names (the registry's
LABEL_DIGEST_PATH = "labels.digest"  # metadata holds both; the names live in the artifact's config.json)
QUANTIZE_PATH = "inference.quantize"
GPU_PRECISION_PATH = "inference.gpu.precision"  # fp16 or fp32: what a GPU endpoint serves
RUNTIME_PATH = "inference.runtime"
# Evaluate's serving artifact (the trained model plus the endpoint's chosen variant): what the registry registers
SERVING_OUTPUT = "serving"
SERVING_DIR = f"{PROCESSING}/serving"


def report_accuracy(report: dict | None) -> float | None:
    """The accuracy an evaluation report holds at ACCURACY_PATH (what the gate reads; an earlier report's at
    BINARY_ACCURACY_PATH), None where it has none."""
    for path in (ACCURACY_PATH, BINARY_ACCURACY_PATH):
        value = report
        for key in path.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None

# The training job: log lines -> metrics, files it writes, and where SageMaker puts them
METRIC_DEFINITIONS = (
    {"name": "train:loss", "regex": r"step=\d+ .*loss=([0-9.eE+-]+)"},
    {"name": "train:samples_per_sec", "regex": r"samples_per_sec=([0-9.eE+-]+)"},
    {"name": "train:learning_rate", "regex": r" lr=([0-9.eE+-]+)"},
    {"name": "validation:accuracy", "regex": r"val_accuracy=([0-9.eE+-]+)"},
    {"name": "test:accuracy", "regex": r"test_accuracy=([0-9.eE+-]+)"},
)
STATS_FILE = "training_stats.json"
STATS_METRICS = {  # training_stats.json key -> the final metric that stands in for it
    "samples_per_sec": "train:samples_per_sec",
    "train_loss": "train:loss",
    "val_accuracy": "validation:accuracy",
    "test_accuracy": "test:accuracy",
}
PREDICTIONS_FILE = "predictions/test.parquet"  # in the model artifact: the Train step's test predictions
MODEL_ARCHIVE, OUTPUT_ARCHIVE = "model.tar.gz", "output.tar.gz"


def job_output(s3_output_path: str, job_name: str, archive: str) -> str:
    """Where SageMaker puts a training job's model.tar.gz or output.tar.gz."""
    return f"{s3_output_path.rstrip('/')}/{job_name}/output/{archive}"


# Experiment tracking (steps/tracking.py, shipped in every bundle: it holds these values itself): where the server and
# the experiment are (a file that `upsert` writes, in Train's channel and Evaluate's input named "tracking": its S3
# key is fixed, so that turning tracking on or renaming the experiment changes no cache key; the environment wins,
# which is how the local runner points the steps at its own store), the tag that finds an execution's run, and where
# the report names it (a registered version's metadata value)
TRACKING_INPUT = "tracking"
TRACKING_FILE = "tracking.json"
TRACKING_DIR = f"{PROCESSING}/input/tracking"  # Evaluate's copy of the file's folder (Train's: $SM_CHANNEL_TRACKING)
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
EXECUTION_ENV = "PIPELINE_EXECUTION_ID"
EXECUTION_TAG = "pipeline.execution_id"
RUN_ID_PATH = "tracking.run_id"
RUN_ID_METADATA = "mlflow_run_id"
UNTRACKED = "none"  # the report's run id when nothing was tracked (metadata values cannot be empty)

# The Model Registry
PENDING, APPROVED, REJECTED = "PendingManualApproval", "Approved", "Rejected"
APPROVAL_STATUSES = (APPROVED, PENDING, REJECTED)
MODEL_PACKAGE_EVENT = "SageMaker Model Package State Change"
# The deploy Lambda's timeout (upsert sets it): no invocation runs longer, so an event's claim that old and not
# finished belongs to an invocation Lambda killed, and its retry takes the claim over
DEPLOY_LAMBDA_TIMEOUT_S = 900

# The endpoint
MAX_PAYLOAD_BYTES = 6 * 1024 * 1024  # SageMaker real-time inference's request limit
VARIANT_ATTRIBUTE = "inference-variant"  # in an answer's CustomAttributes: the variant that served it
CONTENT_TYPES = ("application/json", "text/csv", "text/plain")
RESPONSE_TYPES = ("application/json", "application/jsonlines")
