"""The local stand-in for an AWS account: local S3, the upserted pipeline, the registry, the endpoint, deploy."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from pipeline.code import bundles
from pipeline.config import Config
from pipeline.contract import APPROVED
from pipeline.dag.graph import changed_steps
from pipeline.errors import UserError
from pipeline.local.endpoint import read_state, start_background, stop_background
from pipeline.local.jobs import StepFailed
from pipeline.local.profile import local_config
from pipeline.local.registry import ModelVersion, Registry
from pipeline.local.runner import DEFINITION_FILE, Execution, ExecutionNotFound, LocalRunner
from pipeline.local.storage import LocalS3
from pipeline.records import Upserted

LOCAL_ARN = "arn:aws:sagemaker:local:000000000000"


def _is_hub_dataset(source: str) -> bool:
    return not (source.startswith(("sample", "s3://")) or Path(source).exists())


class DeployRefused(UserError, ValueError):
    """A model version that is not Approved was asked to be deployed."""


class LocalAccount:
    """Everything `run --local`, `serve` and `models --local` need, rooted in one folder (default `.local`)."""

    def __init__(self, cfg: Config, root: Path | None = None) -> None:
        self.cfg = local_config(cfg)
        self.root = Path(root or cfg.local.root).resolve()
        self.s3 = LocalS3(self.root)
        self.registry = Registry(self.root / "registry.sqlite")
        self.group = self.cfg.pipeline.model_package_group
        self.pipeline_file = self.root / "pipelines" / self.cfg.pipeline.name / DEFINITION_FILE

    def state_file(self, endpoint: str) -> Path:
        return self.root / "endpoints" / f"{endpoint}.json"

    def definition(self) -> dict:
        """The definition of the local profile of the config (what upsert stores)."""
        from pipeline.definition import definition

        return json.loads(definition(self.cfg))

    def upsert(self) -> Upserted:
        """What `upsert` does on AWS: put the step code at its content-hashed keys and store the definition."""
        report = Upserted(action="updated" if self.pipeline_file.exists() else "created",
                          pipeline_arn=f"{LOCAL_ARN}:pipeline/{self.cfg.pipeline.name.lower()}",
                          deploy_function="local (steps/deploy.py's local counterpart)")
        for bundle in bundles().values():
            for uri, data in bundle.uploads(self.cfg.s3_root).items():
                if self.s3.path(uri).exists():
                    report.skipped.append(uri)
                else:
                    self.s3.put_bytes(uri, data)
                    report.uploaded.append(uri)
        old = json.loads(self.pipeline_file.read_text()) if self.pipeline_file.exists() else None
        new = self.definition()
        report.steps = changed_steps(old, new)
        self.pipeline_file.parent.mkdir(parents=True, exist_ok=True)
        self.pipeline_file.write_text(json.dumps(new, indent=2))
        return report

    def upserted(self) -> dict:
        if not self.pipeline_file.exists():
            name = self.cfg.pipeline.name
            raise ExecutionNotFound(f"no local pipeline {name} yet: run `trainium-pipeline run --local`")
        return json.loads(self.pipeline_file.read_text())

    def run(
        self,
        parameters: dict[str, str],
        *,
        use_cache: bool = True,
        on_update: Callable[[Execution], None] | None = None,
    ) -> Execution:
        """Execute the upserted pipeline definition end to end on this machine."""
        if Path(self.cfg.training.model_id).is_dir() and not _is_hub_dataset(self.cfg.data.source):
            for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # nothing to fetch: never wait on the network
                os.environ.setdefault(var, "1")
        runner = LocalRunner(
            self.upserted(),
            self.cfg.pipeline.name,
            self.root,
            processes=self.cfg.local.processes,
            use_cache=use_cache,
            register=self.register_step,
            invoke_lambda=self.invoke_lambda,
            on_update=on_update,
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
        _, group, number = inputs["model_package_arn"].rsplit("/", 2)
        try:
            return self.deploy(self.registry.get(group, int(number)), inputs.get("endpoint_name"))
        except DeployRefused as refused:
            raise StepFailed(str(refused)) from None

    def deploy(self, version: ModelVersion, endpoint: str | None = None) -> dict:
        """Serve `version` on the local endpoint (created or updated); refuses anything not Approved."""
        endpoint = endpoint or self.cfg.deploy.endpoint_name
        if version.status != APPROVED:
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

    def find(self, execution_id: str | None) -> Execution:
        """The latest execution, or the one with this id or ARN."""
        chosen = next((e for e in self.executions() if execution_id in (None, e.id, e.arn)), None)
        if chosen is None:
            raise ExecutionNotFound(f"no local execution {execution_id}" if execution_id else "no local executions yet")
        return chosen

    def ran_definition(self, execution: Execution) -> dict:
        """The definition `execution` ran (saved beside its record)."""
        path = self.root / "executions" / execution.pipeline / execution.id / DEFINITION_FILE
        if not path.exists():
            raise ExecutionNotFound(f"local execution {execution.id} has no {DEFINITION_FILE} (an older runner's)")
        return json.loads(path.read_text())
