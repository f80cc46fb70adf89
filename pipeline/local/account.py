"""The lifecycle's account on this machine (steps/deploy/lifecycle.py's `Account`): the SQLite registry, the staging and
production endpoints as detached local endpoints on their own ports (local.staging_port, local.port), the alerts file.

Nothing here is ever busy: a deploy returns once the endpoint serves the new version (swapped in place, see
pipeline.local.endpoint.process), so the lifecycle tests a staging version at once. There is no scaling locally.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.config import Config
from pipeline.local.endpoint import (
    EndpointStartError,
    append_alert,
    count_restart,
    read_state,
    restarts,
    start_background,
    supervisor,
)
from pipeline.local.registry import ModelNotFoundError, ModelVersion, Registry
from pipeline.local.storage import Layout
from steps.contract import APPROVED
from steps.deploy import endpoint_check, lifecycle

NO_SCALING = "none (local)"


def endpoint_url(state: dict) -> str:
    return state.get("url") or f"http://{state.get('host', '127.0.0.1')}:{state['port']}"


def runtime_client(url: str) -> Any:
    """The stock boto3 `sagemaker-runtime` client pointed at a local endpoint (placeholder credentials: it signs)."""
    import boto3
    from botocore.config import Config as BotoConfig

    return boto3.client("sagemaker-runtime", endpoint_url=url, region_name="us-east-1", aws_access_key_id="local",
                        aws_secret_access_key="local", aws_session_token=None,
                        config=BotoConfig(read_timeout=70, retries={"max_attempts": 1, "mode": "standard"}))


class LocalAccount:
    """lifecycle.Account on the local registry, endpoints and alerts file of one local root."""

    def __init__(self, cfg: Config, layout: Layout, registry: Registry) -> None:
        self.layout, self.registry, self.group = layout, registry, cfg.pipeline.model_package_group
        deploy = cfg.deploy
        self.names = {lifecycle.STAGING: deploy.staging_endpoint_name, lifecycle.PRODUCTION: deploy.endpoint_name}
        self.ports = {lifecycle.STAGING: cfg.local.staging_port, lifecycle.PRODUCTION: cfg.local.port}
        self.raised: list[str] = []  # the alerts of this process, for the CLI to print

    @staticmethod
    def _version(found: ModelVersion) -> Any:
        return lifecycle.Version(found.version, found.status, dict(found.customer_metadata), found.arn)

    def approved(self) -> list:
        return [self._version(v) for v in self.registry.list(self.group, status=APPROVED)]

    def version(self, number: int) -> Any:
        try:
            return self._version(self.registry.get(self.group, number))
        except ModelNotFoundError:
            return None

    def set_metadata(self, version: Any, values: dict[str, str]) -> None:
        self.registry.update_metadata(self.group, version.number, values)

    def state(self, stage: str) -> dict | None:
        state = read_state(self.layout.endpoint_state(self.names[stage]))
        return state if state and state.get("running") else None

    def endpoint(self, stage: str) -> Any:
        state = self.state(stage)
        if state is None:
            return lifecycle.Endpoint(self.names[stage])
        version = int(state["version"]) if str(state.get("version") or "").isdigit() else None
        return lifecycle.Endpoint(self.names[stage], version, "InService", 1, endpoint_url(state))

    def recover(self) -> list[dict[str, Any]]:
        """Before a lifecycle action: stop the endpoint processes no state file records (left by a command killed
        midway) and restart an endpoint whose process died; an alert for each."""
        folder, outcomes = self.layout.endpoint_state(self.names[lifecycle.STAGING]).parent, []
        for line in supervisor.stop_strays(folder):
            outcomes.append(self._recovered("stray-stopped", line))
        for stage, name in self.names.items():
            state_file = self.layout.endpoint_state(name)
            dead = supervisor.died(state_file)
            if dead is None:
                continue
            what = f"{stage} {name}: the endpoint process (pid {dead['pid']}, version {dead.get('version')}) died"
            try:
                started = start_background(Path(dead["model_data"]), name, self.ports[stage], state_file,
                                           version=dead.get("version"), environment=self._environment(dead),
                                           alerts_file=self.layout.alerts)
            except (EndpointStartError, KeyError) as e:
                outcomes.append(self._recovered("restart-failed", f"{what}; restarting it failed: {e}"))
                continue
            count = count_restart(state_file)
            outcomes.append(self._recovered("restarted", f"{what}; restarted at {endpoint_url(started)} "
                                                         f"(restart {count})"))
        return outcomes

    def _environment(self, state: dict) -> dict[str, str]:
        """The container environment of the version an endpoint state names (none when it is not registered)."""
        try:
            return dict(self.registry.get(self.group, int(state.get("version")) or 0).environment)
        except (ModelNotFoundError, TypeError, ValueError):
            return {}

    def _recovered(self, action: str, line: str) -> dict[str, Any]:
        outcome = {"stage": "", "endpoint": "", "action": action, "version": None, "line": line}
        self.alert(line, outcome)
        return outcome

    def restarts(self, stage: str) -> int:
        return restarts(self.layout.endpoint_state(self.names[stage]))

    def deploy(self, stage: str, version: Any) -> dict[str, Any]:
        name, state = self.names[stage], self.state(stage)
        config = f"{name}-v{version.number}"
        if state is not None and str(state.get("version")) == str(version.number):
            return {"action": "unchanged", "endpoint_config_name": config, "url": endpoint_url(state)}
        found = self.registry.get(self.group, version.number)
        try:
            started = start_background(Path(found.model_data), name, self.ports[stage],
                                       self.layout.endpoint_state(name), version=str(version.number),
                                       environment=found.environment, alerts_file=self.layout.alerts)
        except EndpointStartError as e:
            raise lifecycle.DeployError(str(e)) from None
        finally:
            supervisor.stop_strays(self.layout.endpoint_state(name).parent)  # one process per endpoint once done
        return {"action": "updated" if state else "created", "endpoint_config_name": config,
                "url": endpoint_url(started)}

    def in_service(self, stage: str) -> str:
        return ""

    def test_seconds(self) -> float | None:
        return None  # the command waits for its verdict

    def runtime(self, stage: str) -> Any:
        state = self.state(stage)
        return runtime_client(endpoint_url(state) if state else f"http://127.0.0.1:{self.ports[stage]}")

    def sample(self, version: Any) -> list[dict[str, Any]]:
        found = self.registry.get(self.group, version.number)
        if not found.metrics_source:
            raise endpoint_check.SampleError(f"version {version.number} has no evaluation report")
        path = Path(found.metrics_source).parent / endpoint_check.SAMPLE_FILE
        if not path.is_file():
            raise endpoint_check.SampleError(f"{path}: not found")
        with path.open(encoding="utf-8") as lines:
            return endpoint_check.read_sample(lines, str(path))

    def expected(self, version: Any) -> dict[str, Any]:
        found = self.registry.get(self.group, version.number)
        return endpoint_check.expectation(found.environment, found.metrics)

    def alert(self, line: str, detail: dict[str, Any]) -> None:
        """Appended to <local root>/alerts.jsonl: {"time", "line", "detail"}; printed by the CLI."""
        self.raised.append(line)
        append_alert(self.layout.alerts, line, detail)
