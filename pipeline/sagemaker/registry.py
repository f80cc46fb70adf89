"""The SageMaker Model Registry from the terminal: list, describe, approve and reject versions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pipeline.sagemaker.aws import Aws, AwsError, explained
from steps.contract import APPROVAL_STATUSES


def _accuracy(metadata: dict[str, str] | None) -> float | str | None:
    raw = (metadata or {}).get("accuracy")
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        return raw


MAX_NOTE = 1024  # UpdateModelPackage.ApprovalDescription


def _check_status(status: str) -> None:
    if status not in APPROVAL_STATUSES:
        raise ValueError(f"status {status!r}: expected one of {', '.join(APPROVAL_STATUSES)}")


def _summaries(aws: Aws, group: str, status: str | None = None) -> list[dict]:
    request: dict[str, Any] = {"ModelPackageGroupName": group, "SortBy": "CreationTime", "SortOrder": "Descending"}
    if status:
        request["ModelApprovalStatus"] = status
    with explained(f"list versions of model package group {group}"):
        pages = aws.sagemaker.get_paginator("list_model_packages").paginate(**request)
        found = [s for page in pages for s in page["ModelPackageSummaryList"]]
    return sorted(found, key=lambda s: (int(s.get("ModelPackageVersion", 0)), s.get("CreationTime")), reverse=True)


def _row(package: dict) -> dict:
    created = package.get("CreationTime")
    return {
        "version": int(package.get("ModelPackageVersion", 0)),
        "status": package.get("ModelApprovalStatus", ""),
        "accuracy": _accuracy(package.get("CustomerMetadataProperties")),
        "created": created.isoformat() if isinstance(created, datetime) else (created or ""),
        "arn": package.get("ModelPackageArn", ""),
    }


def list_versions(aws: Aws, group: str, status: str | None = None) -> list[dict]:
    """Versions of `group`, newest first: version, status, accuracy (None if not recorded), created, arn."""
    if status:
        _check_status(status)
    rows = []
    for summary in _summaries(aws, group, status):
        with explained(f"describe model package {summary['ModelPackageArn']}"):
            package = aws.sagemaker.describe_model_package(ModelPackageName=summary["ModelPackageArn"])
        rows.append(_row(package))
    return rows


def _arn(aws: Aws, group: str, version: int | str) -> str:
    for summary in _summaries(aws, group):
        if str(summary.get("ModelPackageVersion")) == str(version):
            return summary["ModelPackageArn"]
    raise AwsError(f"model package group {group} has no version {version} (see: trainium-pipeline models list)")


def describe(aws: Aws, group: str, version: int | str) -> dict:
    """One version in detail: the list row plus description, approval note, metadata, image, model data."""
    arn = _arn(aws, group, version)
    with explained(f"describe model package {arn}"):
        package = aws.sagemaker.describe_model_package(ModelPackageName=arn)
    containers = package.get("InferenceSpecification", {}).get("Containers", [{}])
    metrics = package.get("ModelMetrics", {}).get("ModelQuality", {}).get("Statistics", {})
    return {
        **_row(package),
        "group": package.get("ModelPackageGroupName", group),
        "description": package.get("ModelPackageDescription", ""),
        "approval_description": package.get("ApprovalDescription", ""),
        "metadata": dict(package.get("CustomerMetadataProperties") or {}),
        "image": containers[0].get("Image", "") if containers else "",
        "model_data": containers[0].get("ModelDataUrl", "") if containers else "",
        "metrics_s3_uri": metrics.get("S3Uri", ""),
        "package_status": package.get("ModelPackageStatus", ""),
    }


def set_status(aws: Aws, group: str, version: int | str, status: str, note: str = "") -> dict:
    """Approve, reject or reset a version (approving one fires the deploy rule, if triggers are applied)."""
    _check_status(status)
    if note and len(note) > MAX_NOTE:
        raise ValueError(f"--note: {len(note)} characters; expected at most {MAX_NOTE} (UpdateModelPackage's "
                         "ApprovalDescription)")
    arn = _arn(aws, group, version)
    with explained(f"describe model package {arn}"):
        package = aws.sagemaker.describe_model_package(ModelPackageName=arn)
    request: dict[str, Any] = {"ModelPackageArn": arn, "ModelApprovalStatus": status}
    if note:
        request["ApprovalDescription"] = note
    if package.get("CustomerMetadataProperties"):
        # Unchanged values: a no-op on SageMaker, and moto otherwise drops the metadata on update.
        request["CustomerMetadataProperties"] = package["CustomerMetadataProperties"]
    with explained(f"set model package {group} version {version} to {status}"):
        aws.sagemaker.update_model_package(**request)
    return describe(aws, group, version)
