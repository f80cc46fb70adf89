"""The local model registry: versions per group, status filters, approval, describe shape, two writers at once."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest

from pipeline.local.registry import ModelNotFoundError, Registry
from steps.contract import APPROVED, PENDING, REJECTED

ROOT = Path(__file__).resolve().parents[1]
EVALUATION = {  # evaluation.json's shape: the accuracy where the gate reads it (contract.ACCURACY_PATH)
    "binary_classification_metrics": {"accuracy": {"value": 0.91, "standard_deviation": "NaN"}, "f1": {"value": 0.9}}
}


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "registry" / "models.db")


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    path = tmp_path / "model.tar.gz"
    path.write_bytes(b"not really a tarball")
    return path


def test_versions_are_numbered_per_group(registry: Registry, artifact: Path):
    registry.create_group("bert", description="sentiment")
    registry.create_group("bert")  # idempotent
    first = registry.register("bert", artifact, approval_status=PENDING)
    second = registry.register("bert", artifact, approval_status=APPROVED)
    other = registry.register("other", artifact, approval_status=PENDING)  # group created on demand
    assert (first.version, second.version, other.version) == (1, 2, 1)
    assert first.arn == "arn:aws:sagemaker:local:000000000000:model-package/bert/1"
    assert first.model_data == str(artifact.resolve())
    assert registry.get("bert", 2) == second
    assert [g["name"] for g in registry.groups()] == ["bert", "other"]
    assert registry.groups()[0]["description"] == "sentiment"
    with pytest.raises(ModelNotFoundError):
        registry.get("bert", 3)
    assert Registry(registry.path).get("bert", 1) == first  # persisted in the file


def test_list_filters_by_status_and_sorts(registry: Registry, artifact: Path):
    for status in (PENDING, APPROVED, REJECTED, APPROVED):
        registry.register("bert", artifact, approval_status=status)
    assert [v.version for v in registry.list("bert")] == [4, 3, 2, 1]
    assert [v.version for v in registry.list("bert", sort="asc")] == [1, 2, 3, 4]
    assert [v.version for v in registry.list("bert", status=APPROVED)] == [4, 2]
    assert [v.version for v in registry.list("bert", status=REJECTED, sort="asc")] == [3]
    assert registry.list("nothing") == []
    assert registry.latest_approved("bert").version == 4
    assert registry.latest_approved("nothing") is None
    with pytest.raises(ValueError, match="sort"):
        registry.list("bert", sort="sideways")


def test_approve_and_reject_change_status_time_and_note(registry: Registry, artifact: Path):
    created = registry.register("bert", artifact, approval_status=PENDING)
    assert registry.latest_approved("bert") is None
    approved = registry.set_status("bert", 1, APPROVED, note="looks good")
    assert (approved.approval_status, approved.approval_note) == (APPROVED, "looks good")
    assert approved.created == created.created
    assert approved.modified > created.modified
    assert registry.latest_approved("bert") == approved
    rejected = registry.reject("bert", 1, note="regressed")
    assert (rejected.status, rejected.note) == (REJECTED, "regressed")
    assert rejected.modified > approved.modified
    assert registry.latest_approved("bert") is None
    with pytest.raises(ModelNotFoundError):
        registry.approve("bert", 7)


def test_invalid_status_is_rejected(registry: Registry, artifact: Path):
    with pytest.raises(ValueError, match="invalid approval status 'approved'.*PendingManualApproval"):
        registry.register("bert", artifact, approval_status="approved")
    registry.register("bert", artifact, approval_status=PENDING)
    with pytest.raises(ValueError, match="invalid approval status"):
        registry.set_status("bert", 1, "Maybe")
    with pytest.raises(ValueError, match="invalid approval status"):
        registry.list("bert", status="Accepted")
    assert registry.get("bert", 1).approval_status == PENDING


def test_describe_has_the_shape_of_describe_model_package(registry: Registry, artifact: Path, tmp_path: Path):
    evaluation = tmp_path / "evaluation.json"
    evaluation.write_text(json.dumps(EVALUATION))
    version = registry.register(
        "bert", artifact, approval_status=PENDING, metrics=evaluation, customer_metadata={"epochs": 3},
        image="huggingface-pytorch-inference:cpu", content_types=["application/json", "text/csv"],
        response_types=["application/jsonlines"], inference_instances=["ml.m5.large"], description="first",
        environment={"INFERENCE_QUANTIZE": "int8"},
    )
    assert version.accuracy == 0.91
    assert version.metrics == EVALUATION
    answer = registry.set_status("bert", 1, APPROVED, note="ok").describe()
    assert answer["ModelPackageGroupName"] == "bert"
    assert answer["ModelPackageVersion"] == 1
    assert answer["ModelPackageArn"].endswith(":model-package/bert/1")
    assert answer["ModelApprovalStatus"] == APPROVED
    assert answer["ApprovalDescription"] == "ok"
    assert answer["ModelPackageDescription"] == "first"
    assert isinstance(answer["CreationTime"], datetime) and answer["CreationTime"].tzinfo is not None
    assert answer["LastModifiedTime"] >= answer["CreationTime"]
    assert answer["InferenceSpecification"]["Containers"] == [
        {"Image": "huggingface-pytorch-inference:cpu", "ModelDataUrl": str(artifact.resolve()),
         "Environment": {"INFERENCE_QUANTIZE": "int8"}}]
    assert answer["InferenceSpecification"]["SupportedContentTypes"] == ["application/json", "text/csv"]
    assert answer["InferenceSpecification"]["SupportedResponseMIMETypes"] == ["application/jsonlines"]
    assert answer["InferenceSpecification"]["SupportedRealtimeInferenceInstanceTypes"] == ["ml.m5.large"]
    assert answer["CustomerMetadataProperties"] == {"epochs": "3"}
    assert answer["ModelMetrics"]["ModelQuality"]["Statistics"]["S3Uri"] == str(evaluation.resolve())
    assert json.loads(json.dumps(answer, default=str))  # printable like a boto3 answer

    bare = registry.register("bert", "s3://bucket/model.tar.gz", approval_status=PENDING)
    assert bare.model_data == "s3://bucket/model.tar.gz"
    assert bare.accuracy is None and "ModelMetrics" not in bare.describe() and bare.environment == {}
    other = registry.register("bert", artifact, approval_status=PENDING, metrics={"accuracy": 0.5})
    assert other.accuracy is None  # not an evaluation report: no accuracy is guessed from another shape


def test_two_processes_register_at_once(registry: Registry, artifact: Path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from pipeline.local.registry import Registry
        registry = Registry({str(registry.path)!r})
        for _ in range(15):
            registry.register("bert", {str(artifact)!r}, approval_status="PendingManualApproval")
            registry.list("bert")
    """)
    writers = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(2)]
    for _ in range(10):
        registry.register("bert", artifact, approval_status=APPROVED)
    assert [writer.wait(timeout=60) for writer in writers] == [0, 0]
    assert [v.version for v in registry.list("bert", sort="asc")] == list(range(1, 41))
    assert len(registry.list("bert", status=APPROVED)) == 10


def test_a_registry_made_before_environments_and_response_types_gains_the_columns(tmp_path: Path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    Registry(path).register("bert", "s3://b/m.tar.gz", approval_status=PENDING)
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE model_packages DROP COLUMN environment")
        db.execute("ALTER TABLE model_packages DROP COLUMN response_types")
    reopened = Registry(path)
    assert reopened.get("bert", 1).environment == {} and reopened.get("bert", 1).response_types == ()
    again = reopened.register("bert", "s3://b/m.tar.gz", approval_status=PENDING, environment={"A": "1"},
                              response_types=["application/json"])
    assert again.environment == {"A": "1"} and again.response_types == ("application/json",)


@pytest.mark.parametrize(("metadata", "message"), [
    ({f"k{i}": "v" for i in range(51)}, "entries, at most 50"),
    ({"source": "x" * 257}, "must have 1 to 256 characters"),
    ({"source": ""}, "must have 1 to 256 characters"),
    ({"k" * 129: "v"}, "must have 1 to 128 characters"),
    ({"path": "~/data#1"}, "characters of letters, digits, spaces and _"),
])
def test_customer_metadata_keeps_to_what_create_model_package_takes(registry: Registry, artifact: Path, metadata,
                                                                     message):
    """CreateModelPackage refuses these (botocore's CustomerMetadataMap): a local run must not pass them."""
    with pytest.raises(ValueError, match=message):
        registry.register("g", artifact, approval_status=PENDING, customer_metadata=metadata)
    version = registry.register("g", artifact, approval_status=PENDING, customer_metadata={"a": "1"})
    with pytest.raises(ValueError, match=message):
        registry.update_metadata("g", version.version, metadata)  # UpdateModelPackage: the merged map
    assert registry.get("g", version.version).customer_metadata == {"a": "1"}
