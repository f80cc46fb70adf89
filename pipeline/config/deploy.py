"""The config sections of serving: `deploy` (the deploy Lambda, the production endpoint, the staging endpoint, the
endpoint test, promotion, autoscaling) and `alerts`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.config.base import (
    ENDPOINT_NAME,
    ENDPOINT_NAME_LENGTH,
    INSTANCE_TYPE,
    ROLE_ARN,
    S3_URI,
    Section,
    pattern,
)
from steps.deploy.lifecycle import Policy
from steps.deploy.sagemaker_account import TARGET_INVOCATIONS
from steps.deploy.targets import P95_MS, SERVERLESS_MAX_CONCURRENCY, SERVERLESS_MEMORY_MB, serving_target

POLICY = Policy()  # the lifecycle's defaults (the deploy Lambda falls back to them too): their one home
TOPIC_ARN = pattern(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[\w.-]+$",
                    "an SNS topic ARN like arn:aws:sns:us-east-1:123456789012:alerts")


class Staging(Section):
    """The staging endpoint: every approved version is deployed and tested here first."""

    # default: <deploy.endpoint_name>-staging
    endpoint_name: str | None = Field(default=None, pattern=ENDPOINT_NAME, max_length=ENDPOINT_NAME_LENGTH)
    instance_type: str | None = Field(default=None, pattern=INSTANCE_TYPE)  # default: deploy.instance_type
    instance_count: int = Field(default=1, ge=1)


class EndpointTest(Section):
    """The endpoint test on staging: labelled test rows through the real invoke path."""

    rows: int = Field(default=POLICY.test_rows, ge=1, le=4000)
    max_accuracy_drop: float = Field(default=POLICY.max_accuracy_drop, ge=0, le=1)  # below the evaluation's accuracy
    p95_ms: float | None = Field(default=None, gt=0)  # latency budget of one request; default: its target's
    p50_factor: float = Field(default=POLICY.p50_factor, gt=0)  # the p50 <= this times Evaluate's one-row time ...
    p50_overhead_ms: float = Field(default=POLICY.p50_overhead_ms, ge=0)  # ... plus this (HTTP, JSON, tokenizing)


class Challenge(Section):
    """Champion/challenger after a passed staging test: production is sent the candidate's sample rows, and the
    candidate is promoted automatically only when the paired difference of the gate's metric
    (evaluation.gate_metric) has its 95% interval's lower end above -tolerance (steps/deploy/challenge.py)."""

    rows: int = Field(default=POLICY.challenge_rows, ge=1, le=100_000)  # at most the sample's (evaluation.sample_size)
    tolerance: float = Field(default=POLICY.challenge_tolerance, ge=0, le=1)


class Autoscaling(Section):
    """Target tracking of the production endpoint on invocations per instance (per minute)."""

    min_instances: int = Field(default=1, ge=1)
    max_instances: int = Field(default=2, ge=1)
    target_invocations: float = Field(default=TARGET_INVOCATIONS, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.min_instances > self.max_instances:
            raise ValueError(f"deploy.autoscaling.min_instances={self.min_instances}: expected at most "
                             f"deploy.autoscaling.max_instances ({self.max_instances})")
        return self


class Neuron(Section):
    """Inferentia2 endpoints (deploy.instance_type ml.inf2.*): the handler compiles the model for Neuron with these
    static shapes when an instance starts (docs/serving-targets.md)."""

    batch_size: int = Field(default=1, ge=1, le=64)  # texts per compiled forward pass: a request runs in such batches
    sequence_length: int | None = Field(default=None, ge=8, le=512)  # tokens per text; default: training.max_length
    cast: Literal["bf16", "fp32"] = "bf16"  # bf16: matrix multiplications in bf16 (Neuron's benchmarks); fp32: none


class Serverless(Section):
    """SageMaker Serverless Inference for low traffic: both endpoints run the CPU image without instances, and
    SageMaker scales them, to zero when idle (the next request then waits for a cold start). No data capture, no
    autoscaling policy (docs/serving-targets.md)."""

    memory_mb: int = 2048  # 1024 to 6144 in 1024 steps; the vCPUs grow with it
    max_concurrency: int = Field(default=5, ge=1, le=SERVERLESS_MAX_CONCURRENCY)  # requests at once, per endpoint
    provisioned_concurrency: int | None = Field(default=None, ge=1, le=SERVERLESS_MAX_CONCURRENCY)  # kept warm

    @model_validator(mode="after")
    def _limits(self) -> Serverless:
        if self.memory_mb not in SERVERLESS_MEMORY_MB:
            raise ValueError(f"deploy.serverless.memory_mb={self.memory_mb}: expected one of "
                             f"{', '.join(map(str, SERVERLESS_MEMORY_MB))}")
        if (self.provisioned_concurrency or 0) > self.max_concurrency:
            raise ValueError(f"deploy.serverless.provisioned_concurrency={self.provisioned_concurrency}: expected at "
                             f"most deploy.serverless.max_concurrency ({self.max_concurrency})")
        return self

    @property
    def api(self) -> dict[str, int]:
        """As CreateEndpointConfig's ProductionVariantServerlessConfig."""
        provisioned = {"ProvisionedConcurrency": self.provisioned_concurrency} if self.provisioned_concurrency else {}
        return {"MemorySizeInMB": self.memory_mb, "MaxConcurrency": self.max_concurrency, **provisioned}


class Deploy(Section):
    endpoint_name: str = Field(pattern=ENDPOINT_NAME, max_length=ENDPOINT_NAME_LENGTH)  # the production endpoint
    instance_type: str = Field(default="ml.c5.xlarge", pattern=INSTANCE_TYPE)
    instance_count: int = Field(default=1, ge=1)
    lambda_function_name: str = Field(pattern=pattern(r"^[a-zA-Z0-9_-]{1,64}$",
                                                      "a Lambda function name: 1 to 64 letters, digits, - and _"))
    lambda_role_arn: str | None = Field(default=None, pattern=ROLE_ARN)
    data_capture_s3_uri: str | None = Field(default=None, pattern=S3_URI)
    guardrails_alarm: str | None = None
    model_server_workers: int = Field(default=2, ge=1, le=64)
    max_texts: int = Field(default=256, ge=1, le=10000)
    staging: Staging = Staging()
    test: EndpointTest = EndpointTest()
    auto_promote: bool = POLICY.auto_promote
    challenge: Challenge = Challenge()
    autoscaling: Autoscaling = Autoscaling()
    neuron: Neuron = Neuron()
    serverless: Serverless | None = None  # set: both endpoints on Serverless Inference instead of instances

    @property
    def staging_instance_type(self) -> str:
        return self.staging.instance_type or self.instance_type

    @property
    def target(self) -> str:
        """The serving stack of the endpoints: "cpu", "gpu" or "neuron" (staging and production have the same)."""
        return serving_target(self.instance_type)

    @property
    def p95_budget_ms(self) -> float:
        """The endpoint test's p95 budget: deploy.test.p95_ms, else the target's (steps/deploy/targets.py)."""
        return self.test.p95_ms or P95_MS["serverless" if self.serverless else self.target]

    @property
    def staging_endpoint_name(self) -> str:
        return self.staging.endpoint_name or f"{self.endpoint_name}-staging"

    @model_validator(mode="after")
    def _endpoints(self) -> Deploy:
        if self.staging.endpoint_name is None and len(self.staging_endpoint_name) > ENDPOINT_NAME_LENGTH:
            raise ValueError(f"deploy.endpoint_name={self.endpoint_name!r}: expected at most "
                             f"{ENDPOINT_NAME_LENGTH - len('-staging')} characters, so that the staging endpoint "
                             f"{self.staging_endpoint_name!r} fits SageMaker's {ENDPOINT_NAME_LENGTH}; or set "
                             "deploy.staging.endpoint_name")
        if self.staging_endpoint_name.lower() == self.endpoint_name.lower():
            raise ValueError(f"deploy.staging.endpoint_name={self.staging_endpoint_name!r}: expected another name "
                             f"than deploy.endpoint_name")
        target = serving_target(self.instance_type)
        staged = serving_target(self.staging_instance_type, "deploy.staging.instance_type")
        if staged != target:
            raise ValueError(f"deploy.staging.instance_type={self.staging_instance_type}: a {staged} instance, while "
                             f"deploy.instance_type={self.instance_type} is a {target} one; expected the same kind, "
                             "so that staging tests the serving stack production runs")
        if self.serverless and target != "cpu":
            raise ValueError(f"deploy.serverless: Serverless Inference runs the CPU image, while "
                             f"deploy.instance_type={self.instance_type} is a {target} instance; expected a CPU type "
                             "(ml.c*, ml.m*, ml.r*, ml.t*) or deploy.serverless: null")
        if self.serverless and self.data_capture_s3_uri:
            raise ValueError(f"deploy.data_capture_s3_uri={self.data_capture_s3_uri}: Serverless Inference does not "
                             "capture data; expected null with deploy.serverless")
        scaling = self.autoscaling
        if not scaling.min_instances <= self.instance_count <= scaling.max_instances:
            raise ValueError(f"deploy.instance_count={self.instance_count}: expected within deploy.autoscaling's "
                             f"{scaling.min_instances}..{scaling.max_instances} instances")
        return self


class Alerts(Section):
    """The alerts topic (made by bootstrap) and its optional e-mail subscription."""

    email: str | None = Field(default=None, pattern=pattern(r"^[^@\s]+@[^@\s]+\.[^@\s]+$",
                                                            "an email address like ml-team@example.com"))
    topic_arn: str | None = Field(default=None, pattern=TOPIC_ARN)
