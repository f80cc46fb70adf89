"""Execute a SageMaker pipeline definition JSON on this machine, step by step, as SageMaker would."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipeline.dag.expressions import Context, ExpressionError, condition, evaluate, json_file_loader
from pipeline.dag.graph import StepGraph
from pipeline.dag.parameters import resolve
from pipeline.errors import UserError
from pipeline.local.jobs import StepFailed, run_processing, run_training
from pipeline.local.storage import LocalS3

MASK = "<execution>"
DEFINITION_FILE = "definition.json"  # beside execution.json: the definition the execution ran


class ExecutionNotFound(UserError, LookupError):
    """No local execution with that id."""


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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)

    @classmethod
    def load(cls, path: Path) -> Execution:
        data = json.loads(path.read_text())
        data["steps"] = {k: StepRecord(**v) for k, v in data["steps"].items()}
        return cls(**data)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class LocalRunner:
    """Runs one definition. Register and Lambda steps are delegated to `register` and `invoke_lambda`."""

    def __init__(
        self,
        definition: dict,
        pipeline_name: str,
        root: Path,
        *,
        processes: int = 2,
        use_cache: bool = True,
        register: Callable[[str, dict], dict] | None = None,
        invoke_lambda: Callable[[str, dict], dict] | None = None,
        on_update: Callable[[Execution], None] | None = None,
    ) -> None:
        self.definition = definition
        self.graph = StepGraph(definition)
        self.pipeline = pipeline_name
        self.root = Path(root).resolve()
        self.s3 = LocalS3(self.root)
        self.processes = processes
        self.use_cache = use_cache
        self.register = register
        self.invoke_lambda = invoke_lambda
        self.on_update = on_update or (lambda execution: None)

    # records
    def executions_dir(self) -> Path:
        return self.root / "executions" / self.pipeline

    def _save(self, execution: Execution) -> None:
        folder = self.executions_dir() / execution.id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "execution.json").write_text(execution.to_json())

    # run
    def run(self, overrides: dict[str, str] | None = None, execution_id: str | None = None) -> Execution:
        """Run every step in dependency order; return the finished (or stopped) execution record."""
        parameters = resolve(self.definition, overrides or {})
        execution_id = execution_id or f"{datetime.now():%Y%m%d%H%M%S}-{secrets.token_hex(3)}"
        arn = f"arn:aws:sagemaker:local:000000000000:pipeline/{self.pipeline.lower()}/execution/{execution_id}"
        execution = Execution(
            id=execution_id,
            arn=arn,
            pipeline=self.pipeline,
            status="Executing",
            started=_now(),
            parameters=parameters,
            steps={n: StepRecord(n, self.graph.steps[n]["Type"]) for n in self.graph.order},
        )
        variables = {
            "PipelineExecutionId": execution_id,
            "PipelineExecutionArn": arn,
            "PipelineName": self.pipeline,
            "PipelineExecutionDisplayName": execution_id,
            "ExecutionStartTime": execution.started,
            "CurrentDateTime": execution.started,
        }
        ctx = Context(parameters=parameters, execution=variables)
        masked = Context(
            parameters=parameters, execution={**variables, "PipelineExecutionId": MASK, "PipelineExecutionArn": MASK}
        )
        outcomes: dict[str, str] = {}
        self._save(execution)
        (self.executions_dir() / execution.id / DEFINITION_FILE).write_text(json.dumps(self.definition, indent=2))
        try:
            for name in self.graph.order:
                record = execution.steps[name]
                self._run_step(name, record, execution, ctx, masked, outcomes)
                masked.properties, masked.property_files = ctx.properties, ctx.property_files
                self._save(execution)
                self.on_update(execution)
            failed = [r for r in execution.steps.values() if r.status == "Failed"]
            execution.status = "Failed" if failed else "Succeeded"
            execution.failure_reason = f"step {failed[0].name} failed: {failed[0].reason}" if failed else ""
        except KeyboardInterrupt:
            execution.status = "Stopped"
            execution.failure_reason = "stopped by the user (Ctrl-C)"
            for record in execution.steps.values():
                if record.status in ("Executing", "Pending"):
                    record.status = "Stopped" if record.status == "Executing" else "NotStarted"
        finally:
            execution.ended = _now()
            self._save(execution)
            self.on_update(execution)
        return execution

    def _run_step(
        self,
        name: str,
        record: StepRecord,
        execution: Execution,
        ctx: Context,
        masked: Context,
        outcomes: dict[str, str],
    ) -> None:
        step = self.graph.steps[name]
        statuses = {d: execution.steps[d].status for d in self.graph.depends[name]}
        if any(s in ("Failed", "NotStarted", "Stopped") for s in statuses.values()):
            record.status, record.reason = "NotStarted", "an upstream step did not succeed"
            return
        branch = self.graph.branch_of.get(name)
        if branch and outcomes.get(branch[0]) != branch[1]:
            record.status, record.reason = "Skipped", f"{branch[0]} took the other branch"
            return
        if any(s == "Skipped" for s in statuses.values()):
            record.status, record.reason = "Skipped", "an upstream step was skipped"
            return
        record.status, record.started = "Executing", _now()
        started = time.monotonic()
        folder = self.executions_dir() / execution.id / name
        folder.mkdir(parents=True, exist_ok=True)
        record.log = str(folder.parent / f"{name}.log")
        self._save(execution)
        self.on_update(execution)
        try:
            record.properties = self._execute(name, step, folder, ctx, masked, outcomes, record)
            record.status = "Succeeded"
        except (StepFailed, ExpressionError, FileNotFoundError, ValueError) as failure:
            record.status, record.reason = "Failed", str(failure)
        finally:
            record.ended, record.seconds = _now(), round(time.monotonic() - started, 2)
        if record.status == "Succeeded":
            ctx.properties[name] = record.properties
            for declared in step.get("PropertyFiles", []):
                output = record.properties["ProcessingOutputConfig"]["Outputs"][declared["OutputName"]]
                path = self.s3.path(output["S3Output"]["S3Uri"]) / declared["FilePath"]
                ctx.property_files[(name, declared["PropertyFileName"])] = json_file_loader(path)

    def _execute(
        self,
        name: str,
        step: dict,
        folder: Path,
        ctx: Context,
        masked: Context,
        outcomes: dict[str, str],
        record: StepRecord,
    ) -> dict:
        kind, where = step["Type"], f"step {name}"
        if kind == "Condition":
            passed = all(condition(c, ctx, where) for c in step["Arguments"].get("Conditions", []))
            outcomes[name] = "IfSteps" if passed else "ElseSteps"
            record.reason = f"condition {'met' if passed else 'not met'}"
            return {"Outcome": str(passed).lower()}
        if kind == "Fail":
            raise StepFailed(str(evaluate(step["Arguments"].get("ErrorMessage", ""), ctx, where)))
        args = evaluate(step.get("Arguments", {}), ctx, where)
        if kind == "RegisterModel":
            if self.register is None:
                raise StepFailed("no local model registry configured")
            return self.register(name, args)
        if kind == "Lambda":
            if self.invoke_lambda is None:
                raise StepFailed("no local Lambda handlers configured")
            return {"OutputParameters": self.invoke_lambda(step["FunctionArn"], args)}
        if kind not in ("Processing", "Training"):
            raise ExpressionError(f"{where}: step type {kind!r} is not supported by the local runner")
        key = self._cache_key(step, evaluate(step.get("Arguments", {}), masked, where), args)
        cached = self._cache_get(key, step)
        if cached is not None:
            record.cached = True
            return cached
        job = f"{name.lower()}-{record.started[:19].replace(':', '').replace('-', '')}-{secrets.token_hex(2)}"
        with open(record.log, "w") as log:
            if kind == "Processing":
                properties = run_processing(job, args, folder, self.s3, log)
            else:
                properties = run_training(job, args, folder, self.s3, log, self.processes)
        self._cache_put(key, step, properties)
        return properties

    # caching, like SageMaker's: same resolved arguments (outputs aside) and same input contents
    def _cache_key(self, step: dict, masked_args: dict, args: dict) -> str | None:
        if not (self.use_cache and step.get("CacheConfig", {}).get("Enabled")):
            return None
        inputs = [i["S3Input"]["S3Uri"] for i in args.get("ProcessingInputs", []) if "S3Input" in i]
        inputs += [c["DataSource"]["S3DataSource"]["S3Uri"] for c in args.get("InputDataConfig", [])]
        submit = json.loads(str(args.get("HyperParameters", {}).get("sagemaker_submit_directory", '""')))
        inputs += [submit] if submit.startswith("s3://") else []
        digest = hashlib.sha256(json.dumps([step["Type"], masked_args], sort_keys=True).encode())
        for uri in inputs:
            digest.update(uri.encode() + self.s3.digest(uri).encode())
        return digest.hexdigest()

    def _cache_file(self, key: str) -> Path:
        return self.root / "cache" / self.pipeline / f"{key}.json"

    def _cache_get(self, key: str | None, step: dict) -> dict | None:
        if key is None or not self._cache_file(key).exists():
            return None
        properties = json.loads(self._cache_file(key).read_text())
        outputs = [
            o["S3Output"]["S3Uri"] for o in properties.get("ProcessingOutputConfig", {}).get("Outputs", {}).values()
        ]
        outputs += [properties["ModelArtifacts"]["S3ModelArtifacts"]] if "ModelArtifacts" in properties else []
        return properties if all(self.s3.path(uri).exists() for uri in outputs) else None

    def _cache_put(self, key: str | None, step: dict, properties: dict) -> None:
        if key is not None:
            self._cache_file(key).parent.mkdir(parents=True, exist_ok=True)
            self._cache_file(key).write_text(json.dumps(properties, indent=2))
