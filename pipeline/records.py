"""What the backends return and the views show: executions, steps, model versions, deployments.

Both backends speak in these records, so that one view shows either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from steps import contract


@dataclass
class StepView:
    name: str
    status: str
    type: str = ""
    started: str = ""
    seconds: float | None = None
    note: str = ""  # failure reason, "cache hit", condition outcome
    details: dict = field(default_factory=dict)  # SageMaker's step Metadata, or the local step's properties
    attempts: int = 0  # the step's current attempt (0: it did not run in this execution)
    reused_from: str = ""  # a selective execution took this step's outputs from that execution


@dataclass
class ExecutionView:
    id: str
    arn: str
    pipeline: str
    status: str
    started: str = ""
    ended: str = ""
    steps: list[StepView] | None = None  # None: the endpoint cannot list them (moto)
    parameters: dict[str, str] = field(default_factory=dict)
    failure_reason: str = ""
    display_name: str = ""
    selective_from: str = ""  # a selective execution: the execution its unselected steps' outputs come from
    selected_steps: list[str] = field(default_factory=list)
    retries: int = 0  # times it was retried, where known (locally); on SageMaker see the steps' attempts


@dataclass
class VersionView:
    version: int
    status: str
    accuracy: float | str | None
    created: str
    note: str = ""
    arn: str = ""


@dataclass
class Deployment:
    endpoint: str
    action: str  # created | updated | unchanged | in progress
    where: str  # the local URL, or the endpoint config on SageMaker


@dataclass
class Changes:
    """What a lifecycle command did and decided, one line each (alerts included); the first failed deploy."""

    lines: list[str] = field(default_factory=list)
    failure: str = ""


def changes(outcomes: list[dict]) -> Changes:
    """The lines of steps/deploy/lifecycle.py's outcomes."""
    failed = [o["line"] for o in outcomes if o.get("action") == "deploy-failed"]
    return Changes([o["line"] for o in outcomes], failed[0] if failed else "")


@dataclass
class StageView:
    """One endpoint of the lifecycle, for `endpoints`."""

    stage: str  # staging | production
    endpoint: str
    version: int | None
    status: str  # InService, Updating, ... ; "absent" when there is none
    instances: str
    scaling: str
    test: str  # the last staging test of the version it serves
    where: str = ""  # the local URL, or the endpoint config


@dataclass
class Approval:
    version: VersionView
    changes: Changes = field(default_factory=Changes)  # what the lifecycle did (staging deploy, test, rollback)


@dataclass
class Upserted:
    action: str  # created | updated
    pipeline_arn: str
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    deploy_function: str = ""
    steps: dict[str, list[str]] = field(default_factory=dict)  # added / removed / changed


@dataclass
class RunSummary:
    """What a finished run tells its user: the gate's accuracy, the failures, the new version, the endpoint."""

    execution: ExecutionView
    accuracy: float | None = None
    threshold: Any = None
    failures: list[tuple[str, str, list[str]]] = field(default_factory=list)  # step, reason, last log lines
    registered: VersionView | None = None
    group: str = ""
    deployment: Deployment | None = None
    artifacts: str = ""
    approve_hint: str = ""
    lifecycle: list[str] = field(default_factory=list)  # what the Deploy step did on staging and production
    plot: str = ""  # the summary PNG (loss, throughput, confusion matrix), where one was written


OnUpdate = Callable[[ExecutionView], None]


def run_summary(
    execution: ExecutionView,
    *,
    report: dict | None,
    registered: VersionView | None,
    group: str,
    deployed: dict[str, str] | None,
    endpoint: str,
    artifacts: str,
    local: bool,
    log_tail: Callable[[str], list[str]] = lambda step: [],
) -> RunSummary:
    """The summary of a finished run, from what its backend found: the evaluation `report` (its accuracy is what
    the gate read), the `registered` version of `group`, the Deploy step's outputs (`deployed`: the staging endpoint it
    names, else `endpoint`), where its artifacts are, and the last log lines of a failed step."""
    summary = RunSummary(execution, contract.report_accuracy(report), artifacts=artifacts)
    summary.threshold = execution.parameters.get(contract.ACCURACY_THRESHOLD)
    summary.failures = [(s.name, s.note, log_tail(s.name)) for s in execution.steps or [] if s.status == "Failed"]
    if registered:
        summary.registered, summary.group = registered, group
        if registered.status != contract.APPROVED:
            summary.approve_hint = f"trainium-pipeline models approve {registered.version}" + (" --local" * local)
    if deployed is not None:
        where = deployed.get("url") or deployed.get("endpoint_config_name", "")
        summary.deployment = Deployment(deployed.get("endpoint_name") or endpoint, deployed.get("action", ""), where)
    return summary
