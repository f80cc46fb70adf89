"""The lifecycle's settings from the config, handed to steps/deploy/ as its own types: the CLI and the local account
use them directly, and `upsert` writes them into the deploy Lambda's environment (`Settings.to_env`)."""

from __future__ import annotations

from pipeline.config import Config
from pipeline.config.tracking import experiment
from steps.deploy.lifecycle import Policy
from steps.deploy.sagemaker_account import Settings, Stage

MARKERS = "lifecycle-markers"  # under s3_root: the deploy Lambda's handled events and metadata revisions


def policy(cfg: Config) -> Policy:
    """Promotion, the endpoint test and champion/challenger: deploy.auto_promote, deploy.test, deploy.challenge (with
    evaluation.gate_metric)."""
    test, versus = cfg.deploy.test, cfg.deploy.challenge
    return Policy(auto_promote=cfg.deploy.auto_promote, test_rows=test.rows, max_accuracy_drop=test.max_accuracy_drop,
                  p95_ms=cfg.deploy.p95_budget_ms, p50_factor=test.p50_factor, p50_overhead_ms=test.p50_overhead_ms,
                  challenge_metric=cfg.evaluation.gate_metric, challenge_rows=versus.rows,
                  challenge_tolerance=versus.tolerance)


def settings(cfg: Config) -> Settings:
    """Everything the deploy Lambda (and the CLI acting as it) needs to know of the config."""
    deploy, scaling = cfg.deploy, cfg.deploy.autoscaling
    return Settings(
        group=cfg.pipeline.model_package_group,
        staging=Stage(deploy.staging_endpoint_name, deploy.staging_instance_type, deploy.staging.instance_count),
        production=Stage(deploy.endpoint_name, deploy.instance_type, deploy.instance_count),
        role_arn=cfg.aws.role_arn,
        data_capture_s3_uri=deploy.data_capture_s3_uri,
        guardrails_alarm=deploy.guardrails_alarm,
        scaling=(scaling.min_instances, scaling.max_instances, float(scaling.target_invocations)),
        topic_arn=cfg.alerts.topic_arn,
        policy=policy(cfg),
        markers_s3_uri=f"{cfg.s3_root}/{MARKERS}",
        tracking_uri=cfg.tracking.server_arn,
        experiment=experiment(cfg) if cfg.tracking.server_arn else None,
        serverless=deploy.serverless.api if deploy.serverless else None,
    )
