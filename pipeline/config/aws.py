"""The `aws` config section: region, execution role, bucket, key, VPC, tags; and the region's partition, the one
source of the partition in every ARN and policy the project writes."""

from __future__ import annotations

import functools
import unicodedata

from pydantic import Field, field_validator, model_validator

from pipeline.config.base import ROLE_ARN, Section, pattern

# SageMaker's Tag shape (botocore): \p{L}\p{Z}\p{N} and _.:/=+-@, keys 1-128 and values 0-256 characters, 50 tags
# (the registry's customer metadata keys and values take the same characters)
TAG_PUNCTUATION = "_.:/=+-@"
TAG_CHARACTERS = "letters, digits, spaces and _ . : / = + - @"  # the same, as error messages say it
TAG_KEY_LENGTH, TAG_VALUE_LENGTH, MAX_TAGS = 128, 256, 50


def tag_text(text: str, most: int, least: int = 0) -> bool:
    """Whether `text` has `least` to `most` characters, each one SageMaker's tags and metadata may have."""
    return least <= len(text) <= most and all(c in TAG_PUNCTUATION or unicodedata.category(c)[0] in "LZN"
                                              for c in text)


class Vpc(Section):
    subnets: list[str] = Field(min_length=1)
    security_group_ids: list[str] = Field(min_length=1)
    internet: bool = True  # the subnets reach PyPI and the Hugging Face Hub (through a NAT gateway)
    # without internet: the subnets reach SageMaker managed MLflow through its interface VPC endpoint (PrivateLink)
    mlflow_endpoint: bool = False


@functools.cache
def partition_of(region: str) -> str:
    """The AWS partition of `region` (aws, aws-cn, aws-us-gov, ...), from botocore's endpoint data."""
    import botocore.session
    from botocore.exceptions import UnknownRegionError

    try:
        return botocore.session.get_session().get_partition_for_region(region)
    except UnknownRegionError:
        raise ValueError(f"aws.region={region!r}: expected a region of an AWS partition (botocore knows none with "
                         f"this name)") from None


class Aws(Section):
    region: str = Field(pattern=pattern(r"^[a-z]{2}(-gov)?-[a-z]+-\d$", "an AWS region like us-east-1"))
    role_arn: str = Field(pattern=ROLE_ARN)
    bucket: str = Field(pattern=pattern(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$",
                                        "an S3 bucket name: 3 to 63 lowercase letters, digits, dots and hyphens"))
    prefix: str = Field(default="trainium-bert", pattern=pattern(
        r"^[\w.-]+(/[\w.-]+)*$", "a key prefix like team/trainium-bert: letters, digits, _ . - and inner slashes"))
    kms_key_id: str | None = None
    vpc: Vpc | None = None
    tags: dict[str, str] = {}

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: dict[str, str]) -> dict[str, str]:
        """Tags SageMaker takes on every job and resource (else refused at CreatePipeline or at a job's start)."""
        if len(tags) > MAX_TAGS:
            raise ValueError(f"aws.tags: {len(tags)} tags, expected at most {MAX_TAGS}")
        for key, value in tags.items():
            if not tag_text(key, TAG_KEY_LENGTH, least=1):
                raise ValueError(f"aws.tags: key {key!r}: expected 1 to {TAG_KEY_LENGTH} characters of "
                                 f"{TAG_CHARACTERS}")
            if key.lower().startswith("aws:"):
                raise ValueError(f"aws.tags: key {key!r}: expected a key without the prefix aws: (AWS's own)")
            if not tag_text(value, TAG_VALUE_LENGTH):
                raise ValueError(f"aws.tags.{key}={value!r}: expected at most {TAG_VALUE_LENGTH} characters of "
                                 f"{TAG_CHARACTERS}")
        return tags

    @property
    def account(self) -> str:
        """The AWS account id, taken from the execution role ARN."""
        return self.role_arn.split(":")[4]

    @property
    def partition(self) -> str:
        return partition_of(self.region)

    @model_validator(mode="after")
    def _role_in_the_regions_partition(self) -> Aws:
        role_partition = self.role_arn.split(":")[1]
        if role_partition != self.partition:
            raise ValueError(f"aws.role_arn={self.role_arn!r}: expected an ARN of partition {self.partition} "
                             f"(aws.region={self.region}), not {role_partition}")
        return self
