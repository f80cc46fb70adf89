"""The pipeline on SageMaker: upsert, executions, the Model Registry, deployment and cost, through pipeline.aws."""

from __future__ import annotations

import io
import json
from functools import cached_property

from pipeline import contract, executions, models_aws
from pipeline.aws import Aws, AwsError, explained, split_s3_uri
from pipeline.code import load_deploy_handler
from pipeline.config import Config
from pipeline.cost import ExecutionCost, sagemaker_costs
from pipeline.dag.parameters import ParameterError, as_request, resolve
from pipeline.records import Approval, Deployment, ExecutionView, OnUpdate, RunSummary, Upserted, VersionView
from pipeline.upsert import upsert


def version_view(row: dict) -> VersionView:
    return VersionView(row["version"], row["status"], row["accuracy"], str(row["created"]), arn=row.get("arn", ""))


class AwsBackend:
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
        resolve(json.loads(self.definition_text), parameters)  # types and the data source's form

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

    def _arn(self, execution: str | None) -> str:
        if execution and execution.startswith("arn:"):
            return execution
        if execution:
            return (
                f"arn:aws:sagemaker:{self.cfg.aws.region}:{self.cfg.aws.account}:pipeline/"
                f"{self.cfg.pipeline.name.lower()}/execution/{execution}"
            )
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
        report = self._evaluation(details)
        summary = RunSummary(execution, threshold=execution.parameters.get(contract.ACCURACY_THRESHOLD))
        if report:
            summary.accuracy = report["binary_classification_metrics"]["accuracy"]["value"]
        summary.failures = [(s.name, s.note, []) for s in execution.steps or [] if s.status == "Failed"]
        package = details.get(contract.REGISTER, {}).get("RegisterModel", {}).get("Arn")
        if package:
            version = int(package.rsplit("/", 1)[-1])
            summary.registered = version_view(models_aws.describe(self.aws, self.group, version))
            summary.group = self.group
            if summary.registered.status != contract.APPROVED:
                summary.approve_hint = f"trainium-pipeline models approve {version}"
        deployed = details.get(contract.DEPLOY, {}).get("Lambda", {}).get("OutputParameters", [])
        if deployed:
            outputs = {o["Name"]: o["Value"] for o in deployed}
            name = execution.parameters.get(contract.ENDPOINT_NAME, self.cfg.deploy.endpoint_name)
            summary.deployment = Deployment(name, outputs.get("action", ""), outputs.get("endpoint_config_name", ""))
        summary.artifacts = f"{self.cfg.s3_root}/executions/{execution.id}"
        return summary

    def versions(self, status: str | None) -> list[VersionView]:
        return [version_view(row) for row in models_aws.list_versions(self.aws, self.group, status)]

    def describe_version(self, version: int) -> dict:
        return models_aws.describe(self.aws, self.group, version)

    def set_status(self, version: int, status: str, note: str) -> Approval:
        changed = version_view(models_aws.set_status(self.aws, self.group, version, status, note))
        hint = ""
        if status == contract.APPROVED:
            hint = f"the deploy-on-approval rule (triggers apply) deploys it, or: trainium-pipeline deploy {version}"
        return Approval(changed, None, hint)

    def deploy(self, version: int) -> Deployment:
        handler = load_deploy_handler()
        arn = models_aws.describe(self.aws, self.group, version)["arn"]
        d = self.cfg.deploy
        try:
            with explained(f"deploy version {version}"):
                result = handler.deploy(
                    self.aws.sagemaker,
                    arn,
                    d.endpoint_name,
                    d.instance_type,
                    d.instance_count,
                    role_arn=self.cfg.aws.role_arn,
                    data_capture_s3_uri=d.data_capture_s3_uri,
                    guardrails_alarm=d.guardrails_alarm,
                )
        except (handler.NotApproved, handler.DeployError) as e:
            raise AwsError(str(e)) from None
        return Deployment(result["endpoint_name"], result["action"], f"config {result['endpoint_config_name']}")

    def cost(self, execution: str | None) -> ExecutionCost:
        return sagemaker_costs(self.aws, self._arn(execution), self.cfg.prices)
