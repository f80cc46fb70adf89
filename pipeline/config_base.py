"""What every config section shares: the strict base class and the patterns of common values."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

INSTANCE_TYPE = r"^ml\.[a-z0-9]+\.[a-z0-9]+$"
ROLE_ARN = r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+$"
# a managed MLflow tracking server in a partition sagemaker-mlflow serves (aws, aws-us-gov); not an MLflow App,
# whose host and signing differ
MLFLOW_ARN = r"^arn:aws(-us-gov)?:sagemaker:[a-z0-9-]+:\d{12}:mlflow-tracking-server/[\w.-]+$"
S3_URI = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$"
ENDPOINT_NAME = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, types are not coerced loosely."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
