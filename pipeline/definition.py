"""The pipeline DAG: one function, config in, SageMaker `Pipeline` out.

Tokenize -> Train -> Evaluate -> AccuracyGate -+-> RegisterModel --> ApprovedGate -> Deploy
                                               +-> AccuracyTooLow (Fail)

`definition()` builds it with no network call and gives byte-identical JSON for the same config
and code: step code lives at content-hashed S3 keys (see `pipeline.code`).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from pipeline import contract as c
from pipeline.code import bundles
from pipeline.config import Config
from pipeline.sdk import offline_sdk, pipeline_session

if TYPE_CHECKING:
    from sagemaker.mlops.workflow.pipeline import Pipeline

MODEL_INPUT = f"{c.PROCESSING}/input/model"  # a base model staged from S3 (training.model_id s3://...)
WHEELS_INPUT = f"{c.PROCESSING}/input/wheels"  # wheels staged from S3 (images.wheels), installed by run.py
TRAINING_MODEL_CHANNEL = "/opt/ml/input/data/model"
# Train step environment: glibc arenas capped (a checkpointing leak, as optimum-neuron does); libfabric fork safety
# for the DataLoader workers and device RDMA on EFA (multi-node; ignored elsewhere). train.py adds the rest.
TRAINING_ENVIRONMENT = {"MALLOC_ARENA_MAX": "64", "FI_EFA_FORK_SAFE": "1", "FI_EFA_USE_DEVICE_RDMA": "1"}
NO_INTERNET = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}  # fail at once instead of waiting on the Hub


def arguments(pairs: dict[str, Any]) -> list:
    """`{"--flag": value}` as a container argument list; None values are left out."""
    return [item for flag, value in pairs.items() if value is not None for item in (flag, value)]


def build_pipeline(cfg: Config) -> Pipeline:
    """Build the SageMaker Pipelines DAG for `cfg` (no AWS call is made)."""
    offline_sdk(cfg.aws.region)
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

    session = pipeline_session(cfg)
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

    input_data = ParameterString(c.INPUT_DATA, default_value=cfg.data.source)
    train_instance_type = ParameterString("TrainInstanceType", default_value=cfg.training.instance_type)
    train_instance_count = ParameterInteger("TrainInstanceCount", default_value=cfg.training.instance_count)
    epochs = ParameterInteger("Epochs", default_value=cfg.training.epochs)
    learning_rate = ParameterFloat("LearningRate", default_value=cfg.training.learning_rate)
    batch_size = ParameterInteger("BatchSize", default_value=cfg.training.batch_size)
    max_length = ParameterInteger("MaxLength", default_value=cfg.training.max_length)
    threshold = ParameterFloat(c.ACCURACY_THRESHOLD, default_value=cfg.evaluation.accuracy_threshold)
    approval = ParameterString("ModelApprovalStatus", default_value=cfg.registry.approval_status)
    endpoint_name = ParameterString(c.ENDPOINT_NAME, default_value=cfg.deploy.endpoint_name)
    parameters = [input_data, train_instance_type, train_instance_count, epochs, learning_rate, batch_size,
                  max_length, threshold, approval, endpoint_name]

    offline = bool(vpc and not vpc.internet)
    staged_model = cfg.training.model_id.startswith("s3://")

    def processor(step: str, resources, image: str) -> Processor:
        environment = {"PIP_DEFAULT_TIMEOUT": "20", **(NO_INTERNET if offline else {})}
        return Processor(
            role=cfg.aws.role_arn,
            image_uri=image,
            instance_type=resources.instance_type,
            instance_count=resources.instance_count,
            volume_size_in_gb=resources.volume_size_gb,
            volume_kms_key=cfg.aws.kms_key_id,
            output_kms_key=cfg.aws.kms_key_id,
            max_runtime_in_seconds=resources.max_runtime_seconds,
            entrypoint=["python3", f"{c.CODE_DIR}/{c.ENTRY_POINT}", step],
            base_job_name=f"{cfg.pipeline.name}-{step}",
            sagemaker_session=session,
            env=environment,
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

    def code_inputs() -> list[ProcessingInput]:
        inputs = [s3_input("code", steps_code, c.CODE_DIR)]
        return inputs + ([s3_input("wheels", cfg.images.wheels, WHEELS_INPUT)] if cfg.images.wheels else [])

    # 1. Tokenize: Hub / S3 / sample reviews -> tokenized train, validation and test splits.
    tokenize_inputs = code_inputs()
    if cfg.data.is_s3:
        tokenize_inputs.append(s3_input("data", input_data, c.DATA_DIR))
    if staged_model:
        tokenize_inputs.append(s3_input("model", cfg.training.model_id, MODEL_INPUT))
    tokenize = ProcessingStep(
        name=c.TOKENIZE,
        step_args=processor("preprocess", cfg.tokenize, cfg.image("processing")).run(
            inputs=tokenize_inputs,
            outputs=[s3_output(name, f"{c.OUTPUT_DIR}/{name}") for name in c.TOKENIZE_OUTPUTS],
            arguments=arguments({
                "--source": input_data,
                "--input-dir": c.DATA_DIR,
                "--output-dir": c.OUTPUT_DIR,
                "--model-id": MODEL_INPUT if staged_model else cfg.training.model_id,
                "--max-length": max_length.to_string(),
                "--validation-share": str(cfg.data.validation_share),
                "--max-bad-share": str(cfg.data.max_bad_share),
                "--seed": str(cfg.training.seed),
                "--max-rows-per-split": str(cfg.data.max_rows_per_split) if cfg.data.max_rows_per_split else None,
            }),
        ),
        cache_config=cache,
        retry_policies=retry,
    )

    def tokenized(split: str):
        return tokenize.properties.ProcessingOutputConfig.Outputs[split].S3Output.S3Uri

    # 2. Train: torchrun via the DLC's own launcher, one process per NeuronCore; it also scores the test split.
    t = cfg.training
    hyperparameters = {
        "model-id": TRAINING_MODEL_CHANNEL if staged_model else t.model_id,
        "epochs": epochs.to_string(),
        "max-steps": str(t.max_steps),
        "batch-size": batch_size.to_string(),
        "grad-accum": str(t.grad_accum),
        "learning-rate": learning_rate.to_string(),
        "warmup-ratio": str(t.warmup_ratio),
        "weight-decay": str(t.weight_decay),
        "max-length": max_length.to_string(),
        "seed": str(t.seed),
        "log-interval": str(t.log_interval),
        "checkpoint-interval": str(t.checkpoint_interval),
        "bf16": str(t.bf16).lower(),
        "sagemaker_program": json.dumps("train.py"),
        "sagemaker_submit_directory": json.dumps(training_code),
        "sagemaker_torch_distributed_enabled": "true",
        "sagemaker_instance_type": train_instance_type,
        "sagemaker_region": json.dumps(cfg.aws.region),
    }
    channels = [InputData(channel_name=split, data_source=tokenized(split)) for split in c.SPLITS]
    if staged_model:
        channels.append(InputData(channel_name="model", data_source=t.model_id))
    trainer = ModelTrainer(
        role=cfg.aws.role_arn,
        training_image=cfg.image("training"),
        base_job_name=f"{cfg.pipeline.name}-train",
        sagemaker_session=session,
        compute=Compute(
            instance_type=train_instance_type,
            instance_count=train_instance_count,
            volume_size_in_gb=t.volume_size_gb,
            volume_kms_key_id=cfg.aws.kms_key_id,
            enable_managed_spot_training=t.spot.enabled or None,
        ),
        networking=Networking(subnets=vpc.subnets, security_group_ids=vpc.security_group_ids) if vpc else None,
        stopping_condition=StoppingCondition(
            max_runtime_in_seconds=t.max_runtime_seconds,
            max_wait_time_in_seconds=t.spot.max_wait_seconds if t.spot.enabled else None,
        ),
        input_data_config=channels,
        output_data_config=OutputDataConfig(
            s3_output_path=Join(on="/", values=[*run_prefix, "model"]), kms_key_id=cfg.aws.kms_key_id
        ),
        checkpoint_config=CheckpointConfig(
            s3_uri=Join(on="/", values=[cfg.checkpoint_s3_uri, ExecutionVariables.PIPELINE_EXECUTION_ID]),
            local_path=c.CHECKPOINT_DIR,
        ),
        environment={
            "NEURON_COMPILE_CACHE_URL": cfg.compile_cache_s3_uri,
            "HF_HUB_DISABLE_TELEMETRY": "1",
            **TRAINING_ENVIRONMENT,
            **(NO_INTERNET if offline else {}),
        },
        hyperparameters=hyperparameters,
        tags=[Tag(key=tag["Key"], value=tag["Value"]) for tag in tags] or None,
    ).with_metric_definitions([dict(m) for m in c.METRIC_DEFINITIONS])
    train = TrainingStep(name=c.TRAIN, step_args=trainer.train(), cache_config=cache, retry_policies=retry)
    model_data = train.properties.ModelArtifacts.S3ModelArtifacts

    # 3. Evaluate: the whole test split's metrics from the Train step's predictions, checked on a sample here.
    evaluation_report = PropertyFile(name=c.PROPERTY_FILE, output_name=c.EVALUATION_OUTPUT, path=c.REPORT_FILE)
    e = cfg.evaluation
    evaluate = ProcessingStep(
        name=c.EVALUATE,
        step_args=processor("evaluate", e, cfg.image("evaluation")).run(
            inputs=[
                *code_inputs(),
                s3_input("model", model_data, c.MODEL_DIR),
                s3_input("test", tokenized("test"), c.TEST_DIR),
            ],
            outputs=[s3_output(c.EVALUATION_OUTPUT, c.EVALUATION_DIR), s3_output(c.SERVING_OUTPUT, c.SERVING_DIR)],
            arguments=[
                *arguments({
                    "--model-dir": c.MODEL_DIR,
                    "--test-dir": c.TEST_DIR,
                    "--output-dir": c.EVALUATION_DIR,
                    "--serving-dir": c.SERVING_DIR,
                    "--sample-size": str(e.sample_size),
                    "--min-agreement": str(e.min_agreement),
                    "--seed": str(t.seed),
                    "--int8-tolerance": str(e.int8_tolerance),
                }),
                "--int8" if e.int8 else "--no-int8",
            ],
        ),
        property_files=[evaluation_report],
        cache_config=cache,
        retry_policies=retry,
    )
    evaluation_uri = Join(
        on="/",
        values=[
            evaluate.properties.ProcessingOutputConfig.Outputs[c.EVALUATION_OUTPUT].S3Output.S3Uri,
            c.REPORT_FILE,
        ],
    )
    accuracy = JsonGet(step_name=evaluate.name, property_file=evaluation_report, json_path=c.ACCURACY_PATH)

    # 5. Register the serving artifact (the model and its chosen variant); 6. deploy it when Approved.
    serving_model = Join(
        on="/",
        values=[evaluate.properties.ProcessingOutputConfig.Outputs[c.SERVING_OUTPUT].S3Output.S3Uri, c.MODEL_ARCHIVE],
    )
    model = ModelBuilder(
        image_uri=cfg.image("inference"),
        s3_model_data_url=serving_model,
        role_arn=cfg.aws.role_arn,
        sagemaker_session=session,
        env_vars={
            "SAGEMAKER_PROGRAM": "inference.py",
            "SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/code",
            "SAGEMAKER_MODEL_SERVER_WORKERS": str(cfg.deploy.model_server_workers),
            "INFERENCE_MAX_TEXTS": str(cfg.deploy.max_texts),
            # the variant the evaluation chose on the test split: runtime (torch / onnxruntime), fp32 or int8
            "INFERENCE_RUNTIME": JsonGet(
                step_name=evaluate.name, property_file=evaluation_report, json_path=c.RUNTIME_PATH
            ),
            "INFERENCE_QUANTIZE": JsonGet(
                step_name=evaluate.name, property_file=evaluation_report, json_path=c.QUANTIZE_PATH
            ),
        },
    )
    register = ModelStep(
        name=c.REGISTER,
        step_args=model.register(
            model_package_group_name=cfg.pipeline.model_package_group,
            content_types=list(c.CONTENT_TYPES),
            response_types=list(c.RESPONSE_TYPES),
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
        name=c.DEPLOY,
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
        name=c.APPROVED_GATE,
        conditions=[ConditionEquals(left=approval, right=c.APPROVED)],
        if_steps=[deploy],
        else_steps=[],
        depends_on=[register],
    )

    # 4. Gate on accuracy; below the threshold the run fails and says why.
    too_low = FailStep(
        name=c.ACCURACY_TOO_LOW,
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
        name=c.ACCURACY_GATE,
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
