"""Least-privilege IAM documents of the roles the pipeline's services assume (printed, and created by bootstrap)."""

from __future__ import annotations

from pipeline.config import Config
from pipeline.config.deploy_settings import MARKERS
from steps.contract import EVALUATION_OUTPUT, REPORT_FILE, SAMPLE_FILE
from steps.tracking import END_RUN_ACTIONS

AUTOSCALING_SLR = ("role/aws-service-role/sagemaker.application-autoscaling.amazonaws.com/"
                   "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint")


def kms_key_arn(cfg: Config) -> str:
    key, aws = cfg.aws.kms_key_id or "", cfg.aws
    return key if key.startswith("arn:") else f"arn:{aws.partition}:kms:{aws.region}:{aws.account}:key/{key}"


def alerts_topic_arn(cfg: Config) -> str:
    """alerts.topic_arn, else the topic the bootstrap stack names <pipeline>-alerts."""
    aws = cfg.aws
    return cfg.alerts.topic_arn or f"arn:{aws.partition}:sns:{aws.region}:{aws.account}:{cfg.pipeline.name}-alerts"


def policies(cfg: Config) -> dict[str, dict]:
    """Least-privilege IAM documents: the deploy Lambda's role and the role EventBridge assumes."""
    region, account, arn = cfg.aws.region, cfg.aws.account, f"arn:{cfg.aws.partition}"
    sm = f"{arn}:sagemaker:{region}:{account}"
    group = cfg.pipeline.model_package_group.lower()
    endpoint = cfg.deploy.endpoint_name.lower()
    staging = cfg.deploy.staging_endpoint_name.lower()
    function = cfg.deploy.lambda_function_name
    configs = [f"{sm}:endpoint-config/{endpoint[:40]}*", f"{sm}:endpoint-config/{staging[:40]}*"]
    # what Evaluate writes for the endpoint test: the sample, and the report with the latency to hold it to
    read = [f"executions/*/{EVALUATION_OUTPUT}/{name}" for name in (SAMPLE_FILE, REPORT_FILE)]
    deploy_role = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ModelPackages",
                "Effect": "Allow",
                "Action": ["sagemaker:DescribeModelPackage", "sagemaker:UpdateModelPackage"],
                "Resource": [f"{sm}:model-package/{group}/*"],
            },
            {  # IAM has no resource type for ListModelPackages: "*" (it lists names and statuses only)
                "Sid": "ListModelPackages",
                "Effect": "Allow",
                "Action": ["sagemaker:ListModelPackages"],
                "Resource": ["*"],
            },
            {
                "Sid": "CreateModels",
                "Effect": "Allow",
                "Action": ["sagemaker:CreateModel", "sagemaker:DescribeModel"],
                "Resource": [f"{sm}:model/{group[:50]}*"],
            },
            {
                "Sid": "EndpointConfigs",
                "Effect": "Allow",
                "Action": ["sagemaker:CreateEndpointConfig", "sagemaker:DescribeEndpointConfig"],
                "Resource": configs,
            },
            {
                "Sid": "Endpoints",
                "Effect": "Allow",
                "Action": ["sagemaker:CreateEndpoint", "sagemaker:UpdateEndpoint", "sagemaker:DescribeEndpoint"],
                "Resource": [f"{sm}:endpoint/{endpoint}", f"{sm}:endpoint/{staging}", *configs],
            },
            {
                "Sid": "TestStaging",
                "Effect": "Allow",
                "Action": ["sagemaker:InvokeEndpoint"],
                "Resource": [f"{sm}:endpoint/{staging}"],
            },
            {
                "Sid": "ReadTestSample",
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"{arn}:s3:::{cfg.aws.bucket}/{cfg.aws.prefix}/{key}" for key in read],
            },
            {  # markers created only where absent: the events handled, the metadata revisions claimed (an event's
                "Sid": "LifecycleMarkers",  # marker read to see whether a killed invocation left it unfinished)
                "Effect": "Allow",
                "Action": ["s3:PutObject", "s3:GetObject", "s3:DeleteObject"],
                "Resource": [f"{arn}:s3:::{cfg.aws.bucket}/{cfg.aws.prefix}/{MARKERS}/*"],
            },
            {  # what Application Auto Scaling checks that its caller may do to the variant (beside Describe*)
                "Sid": "ScaledEndpoint",
                "Effect": "Allow",
                "Action": ["sagemaker:UpdateEndpointWeightsAndCapacities"],
                "Resource": [f"{sm}:endpoint/{endpoint}"],
            },
            {  # a scalable target's ARN has a random id: scoped to SageMaker variants by the condition keys
                "Sid": "Autoscaling",
                "Effect": "Allow",
                "Action": ["application-autoscaling:RegisterScalableTarget", "application-autoscaling:PutScalingPolicy",
                           "application-autoscaling:DeleteScalingPolicy",
                           "application-autoscaling:DeregisterScalableTarget"],
                "Resource": [f"{arn}:application-autoscaling:{region}:{account}:scalable-target/*"],
                "Condition": {"StringEquals": {"application-autoscaling:service-namespace": "sagemaker",
                                               "application-autoscaling:scalable-dimension":
                                                   "sagemaker:variant:DesiredInstanceCount"}},
            },
            {  # target tracking's alarms, made and removed with the caller's permissions
                "Sid": "TargetTrackingAlarms",
                "Effect": "Allow",
                "Action": ["cloudwatch:PutMetricAlarm", "cloudwatch:DeleteAlarms"],
                # TargetTracking-<ResourceId>-...: the endpoint name in its own case (SageMaker's ARNs lowercase it)
                "Resource": [f"{arn}:cloudwatch:{region}:{account}:alarm:TargetTracking-endpoint/"
                             f"{cfg.deploy.endpoint_name}/*"],
            },
            {  # the first scalable SageMaker variant of an account creates Application Auto Scaling's role
                "Sid": "AutoscalingRole",
                "Effect": "Allow",
                "Action": ["iam:CreateServiceLinkedRole"],
                "Resource": [f"{arn}:iam::{account}:{AUTOSCALING_SLR}"],
                "Condition": {"StringLike": {"iam:AWSServiceName": "sagemaker.application-autoscaling.amazonaws.com"}},
            },
            {
                "Sid": "Alerts",
                "Effect": "Allow",
                "Action": ["sns:Publish"],
                "Resource": [alerts_topic_arn(cfg)],
            },
            {
                "Sid": "PassModelRole",
                "Effect": "Allow",
                "Action": ["iam:PassRole"],
                "Resource": [cfg.aws.role_arn],
                "Condition": {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
            },
            {
                "Sid": "GuardrailAlarms",
                "Effect": "Allow",
                "Action": ["cloudwatch:DescribeAlarms"],
                "Resource": [f"{arn}:cloudwatch:{region}:{account}:alarm:*"],
            },
            *([{
                "Sid": "EncryptedObjects",
                "Effect": "Allow",
                "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
                "Resource": [kms_key_arn(cfg)],
            }] if cfg.aws.kms_key_id else []),
            *([{  # a failed or stopped execution's MLflow run, where a killed step left it RUNNING
                "Sid": "EndOpenRuns",
                "Effect": "Allow",
                "Action": [f"sagemaker-mlflow:{action}" for action in END_RUN_ACTIONS],
                "Resource": [cfg.tracking.server_arn],
            }] if cfg.tracking.server_arn else []),
            {
                "Sid": "Logs",
                "Effect": "Allow",
                "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": [
                    f"{arn}:logs:{region}:{account}:log-group:/aws/lambda/{function}",
                    f"{arn}:logs:{region}:{account}:log-group:/aws/lambda/{function}:*",
                ],
            },
        ],
    }
    events_role = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "StartPipeline",
                "Effect": "Allow",
                "Action": ["sagemaker:StartPipelineExecution"],
                "Resource": [cfg.pipeline_arn],
            }
        ],
    }

    def trust(service: str) -> dict:
        return {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": service},
                    "Action": "sts:AssumeRole",
                }
            ],
        }

    return {
        "deploy-lambda-role": deploy_role,
        "deploy-lambda-trust": trust("lambda.amazonaws.com"),
        "events-role": events_role,
        "events-trust": trust("events.amazonaws.com"),
    }
