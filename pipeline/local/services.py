"""What the pipeline's steps call in an AWS account, played on this machine: CreateModelPackage into the SQLite
registry, and the deploy Lambda, which serves an Approved version on the detached local endpoint (created, updated
or unchanged, as steps/deploy.py does on SageMaker)."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config
from pipeline.contract import APPROVED, PENDING
from pipeline.errors import UserError
from pipeline.local.endpoint import read_state, start_background, stop_background
from pipeline.local.jobs import StepFailed
from pipeline.local.registry import ModelVersion, Registry
from pipeline.local.storage import Layout


class DeployRefused(UserError, ValueError):
    """A model version that is not Approved was asked to be deployed."""


def endpoint_url(state: dict) -> str:
    return state.get("url") or f"http://{state.get('host', '127.0.0.1')}:{state['port']}"


class LocalServices:
    """The local account's model registry, deploy function and endpoints."""

    def __init__(self, cfg: Config, layout: Layout, registry: Registry) -> None:
        self.layout = layout
        self.s3 = layout.s3
        self.registry = registry
        self.deploy_function = cfg.deploy.lambda_function_name
        self.endpoint = cfg.deploy.endpoint_name
        self.port = cfg.local.port

    def register_model(self, args: dict) -> dict:
        """CreateModelPackage: a new version in the local registry, with the evaluation report as its metrics."""
        spec = args["InferenceSpecification"]
        container = spec["Containers"][0]
        statistics = args.get("ModelMetrics", {}).get("ModelQuality", {}).get("Statistics", {})
        version = self.registry.register(
            args["ModelPackageGroupName"],
            self.s3.path(container["ModelDataUrl"]),
            approval_status=args.get("ModelApprovalStatus", PENDING),
            metrics=self.s3.path(statistics["S3Uri"]) if statistics.get("S3Uri") else None,
            customer_metadata=args.get("CustomerMetadataProperties"),
            image=container.get("Image", ""),
            content_types=spec.get("SupportedContentTypes", []),
            inference_instances=spec.get("SupportedRealtimeInferenceInstanceTypes", []),
            description=args.get("ModelPackageDescription", ""),
            environment=container.get("Environment"),
        )
        return {"ModelPackageArn": version.arn, "ModelPackageVersion": version.version}

    def invoke_lambda(self, function_arn: str, inputs: dict) -> dict:
        """Lambda steps: the deploy function is ours; any other function cannot run locally."""
        if function_arn.rsplit(":", 1)[-1] != self.deploy_function:
            raise StepFailed(f"Lambda function {function_arn} has no local implementation")
        _, group, number = inputs["model_package_arn"].rsplit("/", 2)
        try:
            return self.deploy(self.registry.get(group, int(number)), inputs.get("endpoint_name"))
        except DeployRefused as refused:
            raise StepFailed(str(refused)) from None

    def deploy(self, version: ModelVersion, endpoint: str | None = None) -> dict:
        """Serve `version` on the local endpoint (created or updated); refuses anything not Approved."""
        endpoint = endpoint or self.endpoint
        if version.status != APPROVED:
            raise DeployRefused(
                f"model version {version.version} is {version.status}, not Approved: approve it first "
                f"(trainium-pipeline models approve {version.version} --local)"
            )
        state = self.endpoint_state(endpoint)
        config_name = f"{endpoint}-v{version.version}"
        if state and state.get("running") and str(state.get("version")) == str(version.version):
            return {"endpoint_config_name": config_name, "action": "unchanged", "url": endpoint_url(state)}
        action = "updated" if state and state.get("running") else "created"
        state = start_background(
            Path(version.model_data),
            endpoint,
            self.port,
            self.layout.endpoint_state(endpoint),
            version=str(version.version),
            environment=version.environment,
        )
        return {"endpoint_config_name": config_name, "action": action, "url": endpoint_url(state)}

    def stop_endpoint(self, endpoint: str | None = None) -> bool:
        return stop_background(self.layout.endpoint_state(endpoint or self.endpoint))

    def endpoint_state(self, endpoint: str | None = None) -> dict | None:
        return read_state(self.layout.endpoint_state(endpoint or self.endpoint))
