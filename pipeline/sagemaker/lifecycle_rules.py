"""The model lifecycle's EventBridge rules, which `triggers apply` puts beside the approval rule: a rejection and the
staging / production endpoints' state changes invoke the deploy Lambda, and so does a failed or stopped execution
with a tracking server (its MLflow run ends); the end of an execution goes to the alerts topic (as a JSON object:
one readable line, then the event)."""

from __future__ import annotations

from pipeline.config import Config
from steps.contract import MODEL_PACKAGE_EVENT, PENDING, REJECTED

DEPLOY_TARGET_ID = "deploy-lambda"
ALERTS_TARGET_ID = "alerts-topic"
ENDPOINT_EVENT = "SageMaker Endpoint State Change"
EXECUTION_EVENT = "SageMaker Model Building Pipeline Execution Status Change"
LIFECYCLE_KINDS = ("rollback-on-reject", "endpoint-state", "execution-alerts", "execution-tracking")


def rejection_pattern(cfg: Config) -> dict:
    """A version of our group rejected or reset to pending: the deploy Lambda rolls back where it was served."""
    return {
        "source": ["aws.sagemaker"],
        "detail-type": [MODEL_PACKAGE_EVENT],
        "detail": {"ModelPackageGroupName": [cfg.pipeline.model_package_group],
                   "ModelApprovalStatus": [REJECTED, PENDING]},
    }


def endpoint_state_pattern(cfg: Config) -> dict:
    """The staging or production endpoint became InService or Failed (EventBridge spells IN_SERVICE; both kept)."""
    return {
        "source": ["aws.sagemaker"],
        "detail-type": [ENDPOINT_EVENT],
        "detail": {"EndpointName": [cfg.deploy.staging_endpoint_name, cfg.deploy.endpoint_name],
                   "EndpointStatus": ["IN_SERVICE", "InService", "FAILED", "Failed"]},
    }


def execution_pattern(cfg: Config, statuses: tuple[str, ...] = ("Failed", "Succeeded", "Stopped")) -> dict:
    return {
        "source": ["aws.sagemaker"],
        "detail-type": [EXECUTION_EVENT],
        "detail": {"pipelineArn": [cfg.pipeline_arn], "currentPipelineExecutionStatus": list(statuses)},
    }


def execution_alert_target(cfg: Config) -> dict:
    """The alerts topic, given one readable line and the event's JSON."""
    return {
        "Id": ALERTS_TARGET_ID,
        "Arn": cfg.alerts.topic_arn,
        "InputTransformer": {
            "InputPathsMap": {"execution": "$.detail.pipelineExecutionArn",
                              "status": "$.detail.currentPipelineExecutionStatus"},
            "InputTemplate": f'{{"line": "pipeline {cfg.pipeline.name} execution <execution>: <status>", '
                             f'"event": <aws.events.event.json>}}',
        },
    }


def lifecycle_rules(cfg: Config, names: dict[str, str]) -> list[dict]:
    """The lifecycle's rules (named by `names`, kind -> rule name): rejections and endpoint state changes to the
    deploy Lambda (beside the approval rule), and, with alerts.topic_arn, execution results to the alerts topic."""
    deploy = [{"Id": DEPLOY_TARGET_ID, "Arn": cfg.deploy_lambda_arn}]
    rules = [
        {"Name": names["rollback-on-reject"], "EventPattern": rejection_pattern(cfg), "Targets": deploy,
         "Description": f"Roll back endpoints serving a rejected version of {cfg.pipeline.model_package_group}"},
        {"Name": names["endpoint-state"], "EventPattern": endpoint_state_pattern(cfg), "Targets": deploy,
         "Description": f"Test, promote, scale or retry when {cfg.deploy.staging_endpoint_name} or "
                        f"{cfg.deploy.endpoint_name} is InService or Failed"},
    ]
    if cfg.tracking.server_arn:
        rules.append({"Name": names["execution-tracking"], "Targets": deploy,
                      "EventPattern": execution_pattern(cfg, ("Failed", "Stopped")),
                      "Description": f"End the MLflow run of an execution of {cfg.pipeline.name} that failed or "
                                     f"stopped, where a killed step left it RUNNING"})
    if cfg.alerts.topic_arn:
        rules.append({"Name": names["execution-alerts"], "EventPattern": execution_pattern(cfg),
                      "Targets": [execution_alert_target(cfg)],
                      "Description": f"Executions of {cfg.pipeline.name} that ended, to the alerts topic"})
    return rules
