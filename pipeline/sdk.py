"""The SageMaker Python SDK v3, made to build a definition with no network call, and the parts every step of the
DAG is built from (pipeline.definition assembles the steps)."""

from __future__ import annotations

import functools
import logging
import os
import warnings
from typing import TYPE_CHECKING, Any

from pipeline.code import bundles
from pipeline.config import Config, ProcessingResources
from steps import contract

if TYPE_CHECKING:
    from sagemaker.core.processing import Processor
    from sagemaker.core.shapes import ProcessingInput, ProcessingOutput
    from sagemaker.core.workflow.properties import PropertyFile
    from sagemaker.mlops.workflow.steps import ProcessingStep

MODEL_INPUT = f"{contract.PROCESSING}/input/model"  # a base model staged from S3 (training.model_id s3://...)
WHEELS_INPUT = f"{contract.PROCESSING}/input/wheels"  # wheels staged from S3 (images.wheels), installed by run.py
HUB_OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}  # fail at once instead of waiting on the Hub


def offline_sdk(region: str) -> None:
    """Environment for an SDK that must not reach AWS while it only builds a definition."""
    os.environ.setdefault("AWS_DEFAULT_REGION", region)
    os.environ["SAGEMAKER_VALIDATE_ROLE"] = "false"
    warnings.filterwarnings("ignore", module=r"sagemaker\..*")
    logging.getLogger("sagemaker.config").setLevel(logging.ERROR)
    root, guard = logging.getLogger(), logging.NullHandler()
    root.addHandler(guard)  # this SDK module calls logging.basicConfig(INFO) at import: botocore's INFO lines
    try:  # would print around every command's output
        import sagemaker.core.experiments._metrics  # noqa: F401
    finally:
        root.removeHandler(guard)
    import sagemaker.core.telemetry.telemetry_logging as telemetry

    # Telemetry would call sts:GetCallerIdentity and an HTTPS endpoint on every decorated call.
    telemetry._send_telemetry_request = lambda *args, **kwargs: None


def pipeline_session(cfg: Config):
    return _pipeline_session(cfg.aws.region, cfg.aws.bucket)


@functools.lru_cache(maxsize=8)
def _pipeline_session(region: str, bucket: str):
    """One SDK session per region and bucket for the process: it only builds definitions (it calls no AWS API), and
    a new one costs about 0.6 s (botocore loads its service models again for its clients)."""
    import boto3
    from sagemaker.core.workflow.pipeline_context import PipelineSession

    session = PipelineSession(boto_session=boto3.Session(region_name=region), default_bucket=bucket)
    session._default_bucket = bucket  # otherwise the SDK lists buckets to check it
    return session


class Parameters:
    """The pipeline parameters, each defaulting to its config key (their names are in `contract`)."""

    def __init__(self, cfg: Config) -> None:
        from sagemaker.core.workflow import ParameterFloat, ParameterInteger, ParameterString

        training = cfg.training
        self.input_data = ParameterString(contract.INPUT_DATA, default_value=cfg.data.source)
        self.train_instance_type = ParameterString(contract.TRAIN_INSTANCE_TYPE, default_value=training.instance_type)
        self.train_instance_count = ParameterInteger(
            contract.TRAIN_INSTANCE_COUNT, default_value=training.instance_count
        )
        self.epochs = ParameterInteger(contract.EPOCHS, default_value=training.epochs)
        self.learning_rate = ParameterFloat(contract.LEARNING_RATE, default_value=training.learning_rate_for[0])
        self.batch_size = ParameterInteger(contract.BATCH_SIZE, default_value=training.batch_size)
        self.max_length = ParameterInteger(contract.MAX_LENGTH, default_value=training.max_length)
        self.accuracy_threshold = ParameterFloat(
            contract.ACCURACY_THRESHOLD, default_value=cfg.evaluation.accuracy_threshold
        )
        self.approval_status = ParameterString(
            contract.MODEL_APPROVAL_STATUS, default_value=cfg.registry.approval_status
        )

    def declared(self) -> list:
        """In the order the definition lists them."""
        return [self.input_data, self.train_instance_type, self.train_instance_count, self.epochs, self.learning_rate,
                self.batch_size, self.max_length, self.accuracy_threshold, self.approval_status]


class StepParts:
    """What the steps of the DAG share: the config, the SDK session, the parameters, job settings and S3 layout."""

    def __init__(self, cfg: Config) -> None:
        from sagemaker.core.workflow import ExecutionVariables
        from sagemaker.mlops.workflow.retry import SageMakerJobExceptionTypeEnum, SageMakerJobStepRetryPolicy
        from sagemaker.mlops.workflow.steps import CacheConfig

        self.cfg = cfg
        self.session = pipeline_session(cfg)
        self.parameters = Parameters(cfg)
        self.tags = [{"Key": key, "Value": value} for key, value in sorted(cfg.aws.tags.items())]
        self.cache = CacheConfig(enable_caching=True, expire_after=cfg.pipeline.cache_expire_after)
        retried = [SageMakerJobExceptionTypeEnum.CAPACITY_ERROR, SageMakerJobExceptionTypeEnum.RESOURCE_LIMIT,
                   SageMakerJobExceptionTypeEnum.INTERNAL_ERROR]
        self.retry = [
            SageMakerJobStepRetryPolicy(exception_types=retried, interval_seconds=60, backoff_rate=2.0,
                                        max_attempts=cfg.pipeline.retry_attempts)
        ] if cfg.pipeline.retry_attempts else None
        self.run_prefix = [cfg.s3_root, "executions", ExecutionVariables.PIPELINE_EXECUTION_ID]
        self.staged_model = cfg.training.model_id.startswith("s3://")
        self.hub_offline = HUB_OFFLINE if not (cfg.training.model_from_hub or cfg.data.from_hub) else {}

    def processor(self, step: str, resources: ProcessingResources, image: str,
                  env: dict[str, Any] | None = None) -> Processor:
        from sagemaker.core.network import NetworkConfig
        from sagemaker.core.processing import Processor

        cfg, vpc = self.cfg, self.cfg.aws.vpc
        return Processor(
            role=cfg.aws.role_arn,
            image_uri=image,
            instance_type=resources.instance_type,
            instance_count=resources.instance_count,
            volume_size_in_gb=resources.volume_size_gb,
            volume_kms_key=cfg.aws.kms_key_id,
            output_kms_key=cfg.aws.kms_key_id,
            max_runtime_in_seconds=resources.max_runtime_seconds,
            entrypoint=["python3", f"{contract.CODE_DIR}/{contract.ENTRY_POINT}", step],
            base_job_name=f"{cfg.pipeline.name}-{step}",
            sagemaker_session=self.session,
            env={"PIP_DEFAULT_TIMEOUT": "20", **self.hub_offline, **(env or {})},
            tags=self.tags or None,
            network_config=NetworkConfig(subnets=vpc.subnets, security_group_ids=vpc.security_group_ids)
            if vpc
            else None,
        )

    @staticmethod
    def s3_input(name: str, source: Any, destination: str) -> ProcessingInput:
        from sagemaker.core.shapes import ProcessingInput, ProcessingS3Input

        return ProcessingInput(
            input_name=name,
            s3_input=ProcessingS3Input(
                s3_uri=source, local_path=destination, s3_data_type="S3Prefix", s3_input_mode="File"
            ),
        )

    def s3_output(self, name: str, source: str) -> ProcessingOutput:
        from sagemaker.core.shapes import ProcessingOutput, ProcessingS3Output
        from sagemaker.core.workflow import Join

        return ProcessingOutput(
            output_name=name,
            s3_output=ProcessingS3Output(
                s3_uri=Join(on="/", values=[*self.run_prefix, name]), local_path=source, s3_upload_mode="EndOfJob"
            ),
        )

    def code_inputs(self, step: str) -> list[ProcessingInput]:
        """The step's own code bundle (steps/<step>/ and the package's top-level modules), and the wheels if any."""
        inputs = [self.s3_input("code", bundles()[step].uri(self.cfg.s3_root), contract.CODE_DIR)]
        wheels = self.cfg.images.wheels
        return inputs + ([self.s3_input("wheels", wheels, WHEELS_INPUT)] if wheels else [])

    @staticmethod
    def report_value(evaluate: ProcessingStep, report: PropertyFile, path: str) -> Any:
        """A value of the evaluation report (`contract.ACCURACY_PATH`, ...), read when the execution reaches it."""
        from sagemaker.core.workflow import JsonGet

        return JsonGet(step_name=evaluate.name, property_file=report, json_path=path)

    @staticmethod
    def output(step: ProcessingStep, name: str) -> Any:
        """Where the processing output `name` of `step` is, known when the execution has run the step."""
        return step.properties.ProcessingOutputConfig.Outputs[name].S3Output.S3Uri
