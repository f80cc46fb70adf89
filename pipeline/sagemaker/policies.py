"""Least-privilege IAM documents of the roles the pipeline's services assume (printed, and created by bootstrap)."""

from __future__ import annotations

from pipeline.config import Config


def policies(cfg: Config) -> dict[str, dict]:
    """Least-privilege IAM documents: the deploy Lambda's role and the role EventBridge assumes."""
    region, account = cfg.aws.region, cfg.aws.account
    sm = f"arn:aws:sagemaker:{region}:{account}"
    group = cfg.pipeline.model_package_group.lower()
    endpoint = cfg.deploy.endpoint_name.lower()
    function = cfg.deploy.lambda_function_name
    deploy_role = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ReadModelPackages",
                "Effect": "Allow",
                "Action": ["sagemaker:DescribeModelPackage"],
                "Resource": [f"{sm}:model-package/{group}/*"],
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
                "Resource": [f"{sm}:endpoint-config/{endpoint[:40]}*"],
            },
            {
                "Sid": "Endpoint",
                "Effect": "Allow",
                "Action": ["sagemaker:CreateEndpoint", "sagemaker:UpdateEndpoint", "sagemaker:DescribeEndpoint"],
                "Resource": [f"{sm}:endpoint/{endpoint}", f"{sm}:endpoint-config/{endpoint[:40]}*"],
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
                "Resource": [f"arn:aws:cloudwatch:{region}:{account}:alarm:*"],
            },
            {
                "Sid": "Logs",
                "Effect": "Allow",
                "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": [
                    f"arn:aws:logs:{region}:{account}:log-group:/aws/lambda/{function}",
                    f"arn:aws:logs:{region}:{account}:log-group:/aws/lambda/{function}:*",
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
