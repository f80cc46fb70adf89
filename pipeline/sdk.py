"""The SageMaker Python SDK v3, made to build a definition with no network call."""

from __future__ import annotations

import logging
import os
import warnings

from pipeline.config import Config


def offline_sdk(region: str) -> None:
    """Environment for an SDK that must not reach AWS while it only builds a definition."""
    os.environ.setdefault("AWS_DEFAULT_REGION", region)
    os.environ["SAGEMAKER_VALIDATE_ROLE"] = "false"
    warnings.filterwarnings("ignore", module=r"sagemaker\..*")
    logging.getLogger("sagemaker.config").setLevel(logging.ERROR)
    import sagemaker.core.telemetry.telemetry_logging as telemetry

    # Telemetry would call sts:GetCallerIdentity and an HTTPS endpoint on every decorated call.
    telemetry._send_telemetry_request = lambda *args, **kwargs: None


def pipeline_session(cfg: Config):
    import boto3
    from sagemaker.core.workflow.pipeline_context import PipelineSession

    session = PipelineSession(boto_session=boto3.Session(region_name=cfg.aws.region), default_bucket=cfg.aws.bucket)
    session._default_bucket = cfg.aws.bucket  # otherwise the SDK lists buckets to check it
    return session
