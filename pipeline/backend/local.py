"""The pipeline on this machine: the local runner, registry and endpoint behind the Backend interface."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline import contract
from pipeline.config import Config
from pipeline.cost import ExecutionCost, local_costs
from pipeline.dag.parameters import resolve
from pipeline.local.registry import ModelVersion
from pipeline.local.runner import Execution
from pipeline.local.session import LocalAccount
from pipeline.records import (
    Approval,
    Deployment,
    ExecutionView,
    OnUpdate,
    RunSummary,
    StepView,
    Upserted,
    VersionView,
)

LOG_TAIL = 15


def execution_view(execution: Execution) -> ExecutionView:
    steps = [
        StepView(
            name=r.name,
            status=r.status,
            type=r.type,
            started=r.started,
            seconds=r.seconds if r.started else None,
            note="cache hit" if r.cached else r.reason,
            details=r.properties,
        )
        for r in execution.steps.values()
    ]
    return ExecutionView(
        id=execution.id,
        arn=execution.arn,
        pipeline=execution.pipeline,
        status=execution.status,
        started=execution.started,
        ended=execution.ended,
        steps=steps,
        parameters={k: str(v) for k, v in execution.parameters.items()},
        failure_reason=execution.failure_reason,
    )


def version_view(version: ModelVersion) -> VersionView:
    return VersionView(version.version, version.status, version.accuracy, version.created, version.note, version.arn)


class LocalBackend:
    """One local account (a folder, default local.root) holding the pipeline, its executions and registry."""

    def __init__(self, cfg: Config, root: Path | None = None) -> None:
        self.account = LocalAccount(cfg, root)
        self.cfg = self.account.cfg

    def check(self, parameters: dict[str, str]) -> None:
        resolve(self.account.definition(), parameters)

    def upsert(self) -> Upserted:
        return self.account.upsert()

    def start(
        self, parameters: dict[str, str], *, wait: bool, use_cache: bool, on_update: OnUpdate, poll: float = 0.0
    ) -> ExecutionView:
        """Run the upserted pipeline on this machine (always to its end: `wait` changes nothing)."""
        execution = self.account.run(
            parameters, use_cache=use_cache, on_update=lambda e: on_update(execution_view(e))
        )
        return execution_view(execution)

    def execution(self, execution: str | None) -> ExecutionView:
        return execution_view(self.account.find(execution))

    def executions(self, limit: int) -> list[ExecutionView]:
        return [execution_view(e) for e in self.account.executions()[:limit]]

    def summary(self, execution: ExecutionView) -> RunSummary:
        steps = {s.name: s for s in execution.steps or []}
        summary = RunSummary(execution, threshold=execution.parameters.get(contract.ACCURACY_THRESHOLD))
        outputs = steps[contract.EVALUATE].details.get("ProcessingOutputConfig", {}).get("Outputs", {}) if (
            contract.EVALUATE in steps) else {}
        if contract.EVALUATION_OUTPUT in outputs:
            report = self.account.s3.path(outputs[contract.EVALUATION_OUTPUT]["S3Output"]["S3Uri"])
            if (report / contract.REPORT_FILE).exists():
                metrics = json.loads((report / contract.REPORT_FILE).read_text())["binary_classification_metrics"]
                summary.accuracy = metrics["accuracy"]["value"]
        record = self.account.find(execution.id)
        for step in (s for s in record.steps.values() if s.status == "Failed"):
            log = Path(step.log) if step.log else None
            lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL:] if log and log.exists() else []
            summary.failures.append((step.name, step.reason, lines))
        register = steps.get(contract.REGISTER)
        if register and register.status == "Succeeded":
            version = self.account.registry.get(self.account.group, register.details["ModelPackageVersion"])
            summary.registered, summary.group = version_view(version), self.account.group
            if version.status != contract.APPROVED:
                summary.approve_hint = f"trainium-pipeline models approve {version.version} --local"
        deploy = steps.get(contract.DEPLOY)
        if deploy and deploy.status == "Succeeded":
            outputs = deploy.details.get("OutputParameters", {})
            name = execution.parameters.get(contract.ENDPOINT_NAME, self.cfg.deploy.endpoint_name)
            summary.deployment = Deployment(name, outputs.get("action", ""), outputs.get("url", ""))
        summary.artifacts = str(self.account.root / "executions" / execution.pipeline / execution.id)
        return summary

    def versions(self, status: str | None) -> list[VersionView]:
        return [version_view(v) for v in self.account.registry.list(self.account.group, status=status)]

    def describe_version(self, version: int) -> dict:
        return self.account.registry.get(self.account.group, version).describe()

    def set_status(self, version: int, status: str, note: str) -> Approval:
        """Approving deploys at once, as the deploy-on-approval rule does on AWS."""
        changed = self.account.registry.set_status(self.account.group, version, status, note)
        deployment = self._deploy(changed) if status == contract.APPROVED else None
        return Approval(version_view(changed), deployment)

    def _deploy(self, version: ModelVersion) -> Deployment:
        result = self.account.deploy(version)
        return Deployment(self.cfg.deploy.endpoint_name, result["action"], result["url"])

    def deploy(self, version: int) -> Deployment:
        return self._deploy(self.account.registry.get(self.account.group, version))

    def cost(self, execution: str | None) -> ExecutionCost:
        return local_costs(self.account, execution, self.cfg.prices)
