"""A local execution: its record (`execution.json`, what `status --local` shows) and its state while it runs."""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipeline.dag.expressions import Context, json_file_loader
from pipeline.dag.graph import StepGraph
from pipeline.errors import UserError
from pipeline.local.orphans import Owner, stop_owned
from pipeline.local.storage import LOCAL_ARN, RECORD_FILE, LocalS3
from pipeline.records import ExecutionView, StepView

UNFINISHED = ("Failed", "NotStarted", "Stopped")  # a step after one of these does not start


class ExecutionNotFound(UserError, LookupError):
    """No local execution with that id."""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class StepRecord:
    name: str
    type: str
    status: str = "Pending"
    started: str = ""
    ended: str = ""
    seconds: float = 0.0
    reason: str = ""
    cached: bool = False
    log: str = ""
    properties: dict = field(default_factory=dict)
    attempts: int = 0  # times it started in this execution (a retry runs a failed step again)
    reused_from: str = ""  # a selective run took its outputs from this execution

    def view(self) -> StepView:
        seconds = self.seconds if self.started else None
        note = "cache hit" if self.cached else self.reason
        return StepView(self.name, self.status, self.type, self.started, seconds, note, self.properties,
                        attempts=self.attempts, reused_from=self.reused_from)


@dataclass
class Execution:
    id: str
    arn: str
    pipeline: str
    status: str
    started: str
    parameters: dict[str, Any]
    steps: dict[str, StepRecord]
    ended: str = ""
    failure_reason: str = ""
    selective_from: str = ""  # a selective run: the execution the unselected steps' outputs come from
    selected_steps: list[str] = field(default_factory=list)
    retries: int = 0  # times `retry` ran it again
    owner_pid: int = 0  # the process running it, by pid, start time and host (see pipeline.local.orphans)
    owner_started: float = 0.0
    owner_host: str = ""

    @classmethod
    def new(cls, pipeline: str, parameters: dict[str, Any], steps: dict[str, str]) -> Execution:
        """A new execution of `pipeline` with these parameter values; `steps`: name -> type, in run order."""
        execution_id = f"{datetime.now():%Y%m%d%H%M%S}-{secrets.token_hex(3)}"
        owner = Owner.current()
        return cls(
            id=execution_id,
            arn=f"{LOCAL_ARN}:pipeline/{pipeline.lower()}/execution/{execution_id}",
            pipeline=pipeline,
            status="Executing",
            started=now(),
            parameters=parameters,
            steps={name: StepRecord(name, kind) for name, kind in steps.items()},
            owner_pid=owner.pid,
            owner_started=owner.started,
            owner_host=owner.host,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / RECORD_FILE).write_text(self.to_json())

    @classmethod
    def load(cls, path: Path) -> Execution:
        data = json.loads(path.read_text())
        data["steps"] = {k: StepRecord(**v) for k, v in data["steps"].items()}
        return cls(**data)

    def reap(self) -> bool:
        """Fail an execution left `Executing` by a process that is gone (killed, crashed), with the reason, and stop
        what is left of its jobs. True when it did (the caller saves the record)."""
        owner = Owner(self.owner_pid, self.owner_started, self.owner_host)
        if self.status != "Executing" or not self.owner_pid or owner.alive():
            return False
        left = stop_owned(owner)
        self.status, self.ended = "Failed", self.ended or now()
        self.failure_reason = (f"the command running it (pid {owner.pid}) ended without finishing it (killed?); "
                               f"{left} process(es) of its jobs were left and have been stopped")
        for record in self.steps.values():
            if record.status == "Executing":
                record.status, record.reason, record.ended = "Failed", self.failure_reason, record.ended or now()
            elif record.status == "Pending":
                record.status = "NotStarted"
        return True

    def view(self) -> ExecutionView:
        return ExecutionView(
            id=self.id,
            arn=self.arn,
            pipeline=self.pipeline,
            status=self.status,
            started=self.started,
            ended=self.ended,
            steps=[record.view() for record in self.steps.values()],
            parameters={k: str(v) for k, v in self.parameters.items()},
            failure_reason=self.failure_reason,
            selective_from=self.selective_from,
            selected_steps=list(self.selected_steps),
            retries=self.retries,
        )


class ExecutionState:
    """What one run knows as it goes: its record, what expressions see, and which branch each condition took."""

    def __init__(self, execution: Execution, graph: StepGraph, s3: LocalS3) -> None:
        self.execution = execution
        self.graph = graph
        self.s3 = s3
        variables = {
            "PipelineExecutionId": execution.id,
            "PipelineExecutionArn": execution.arn,
            "PipelineName": execution.pipeline,
            "PipelineArn": execution.arn.rsplit("/execution/", 1)[0],  # lowercased, as SageMaker's ARNs
            "PipelineExecutionDisplayName": execution.id,
            "StartDateTime": execution.started,
            "CurrentDateTime": now,  # read when used; TrainingJobName / ProcessingJobName: inside a job step
        }
        self.context = Context(parameters=execution.parameters, execution=variables)
        self.outcomes: dict[str, str] = {}  # condition step -> "IfSteps" | "ElseSteps"
        self.ended_at: str | None = None  # the FailStep that ended the execution
        self.running_then: set[str] = set()  # the steps that could run beside it (they finish, as on SageMaker)

    def record(self, name: str) -> StepRecord:
        return self.execution.steps[name]

    def fail_step_ended(self, name: str) -> None:
        """FailStep `name` ended the execution: SageMaker lets the steps running beside it finish and starts no other.
        Steps run here one by one, so those whose upstream steps had all ended count as running beside it."""
        self.ended_at = name
        self.running_then = {n for n, r in self.execution.steps.items() if r.status == "Pending"
                             and all(self.record(d).status != "Pending" for d in self.graph.depends[n])}

    def blocked(self, name: str) -> tuple[str, str] | None:
        """(status, reason) when step `name` must not run: an upstream step did not succeed or was skipped, or it
        is in the branch its condition did not take, or a FailStep ended the execution before it could start."""
        upstream = {self.record(d).status for d in self.graph.depends[name]}
        if upstream & set(UNFINISHED):
            return "NotStarted", "an upstream step did not succeed"
        branch = self.graph.branch_of.get(name)
        if branch and self.outcomes.get(branch[0]) != branch[1]:
            return "Skipped", f"{branch[0]} took the other branch"
        if "Skipped" in upstream:
            return "Skipped", "an upstream step was skipped"
        if self.ended_at and name not in self.running_then:
            return "NotStarted", f"the FailStep {self.ended_at} ended the execution"
        return None

    def succeeded(self, name: str, properties: dict) -> None:
        """Step `name` succeeded with `properties`: later steps can read them, and its property files."""
        record = self.record(name)
        record.status, record.properties = "Succeeded", properties
        self.context.properties[name] = properties
        for declared in self.graph.steps[name].get("PropertyFiles", []):
            output = properties["ProcessingOutputConfig"]["Outputs"][declared["OutputName"]]
            path = self.s3.path(output["S3Output"]["S3Uri"]) / declared["FilePath"]
            self.context.property_files[(name, declared["PropertyFileName"])] = json_file_loader(path)

    def restore(self, name: str, earlier: StepRecord) -> None:
        """Step `name` succeeded before (in this execution, before a retry, or in the source of a selective run):
        later steps see its properties, property files and the branch it took, as if it had just run."""
        self.succeeded(name, earlier.properties)
        if self.record(name).type == "Condition":
            self.outcomes[name] = "IfSteps" if earlier.properties.get("Outcome") == "true" else "ElseSteps"

    def finish(self) -> None:
        failed = [r for r in self.execution.steps.values() if r.status == "Failed"]
        self.execution.status = "Failed" if failed else "Succeeded"
        self.execution.failure_reason = f"step {failed[0].name} failed: {failed[0].reason}" if failed else ""

    def stop(self, reason: str = "") -> None:
        """Stopped by the user: the running step is Stopped, the ones that had not started never will."""
        self.execution.status = "Stopped"
        self.execution.failure_reason = reason or "stopped by the user (Ctrl-C)"
        for record in self.execution.steps.values():
            if record.status in ("Executing", "Pending"):
                record.status = "Stopped" if record.status == "Executing" else "NotStarted"
