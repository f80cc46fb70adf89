"""The one small layer between the CLI and AWS: clients, one-line errors, S3 and pipeline calls.

Every client honours `AWS_ENDPOINT_URL` (boto3 does), so tests point all of it at moto.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError

from pipeline.errors import UserError

MAX_INLINE_DEFINITION = 100 * 1024  # CreatePipeline's limit for PipelineDefinition


class AwsError(UserError, RuntimeError):
    """An expected AWS failure, explained in one line."""


def explain(error: Exception, action: str) -> str:
    """One line: what failed (`action`) and why, in words a user can act on."""
    if isinstance(error, NoCredentialsError):
        return f"{action}: no AWS credentials found (set AWS_PROFILE or AWS_ACCESS_KEY_ID, or run aws configure)"
    if isinstance(error, NoRegionError):
        return f"{action}: no AWS region (set aws.region or TRAINIUM_PIPELINE_REGION)"
    if isinstance(error, ClientError):
        code = error.response.get("Error", {}).get("Code", "Error")
        message = error.response.get("Error", {}).get("Message", "") or str(error)
        hints = {
            "AccessDenied": "the credentials in use lack this permission",
            "AccessDeniedException": "the credentials in use lack this permission",
            "NoSuchBucket": "the bucket does not exist (check aws.bucket)",
            "ThrottlingException": "AWS is throttling requests; retry in a minute",
            "ExpiredToken": "the session token has expired; refresh your credentials",
            "ExpiredTokenException": "the session token has expired; refresh your credentials",
        }
        hint = hints.get(code)
        return f"{action}: {code}: {message}" + (f" ({hint})" if hint else "")
    return f"{action}: {error}"


@contextlib.contextmanager
def explained(action: str) -> Iterator[None]:
    """Turn boto errors raised inside the block into an AwsError with one clear line."""
    try:
        yield
    except (BotoCoreError, ClientError) as e:
        raise AwsError(explain(e, action)) from None


class Aws:
    """boto3 clients for one region, with adaptive retries for throttling (8 retries) unless the environment sets
    botocore's own AWS_RETRY_MODE or AWS_MAX_ATTEMPTS."""

    def __init__(self, region: str) -> None:
        self.session = boto3.Session(region_name=region)
        chosen = {"AWS_RETRY_MODE", "AWS_MAX_ATTEMPTS"} & set(os.environ)
        self._config = BotoConfig(retries=None if chosen else {"mode": "adaptive", "max_attempts": 8})
        self._clients: dict[str, Any] = {}

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = self.session.client(service, config=self._config)
        return self._clients[service]

    @property
    def s3(self) -> Any:
        return self.client("s3")

    @property
    def sagemaker(self) -> Any:
        return self.client("sagemaker")

    # S3
    def object_exists(self, uri: str) -> bool:
        bucket, key = split_s3_uri(uri)
        try:
            self.s3.head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def put_object(self, uri: str, data: bytes, kms_key_id: str | None = None) -> None:
        bucket, key = split_s3_uri(uri)
        extra = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": kms_key_id} if kms_key_id else {}
        self.s3.put_object(Bucket=bucket, Key=key, Body=data, **extra)

    # Pipelines
    def pipeline_definition(self, name: str) -> dict | None:
        """The deployed definition of pipeline `name`, or None if it does not exist."""
        try:
            described = self.sagemaker.describe_pipeline(PipelineName=name)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("ResourceNotFound", "ValidationException"):
                return None
            raise
        return json.loads(described["PipelineDefinition"])

    def latest_execution_arn(self, pipeline: str) -> str | None:
        found = self.sagemaker.list_pipeline_executions(
            PipelineName=pipeline, SortBy="CreationTime", SortOrder="Descending", MaxResults=1
        )["PipelineExecutionSummaries"]
        return found[0]["PipelineExecutionArn"] if found else None

    def execution_steps(self, arn: str) -> list[dict] | None:
        """Steps of an execution, newest first; None where the service cannot list them (moto)."""
        try:
            pages = self.sagemaker.get_paginator("list_pipeline_execution_steps").paginate(
                PipelineExecutionArn=arn, SortOrder="Ascending"
            )
            return [step for page in pages for step in page["PipelineExecutionSteps"]]
        except (ClientError, NotImplementedError) as e:
            if isinstance(e, ClientError) and e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") != 500:
                raise
            return None


def split_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r}: expected an S3 URI like s3://bucket/key")
    bucket, _, key = uri[5:].partition("/")
    return bucket, key
