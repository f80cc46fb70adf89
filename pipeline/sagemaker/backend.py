"""The pipeline on SageMaker behind the Backend protocol: upsert, executions, the Model Registry, deployment and
cost, through the boto3 layer (pipeline.sagemaker.aws)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING

from pipeline.config import Config, check_parameter_values
from pipeline.config.deploy_settings import settings
from pipeline.cost import ExecutionCost
from pipeline.dag.parameters import ParameterError, as_request, resolve
from pipeline.dag.selection import RERUN, Selection, check_retry, inherit, select
from pipeline.errors import UserError
from pipeline.records import Approval, Changes, StageView, VersionView, changes, run_summary
from pipeline.sagemaker import executions, registry
from pipeline.sagemaker.aws import Aws, AwsError, explained, split_s3_uri
from pipeline.sagemaker.cost import sagemaker_costs
from pipeline.sagemaker.upsert import check_data_reachable, upsert
from pipeline.tracking.store import tag_version
from steps import contract
from steps.deploy import endpoint_check, lifecycle, sagemaker_account, sagemaker_endpoints

if TYPE_CHECKING:
    from pipeline.records import ExecutionView, OnUpdate, RunSummary, Upserted


def version_view(row: dict) -> VersionView:
    return VersionView(row["version"], row["status"], row["accuracy"], str(row["created"]), arn=row.get("arn", ""))


def reachable(values: dict) -> None:
    """Refuse an InputData that is a folder on this machine, which no SageMaker job can read."""
    check_data_reachable(values[contract.INPUT_DATA], f"--param {contract.INPUT_DATA}", ParameterError)


class SageMakerBackend:
    """One pipeline (cfg.pipeline.name) in one account and region."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.aws = Aws(cfg.aws.region)
        self.group = cfg.pipeline.model_package_group

    @cached_property
    def definition_text(self) -> str:
        from pipeline.definition import definition

        return definition(self.cfg)

    def check(self, parameters: dict[str, str]) -> None:
        values = resolve(json.loads(self.definition_text), parameters)  # declared names and types
        reachable(values)  # the data source's form
        check_parameter_values(self.cfg, values, parameters, error=ParameterError)

    def upsert(self) -> Upserted:
        return upsert(self.cfg, self.definition_text, self.aws)

    def start(
        self, parameters: dict[str, str], *, wait: bool, use_cache: bool, on_update: OnUpdate, poll: float = 30.0
    ) -> ExecutionView:
        if not use_cache:
            raise ParameterError("--no-cache: SageMaker's step caching is part of the definition "
                                 "(pipeline.cache_expire_after); it cannot be turned off for one execution")
        self.check(parameters)
        arn = executions.start(self.aws, self.cfg.pipeline.name, as_request(parameters))
        return executions.wait(self.aws, arn, on_update, poll) if wait else executions.describe(self.aws, arn)

    def _selection(
        self, definition: dict, steps: list[str], source: str | None, parameters: dict[str, str]
    ) -> tuple[Selection, str | None, dict[str, str]]:
        """The checked selection, the source's ARN and the parameters of the run (the source's, overridden)."""
        arn = self._arn(source) if source else None
        origin, inherited = executions.source(self.aws, arn) if arn else (None, {})
        chosen = select(definition, steps, origin, self.cfg.pipeline.name)
        merged = inherit(definition, inherited, parameters)
        values = resolve(definition, merged)
        reachable(values)
        check_parameter_values(self.cfg, values, parameters, error=ParameterError)
        return chosen, arn, merged

    def check_selection(self, steps: list[str], source: str | None, parameters: dict[str, str]) -> Selection:
        return self._selection(json.loads(self.definition_text), steps, source, parameters)[0]

    def start_selected(
        self, steps: list[str], source: str | None, parameters: dict[str, str], *, wait: bool, use_cache: bool,
        on_update: OnUpdate, poll: float = 30.0,
    ) -> ExecutionView:
        """A selective execution of the upserted pipeline (SelectiveExecutionConfig), checked first against the
        definition the pipeline has now, which is the one it runs."""
        if not use_cache:
            raise ParameterError("--no-cache: SageMaker's step caching is part of the definition; a selected step "
                                 "whose inputs are unchanged may be a cache hit")
        name = self.cfg.pipeline.name
        with explained(f"describe pipeline {name}"):
            definition = self.aws.pipeline_definition(name)
        if definition is None:
            raise AwsError(f"pipeline {name} does not exist yet (run: trainium-pipeline upsert)")
        chosen, arn, merged = self._selection(definition, steps, source, parameters)
        started = executions.start(self.aws, name, as_request(merged), chosen.request(arn))
        return executions.wait(self.aws, started, on_update, poll) if wait else executions.describe(self.aws, started)

    def retry(self, execution: str | None, *, wait: bool, on_update: OnUpdate, poll: float = 30.0) -> ExecutionView:
        """RetryPipelineExecution, refused first when the execution has not failed or when the code and config now
        make another definition than the one it ran (a retry re-runs that one)."""
        arn = self._arn(execution)
        view = executions.describe(self.aws, arn, with_parameters=False)
        rerun = [s.name for s in view.steps or [] if s.status in RERUN]
        ran = executions.ran_definition(self.aws, arn)
        check_retry(view.id, view.status, ran, json.loads(self.definition_text), rerun)
        executions.retry(self.aws, arn)
        return executions.wait(self.aws, arn, on_update, poll, view.status) if wait else view

    def _arn(self, execution: str | None) -> str:
        if execution and execution.startswith("arn:"):
            return execution
        if execution:
            return f"{self.cfg.pipeline_arn}/execution/{execution}"
        with explained(f"list executions of {self.cfg.pipeline.name}"):
            arn = self.aws.latest_execution_arn(self.cfg.pipeline.name)
        if not arn:
            raise AwsError(f"pipeline {self.cfg.pipeline.name} has no executions yet (run: trainium-pipeline start)")
        return arn

    def execution(self, execution: str | None) -> ExecutionView:
        return executions.describe(self.aws, self._arn(execution))

    def executions(self, limit: int) -> list[ExecutionView]:
        return executions.recent(self.aws, self.cfg.pipeline.name, limit)

    def _evaluation(self, steps: dict) -> dict | None:
        job = steps.get(contract.EVALUATE, {}).get("ProcessingJob", {}).get("Arn")
        if not job:
            return None
        with explained(f"read the evaluation report of {job}"):
            described = self.aws.sagemaker.describe_processing_job(ProcessingJobName=job.rsplit("/", 1)[-1])
            outputs = {o["OutputName"]: o["S3Output"]["S3Uri"] for o in described["ProcessingOutputConfig"]["Outputs"]}
            bucket, key = split_s3_uri(f"{outputs[contract.EVALUATION_OUTPUT].rstrip('/')}/{contract.REPORT_FILE}")
            body = io.BytesIO(self.aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        return json.load(body)

    def summary(self, execution: ExecutionView) -> RunSummary:
        details = {s.name: s.details for s in execution.steps or []}
        package = details.get(contract.REGISTER, {}).get("RegisterModel", {}).get("Arn")
        registered, tagging = None, None
        if package:
            described = registry.describe(self.aws, self.group, int(package.rsplit("/", 1)[-1]))
            registered, tagging = version_view(described), self._tag_run(described)
        deployed = details.get(contract.DEPLOY, {}).get("Lambda", {}).get("OutputParameters", [])
        summary = run_summary(
            execution,
            report=self._evaluation(details),
            registered=registered,
            group=self.group,
            deployed={o["Name"]: o["Value"] for o in deployed} if deployed else None,
            endpoint=self.cfg.deploy.staging_endpoint_name,
            artifacts=f"{self.cfg.s3_root}/executions/{execution.id}",
            local=False,
        )
        summary.lifecycle += [tagging] if tagging else []
        return summary

    def _tag_run(self, version: dict) -> str | None:
        """The run the version came from gets its number (the version carries the run's id): best effort, a warning
        line when it fails (this CLI's credentials need sagemaker-mlflow:SetTag)."""
        server = self.cfg.tracking.server_arn
        run_id = version["metadata"].get(contract.RUN_ID_METADATA, "")
        return tag_version(server, run_id, version["version"], version.get("arn", "")) if server else None

    def versions(self, status: str | None) -> list[VersionView]:
        return [version_view(row) for row in registry.list_versions(self.aws, self.group, status)]

    def describe_version(self, version: int) -> dict:
        return registry.describe(self.aws, self.group, version)

    @cached_property
    def account(self) -> sagemaker_account.SageMakerAccount:
        """The lifecycle's account with the deploy Lambda's settings (from the config) and this CLI's credentials."""
        return sagemaker_account.SageMakerAccount.from_boto3(settings(self.cfg), self.aws.session)

    def _lifecycle(self, what: str, action: Callable) -> list[dict]:
        """Run a lifecycle action with this CLI's credentials (the deploy Lambda does the same on events)."""
        try:
            with explained(what):
                return action(lifecycle.Lifecycle(self.account, self.account.settings.policy))
        except lifecycle.Refused as e:
            raise AwsError(str(e)) from None

    def set_status(self, version: int, status: str, note: str) -> Approval:
        """Approving sends the version to staging at once (the approval rule would too: both are idempotent);
        rejecting rolls back where it was served."""
        changed = version_view(registry.set_status(self.aws, self.group, version, status, note))
        stage = lifecycle.STAGING
        outcomes = self._lifecycle(f"reconcile the endpoints after {status.lower()} version {version}",
                                   lambda life: life.reconcile(stage) if status == contract.APPROVED
                                   else life.on_change())
        return Approval(changed, changes(outcomes))

    def deploy(self, version: int) -> Changes:
        return changes(self._lifecycle(f"deploy version {version} to staging",
                                       lambda life: life.deploy(version)))

    def promote(self, version: int) -> Changes:
        return changes(self._lifecycle(f"promote version {version}",
                                       lambda life: life.promote(version)))

    def endpoints(self) -> list[StageView]:
        views = []
        with explained("describe the staging and production endpoints"):
            for stage in lifecycle.STAGES:
                endpoint = self.account.endpoint(stage)
                served = self.account.version(endpoint.version) if endpoint.version else None
                scaling = "none (staging)"
                if self.cfg.deploy.serverless:
                    scaling = "serverless (SageMaker scales it)"
                elif stage == lifecycle.PRODUCTION:
                    targets = self.aws.client("application-autoscaling").describe_scalable_targets(
                        ServiceNamespace="sagemaker", ResourceIds=[sagemaker_endpoints.scaling_resource(endpoint.name)],
                        ScalableDimension=sagemaker_endpoints.DIMENSION)["ScalableTargets"]
                    scaling = (f"{targets[0]['MinCapacity']}-{targets[0]['MaxCapacity']} instances" if targets
                               else "not applied yet")
                views.append(StageView(stage, endpoint.name, endpoint.version, endpoint.status or "absent",
                                       str(endpoint.instances or 0), scaling,
                                       endpoint_check.last_test(served.metadata) if served else "-", endpoint.where))
        return views

    def serve(self, version: int | None, port: int | None, on_ready: Callable[[str, VersionView], None]) -> None:
        raise UserError("serve runs a version of the local registry on this machine; a SageMaker version is served "
                        "by its endpoint (trainium-pipeline deploy N)")

    def stop_endpoint(self) -> bool:
        raise UserError("serve --stop stops the local endpoint; a SageMaker endpoint is managed by deploy")

    def cost(self, execution: str | None) -> ExecutionCost:
        return sagemaker_costs(self.aws, self._arn(execution), self.cfg.prices)
