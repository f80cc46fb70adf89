"""The pipeline DAG: config in, SageMaker `Pipeline` out, one helper per step, read in DAG order.

Tokenize -> Train -> Evaluate -> AccuracyGate -+-> RegisterModel --> ApprovedGate -> Deploy
                                                +-> AccuracyTooLow (Fail)

`definition()` builds it with no network call and gives byte-identical JSON for the same config
and code: step code lives at content-hashed S3 keys (see `pipeline.code`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING, Any

from pipeline.code import bundles
from pipeline.config import Config
from pipeline.config.tracking import experiment, tracking_prefix
from pipeline.sdk import MODEL_INPUT, StepParts, offline_sdk
from steps import contract
from steps.deploy.targets import SERVING_FAMILIES, SPEC_INSTANCE_TYPES, TARGET_NAMES

if TYPE_CHECKING:
    from sagemaker.core.workflow.properties import PropertyFile
    from sagemaker.mlops.workflow.condition_step import ConditionStep
    from sagemaker.mlops.workflow.fail_step import FailStep
    from sagemaker.mlops.workflow.lambda_step import LambdaStep
    from sagemaker.mlops.workflow.model_step import ModelStep
    from sagemaker.mlops.workflow.pipeline import Pipeline
    from sagemaker.mlops.workflow.steps import ProcessingStep, TrainingStep

TRAINING_MODEL_CHANNEL = "/opt/ml/input/data/model"
LAUNCH_ONLY = ("compile-ahead",)  # hyperparameters that training/launch.py takes and does not pass on to train.py
# Train step environment: glibc arenas capped (a checkpointing leak, as optimum-neuron does); libfabric fork safety
# for the DataLoader workers. Device RDMA is left to the training toolkit and train.py, which set it for the instance
# types whose EFA has it (libfabric aborts where a job forces it and the device has no RDMA read, e.g. g5.48xlarge).
TRAINING_ENVIRONMENT = {"MALLOC_ARENA_MAX": "64", "FI_EFA_FORK_SAFE": "1"}


def arguments(pairs: dict[str, Any]) -> list:
    """`{"--flag": value}` as a container argument list; None values are left out."""
    return [item for flag, value in pairs.items() if value is not None for item in (flag, value)]


class Steps(StepParts):
    """One method per step of the DAG, in the order an execution reaches them."""

    # 1. Tokenize: Hub / S3 / sample reviews -> tokenized train, validation and test splits.
    def tokenize(self) -> ProcessingStep:
        from sagemaker.mlops.workflow.steps import ProcessingStep

        cfg, parameters = self.cfg, self.parameters
        inputs = self.code_inputs("tokenize")
        if cfg.data.is_s3:
            inputs.append(self.s3_input("data", parameters.input_data, contract.DATA_DIR))
        if self.staged_model:
            inputs.append(self.s3_input("model", cfg.training.model_id, MODEL_INPUT))
        rows = cfg.data.max_rows_per_split
        return ProcessingStep(
            name=contract.TOKENIZE,
            step_args=self.processor("tokenize", cfg.tokenize, cfg.image("processing")).run(
                inputs=inputs,
                outputs=[self.s3_output(name, f"{contract.OUTPUT_DIR}/{name}") for name in contract.TOKENIZE_OUTPUTS],
                arguments=arguments({
                    "--source": parameters.input_data,
                    "--input-dir": contract.DATA_DIR,
                    "--output-dir": contract.OUTPUT_DIR,
                    "--model-id": MODEL_INPUT if self.staged_model else cfg.training.model_id,
                    "--max-length": parameters.max_length.to_string(),
                    "--validation-share": str(cfg.data.validation_share),
                    "--max-bad-share": str(cfg.data.max_bad_share),
                    "--text-columns": json.dumps(cfg.data.text_columns),
                    "--label-column": cfg.data.label_column,
                    "--labels": json.dumps(cfg.data.labels),
                    "--seed": str(cfg.training.seed),
                    "--max-rows-per-split": str(rows) if rows else None,
                }),
            ),
            cache_config=self.cache if cfg.data.immutable or not cfg.data.is_s3 else None,  # SageMaker's cache key
            retry_policies=self.retry,  # holds the InputData URI, not the files under it: new files would be missed
        )

    # 2. Train: training/launch.py compiles what the Neuron compile cache lacks, then starts torchrun through the
    # DLC's own launcher, one process per NeuronCore; train.py also scores the test split.
    def hyperparameters(self) -> dict[str, Any]:
        """What train.py reads (the parameters where an execution may change them), launch.py's switch, then the DLC
        toolkit's keys."""
        training, parameters = self.cfg.training, self.parameters
        return {
            "model-id": TRAINING_MODEL_CHANNEL if self.staged_model else training.model_id,
            "epochs": parameters.epochs.to_string(),
            "max-steps": str(training.max_steps),
            "batch-size": parameters.batch_size.to_string(),
            "grad-accum": str(training.grad_accum),
            "learning-rate": parameters.learning_rate.to_string(),
            "lr-global-batch": str(training.learning_rate_for[1]),
            "warmup-ratio": str(training.warmup_ratio),
            "weight-decay": str(training.weight_decay),
            "max-length": parameters.max_length.to_string(),
            "seed": str(training.seed),
            "log-interval": str(training.log_interval),
            "checkpoint-interval": str(training.checkpoint_interval),
            "checkpoint-minutes": str(training.checkpoint_minutes),
            "bf16": str(training.bf16).lower(),
            "backend": training.backend,
            "compile-ahead": str(training.compiles_ahead).lower(),
            "sagemaker_program": json.dumps("launch.py"),
            "sagemaker_submit_directory": json.dumps(bundles()["training"].uri(self.cfg.s3_root)),
            "sagemaker_instance_type": parameters.train_instance_type,
            # ResourceConfig is no cache key attribute: without the count in one, an execution moving Train to more
            # instances (compiled graphs and checkpoints differ with the world size) would reuse the earlier run
            "sagemaker_instance_count": parameters.train_instance_count.to_string(),
            "sagemaker_region": json.dumps(self.cfg.aws.region),
        }

    def train(self, tokenize: ProcessingStep) -> TrainingStep:
        from sagemaker.mlops.workflow.steps import TrainingStep

        return TrainingStep(name=contract.TRAIN, step_args=self.trainer(tokenize).train(), cache_config=self.cache,
                            retry_policies=self.retry)

    def trainer(self, tokenize: ProcessingStep):
        """The training job of Train."""
        from sagemaker.core.shapes import OutputDataConfig, StoppingCondition, Tag
        from sagemaker.core.training.configs import CheckpointConfig, Compute, InputData, Networking
        from sagemaker.core.workflow import Join
        from sagemaker.train import ModelTrainer

        cfg, training, vpc = self.cfg, self.cfg.training, self.cfg.aws.vpc
        environment = {
            "NEURON_COMPILE_CACHE_URL": cfg.compile_cache_s3_uri,
            "HF_HUB_DISABLE_TELEMETRY": "1",
            **TRAINING_ENVIRONMENT,
            **self.hub_offline,
        }
        channels = [InputData(channel_name=name, data_source=self.output(tokenize, name)) for name in contract.SPLITS]
        channels.append(InputData(channel_name=contract.TRACKING_INPUT, data_source=tracking_prefix(cfg)))
        if self.staged_model:
            channels.append(InputData(channel_name="model", data_source=training.model_id))
        return ModelTrainer(
            role=cfg.aws.role_arn,
            training_image=cfg.image("training"),
            base_job_name=f"{cfg.pipeline.name}-train",
            sagemaker_session=self.session,
            compute=Compute(
                instance_type=self.parameters.train_instance_type,
                instance_count=self.parameters.train_instance_count,
                volume_size_in_gb=training.volume_size_gb,  # no VolumeKmsKeyId: CreateTrainingJob refuses it for
                # an instance type with local storage (trn1, p4d, p5, g5: NVMe encrypted by the instance's hardware)
                enable_managed_spot_training=training.spot.enabled or None,
            ),
            networking=Networking(subnets=vpc.subnets, security_group_ids=vpc.security_group_ids) if vpc else None,
            stopping_condition=StoppingCondition(
                max_runtime_in_seconds=training.max_runtime_seconds,
                max_wait_time_in_seconds=training.spot.max_wait_seconds if training.spot.enabled else None,
            ),
            input_data_config=channels,
            output_data_config=OutputDataConfig(
                s3_output_path=Join(on="/", values=[*self.run_prefix, "model"]), kms_key_id=cfg.aws.kms_key_id
            ),
            checkpoint_config=CheckpointConfig(
                s3_uri=self.checkpoints(tokenize, environment), local_path=contract.CHECKPOINT_DIR,
            ),
            environment=environment,
            hyperparameters=self.hyperparameters(),
            tags=[Tag(key=tag["Key"], value=tag["Value"]) for tag in self.tags] or None,
        ).with_metric_definitions([dict(metric) for metric in contract.METRIC_DEFINITIONS])

    def checkpoints(self, tokenize: ProcessingStep, environment: dict[str, str]) -> Any:
        """Train's checkpoint folder in S3: one per training that SageMaker's step cache tells apart, and nothing per
        execution. CheckpointConfig is one of Train's cache key attributes: with the execution id in it, Train would
        never be a cache hit on AWS. It names what the rest of the key holds: a digest of everything fixed (image,
        code, environment, the fixed hyperparameters, the model), the Tokenize job whose data it trains on, and the
        parameters the hyperparameters take. A retried execution resumes from its folder; a training the cache
        would not reuse never does."""
        from sagemaker.core.workflow import Join

        hyperparameters = self.hyperparameters()
        fixed = {k: v for k, v in hyperparameters.items() if isinstance(v, str)}
        digest = hashlib.sha256(json.dumps([self.cfg.image("training"), self.cfg.training.model_id, fixed, environment],
                                           sort_keys=True).encode()).hexdigest()[:16]
        varying = [hyperparameters[k] for k in sorted(hyperparameters) if not isinstance(hyperparameters[k], str)]
        unwrapped = [v.values[0] if isinstance(v, Join) and len(v.values) == 1 else v for v in varying]  # to_string()
        return Join(on="/", values=[self.cfg.checkpoint_s3_uri, digest, tokenize.properties.ProcessingJobName,
                                    *unwrapped])

    # 3. Evaluate: the whole test split's metrics from the Train step's predictions, checked on a sample here.
    def evaluate(self, tokenize: ProcessingStep, train: TrainingStep, report: PropertyFile) -> ProcessingStep:
        from sagemaker.mlops.workflow.steps import ProcessingStep

        evaluation = self.cfg.evaluation
        return ProcessingStep(
            name=contract.EVALUATE,
            step_args=self.processor("evaluation", evaluation, self.cfg.image("evaluation")).run(
                inputs=[
                    *self.code_inputs("evaluation"),
                    self.s3_input(contract.TRACKING_INPUT, tracking_prefix(self.cfg), contract.TRACKING_DIR),
                    self.s3_input("model", train.properties.ModelArtifacts.S3ModelArtifacts, contract.MODEL_DIR),
                    self.s3_input("test", self.output(tokenize, "test"), contract.TEST_DIR),
                    *([self.s3_input("train", self.output(tokenize, "train"), contract.TRAIN_DIR)]
                      if evaluation.baseline_rows else []),
                ],
                outputs=[
                    self.s3_output(contract.EVALUATION_OUTPUT, contract.EVALUATION_DIR),
                    self.s3_output(contract.SERVING_OUTPUT, contract.SERVING_DIR),
                ],
                arguments=[
                    *arguments({
                        "--model-dir": contract.MODEL_DIR,
                        "--test-dir": contract.TEST_DIR,
                        "--train-dir": contract.TRAIN_DIR,
                        "--output-dir": contract.EVALUATION_DIR,
                        "--serving-dir": contract.SERVING_DIR,
                        "--sample-size": str(evaluation.sample_size),
                        "--min-agreement": str(evaluation.min_agreement),
                        "--seed": str(self.cfg.training.seed),
                        "--tracking-dir": contract.TRACKING_DIR,
                        "--int8-tolerance": str(evaluation.int8_tolerance),
                        "--fp16-tolerance": str(evaluation.fp16_tolerance),
                        "--baseline-rows": str(evaluation.baseline_rows),
                        "--gate-metric": evaluation.gate_metric,
                    }),
                    "--int8" if evaluation.int8 else "--no-int8",
                    "--fp16" if evaluation.fp16 else "--no-fp16",
                ],
            ),
            property_files=[report],
            cache_config=self.cache,
            retry_policies=self.retry,
        )

    # 4. AccuracyGate: register the model, or fail.
    def accuracy_gate(self, evaluate: ProcessingStep, report: PropertyFile, register: ModelStep,
                      too_low: FailStep) -> ConditionStep:
        from sagemaker.core.workflow import ConditionGreaterThan, ConditionGreaterThanOrEqualTo
        from sagemaker.mlops.workflow.condition_step import ConditionStep

        gated = self.report_value(evaluate, report, contract.GATE_METRICS[self.cfg.evaluation.gate_metric])
        beats = ([ConditionGreaterThan(left=self.report_value(evaluate, report, contract.BASELINE_MARGIN_PATH),
                                       right=0.0)] if self.cfg.evaluation.beat_baseline else [])
        return ConditionStep(
            name=contract.ACCURACY_GATE,
            conditions=[ConditionGreaterThanOrEqualTo(left=gated, right=self.parameters.accuracy_threshold), *beats],
            if_steps=[register],
            else_steps=[too_low],
        )

    # 5. RegisterModel: Evaluate's serving artifact (the model and its chosen variant) as a new version in the Model
    # Registry, with the evaluation as its metrics.
    def register(self, train: TrainingStep, evaluate: ProcessingStep, report: PropertyFile) -> ModelStep:
        from sagemaker.core.model_metrics import MetricsSource, ModelMetrics
        from sagemaker.core.workflow import ExecutionVariables, Join
        from sagemaker.mlops.workflow.model_step import ModelStep
        from sagemaker.serve.model_builder import ModelBuilder

        cfg = self.cfg
        model_data = Join(on="/", values=[self.output(evaluate, contract.SERVING_OUTPUT), contract.MODEL_ARCHIVE])
        evaluation_uri = Join(on="/", values=[self.output(evaluate, contract.EVALUATION_OUTPUT), contract.REPORT_FILE])
        environment = {
            "SAGEMAKER_PROGRAM": "inference.py",
            "SAGEMAKER_SUBMIT_DIRECTORY": "/opt/ml/model/code",
            "SAGEMAKER_MODEL_SERVER_WORKERS": str(cfg.deploy.model_server_workers),
            "INFERENCE_MAX_TEXTS": str(cfg.deploy.max_texts),
            # the variant the evaluation chose on the test split: runtime (torch / onnxruntime), fp32 or int8
            "INFERENCE_RUNTIME": self.report_value(evaluate, report, contract.RUNTIME_PATH),
            "INFERENCE_QUANTIZE": self.report_value(evaluate, report, contract.QUANTIZE_PATH),
            # ... and the precision a GPU serves in: fp16 if it loses no accuracy beyond evaluation.fp16_tolerance
            "INFERENCE_GPU_PRECISION": self.report_value(evaluate, report, contract.GPU_PRECISION_PATH),
        }
        model = ModelBuilder(image_uri=cfg.serving_image, s3_model_data_url=model_data, role_arn=cfg.aws.role_arn,
                             sagemaker_session=self.session,
                             env_vars=target_environment(cfg, cfg.deploy.target, environment))
        return ModelStep(
            name=contract.REGISTER,
            step_args=model.register(
                model_package_group_name=cfg.pipeline.model_package_group,
                content_types=list(contract.CONTENT_TYPES),
                response_types=list(contract.RESPONSE_TYPES),
                inference_instances=sorted({cfg.deploy.instance_type, cfg.deploy.staging_instance_type}),
                approval_status=self.parameters.approval_status,
                description=f"BERT sentiment classifier fine-tuned by pipeline {cfg.pipeline.name}",
                model_metrics=ModelMetrics(
                    model_statistics=MetricsSource(content_type="application/json", s3_uri=evaluation_uri)
                ),
                customer_metadata_properties={
                    "code_sha256": bundles()["training"].sha256,
                    "data_source": self.parameters.input_data,
                    "accuracy": self.report_value(evaluate, report, contract.ACCURACY_PATH).to_string(),
                    "macro_f1": self.report_value(evaluate, report, contract.GATE_METRICS["macro_f1"]).to_string(),
                    "label_count": self.report_value(evaluate, report, contract.LABEL_COUNT_PATH).to_string(),
                    "label_digest": self.report_value(evaluate, report, contract.LABEL_DIGEST_PATH),
                    "training_job": train.properties.TrainingJobName,
                    "pipeline_execution": ExecutionVariables.PIPELINE_EXECUTION_ARN,
                    contract.RUN_ID_METADATA: self.report_value(evaluate, report, contract.RUN_ID_PATH),
                },
            ),
        )

    # 6. AccuracyTooLow: below the threshold the run fails and says why.
    def too_low(self, evaluate: ProcessingStep, report: PropertyFile) -> FailStep:
        from sagemaker.core.workflow import Join
        from sagemaker.mlops.workflow.fail_step import FailStep

        metric = self.cfg.evaluation.gate_metric
        gated = self.report_value(evaluate, report, contract.GATE_METRICS[metric])
        return FailStep(name=contract.ACCURACY_TOO_LOW, error_message=Join(on=" ", values=[
            {"accuracy": "Accuracy", "macro_f1": "Macro-F1"}[metric], gated, "is below the threshold",
            self.parameters.accuracy_threshold,
            *(["or does not lead the TF-IDF baseline: its lead is",
               self.report_value(evaluate, report, contract.BASELINE_MARGIN_PATH)]
              if self.cfg.evaluation.beat_baseline else []),
            "- the model was not registered.",
        ]))

    # 7. ApprovedGate: deploy only an Approved version. Not nested in AccuracyGate's branch: Pipelines does not
    # support a condition step inside another.
    def approved_gate(self, register: ModelStep, deploy: LambdaStep) -> ConditionStep:
        from sagemaker.core.workflow import ConditionEquals
        from sagemaker.mlops.workflow.condition_step import ConditionStep

        return ConditionStep(
            name=contract.APPROVED_GATE,
            conditions=[ConditionEquals(left=self.parameters.approval_status, right=contract.APPROVED)],
            if_steps=[deploy],
            else_steps=[],
            depends_on=[register],
        )

    # 8. Deploy: the deploy Lambda (steps/deploy/) sends the new version to the staging endpoint, where it is tested
    # before promotion. Endpoint names and sizes are the Lambda's configuration (upsert), not inputs: its role may act
    # on those endpoints only.
    def deploy(self, register: ModelStep) -> LambdaStep:
        from sagemaker.core.lambda_helper import Lambda
        from sagemaker.mlops.workflow.lambda_step import LambdaOutput, LambdaOutputTypeEnum, LambdaStep

        return LambdaStep(
            name=contract.DEPLOY,
            lambda_func=Lambda(function_arn=self.cfg.deploy_lambda_arn, session=self.session),
            inputs={"model_package_arn": register.properties.ModelPackageArn},
            outputs=[
                LambdaOutput(output_name="endpoint_config_name", output_type=LambdaOutputTypeEnum.String),
                LambdaOutput(output_name="action", output_type=LambdaOutputTypeEnum.String),
            ],
        )


def build_pipeline(cfg: Config) -> Pipeline:
    """Build the SageMaker Pipelines DAG for `cfg` (no AWS call is made)."""
    offline_sdk(cfg.aws.region)
    from sagemaker.core.workflow.properties import PropertyFile
    from sagemaker.mlops.workflow.pipeline import Pipeline

    steps = Steps(cfg)
    report = PropertyFile(name=contract.PROPERTY_FILE, output_name=contract.EVALUATION_OUTPUT,
                          path=contract.REPORT_FILE)
    tokenize = steps.tokenize()
    train = steps.train(tokenize)
    evaluate = steps.evaluate(tokenize, train, report)
    register = steps.register(train, evaluate, report)
    accuracy_gate = steps.accuracy_gate(evaluate, report, register, steps.too_low(evaluate, report))
    approved_gate = steps.approved_gate(register, steps.deploy(register))
    return Pipeline(
        name=cfg.pipeline.name,
        parameters=steps.parameters.declared(),
        steps=[tokenize, train, evaluate, accuracy_gate, approved_gate],
        sagemaker_session=steps.session,
        # No SageMaker Experiment and trial per execution (the SDK's default in some regions): nothing here reads
        # them, and the execution role is not allowed to create them.
        pipeline_experiment_config=None,
        mlflow_config=mlflow_config(cfg),
    )


def mlflow_config(cfg: Config) -> Any:
    """The pipeline's MlflowConfig (its SageMaker managed MLflow server and experiment), None without one."""
    from sagemaker.core.shapes.shapes import MlflowConfig

    server = cfg.tracking.server_arn
    return MlflowConfig(mlflow_resource_arn=server, mlflow_experiment_name=experiment(cfg)) if server else None


NEURON_ENVIRONMENT = ("INFERENCE_NEURON_BATCH_SIZE", "INFERENCE_NEURON_SEQUENCE_LENGTH", "INFERENCE_NEURON_CAST",
                      "NEURON_RT_NUM_CORES")


def target_environment(cfg: Config, target: str, environment: dict[str, Any]) -> dict[str, Any]:
    """The serving container's environment on `target` from the register step's (`environment`: the handler reads
    what its device needs, as INFERENCE_GPU_PRECISION on CUDA alone). On Inferentia2: the static shapes and cast the
    handler compiles the model with (deploy.neuron), one NeuronCore per model-server worker, and no worker count, so
    that the Hugging Face toolkit starts one worker per NeuronCore (its rule when SAGEMAKER_MODEL_SERVER_WORKERS is
    unset)."""
    common = {k: v for k, v in environment.items() if k not in NEURON_ENVIRONMENT}
    if target != "neuron":
        return {**common, "SAGEMAKER_MODEL_SERVER_WORKERS": str(cfg.deploy.model_server_workers)}
    neuron = cfg.deploy.neuron
    return {**{k: v for k, v in common.items() if k != "SAGEMAKER_MODEL_SERVER_WORKERS"},
            "INFERENCE_NEURON_BATCH_SIZE": str(neuron.batch_size),
            "INFERENCE_NEURON_SEQUENCE_LENGTH": str(neuron.sequence_length or cfg.training.max_length),
            "INFERENCE_NEURON_CAST": neuron.cast, "NEURON_RT_NUM_CORES": "1"}


def with_other_serving_targets(dag: dict, cfg: Config) -> dict:
    """RegisterModel's AdditionalInferenceSpecifications: the version on each serving target the config does not
    deploy to, with the same artifact on that target's image and environment, so that it can be deployed there from
    the registry. Written into the definition by hand: the SDK's register() takes no additional specifications
    (sagemaker 3.27)."""
    from pipeline.dag.graph import flatten_steps

    (register,) = [s for s in flatten_steps(dag["Steps"]).values() if s["Type"] == "RegisterModel"]
    specification = register["Arguments"]["InferenceSpecification"]
    (container,) = specification["Containers"]
    register["Arguments"]["AdditionalInferenceSpecifications"] = [{
        "Name": f"{other}-endpoint",
        "Description": f"The same version on {TARGET_NAMES[other]} instances ({SERVING_FAMILIES[other]})",
        "Containers": [{**container, "Image": cfg.serving_image_of(other),
                        "Environment": target_environment(cfg, other, container["Environment"])}],
        "SupportedRealtimeInferenceInstanceTypes": list(SPEC_INSTANCE_TYPES[other]),
        "SupportedContentTypes": specification["SupportedContentTypes"],
        "SupportedResponseMIMETypes": specification["SupportedResponseMIMETypes"],
    } for other in SERVING_FAMILIES if other != cfg.deploy.target]
    return dag


def definition(cfg: Config) -> str:
    """The pipeline definition JSON for `cfg`, byte-identical for the same config and code."""
    logging.disable(logging.WARNING)  # the SDK narrates every default it applies
    try:
        text = build_pipeline(cfg).definition()
    finally:
        logging.disable(logging.NOTSET)
    return json.dumps(with_other_serving_targets(json.loads(text), cfg), indent=2, sort_keys=True) + "\n"


def step_arguments(cfg: Config, name: str) -> list[str]:
    """The command line that step `name` (Tokenize, Train or Evaluate) gives its script (Train's: what launch.py gives
    train.py), the pipeline's parameters at
    their defaults, the container's folders left out: where a test or benchmark that runs a step's script itself
    starts (the config is the one home of every default; the scripts default none of them)."""
    from pipeline.dag.expressions import Context, evaluate
    from pipeline.dag.parameters import resolve

    dag = json.loads(definition(cfg))
    (step,) = [step for step in dag["Steps"] if step["Name"] == name]
    context = Context(parameters=resolve(dag, {}), execution={}, properties={})
    arguments = step["Arguments"]
    if "HyperParameters" in arguments:
        given = evaluate(arguments["HyperParameters"], context, f"{name}'s hyperparameters")
        return [part for key, value in given.items() if not key.startswith("sagemaker_") and key not in LAUNCH_ONLY
                for part in (f"--{key}", value)]
    line = evaluate(arguments["AppSpecification"]["ContainerArguments"], context, f"{name}'s arguments")
    kept, skip = [], False
    for part in line:
        if skip:
            skip = False
        elif part.endswith("-dir"):
            skip = True
        else:
            kept.append(part)
    return kept
