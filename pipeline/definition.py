"""The pipeline DAG: one function, config in, SageMaker `Pipeline` out.

Tokenize -> Train -> Evaluate -> AccuracyGate -+-> RegisterModel -> ApprovedGate -> Deploy
                                               +-> AccuracyTooLow (Fail)

`definition()` builds it with no network call and gives byte-identical JSON for the same config
and code: step code lives at content-hashed S3 keys (see `pipeline.code`).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from typing import TYPE_CHECKING

from pipeline.code import bundles
from pipeline.config import Config

if TYPE_CHECKING:
    from sagemaker.mlops.workflow.pipeline import Pipeline

PROCESSING = "/opt/ml/processing"
CONTENT_TYPES = ["application/json", "text/csv", "text/plain"]
METRIC_DEFINITIONS = [
    {"name": "train:loss", "regex": r"step=\d+ .*loss=([0-9.eE+-]+)"},
    {"name": "train:samples_per_sec", "regex": r"samples_per_sec=([0-9.eE+-]+)"},
    {"name": "train:learning_rate", "regex": r" lr=([0-9.eE+-]+)"},
    {"name": "validation:accuracy", "regex": r"val_accuracy=([0-9.eE+-]+)"},
    {"name": "test:accuracy", "regex": r"test_accuracy=([0-9.eE+-]+)"},  # when the job has a test channel
]


def _offline_sdk(region: str) -> None:
    """Environment for an SDK that must not reach AWS while it only builds a definition."""
    os.environ.setdefault("AWS_DEFAULT_REGION", region)
    os.environ["SAGEMAKER_VALIDATE_ROLE"] = "false"
    warnings.filterwarnings("ignore", module=r"sagemaker\..*")
    logging.getLogger("sagemaker.config").setLevel(logging.ERROR)
    import sagemaker.core.telemetry.telemetry_logging as telemetry

    # Telemetry would call sts:GetCallerIdentity and an HTTPS endpoint on every decorated call.
    telemetry._send_telemetry_request = lambda *args, **kwargs: None


def _session(cfg: Config):
    import boto3
    from sagemaker.core.workflow.pipeline_context import PipelineSession

    session = PipelineSession(boto_session=boto3.Session(region_name=cfg.aws.region), default_bucket=cfg.aws.bucket)
    session._default_bucket = cfg.aws.bucket  # otherwise the SDK lists buckets to check it
    return session


def build_pipeline(cfg: Config) -> Pipeline:
    """Build the SageMaker Pipelines DAG for `cfg` (no AWS call is made)."""
    _offline_sdk(cfg.aws.region)
    from sagemaker.core.lambda_helper import Lambda
    from sagemaker.core.model_metrics import MetricsSource, ModelMetrics
    from sagemaker.core.network import NetworkConfig
    from sagemaker.core.processing import Processor
    from sagemaker.core.shapes import (
        OutputDataConfig,
        ProcessingInput,
        ProcessingOutput,
        ProcessingS3Input,
        ProcessingS3Output,
        StoppingCondition,
        Tag,
    )
    from sagemaker.core.training.configs import CheckpointConfig, Compute, InputData, Networking
    from sagemaker.core.workflow import (
        ConditionEquals,
        ConditionGreaterThanOrEqualTo,
        ExecutionVariables,
        Join,
        JsonGet,
        ParameterFloat,
        ParameterInteger,
        ParameterString,
    )
    from sagemaker.core.workflow.properties import PropertyFile
    from sagemaker.mlops.workflow.condition_step import ConditionStep
    from sagemaker.mlops.workflow.fail_step import FailStep
    from sagemaker.mlops.workflow.lambda_step import LambdaOutput, LambdaOutputTypeEnum, LambdaStep
    from sagemaker.mlops.workflow.model_step import ModelStep
    from sagemaker.mlops.workflow.pipeline import Pipeline
    from sagemaker.mlops.workflow.retry import (
        SageMakerJobExceptionTypeEnum,
        SageMakerJobStepRetryPolicy,
    )
    from sagemaker.mlops.workflow.steps import CacheConfig, ProcessingStep, TrainingStep
    from sagemaker.serve.model_builder import ModelBuilder
    from sagemaker.train import ModelTrainer

    session = _session(cfg)
    code = bundles()
    steps_code = code["steps"].uri(cfg.s3_root)
    training_code = code["training"].uri(cfg.s3_root)
    tags = [{"Key": k, "Value": v} for k, v in sorted(cfg.aws.tags.items())]
    cache = CacheConfig(enable_caching=True, expire_after=cfg.pipeline.cache_expire_after)
    retry = (
        [
            SageMakerJobStepRetryPolicy(
                exception_types=[
                    SageMakerJobExceptionTypeEnum.CAPACITY_ERROR,
                    SageMakerJobExceptionTypeEnum.RESOURCE_LIMIT,
                    SageMakerJobExceptionTypeEnum.INTERNAL_ERROR,
                ],
                interval_seconds=60,
                backoff_rate=2.0,
                max_attempts=cfg.pipeline.retry_attempts,
            )
        ]
        if cfg.pipeline.retry_attempts
        else None
    )
    run_prefix = [cfg.s3_root, "executions", ExecutionVariables.PIPELINE_EXECUTION_ID]
    vpc = cfg.aws.vpc

    input_data = ParameterString("InputData", default_value=cfg.data.source)
    train_instance_type = ParameterString("TrainInstanceType", default_value=cfg.training.instance_type)
    train_instance_count = ParameterInteger("TrainInstanceCount", default_value=cfg.training.instance_count)
    epochs = ParameterInteger("Epochs", default_value=cfg.training.epochs)
    learning_rate = ParameterFloat("LearningRate", default_value=cfg.training.learning_rate)
    batch_size = ParameterInteger("BatchSize", default_value=cfg.training.batch_size)
    max_length = ParameterInteger("MaxLength", default_value=cfg.training.max_length)
    threshold = ParameterFloat("AccuracyThreshold", default_value=cfg.evaluation.accuracy_threshold)
    approval = ParameterString("ModelApprovalStatus", default_value=cfg.registry.approval_status)
    endpoint_name = ParameterString("EndpointName", default_value=cfg.deploy.endpoint_name)
    parameters = [
        input_data,
        train_instance_type,
        train_instance_count,
        epochs,
        learning_rate,
        batch_size,
        max_length,
        threshold,
        approval,
        endpoint_name,
    ]

    def processor(step: str, resources) -> Processor:
        return Processor(
            role=cfg.aws.role_arn,
            image_uri=cfg.image("processing"),
            instance_type=resources.instance_type,
            instance_count=resources.instance_count,
            volume_size_in_gb=resources.volume_size_gb,
            volume_kms_key=cfg.aws.kms_key_id,
            output_kms_key=cfg.aws.kms_key_id,
            max_runtime_in_seconds=resources.max_runtime_seconds,
            entrypoint=["python3", f"{PROCESSING}/input/code/run.py", step],
            base_job_name=f"{cfg.pipeline.name}-{step}",
            sagemaker_session=session,
            tags=tags or None,
            network_config=NetworkConfig(subnets=vpc.subnets, security_group_ids=vpc.security_group_ids)
            if vpc
            else None,
        )

    def s3_input(name: str, source, destination: str) -> ProcessingInput:
        return ProcessingInput(
            input_name=name,
            s3_input=ProcessingS3Input(
                s3_uri=source, local_path=destination, s3_data_type="S3Prefix", s3_input_mode="File"
            ),
        )

    def s3_output(name: str, source: str) -> ProcessingOutput:
        return ProcessingOutput(
            output_name=name,
            s3_output=ProcessingS3Output(
                s3_uri=Join(on="/", values=[*run_prefix, name]), local_path=source, s3_upload_mode="EndOfJob"
            ),
        )

    # 1. Tokenize: Hub / S3 / sample reviews -> tokenized train, validation and test splits.
    tokenize_inputs = [s3_input("code", steps_code, f"{PROCESSING}/input/code")]
    if cfg.data.is_s3:
        tokenize_inputs.append(s3_input("data", input_data, f"{PROCESSING}/input/data"))
    tokenize_args = [
        "--source",
        input_data,
        "--input-dir",
        f"{PROCESSING}/input/data",
        "--output-dir",
        f"{PROCESSING}/output",
        "--model-id",
        cfg.training.model_id,
        "--max-length",
        max_length.to_string(),
        "--validation-share",
        str(cfg.data.validation_share),
        "--max-bad-share",
        str(cfg.data.max_bad_share),
        "--seed",
        str(cfg.training.seed),
    ]
    if cfg.data.max_rows_per_split:
        tokenize_args += ["--max-rows-per-split", str(cfg.data.max_rows_per_split)]
    tokenize = ProcessingStep(
        name="Tokenize",
        step_args=processor("preprocess", cfg.tokenize).run(
            inputs=tokenize_inputs,
            outputs=[
                s3_output(split, f"{PROCESSING}/output/{split}") for split in ("train", "validation", "test", "stats")
            ],
            arguments=tokenize_args,
        ),
        cache_config=cache,
        retry_policies=retry,
    )

    def tokenized(split: str):
        return tokenize.properties.ProcessingOutputConfig.Outputs[split].S3Output.S3Uri

    # 2. Train: torchrun via the DLC's own launcher, one process per NeuronCore.
    hyperparameters = {
        "model-id": cfg.training.model_id,
        "epochs": epochs.to_string(),
        "max-steps": str(cfg.training.max_steps),
        "batch-size": batch_size.to_string(),
        "grad-accum": str(cfg.training.grad_accum),
        "learning-rate": learning_rate.to_string(),
        "warmup-ratio": str(cfg.training.warmup_ratio),
        "weight-decay": str(cfg.training.weight_decay),
        "max-length": max_length.to_string(),
        "seed": str(cfg.training.seed),
        "log-interval": str(cfg.training.log_interval),
        "checkpoint-interval": str(cfg.training.checkpoint_interval),
        "bf16": str(cfg.training.bf16).lower(),
        "sagemaker_program": json.dumps("train.py"),
        "sagemaker_submit_directory": json.dumps(training_code),
        "sagemaker_torch_distributed_enabled": "true",
        "sagemaker_instance_type": train_instance_type,
        "sagemaker_region": json.dumps(cfg.aws.region),
    }
    trainer = ModelTrainer(
        role=cfg.aws.role_arn,
        training_image=cfg.image("training"),
        base_job_name=f"{cfg.pipeline.name}-train",
        sagemaker_session=session,
        compute=Compute(
            instance_type=train_instance_type,
            instance_count=train_instance_count,
            volume_size_in_gb=cfg.training.volume_size_gb,
            volume_kms_key_id=cfg.aws.kms_key_id,
            enable_managed_spot_training=cfg.training.spot.enabled or None,
        ),
        networking=Networking(subnets=vpc.subnets, security_group_ids=vpc.security_group_ids) if vpc else None,
        stopping_condition=StoppingCondition(
            max_runtime_in_seconds=cfg.training.max_runtime_seconds,
            max_wait_time_in_seconds=cfg.training.spot.max_wait_seconds if cfg.training.spot.enabled else None,
        ),
        input_data_config=[
            InputData(channel_name=split, data_source=tokenized(split)) for split in ("train", "validation", "test")
        ],
        output_data_config=OutputDataConfig(
            s3_output_path=Join(on="/", values=[*run_prefix, "model"]), kms_key_id=cfg.aws.kms_key_id
        ),
        checkpoint_config=CheckpointConfig(
            s3_uri=Join(on="/", values=[cfg.checkpoint_s3_uri, ExecutionVariables.PIPELINE_EXECUTION_ID]),
            local_path="/opt/ml/checkpoints",
        ),
        environment={
            "NEURON_COMPILE_CACHE_URL": cfg.compile_cache_s3_uri,
            "HF_HUB_DISABLE_TELEMETRY": "1",
        },
        hyperparameters=hyperparameters,
        tags=[Tag(key=t["Key"], value=t["Value"]) for t in tags] or None,
    ).with_metric_definitions(METRIC_DEFINITIONS)
    train = TrainingStep(name="Train", step_args=trainer.train(), cache_config=cache, retry_policies=retry)
    model_data = train.properties.ModelArtifacts.S3ModelArtifacts

    # 3. Evaluate: accuracy of the trained model on the test split -> evaluation.json.
    evaluation_report = PropertyFile(name="EvaluationReport", output_name="evaluation", path="evaluation.json")
    evaluate = ProcessingStep(
        name="Evaluate",
        step_args=processor("evaluate", cfg.evaluation).run(
            inputs=[
                s3_input("code", steps_code, f"{PROCESSING}/input/code"),
                s3_input("model", model_data, f"{PROCESSING}/model"),
                s3_input("test", tokenized("test"), f"{PROCESSING}/test"),
            ],
            outputs=[s3_output("evaluation", f"{PROCESSING}/evaluation")],
            arguments=[
                "--model-dir",
                f"{PROCESSING}/model",
                "--test-dir",
                f"{PROCESSING}/test",
                "--output-dir",
                f"{PROCESSING}/evaluation",
                "--sample-size",
                str(cfg.evaluation.sample_size),
                "--min-agreement",
                str(cfg.evaluation.min_agreement),
                "--seed",
                str(cfg.training.seed),
                "--int8" if cfg.evaluation.int8 else "--no-int8",
                "--int8-tolerance",
                str(cfg.evaluation.int8_tolerance),
            ],
        ),
        property_files=[evaluation_report],
        cache_config=cache,
        retry_policies=retry,
    )
    evaluation_uri = Join(
        on="/",
        values=[
            evaluate.properties.ProcessingOutputConfig.Outputs["evaluation"].S3Output.S3Uri,
            "evaluation.json",
        ],
    )
    accuracy = JsonGet(
        step_name=evaluate.name,
        property_file=evaluation_report,
        json_path="binary_classification_metrics.accuracy.value",
    )

    # 5. Register the model; 6. deploy it when the registered version is Approved.
    model = ModelBuilder(
        image_uri=cfg.image("inference"),
        s3_model_data_url=model_data,
        role_arn=cfg.aws.role_arn,
        sagemaker_session=session,
        env_vars={
            "SAGEMAKER_PROGRAM": "inference.py",
            "SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/code",
            "SAGEMAKER_MODEL_SERVER_WORKERS": str(cfg.deploy.model_server_workers),
            "INFERENCE_MAX_TEXTS": str(cfg.deploy.max_texts),
            # fp32 or int8, as the evaluation chose on the test split
            "INFERENCE_QUANTIZE": JsonGet(
                step_name=evaluate.name, property_file=evaluation_report, json_path="inference.quantize"
            ),
        },
    )
    register = ModelStep(
        name="RegisterModel",
        step_args=model.register(
            model_package_group_name=cfg.pipeline.model_package_group,
            content_types=CONTENT_TYPES,
            response_types=["application/json", "application/jsonlines"],
            inference_instances=[cfg.deploy.instance_type],
            approval_status=approval,
            description=f"BERT sentiment classifier fine-tuned by pipeline {cfg.pipeline.name}",
            model_metrics=ModelMetrics(
                model_statistics=MetricsSource(content_type="application/json", s3_uri=evaluation_uri)
            ),
            customer_metadata_properties={
                "code_sha256": bundles()["training"].sha256,
                "data_source": input_data,
                "accuracy": accuracy.to_string(),
                "training_job": train.properties.TrainingJobName,
                "pipeline_execution": ExecutionVariables.PIPELINE_EXECUTION_ARN,
            },
        ),
    )
    deploy = LambdaStep(
        name="Deploy",
        lambda_func=Lambda(function_arn=cfg.deploy_lambda_arn, session=session),
        inputs={
            "model_package_arn": register.properties.ModelPackageArn,
            "endpoint_name": endpoint_name,
            "instance_type": cfg.deploy.instance_type,
            "instance_count": cfg.deploy.instance_count,
        },
        outputs=[
            LambdaOutput(output_name="endpoint_config_name", output_type=LambdaOutputTypeEnum.String),
            LambdaOutput(output_name="action", output_type=LambdaOutputTypeEnum.String),
        ],
    )
    # Not nested in AccuracyGate's branch: Pipelines does not support a condition step inside another.
    approved_gate = ConditionStep(
        name="ApprovedGate",
        conditions=[ConditionEquals(left=approval, right="Approved")],
        if_steps=[deploy],
        else_steps=[],
        depends_on=[register],
    )

    # 4. Gate on accuracy; below the threshold the run fails and says why.
    too_low = FailStep(
        name="AccuracyTooLow",
        error_message=Join(
            on=" ",
            values=[
                "Accuracy",
                accuracy,
                "is below the threshold",
                threshold,
                "- the model was not registered.",
            ],
        ),
    )
    gate = ConditionStep(
        name="AccuracyGate",
        conditions=[ConditionGreaterThanOrEqualTo(left=accuracy, right=threshold)],
        if_steps=[register],
        else_steps=[too_low],
    )
    return Pipeline(
        name=cfg.pipeline.name,
        parameters=parameters,
        steps=[tokenize, train, evaluate, gate, approved_gate],
        sagemaker_session=session,
    )


def definition(cfg: Config) -> str:
    """The pipeline definition JSON for `cfg`, byte-identical for the same config and code."""
    logging.disable(logging.WARNING)  # the SDK narrates every default it applies
    try:
        text = build_pipeline(cfg).definition()
    finally:
        logging.disable(logging.NOTSET)
    return json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
