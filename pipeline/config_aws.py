"""The `aws` config section: region, execution role, bucket, key, VPC, tags; and the region's partition, the one
source of the partition in every ARN and policy the project writes."""

from __future__ import annotations

import functools

from pydantic import Field, model_validator

from pipeline.config_base import ROLE_ARN, Section


class Vpc(Section):
    subnets: list[str] = Field(min_length=1)
    security_group_ids: list[str] = Field(min_length=1)
    internet: bool = True  # the subnets reach PyPI and the Hugging Face Hub (through a NAT gateway)


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
    region: str = Field(pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
    role_arn: str = Field(pattern=ROLE_ARN)
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    prefix: str = Field(default="trainium-bert", pattern=r"^[\w.-]+(/[\w.-]+)*$")
    kms_key_id: str | None = None
    vpc: Vpc | None = None
    tags: dict[str, str] = {}

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
