"""Execute a SageMaker pipeline definition JSON on this machine, step by step, as SageMaker would.

One `ExecutionState` holds what a run knows as it goes; each step type has its executor in `EXECUTORS` (as the SDK's
own local pipeline executor has one class per step type). RegisterModel and Lambda steps call the account's services
(pipeline.local.services), processing and training jobs run under the container contract (pipeline.local.jobs).
A run can be selective (some steps run, the others' outputs come from a source execution's record) and a failed
run can be retried in place: its succeeded steps keep their outputs, the others run again (a new attempt each).
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Protocol

from pipeline.dag.expressions import Context, ExpressionError, condition, evaluate
from pipeline.dag.graph import StepGraph
from pipeline.dag.parameters import resolve
from pipeline.dag.selection import Selection
from pipeline.errors import UserError
from pipeline.local.cache import StepCache
from pipeline.local.execution import Execution, ExecutionState, StepRecord, now
from pipeline.local.jobs import StepFailed, run_processing, run_training
from pipeline.local.storage import DEFINITION_FILE, Layout, LocalS3
from steps import contract
from steps.tracking import DEFAULT_EXPERIMENT, settings


class StepServices(Protocol):
    """What RegisterModel and Lambda steps call: the account's model registry and its Lambda functions."""

    def register_model(self, args: dict) -> dict: ...

    def invoke_lambda(self, function_arn: str, inputs: dict) -> dict: ...


@dataclass
class StepRun:
    """One step of one execution, as its executor sees it."""

    runner: LocalRunner
    state: ExecutionState
    step: dict
    record: StepRecord
    folder: Path

    @property
    def where(self) -> str:
        return f"step {self.record.name}"

    def arguments(self, context: Context | None = None) -> dict:
        """The step's Arguments with every expression evaluated (against `context`, default the execution's)."""
        return evaluate(self.step.get("Arguments", {}), context or self.state.context, self.where)

    def services(self) -> StepServices:
        if self.runner.services is None:
            raise StepFailed(f"no local services for {self.record.type} steps configured")
        return self.runner.services


def condition_step(run: StepRun) -> dict:
    passed = all(condition(c, run.state.context, run.where) for c in run.step["Arguments"].get("Conditions", []))
    run.state.outcomes[run.record.name] = "IfSteps" if passed else "ElseSteps"
    run.record.reason = f"condition {'met' if passed else 'not met'}"
    return {"Outcome": str(passed).lower()}


def fail_step(run: StepRun) -> dict:
    raise StepFailed(str(evaluate(run.step["Arguments"].get("ErrorMessage", ""), run.state.context, run.where)))


def register_step(run: StepRun) -> dict:
    return run.services().register_model(run.arguments())


def lambda_step(run: StepRun) -> dict:
    return {"OutputParameters": run.services().invoke_lambda(run.step["FunctionArn"], run.arguments())}


def job_step(launch: Callable[[StepRun, str, dict, IO[str]], dict]) -> Callable[[StepRun], dict]:
    """The executor of a job step type: reuse a cached run, else launch the job with its log and cache it."""

    def execute(run: StepRun) -> dict:
        stamp = run.record.started[:19].replace(":", "").replace("-", "")
        job = f"{run.record.name.lower()}-{stamp}-{secrets.token_hex(2)}"
        job_variable = {"Processing": "ProcessingJobName", "Training": "TrainingJobName"}[run.record.type]
        args = run.arguments(replace(run.state.context, execution={**run.state.context.execution, job_variable: job}))
        cache = run.runner.cache
        key = cache.key(run.step, args)
        cached = cache.get(key, run.step)
        if cached is not None:
            run.record.cached = True
            return cached
        with open(run.record.log, "w") as log:
            properties = launch(run, job, run.runner.local_environment(args, run.state.execution.id), log)
        cache.put(key, properties)
        return properties

    return execute


def fresh(folder: Path) -> Path:
    """An empty working folder, as a new job container starts with (a retried step leaves nothing behind)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def processing_job(run: StepRun, job: str, args: dict, log: IO[str]) -> dict:
    return run_processing(job, args, fresh(run.folder), run.runner.s3, log)


def _files(folder: Path) -> set[tuple[str, int]]:
    return {(p.relative_to(folder).as_posix(), p.stat().st_size) for p in folder.rglob("*") if p.is_file()}


def training_job(run: StepRun, job: str, args: dict, log: IO[str]) -> dict:
    """A training job whose checkpoints (`CheckpointConfig.S3Uri`, one folder per training the step cache tells
    apart) survive a failed or stopped attempt, so that a retry resumes from them, and are deleted once the step
    succeeds: nothing is to resume from them then (a retry keeps a succeeded step; a new execution training the same
    thing is a cache hit, or with --no-cache starts afresh)."""
    s3, uri = run.runner.s3, args.get("CheckpointConfig", {}).get("S3Uri")
    left = run.folder / "opt_ml" / "checkpoints"  # run_training's copy, synced to `uri` when the job ends
    if uri and left.is_dir() and any(left.iterdir()):
        s3.upload(left, uri)  # an attempt killed before its sync: its checkpoints are the newest
    try:
        properties = run_training(job, args, fresh(run.folder), s3, log, run.runner.processes)
    finally:
        if not uri or (s3.path(uri).is_dir() and _files(s3.path(uri)) == _files(left)):
            shutil.rmtree(left, ignore_errors=True)  # the same files are in `uri`
    if uri:
        shutil.rmtree(s3.path(uri), ignore_errors=True)
    return properties


EXECUTORS: dict[str, Callable[[StepRun], dict]] = {  # step type -> its executor
    "Processing": job_step(processing_job),
    "Training": job_step(training_job),
    "Condition": condition_step,
    "Fail": fail_step,
    "RegisterModel": register_step,
    "Lambda": lambda_step,
}


class LocalRunner:
    """Runs one definition of pipeline `pipeline` in the local account at `root`."""

    def __init__(
        self,
        definition: dict,
        pipeline: str,
        root: Path,
        *,
        processes: int = 2,
        use_cache: bool = True,
        services: StepServices | None = None,
        on_update: Callable[[Execution], None] | None = None,
        tracking_uri: str | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri  # the local MLflow store, for the steps that the definition has track
        self.definition = definition
        self.graph = StepGraph(definition)
        self.pipeline = pipeline
        self.layout = Layout.at(root)
        self.s3: LocalS3 = self.layout.s3
        self.cache = StepCache(self.layout.cache(pipeline), self.s3, enabled=use_cache)
        self.processes = processes
        self.services = services
        self.on_update = on_update or (lambda execution: None)

    def local_environment(self, args: dict, execution: str) -> dict:
        """A job's arguments with this machine's MLflow store as its tracking URI and the execution to track, where
        the definition has the step track (it has a "tracking" input): a local run never logs to the configured
        server."""
        if not (self.tracking_uri and tracking_input(args)):
            return args
        environment = args.get("Environment") or {}
        return {**args, "Environment": {**environment, contract.TRACKING_URI_ENV: self.tracking_uri,
                                        contract.EXECUTION_ENV: execution}}

    def run(
        self, overrides: dict[str, str] | None = None, *, selection: Selection | None = None,
        source: Execution | None = None,
    ) -> Execution:
        """Run every step in dependency order, or only the `selection`'s steps with the outputs of its reused steps
        taken from the `source` execution's record; return the finished (or stopped) execution record."""
        parameters = resolve(self.definition, overrides or {})
        names = self.graph.order
        if selection is not None:
            names = [n for n in self.graph.order if n in {*selection.steps, *selection.reused}]
        steps = {name: self.graph.steps[name]["Type"] for name in names}
        state = ExecutionState(Execution.new(self.pipeline, parameters, steps), self.graph, self.s3)
        if selection is not None:
            names = state.execution.selected_steps = list(selection.steps)
            state.execution.selective_from = source.id if source else ""
            for name in selection.reused if source else ():
                state.restore(name, source.steps[name])
                state.record(name).reused_from = source.id
        folder = self.layout.execution(self.pipeline, state.execution.id)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / DEFINITION_FILE).write_text(json.dumps(self.definition, indent=2))
        return self._execute(state, names)

    def retry(self, execution: Execution) -> Execution:
        """Run `execution` again in place (its id, record and this, the definition it ran): the steps that
        succeeded keep their outputs, the others start again as a new attempt (a Train step resumes from its
        checkpoints, which are keyed by the execution id)."""
        state = ExecutionState(execution, self.graph, self.s3)
        again = []
        for name in self.graph.order:
            record = execution.steps.get(name)
            if record is None:  # not selected in a selective execution
                continue
            if record.status == "Succeeded":
                state.restore(name, record)
                continue
            again.append(name)
            record.attempts = record.attempts or int(bool(record.log))  # a record from before attempts were counted
            record.status, record.reason, record.cached, record.properties = "Pending", "", False, {}
            record.started = record.ended = ""
            record.seconds = 0.0
        execution.status, execution.failure_reason, execution.ended = "Executing", "", ""
        execution.retries += 1
        return self._execute(state, again)

    def _execute(self, state: ExecutionState, names: list[str]) -> Execution:
        folder = self.layout.execution(self.pipeline, state.execution.id)
        self._save(state)
        try:
            for name in names:
                self._run_step(state, name, folder / name)
                self._save(state)
            state.finish()
        except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM / SIGHUP (pipeline.errors.Terminated)
            state.stop(str(interrupt))
        finally:
            state.execution.ended = now()
            self._end_tracking(state.execution)
            self._save(state)
        return state.execution

    def _end_tracking(self, execution: Execution) -> None:
        """A failed or stopped execution's MLflow run ends FAILED or KILLED, if no step could end it."""
        if not self.tracking_uri or execution.status not in ("Failed", "Stopped"):
            return
        from pipeline.tracking.store import end_open_run

        for step in self.graph.steps.values():
            folder = tracking_input(step.get("Arguments", {}))
            if isinstance(folder, str):
                experiment = settings(str(self.s3.path(folder))).get("experiment") or DEFAULT_EXPERIMENT
                end_open_run(self.tracking_uri, experiment, execution.id,
                             "FAILED" if execution.status == "Failed" else "KILLED")
                return

    def _save(self, state: ExecutionState) -> None:
        state.execution.save(self.layout.execution(self.pipeline, state.execution.id))
        self.on_update(state.execution)

    def _run_step(self, state: ExecutionState, name: str, folder: Path) -> None:
        record = state.record(name)
        blocked = state.blocked(name)
        if blocked:
            record.status, record.reason = blocked
            return
        record.status, record.started = "Executing", now()
        record.attempts += 1
        attempt = f".attempt-{record.attempts}" if record.attempts > 1 else ""  # each attempt keeps its log
        record.log = str(folder.parent / f"{name}{attempt}.log")
        folder.mkdir(parents=True, exist_ok=True)
        self._save(state)
        executor = EXECUTORS.get(record.type)
        started = time.monotonic()
        try:
            if executor is None:
                raise ExpressionError(f"step {name}: step type {record.type!r} is not supported by the local runner")
            state.succeeded(name, executor(StepRun(self, state, self.graph.steps[name], record, folder)))
        except (StepFailed, UserError, FileNotFoundError, ValueError) as failure:
            record.status, record.reason = "Failed", str(failure)
            if record.type == "Fail":
                state.fail_step_ended(name)
        except Exception as e:  # the runner's own fault: the step fails with it, the execution still ends
            record.status, record.reason = "Failed", f"the local runner failed: {type(e).__name__}: {e}"
        finally:
            record.ended, record.seconds = now(), round(time.monotonic() - started, 2)


def tracking_input(args: dict) -> str | None:
    """The S3 folder of a job's "tracking" input (a training channel or a processing input), else None."""
    for channel in args.get("InputDataConfig") or []:
        if channel.get("ChannelName") == contract.TRACKING_INPUT:
            return channel.get("DataSource", {}).get("S3DataSource", {}).get("S3Uri")
    for given in args.get("ProcessingInputs") or []:
        if given.get("InputName") == contract.TRACKING_INPUT:
            return given.get("S3Input", {}).get("S3Uri")
    return None

