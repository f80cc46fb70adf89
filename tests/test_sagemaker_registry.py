"""The Model Registry commands' layer (pipeline/sagemaker/registry.py) against moto, in-process."""

from __future__ import annotations

import pytest

from pipeline.sagemaker import registry
from pipeline.sagemaker.aws import AwsError

REGION = "us-east-1"
GROUP = "trainium-bert"
SPEC = {
    "Containers": [{"Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/hf:cpu", "ModelDataUrl": "s3://b/m.tar.gz"}],
    "SupportedContentTypes": ["application/json"],
    "SupportedResponseMIMETypes": ["application/json"],
}


@pytest.fixture
def aws(moto_session):
    mock, aws = moto_session
    mock.reset()
    sm = aws.sagemaker
    sm.create_model_package_group(ModelPackageGroupName=GROUP)
    sm.create_model_package_group(ModelPackageGroupName="other-group")
    for accuracy in ("0.88", "0.91", None):
        sm.create_model_package(
            ModelPackageGroupName=GROUP,
            InferenceSpecification=SPEC,
            ModelApprovalStatus="PendingManualApproval",
            ModelPackageDescription="BERT sentiment",
            **({"CustomerMetadataProperties": {"accuracy": accuracy}} if accuracy else {}),
        )
    sm.create_model_package(ModelPackageGroupName="other-group", InferenceSpecification=SPEC)
    return aws


def test_list_is_newest_first_with_accuracy(aws):
    rows = registry.list_versions(aws, GROUP)
    assert [r["version"] for r in rows] == [3, 2, 1]
    assert [r["accuracy"] for r in rows] == [None, 0.91, 0.88]
    assert {r["status"] for r in rows} == {"PendingManualApproval"}
    assert all(r["created"] and r["arn"].endswith(f"/{GROUP}/{r['version']}") for r in rows)


def test_list_is_paginated(aws):
    """ListModelPackages answers at most 100 summaries a page (moto too): a group of 105 versions is listed whole,
    newest first, with the other group's version left out."""
    for _ in range(102):
        aws.sagemaker.create_model_package(ModelPackageGroupName=GROUP, InferenceSpecification=SPEC)
    first_page = aws.sagemaker.list_model_packages(ModelPackageGroupName=GROUP)
    assert len(first_page["ModelPackageSummaryList"]) == 100 and first_page.get("NextToken")
    rows = registry.list_versions(aws, GROUP)
    assert [r["version"] for r in rows] == list(range(105, 0, -1))


def test_approve_and_reject_change_status_and_keep_metadata(aws):
    approved = registry.set_status(aws, GROUP, 2, "Approved", note="looks good")
    assert approved["status"] == "Approved" and approved["approval_description"] == "looks good"
    assert approved["accuracy"] == 0.91
    rejected = registry.set_status(aws, GROUP, "1", "Rejected")
    assert rejected["status"] == "Rejected"
    rows = {r["version"]: r for r in registry.list_versions(aws, GROUP)}
    assert (rows[1]["status"], rows[2]["status"], rows[3]["status"]) == (
        "Rejected",
        "Approved",
        "PendingManualApproval",
    )
    assert rows[2]["accuracy"] == 0.91


def test_list_filters_by_status(aws):
    registry.set_status(aws, GROUP, 1, "Approved")
    registry.set_status(aws, GROUP, 3, "Approved")
    assert [r["version"] for r in registry.list_versions(aws, GROUP, status="Approved")] == [3, 1]
    assert [r["version"] for r in registry.list_versions(aws, GROUP, status="PendingManualApproval")] == [2]
    assert registry.list_versions(aws, GROUP, status="Rejected") == []
    with pytest.raises(ValueError, match="expected one of"):
        registry.list_versions(aws, GROUP, status="Maybe")


def test_describe(aws):
    info = registry.describe(aws, GROUP, 2)
    assert info["version"] == 2 and info["group"] == GROUP
    assert info["description"] == "BERT sentiment"
    assert info["model_data"] == "s3://b/m.tar.gz" and info["image"].endswith("hf:cpu")
    assert info["metadata"] == {"accuracy": "0.91"}


def test_unknown_version_and_group_are_one_line_errors(aws):
    with pytest.raises(AwsError, match="has no version 9"):
        registry.describe(aws, GROUP, 9)
    with pytest.raises(AwsError, match="has no version 1"):
        registry.set_status(aws, "missing-group", 1, "Approved")
    with pytest.raises(ValueError, match="expected one of"):
        registry.set_status(aws, GROUP, 1, "approved")


def test_aws_errors_are_explained(aws, monkeypatch):
    from botocore.exceptions import ClientError

    def denied(**kwargs):
        raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}}, "DescribeModelPackage")

    monkeypatch.setattr(aws.sagemaker, "describe_model_package", denied)
    with pytest.raises(AwsError, match="describe model package .*AccessDeniedException.*lack this permission"):
        registry.list_versions(aws, GROUP)


def test_clients_retry_adaptively_unless_the_environment_says_how(monkeypatch):
    from pipeline.sagemaker.aws import Aws

    for var in ("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"):
        monkeypatch.delenv(var, raising=False)
    assert Aws(REGION).client("s3").meta.config.retries == {"mode": "adaptive", "total_max_attempts": 9}  # 8 retries
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own settings win: one attempt, no backoff
    assert Aws(REGION).client("s3").meta.config.retries["total_max_attempts"] == 1
