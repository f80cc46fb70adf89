"""The deploy Lambda (handler `steps.deploy.handler.lambda_handler`): the model lifecycle on AWS, driven by events.

Runs in the python3.12 Lambda runtime from a zip that `upsert` makes of this package with steps/__init__.py and the
contract (pipeline.code's `deploy` bundle): standard library and boto3 only. Its settings
come from the environment (sagemaker_account.Settings). Callers, each handled by lifecycle.Lifecycle:
- the pipeline's Deploy LambdaStep, {"model_package_arn": ...} (also a direct invocation): the version must be
  Approved (else the step fails); staging is reconciled, i.e. the new version goes to the staging endpoint;
- "SageMaker Model Package State Change" (the approval rule): Approved -> staging; Rejected or back to pending ->
  production, then staging (a rollback where either served that version). Events whose UpdatedModelPackageFields
  leave out ModelApprovalStatus (the lifecycle's own metadata writes) are ignored;
- "SageMaker Endpoint State Change" of the staging or production endpoint: IN_SERVICE reconciles that stage (staging:
  the endpoint test of a new version, then auto-promotion if configured; production: autoscaling, and an approval or
  rollback that waited for the update), FAILED is an alert;
- "SageMaker Model Building Pipeline Execution Status Change", Failed or Stopped (with a tracking server): the
  execution's MLflow run ends FAILED or KILLED where a step killed outright left it RUNNING.
SageMaker may send several events per state change, and a failed invocation is retried: an event whose state change
(`event_key`) was handled already, or is being handled, is ignored (one whose invocation was killed at the timeout
is handled by the retry); the deploy Lambda runs one invocation at a time (reserved concurrency 1,
set by upsert), so two endpoint tests never share the staging endpoint.
Nothing is refused because an endpoint is busy: the decision is "deferred" and the InService event of that update
runs it. Returns {"action", "endpoint_config_name", "endpoint_name", "outcomes": [...]} (the first two are the
LambdaStep's outputs, from the staging outcome).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

from steps import contract, tracking
from steps.contract import APPROVED, DEPLOY_LAMBDA_TIMEOUT_S, MODEL_PACKAGE_EVENT
from steps.deploy import lifecycle, sagemaker_account, sagemaker_endpoints

ENDPOINT_EVENT = "SageMaker Endpoint State Change"
EXECUTION_EVENT = "SageMaker Model Building Pipeline Execution Status Change"
RUN_ENDS = {"Failed": "FAILED", "Stopped": "KILLED"}  # an ended execution's status -> its MLflow run's
STATUS_FIELD = "ModelApprovalStatus"


class UnknownEvent(ValueError):
    """An event of no shape this handler knows."""


def result(outcomes: list[dict[str, Any]], stage: str = lifecycle.STAGING) -> dict[str, Any]:
    main = next((o for o in outcomes if o["stage"] == stage and o.get("endpoint_config_name")), None)
    main = main or next((o for o in outcomes if o["stage"] == stage), {"action": "ignored", "endpoint": ""})
    return {"action": main["action"], "endpoint_config_name": main.get("endpoint_config_name", ""),
            "endpoint_name": main["endpoint"], "outcomes": outcomes}


def _ignored(reason: str) -> dict[str, Any]:
    return {"action": "ignored", "endpoint_config_name": "", "endpoint_name": "", "reason": reason, "outcomes": []}


def _package_event(life: lifecycle.Lifecycle, settings: sagemaker_account.Settings, detail: dict) -> dict[str, Any]:
    if detail.get("ModelPackageGroupName") != settings.group:
        return _ignored(f"model package group {detail.get('ModelPackageGroupName')!r} is not {settings.group!r}")
    updated = detail.get("UpdatedModelPackageFields")
    if updated is not None and STATUS_FIELD not in updated:
        return _ignored(f"only {', '.join(updated) or 'nothing'} changed, not the approval status")
    if detail.get(STATUS_FIELD) == APPROVED:
        return result(life.reconcile(lifecycle.STAGING))
    return result(life.on_change(), lifecycle.PRODUCTION)


def _endpoint_event(life: lifecycle.Lifecycle, account: sagemaker_account.SageMakerAccount,
                    detail: dict) -> dict[str, Any]:
    stage = account.settings.stage_of(detail.get("EndpointName", ""))
    status = str(detail.get("EndpointStatus", "")).replace("_", "").lower()
    if stage is None:
        return _ignored(f"endpoint {detail.get('EndpointName')!r} is neither the staging nor the production one")
    if status not in ("inservice", "failed"):
        return _ignored(f"endpoint status {detail.get('EndpointStatus')!r}")
    reason = account.failure_reason(stage) if status == "failed" else ""
    return result(life.on_endpoint(stage, status, reason), stage)


def _execution_event(settings: sagemaker_account.Settings, detail: dict) -> dict[str, Any]:
    """A failed or stopped execution: its MLflow run ends FAILED or KILLED if still RUNNING (a step killed outright,
    by its instance, memory or the execution's stop, could not end it)."""
    ended = RUN_ENDS.get(detail.get("currentPipelineExecutionStatus", ""))
    if not ended or not settings.tracking_uri:
        return _ignored(f"execution {detail.get('currentPipelineExecutionStatus')!r}"
                        + ("" if settings.tracking_uri else ", and no tracking server"))
    arn = str(detail.get("pipelineExecutionArn", ""))
    execution = arn.rsplit("/", 1)[-1]
    tracker = tracking.Tracker("deploy", {contract.TRACKING_URI_ENV: settings.tracking_uri,
                                          contract.EXECUTION_ENV: execution, tracking.EXECUTION_ARN_ENV: arn,
                                          contract.EXPERIMENT_ENV: settings.experiment or tracking.DEFAULT_EXPERIMENT})
    run_id = tracker.end_open(ended)
    if run_id:
        return {**_ignored(""), "action": "run-ended",
                "reason": f"MLflow run {run_id} of execution {execution} ended {ended}"}
    if tracker.off_reason:
        return _ignored(f"could not ask MLflow for the run of execution {execution}: {tracker.off_reason}")
    return _ignored(f"no RUNNING MLflow run of execution {execution}")


def step(account: lifecycle.Account, policy: lifecycle.Policy, arn: str) -> dict[str, Any]:
    """The Deploy step (here and in the local runner) or a direct call: the named version must be Approved, and a
    failed deploy fails the step."""
    version = account.version(int(arn.rsplit("/", 1)[-1]))
    if version is None or version.status != APPROVED:
        status = version.status if version else "missing"
        raise sagemaker_endpoints.NotApproved(
            f"model package {arn} is {status}, not Approved: approve it first; nothing was deployed")
    done = result(lifecycle.Lifecycle(account, policy).reconcile(lifecycle.STAGING))
    failed = [o["line"] for o in done["outcomes"] if o["action"] == "deploy-failed"]
    if failed:
        raise sagemaker_endpoints.DeployError(failed[0])
    return done


def event_key(event: dict) -> str | None:
    """The state change an EventBridge event reports, the same for every event SageMaker sends about it (what changed,
    to what, and when it changed; EventBridge's event id where the detail has no LastModifiedTime); None for a direct
    invocation or an event that says neither."""
    kind, detail = event.get("detail-type"), event.get("detail") or {}
    when = detail.get("LastModifiedTime") or event.get("id")
    if kind not in (MODEL_PACKAGE_EVENT, ENDPOINT_EVENT) or not when:
        return None
    change = [kind, detail.get("ModelPackageArn") or detail.get("EndpointArn") or detail.get("EndpointName"),
              detail.get(STATUS_FIELD) or detail.get("EndpointStatus"), when]
    return hashlib.sha256(json.dumps(change, default=str).encode()).hexdigest()


def handle(event: dict, account: sagemaker_account.SageMakerAccount) -> dict[str, Any]:
    """Route one event (see the module) to the lifecycle of `account`, once per state change: a duplicate is ignored;
    a failure releases the change for the retry, and so does a timeout (no release then: the retry takes over a claim
    older than the Lambda's timeout that never finished)."""
    key = event_key(event)
    if key is None:
        return _route(event, account)
    if not account.claim(f"events/{key}", abandoned_after_s=DEPLOY_LAMBDA_TIMEOUT_S):
        return _ignored(f"a duplicate: this state change (event key {key[:12]}) was handled already")
    try:
        done = _route(event, account)
    except BaseException:
        account.release(f"events/{key}")
        raise
    account.finish(f"events/{key}")
    return done


def _route(event: dict, account: sagemaker_account.SageMakerAccount) -> dict[str, Any]:
    life = lifecycle.Lifecycle(account, account.settings.policy)
    kind = event.get("detail-type")
    if kind == MODEL_PACKAGE_EVENT:
        return _package_event(life, account.settings, event.get("detail") or {})
    if kind == ENDPOINT_EVENT:
        return _endpoint_event(life, account, event.get("detail") or {})
    if kind == EXECUTION_EVENT:
        return _execution_event(account.settings, event.get("detail") or {})
    if event.get("model_package_arn"):
        return step(account, account.settings.policy, event["model_package_arn"])
    raise UnknownEvent(f"unrecognised event: expected {{'model_package_arn': ...}}, a '{MODEL_PACKAGE_EVENT}', an "
                       f"'{ENDPOINT_EVENT}' or an '{EXECUTION_EVENT}' EventBridge event; got keys {sorted(event)}")


def lambda_handler(event: dict, context: Any = None) -> dict[str, Any]:
    """Entry point of the deploy Lambda. A refusal raises, so a LambdaStep fails with the message."""
    settings = sagemaker_account.Settings.from_env(os.environ)
    account = sagemaker_account.SageMakerAccount.from_boto3(settings)
    if hasattr(context, "get_remaining_time_in_millis"):  # the endpoint test leaves time for its verdict
        account.deadline = time.monotonic() + context.get_remaining_time_in_millis() / 1000
    result = handle(event or {}, account)
    print(json.dumps({k: v for k, v in result.items() if k != "outcomes"}))  # one summary line per invocation
    return result
