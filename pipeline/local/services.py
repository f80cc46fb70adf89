"""What the pipeline's steps and the lifecycle commands call in an AWS account, played on this machine:
CreateModelPackage into the SQLite registry, the deploy Lambda (steps/deploy/handler.py, the same code), and the
lifecycle of steps/deploy/lifecycle.py (approve, reject, promote, deploy) on the local account (pipeline.local.account).

Every lifecycle action holds an exclusive lock on the local root (endpoints/lifecycle.lock), so concurrent commands
(`models approve 2 --local & models approve 3 --local`) end as some serial order of them would.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pipeline.config import Config
from pipeline.config.deploy_settings import policy
from pipeline.errors import UserError
from pipeline.local.account import LocalAccount
from pipeline.local.jobs import StepFailed
from pipeline.local.registry import Registry
from pipeline.local.storage import Layout
from pipeline.tracking.store import local_uri, tag_version
from steps.contract import APPROVED, PENDING, RUN_ID_METADATA
from steps.deploy import handler as deploy_handler
from steps.deploy import lifecycle


class DeployRefused(UserError, ValueError):
    """A lifecycle request that cannot be done (a version not Approved, not tested, a failed deploy): one line."""


class LocalServices:
    """The local account's model registry, deploy function, lifecycle and endpoints."""

    def __init__(self, cfg: Config, layout: Layout, registry: Registry) -> None:
        self.layout = layout
        self.s3 = layout.s3
        self.registry = registry
        self.group = cfg.pipeline.model_package_group
        self.deploy_function = cfg.deploy.lambda_function_name
        self.account = LocalAccount(cfg, layout, registry)
        self.policy = policy(cfg)
        self.step_lines: list[str] = []  # what the Deploy steps of this process did, for the run's summary

    @contextmanager
    def lock(self) -> Iterator[None]:
        """One lifecycle action at a time on this local root (an exclusive flock, released if the process dies)."""
        path = self.layout.lifecycle_lock
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

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
            response_types=spec.get("SupportedResponseMIMETypes", []),
            inference_instances=spec.get("SupportedRealtimeInferenceInstanceTypes", []),
            description=args.get("ModelPackageDescription", ""),
            environment=container.get("Environment"),
        )
        warning = tag_version(local_uri(self.layout.root), version.customer_metadata.get(RUN_ID_METADATA, ""),
                              version.version, version.arn)
        if warning:
            self.step_lines.append(warning)
        return {"ModelPackageArn": version.arn, "ModelPackageVersion": version.version}

    def invoke_lambda(self, function_arn: str, inputs: dict) -> dict:
        """Lambda steps: the deploy function is ours (its own `step`, here on the local account); any other function
        cannot run locally. Returns the step's output parameters."""
        if function_arn.rsplit(":", 1)[-1] != self.deploy_function:
            raise StepFailed(f"Lambda function {function_arn} has no local implementation")
        try:
            with self.lock():
                self.step_lines += [o["line"] for o in self.account.recover()]
                done = deploy_handler.step(self.account, self.policy, inputs["model_package_arn"])
        except (lifecycle.Refused, lifecycle.DeployError) as refused:
            raise StepFailed(str(refused)) from None
        self.step_lines += [o["line"] for o in done["outcomes"]]
        where = next((o.get("where", "") for o in done["outcomes"] if o.get("endpoint_config_name")), "")
        return {"action": done["action"], "endpoint_config_name": done["endpoint_config_name"],
                "endpoint_name": done["endpoint_name"], "url": where}

    def _run(self, action: Callable[[Any], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        with self.lock():
            recovered = self.account.recover()
            try:
                return recovered + action(lifecycle.Lifecycle(self.account, self.policy))
            except lifecycle.Refused as e:
                raise DeployRefused(str(e)) from None

    def set_status(self, number: int, status: str, note: str) -> tuple[Any, list[dict[str, Any]]]:
        """Approve (staging deploys and tests it), reject or reset a version (a rollback where it served), under the
        lock: the registry change and what follows from it are one step."""
        changed: list = []

        def change(life: Any) -> list[dict[str, Any]]:
            changed.append(self.registry.set_status(self.group, number, status, note))
            return life.reconcile(lifecycle.STAGING) if status == APPROVED else life.on_change()

        outcomes = self._run(change)
        return changed[0], outcomes

    def promote(self, number: int) -> list[dict[str, Any]]:
        return self._run(lambda life: life.promote(number))

    def deploy(self, number: int) -> list[dict[str, Any]]:
        """`deploy N`: to staging, tested there (then promoted if deploy.auto_promote)."""
        return self._run(lambda life: life.deploy(number))

    def recover(self) -> list[dict[str, Any]]:
        """Stop stray endpoint processes and restart dead endpoints (see LocalAccount.recover), under the lock."""
        with self.lock():
            return self.account.recover()

    def endpoint(self, stage: str) -> Any:
        return self.account.endpoint(stage)

    def endpoint_state(self, endpoint: str | None = None) -> dict | None:
        """The state of a stage's endpoint process (default production), or None when it does not run."""
        stage = lifecycle.STAGING if endpoint == self.account.names[lifecycle.STAGING] else lifecycle.PRODUCTION
        return self.account.state(stage)
