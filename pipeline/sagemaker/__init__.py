"""The pipeline in an AWS account: SageMaker Pipelines, the Model Registry and endpoints through boto3, and the
account pieces around them (EventBridge triggers, the CloudFormation stack of `bootstrap`, which holds the IAM).

`aws` is the one small boto3 layer (one-line errors, `AWS_ENDPOINT_URL`); `backend` implements pipeline.backend's
protocol with `upsert`, `executions`, `registry` and `cost`; `triggers` and `bootstrap` serve the
AWS-only commands.
"""
