"""The pipeline on this machine behind the Backend protocol: the local runner, registry and endpoint."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.code import job_bundles
from pipeline.config import Config, check_parameter_values
from pipeline.config.tracking import tracking_settings
from pipeline.cost import ExecutionCost, stats_from_tarball
from pipeline.dag.graph import changed_steps
from pipeline.dag.parameters import ParameterError, resolve
from pipeline.dag.requests import check_job_steps
from pipeline.dag.selection import RERUN, Selection, Source, check_retry, inherit, select
from pipeline.errors import UserError
from pipeline.local.account import NO_SCALING, endpoint_check, lifecycle
from pipeline.local.cost import local_costs
from pipeline.local.endpoint import serve, supervisor
from pipeline.local.execution import Execution, ExecutionNotFound, StepRecord
from pipeline.local.registry import ModelVersion, Registry
from pipeline.local.runner import LocalRunner
from pipeline.local.services import LocalServices
from pipeline.local.storage import DEFINITION_FILE, LOCAL_ARN, RECORD_FILE, Layout
from pipeline.records import Approval, Changes, StageView, Upserted, VersionView, changes, run_summary
from pipeline.tracking.plot import PLOT_FILE, write_summary_plot
from pipeline.tracking.store import local_uri
from steps import contract
from steps.deploy.targets import TARGET_NAMES

if TYPE_CHECKING:
    from pipeline.records import ExecutionView, OnUpdate, RunSummary

LOG_TAIL = 15


def version_view(version: ModelVersion) -> VersionView:
    return VersionView(version.version, version.status, version.accuracy, version.created, version.note, version.arn)


class LocalBackend:
    """One local account (a folder, default local.root) holding the pipeline, its executions and registry.

    `cfg` is the local profile of the config (load_config(..., local=True)).
    """

    def __init__(self, cfg: Config, root: Path | None = None) -> None:
        self.cfg = cfg
        self.layout = Layout.at(root or cfg.local.root)
        self.s3 = self.layout.s3
        self.registry = Registry(self.layout.registry)
        self.services = LocalServices(cfg, self.layout, self.registry)
        self.pipeline = cfg.pipeline.name
        self.group = cfg.pipeline.model_package_group
        self.endpoint_lines: list[str] = []  # what the last `endpoints` recovered or found amiss

    @cached_property
    def definition(self) -> dict:
        """The definition of the config (what upsert stores), built once."""
        from pipeline.definition import definition

        return json.loads(definition(self.cfg))

    def check(self, parameters: dict[str, str]) -> None:
        check_parameter_values(self.cfg, resolve(self.definition, parameters), parameters, error=ParameterError)

    def serving_note(self) -> str:
        """Where AWS would serve otherwise than the local endpoint does (on this machine's CPU), else ""."""
        deploy = self.cfg.deploy
        if deploy.serverless:
            return (f"; its endpoints serve on this machine's CPU, while on AWS they are serverless "
                    f"({deploy.serverless.memory_mb} MB, up to {deploy.serverless.max_concurrency} requests at once)")
        if deploy.target == "cpu":
            return ""
        return (f"; its endpoints serve on this machine's CPU, while on AWS deploy.instance_type="
                f"{deploy.instance_type} serves on {TARGET_NAMES[deploy.target]} with {self.cfg.serving_image}")

    def upsert(self) -> Upserted:
        """What `upsert` does on AWS: check the job steps as requests, put the step code at its content-hashed keys
        and the tracking file at its own, and store the definition."""
        check_job_steps(self.definition)
        stored = self.layout.pipeline_definition(self.pipeline)
        report = Upserted(action="updated" if stored.exists() else "created",
                          pipeline_arn=f"{LOCAL_ARN}:pipeline/{self.pipeline.lower()}",
                          deploy_function="local (steps/deploy/ on the local account)" + self.serving_note())
        self.s3.put_bytes(*tracking_settings(self.cfg))  # always: its key is fixed
        for bundle in job_bundles():
            for uri, data in bundle.uploads(self.cfg.s3_root).items():
                if self.s3.path(uri).exists():
                    report.skipped.append(uri)
                else:
                    self.s3.put_bytes(uri, data)
                    report.uploaded.append(uri)
        report.steps = changed_steps(json.loads(stored.read_text()) if stored.exists() else None, self.definition)
        stored.parent.mkdir(parents=True, exist_ok=True)
        stored.write_text(json.dumps(self.definition, indent=2))
        return report

    def start(
        self, parameters: dict[str, str], *, wait: bool, use_cache: bool, on_update: OnUpdate, poll: float = 0.0
    ) -> ExecutionView:
        """Run the upserted pipeline on this machine (always to its end: `wait` changes nothing)."""
        return self.run(parameters, use_cache=use_cache, on_update=lambda e: on_update(e.view())).view()

    def run(
        self,
        parameters: dict[str, str],
        *,
        use_cache: bool = True,
        on_update: Callable[[Execution], None] | None = None,
    ) -> Execution:
        """Execute the upserted pipeline definition end to end on this machine."""
        return self._runner(self._upserted(), use_cache, on_update).run(parameters)

    def _upserted(self) -> dict:
        stored = self.layout.pipeline_definition(self.pipeline)
        if not stored.exists():
            raise ExecutionNotFound(f"no local pipeline {self.pipeline} yet: run `trainium-pipeline run --local`")
        return json.loads(stored.read_text())

    def _runner(self, definition: dict, use_cache: bool, on_update: Callable[[Execution], None] | None) -> LocalRunner:
        return LocalRunner(definition, self.pipeline, self.layout.root, processes=self.cfg.local.processes,
                           use_cache=use_cache, services=self.services, on_update=on_update,
                           tracking_uri=local_uri(self.layout.root))

    def _selection(
        self, definition: dict, steps: list[str], source: str | None, parameters: dict[str, str]
    ) -> tuple[Selection, Execution | None, dict[str, str]]:
        """The checked selection, its source record and the parameters of the run (the source's, overridden)."""
        record = self.record(source) if source else None
        statuses = {name: step.status for name, step in record.steps.items()} if record else None
        origin = Source(record.id, record.pipeline, record.status, statuses) if record else None
        chosen = select(definition, steps, origin, self.pipeline)
        merged = inherit(definition, record.parameters if record else {}, parameters)
        check_parameter_values(self.cfg, resolve(definition, merged), parameters, error=ParameterError)
        return chosen, record, merged

    def check_selection(self, steps: list[str], source: str | None, parameters: dict[str, str]) -> Selection:
        return self._selection(self.definition, steps, source, parameters)[0]

    def start_selected(
        self, steps: list[str], source: str | None, parameters: dict[str, str], *, wait: bool, use_cache: bool,
        on_update: OnUpdate, poll: float = 0.0,
    ) -> ExecutionView:
        """Run only `steps` of the upserted pipeline, the outputs of their unselected upstream steps taken from the
        record of execution `source` (always to its end: `wait` changes nothing)."""
        definition = self._upserted()
        chosen, record, merged = self._selection(definition, steps, source, parameters)
        runner = self._runner(definition, use_cache, lambda e: on_update(e.view()))
        return runner.run(merged, selection=chosen, source=record).view()

    def retry(self, execution: str | None, *, wait: bool, on_update: OnUpdate, poll: float = 0.0) -> ExecutionView:
        """Run a Failed or Stopped execution again in place, with the definition it ran (refused when the code and
        config now make another one); always to its end."""
        record = self.record(execution)
        ran = self.ran_definition(record)
        rerun = [name for name, step in record.steps.items() if step.status in RERUN]
        check_retry(record.id, record.status, ran, self.definition, rerun)
        return self._runner(ran, True, lambda e: on_update(e.view())).retry(record).view()

    def records(self) -> list[Execution]:
        """The pipeline's local executions, newest first; one whose process died while running it is failed now."""
        found = []
        for path in self.layout.executions(self.pipeline).glob(f"*/{RECORD_FILE}"):
            execution = Execution.load(path)
            if execution.reap():
                execution.save(path.parent)
            found.append(execution)
        return sorted(found, key=lambda e: (e.started, e.id), reverse=True)

    def record(self, execution: str | None) -> Execution:
        """The latest execution, or the one with this id or ARN."""
        chosen = next((e for e in self.records() if execution in (None, e.id, e.arn)), None)
        if chosen is None:
            raise ExecutionNotFound(f"no local execution {execution}" if execution else "no local executions yet")
        return chosen

    def ran_definition(self, execution: Execution) -> dict:
        """The definition `execution` ran (saved beside its record)."""
        path = self.layout.execution(execution.pipeline, execution.id) / DEFINITION_FILE
        if not path.exists():
            raise ExecutionNotFound(f"local execution {execution.id} has no {DEFINITION_FILE} (an older runner's)")
        return json.loads(path.read_text())

    def execution(self, execution: str | None) -> ExecutionView:
        return self.record(execution).view()

    def executions(self, limit: int) -> list[ExecutionView]:
        return [e.view() for e in self.records()[:limit]]

    def _evaluation(self, evaluate: StepRecord | None) -> dict | None:
        """The evaluation report that the Evaluate step wrote, if it did."""
        outputs = evaluate.properties.get("ProcessingOutputConfig", {}).get("Outputs", {}) if evaluate else {}
        if contract.EVALUATION_OUTPUT not in outputs:
            return None
        report = self.s3.path(outputs[contract.EVALUATION_OUTPUT]["S3Output"]["S3Uri"]) / contract.REPORT_FILE
        return json.loads(report.read_text()) if report.exists() else None

    def summary(self, execution: ExecutionView) -> RunSummary:
        steps = self.record(execution.id).steps
        register, deploy = steps.get(contract.REGISTER), steps.get(contract.DEPLOY)
        registered = None
        if register and register.status == "Succeeded":
            registered = version_view(self.registry.get(self.group, register.properties["ModelPackageVersion"]))

        def log_tail(step: str) -> list[str]:
            log = Path(steps[step].log) if steps[step].log else None
            return log.read_text(errors="replace").splitlines()[-LOG_TAIL:] if log and log.exists() else []

        summary = run_summary(
            execution,
            report=self._evaluation(steps.get(contract.EVALUATE)),
            registered=registered,
            group=self.group,
            deployed=self._deployed(deploy, registered),
            endpoint=self.cfg.deploy.staging_endpoint_name,
            artifacts=str(self.layout.execution(execution.pipeline, execution.id)),
            local=True,
            log_tail=log_tail,
        )
        summary.lifecycle = list(self.services.step_lines)
        summary.plot = str(write_summary_plot(
            self.layout.execution(execution.pipeline, execution.id) / PLOT_FILE, self._training_stats(steps.get(
                contract.TRAIN)), self._evaluation(steps.get(contract.EVALUATE)), f"execution {execution.id}") or "")
        return summary

    def _training_stats(self, train: StepRecord | None) -> dict | None:
        """The training_stats.json of the Train step's output.tar.gz, if it ran."""
        model = (train.properties.get("ModelArtifacts") or {}).get("S3ModelArtifacts") if train else None
        archive = self.s3.path(model).with_name(contract.OUTPUT_ARCHIVE) if model else None
        return stats_from_tarball(archive.read_bytes()) if archive and archive.exists() else None

    def versions(self, status: str | None) -> list[VersionView]:
        return [version_view(v) for v in self.registry.list(self.group, status=status)]

    def describe_version(self, version: int) -> dict:
        return self.registry.get(self.group, version).describe()

    def _deployed(self, deploy: StepRecord | None, registered: VersionView | None) -> dict | None:
        """The Deploy step's outputs; production's endpoint instead when it serves the registered version."""
        if deploy is None or deploy.status != "Succeeded":
            return None
        production = self.services.endpoint(lifecycle.PRODUCTION)
        if registered and production.version == registered.version:
            return {"endpoint_name": production.name, "action": "promoted", "url": production.where}
        return deploy.properties.get("OutputParameters", {})

    def set_status(self, version: int, status: str, note: str) -> Approval:
        """Approving deploys to staging and tests at once, as the approval rule does on AWS; rejecting rolls back."""
        changed, outcomes = self.services.set_status(version, status, note)
        return Approval(version_view(changed), changes(outcomes))

    def deploy(self, version: int) -> Changes:
        return changes(self.services.deploy(version))

    def promote(self, version: int) -> Changes:
        return changes(self.services.promote(version))

    def endpoints(self) -> list[StageView]:
        """Each stage as it answers (an endpoint whose process died is restarted first), with its restart count
        and, in its status, the version the registry says it should serve where that is another one."""
        self.endpoint_lines = [o["line"] for o in self.services.recover()]
        account, views = self.services.account, []
        for stage in lifecycle.STAGES:
            endpoint = self.services.endpoint(stage)
            served = account.version(endpoint.version) if endpoint.version else None
            test = endpoint_check.last_test(served.metadata) if served else "-"
            status = endpoint.status or "absent"
            if (restarts := account.restarts(stage)):
                status += f", {restarts} restart{'s' * (restarts > 1)}"
            if stage == lifecycle.PRODUCTION and (expected := self._registry_production(endpoint)) is not None:
                status += f", registry: version {expected}"
                self.endpoint_lines.append(f"{stage} {endpoint.name}: serves version {endpoint.version or 'none'} "
                                           f"but the registry's production version is {expected}")
            views.append(StageView(stage, endpoint.name, endpoint.version, status,
                                   str(endpoint.instances or 0), NO_SCALING, test, endpoint.where))
        return views

    def _registry_production(self, endpoint: object) -> int | None:
        """The version promoted last in the registry when production serves another one, else None."""
        approved = self.services.account.approved()
        promoted = [v for v in approved if v.passed and v.metadata.get(lifecycle.PROMOTED)]
        last = max(promoted, key=lambda v: (v.metadata[lifecycle.PROMOTED], v.number), default=None)
        return last.number if last is not None and last.number != getattr(endpoint, "version", None) else None

    def serve(self, version: int | None, port: int | None, on_ready: Callable[[str, VersionView], None]) -> None:
        chosen = self.registry.get(self.group, version) if version else self.registry.latest_approved(self.group)
        if chosen is None:
            raise UserError("no Approved model version in the local registry; run `run --local` first")
        serve(
            Path(chosen.model_data),
            self.cfg.deploy.endpoint_name,
            port or self.cfg.local.port,
            version=str(chosen.version),
            on_ready=lambda url: on_ready(url, version_view(chosen)),
            environment=chosen.environment,
            alerts_file=self.layout.alerts,
        )

    def stop_endpoint(self) -> bool:
        """Stop every endpoint process of this local root (recorded or not); False when none was running; a
        UserError naming those that could not be stopped."""
        with self.services.lock():
            count, failed = supervisor.stop_all(self.layout.endpoint_state(self.cfg.deploy.endpoint_name).parent)
        if failed:
            raise UserError(f"could not stop {len(failed)} local endpoint process(es): {'; '.join(failed)}")
        return count > 0

    def cost(self, execution: str | None) -> ExecutionCost:
        chosen = self.record(execution)
        return local_costs(chosen, self.ran_definition(chosen), self.s3, self.cfg.prices)
