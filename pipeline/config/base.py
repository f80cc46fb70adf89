"""What every config section shares: the strict base class and the patterns of common values."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

EXPECTED: dict[str, str] = {}  # pattern -> what a config error says a value must look like


def pattern(regex: str, expected: str) -> str:
    """`regex`, for a Field's pattern, with the words a config error uses for it instead of the regex."""
    EXPECTED[regex] = expected
    return regex


INSTANCE_TYPE = pattern(r"^ml\.[a-z0-9]+\.[a-z0-9]+$", "an instance type like ml.trn1.32xlarge")
ROLE_ARN = pattern(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+$",
                   "an IAM role ARN like arn:aws:iam::123456789012:role/Name")
# a managed MLflow tracking server in a partition sagemaker-mlflow serves (aws, aws-us-gov); not an MLflow App,
# whose host and signing differ
MLFLOW_ARN = pattern(r"^arn:aws(-us-gov)?:sagemaker:[a-z0-9-]+:\d{12}:mlflow-tracking-server/[\w.-]+$",
                     "a SageMaker MLflow tracking server ARN like arn:aws:sagemaker:us-east-1:123456789012:"
                     "mlflow-tracking-server/name (an MLflow App's ARN is not one: another host and signing)")
S3_URI = pattern(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", "an S3 URI like s3://bucket/prefix")
ENDPOINT_NAME_LENGTH = 63  # SageMaker's EndpointName: at most 63 characters of this pattern
ENDPOINT_NAME = pattern(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$",
                        "letters, digits and hyphens, starting and ending with a letter or digit")


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, types are not coerced loosely."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
