"""The local stand-in for an AWS account: local S3, the registry, the endpoint and the deploy function."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rich.console import Console

from pipeline.code import bundles
from pipeline.config import Config
from pipeline.local.endpoint import read_state, start_background, stop_background
from pipeline.local.jobs import StepFailed
from pipeline.local.profile import local_config
from pipeline.local.registry import ModelVersion, Registry
from pipeline.local.runner import Execution, LocalRunner
from pipeline.local.storage import LocalS3


def _is_hub_dataset(source: str) -> bool:
    return not (source.startswith(("sample", "s3://")) or Path(source).exists())


class DeployRefused(ValueError):
    """A model version that is not Approved was asked to be deployed."""


class LocalAccount:
    """Everything `run --local`, `serve` and `models` need, rooted in one folder (default `.local`)."""

    def __init__(self, cfg: Config, root: Path | None = None) -> None:
        self.cfg = local_config(cfg)
        self.root = Path(root or cfg.local.root).resolve()
        self.s3 = LocalS3(self.root)
        self.registry = Registry(self.root / "registry.sqlite")
        self.group = self.cfg.pipeline.model_package_group

    def state_file(self, endpoint: str) -> Path:
        return self.root / "endpoints" / f"{endpoint}.json"

    def definition(self) -> dict:
        from pipeline.definition import definition

        return json.loads(definition(self.cfg))

    def upload_code(self) -> None:
        """What `upsert` does on AWS: put the step code at its content-hashed keys."""
        for bundle in bundles().values():
            for uri, data in bundle.uploads(self.cfg.s3_root).items():
                if not self.s3.path(uri).exists():
                    self.s3.put_bytes(uri, data)

    def run(self, parameters: dict[str, str], *, use_cache: bool = True, console: Console | None = None) -> Execution:
        """Execute the pipeline definition end to end on this machine."""
        if Path(self.cfg.training.model_id).is_dir() and not _is_hub_dataset(self.cfg.data.source):
            for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # nothing to fetch: never wait on the network
                os.environ.setdefault(var, "1")
        definition = self.definition()
        self.upload_code()
        runner = LocalRunner(
            definition,
            self.cfg.pipeline.name,
            self.root,
            processes=self.cfg.local.processes,
            use_cache=use_cache,
            register=self.register_step,
            invoke_lambda=self.invoke_lambda,
            console=console,
        )
        return runner.run(parameters)

    def register_step(self, step: str, args: dict) -> dict:
        """The RegisterModel step: a new version in the local registry, with the evaluation report as metrics."""
        spec = args["InferenceSpecification"]
        container = spec["Containers"][0]
        statistics = args.get("ModelMetrics", {}).get("ModelQuality", {}).get("Statistics", {})
        metrics = self.s3.path(statistics["S3Uri"]) if statistics.get("S3Uri") else None
        version = self.registry.register(
            args["ModelPackageGroupName"],
            self.s3.path(container["ModelDataUrl"]),
            approval_status=args.get("ModelApprovalStatus", "PendingManualApproval"),
            metrics=metrics,
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
        if function_arn.rsplit(":", 1)[-1] != self.cfg.deploy.lambda_function_name:
            raise StepFailed(f"Lambda function {function_arn} has no local implementation")
        version = self.version_from_arn(inputs["model_package_arn"])
        try:
            return self.deploy(version, inputs.get("endpoint_name") or self.cfg.deploy.endpoint_name)
        except DeployRefused as refused:
            raise StepFailed(str(refused)) from None

    def version_from_arn(self, arn: str) -> ModelVersion:
        _, group, number = arn.rsplit("/", 2)
        return self.registry.get(group, int(number))

    def deploy(self, version: ModelVersion, endpoint: str | None = None) -> dict:
        """Serve `version` on the local endpoint (created or updated); refuses anything not Approved."""
        endpoint = endpoint or self.cfg.deploy.endpoint_name
        if version.status != "Approved":
            raise DeployRefused(
                f"model version {version.version} is {version.status}, not Approved: approve it first "
                f"(trainium-pipeline models approve {version.version} --local)"
            )
        state = read_state(self.state_file(endpoint))
        config_name = f"{endpoint}-v{version.version}"
        if state and state.get("running") and str(state.get("version")) == str(version.version):
            return {"endpoint_config_name": config_name, "action": "unchanged", "url": self._url(state)}
        action = "updated" if state and state.get("running") else "created"
        state = start_background(
            Path(version.model_data),
            endpoint,
            self.cfg.local.port,
            self.state_file(endpoint),
            version=str(version.version),
            environment=version.environment,
        )
        return {"endpoint_config_name": config_name, "action": action, "url": self._url(state)}

    def stop_endpoint(self, endpoint: str | None = None) -> bool:
        return stop_background(self.state_file(endpoint or self.cfg.deploy.endpoint_name))

    def endpoint_state(self, endpoint: str | None = None) -> dict | None:
        return read_state(self.state_file(endpoint or self.cfg.deploy.endpoint_name))

    @staticmethod
    def _url(state: dict) -> str:
        return state.get("url") or f"http://{state.get('host', '127.0.0.1')}:{state['port']}"

    def executions(self) -> list[Execution]:
        folder = self.root / "executions" / self.cfg.pipeline.name
        found = [Execution.load(p) for p in folder.glob("*/execution.json")]
        return sorted(found, key=lambda e: (e.started, e.id), reverse=True)
