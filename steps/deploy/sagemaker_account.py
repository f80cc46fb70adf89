"""The lifecycle's account on AWS (lifecycle.Account over boto3): the Model Registry, the staging and production
endpoints, the labelled sample in S3 and the alerts topic. Used by the deploy Lambda and, with the same settings, by
the CLI (`promote`, `models reject`, `endpoints`). Standard library and boto3 only.

The Lambda reads its settings from its environment (`Settings.from_env`), which `upsert` writes from the config's
settings (`Settings.to_env`); the CLI hands the config's settings over directly. The variables:
ENDPOINT_NAME / INSTANCE_TYPE / INSTANCE_COUNT (production), STAGING_ENDPOINT_NAME / STAGING_INSTANCE_TYPE /
STAGING_INSTANCE_COUNT, MODEL_PACKAGE_GROUP, SAGEMAKER_ROLE_ARN (the models' execution role), DATA_CAPTURE_S3_URI and
GUARDRAILS_ALARM (production), SCALING_MIN_INSTANCES / SCALING_MAX_INSTANCES / SCALING_TARGET_INVOCATIONS (production
autoscaling), SERVERLESS_CONFIG (both endpoints serverless: a ProductionVariantServerlessConfig as JSON), AUTO_PROMOTE,
TEST_ROWS / TEST_MAX_ACCURACY_DROP / TEST_P95_MS (the endpoint test), ALERTS_TOPIC_ARN, MARKERS_S3_URI.

Concurrency (SageMaker may send several events per state change; async invocations are retried): under
MARKERS_S3_URI, objects created only where absent (S3 PutObject If-None-Match: *) mark each state change claimed
(`claim`; `finish` marks it handled, and a claim left unfinished by an invocation Lambda killed at its timeout is
taken over by the retry, with a PutObject If-Match on the ETag it read, so of two takers one wins) and each revision
of a version's metadata (`set_metadata`: a write claims revision n+1 of what it read, so a concurrent writer re-reads
instead of overwriting; UpdateModelPackage itself has no condition to offer).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from steps.contract import EXPERIMENT_ENV, TRACKING_URI_ENV
from steps.deploy import challenge, endpoint_check, lifecycle, targets
from steps.deploy import sagemaker_endpoints as endpoints

SUBJECT_LIMIT = 99  # SNS: a subject is under 100 ASCII characters, one line
REVISION = "lifecycle_revision"  # the metadata's revision, claimed under MARKERS_S3_URI by each write
ABANDONED_S = 10.0  # a revision claimed this long ago and still not written: its writer died
FINISHED = b"handled"  # the body of an event's marker once its invocation finished
RUNTIME_READ_TIMEOUT_S = 70  # an endpoint answers within 60 s (InvokeEndpoint), or with a ModelError
VERDICT_S = 60  # what recording a test's verdict takes: the metadata writes, an alert, an auto-promotion


TARGET_INVOCATIONS = 100.0  # production autoscaling's target: invocations per instance per minute


@dataclass(frozen=True)
class Stage:
    endpoint: str
    instance_type: str = endpoints.DEFAULT_INSTANCE_TYPE
    instance_count: int = 1


@dataclass(frozen=True)
class Settings:
    group: str
    staging: Stage
    production: Stage
    role_arn: str | None = None
    data_capture_s3_uri: str | None = None
    guardrails_alarm: str | None = None
    scaling: tuple[int, int, float] = (1, 1, TARGET_INVOCATIONS)  # min, max instances; invocations per instance
    topic_arn: str | None = None
    policy: lifecycle.Policy = field(default_factory=lifecycle.Policy)
    markers_s3_uri: str | None = None
    tracking_uri: str | None = None  # the MLflow server whose RUNNING run of a failed or stopped execution it ends
    experiment: str | None = None
    serverless: dict[str, int] | None = None  # both endpoints on Serverless Inference (ServerlessConfig)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """The settings of the deploy Lambda's environment; DeployError naming a missing or malformed variable."""

        def get(name: str, default: str | None = None) -> str:
            value = env.get(name) or default
            if value is None:
                raise endpoints.DeployError(f"the deploy Lambda's environment has no {name}: run trainium-pipeline "
                                            f"upsert to configure it")
            return value

        default, first = lifecycle.Policy(), Stage("")
        try:
            production = Stage(get("ENDPOINT_NAME"), get("INSTANCE_TYPE", first.instance_type),
                               int(get("INSTANCE_COUNT", str(first.instance_count))))
            staging = Stage(get("STAGING_ENDPOINT_NAME", f"{production.endpoint}-staging"),
                            get("STAGING_INSTANCE_TYPE", production.instance_type),
                            int(get("STAGING_INSTANCE_COUNT", str(first.instance_count))))
            scaling = (int(get("SCALING_MIN_INSTANCES", str(production.instance_count))),
                       int(get("SCALING_MAX_INSTANCES", str(production.instance_count))),
                       float(get("SCALING_TARGET_INVOCATIONS", str(TARGET_INVOCATIONS))))
            policy = lifecycle.Policy(auto_promote=get("AUTO_PROMOTE", str(default.auto_promote)).lower() == "true",
                                      test_rows=int(get("TEST_ROWS", str(default.test_rows))),
                                      max_accuracy_drop=float(get("TEST_MAX_ACCURACY_DROP",
                                                                  str(default.max_accuracy_drop))),
                                      p95_ms=float(get("TEST_P95_MS", str(default.p95_ms))),
                                      p50_factor=float(get("TEST_P50_FACTOR", str(default.p50_factor))),
                                      p50_overhead_ms=float(get("TEST_P50_OVERHEAD_MS", str(default.p50_overhead_ms))),
                                      challenge_metric=get("CHALLENGE_METRIC", default.challenge_metric),
                                      challenge_rows=int(get("CHALLENGE_ROWS", str(default.challenge_rows))),
                                      challenge_tolerance=float(get("CHALLENGE_TOLERANCE",
                                                                    str(default.challenge_tolerance))))
            if policy.challenge_metric not in challenge.METRICS:
                raise ValueError(f"CHALLENGE_METRIC={policy.challenge_metric!r}: expected one of "
                                 f"{', '.join(challenge.METRICS)}")
            serverless = serverless_config(env.get("SERVERLESS_CONFIG") or "")
        except ValueError as e:
            raise endpoints.DeployError(f"the deploy Lambda's environment: {e}") from None
        return cls(get("MODEL_PACKAGE_GROUP"), staging, production, env.get("SAGEMAKER_ROLE_ARN") or None,
                   env.get("DATA_CAPTURE_S3_URI") or None, env.get("GUARDRAILS_ALARM") or None, scaling,
                   env.get("ALERTS_TOPIC_ARN") or None, policy, env.get("MARKERS_S3_URI") or None,
                   env.get(TRACKING_URI_ENV) or None, env.get(EXPERIMENT_ENV) or None, serverless)

    def to_env(self) -> dict[str, str]:
        """The Lambda's environment that `from_env` reads back as these settings (optional ones only when set)."""
        policy, (low, high, target) = self.policy, self.scaling
        variables = {
            "MODEL_PACKAGE_GROUP": self.group,
            "ENDPOINT_NAME": self.production.endpoint,
            "INSTANCE_TYPE": self.production.instance_type,
            "INSTANCE_COUNT": str(self.production.instance_count),
            "STAGING_ENDPOINT_NAME": self.staging.endpoint,
            "STAGING_INSTANCE_TYPE": self.staging.instance_type,
            "STAGING_INSTANCE_COUNT": str(self.staging.instance_count),
            "AUTO_PROMOTE": str(policy.auto_promote).lower(),
            "TEST_ROWS": str(policy.test_rows),
            "TEST_MAX_ACCURACY_DROP": repr(float(policy.max_accuracy_drop)),
            "TEST_P95_MS": repr(float(policy.p95_ms)),
            "TEST_P50_FACTOR": repr(float(policy.p50_factor)),
            "TEST_P50_OVERHEAD_MS": repr(float(policy.p50_overhead_ms)),
            "CHALLENGE_METRIC": policy.challenge_metric,
            "CHALLENGE_ROWS": str(policy.challenge_rows),
            "CHALLENGE_TOLERANCE": repr(float(policy.challenge_tolerance)),
            "SCALING_MIN_INSTANCES": str(low),
            "SCALING_MAX_INSTANCES": str(high),
            "SCALING_TARGET_INVOCATIONS": repr(float(target)),
        }
        optional = {"SAGEMAKER_ROLE_ARN": self.role_arn, "DATA_CAPTURE_S3_URI": self.data_capture_s3_uri,
                    "GUARDRAILS_ALARM": self.guardrails_alarm, "ALERTS_TOPIC_ARN": self.topic_arn,
                    "MARKERS_S3_URI": self.markers_s3_uri, TRACKING_URI_ENV: self.tracking_uri,
                    EXPERIMENT_ENV: self.experiment if self.tracking_uri else None,
                    "SERVERLESS_CONFIG": json.dumps(self.serverless, sort_keys=True) if self.serverless else None}
        return variables | {key: value for key, value in optional.items() if value}

    def stage(self, stage: str) -> Stage:
        return self.staging if stage == lifecycle.STAGING else self.production

    def stage_of(self, endpoint_name: str) -> str | None:
        """The stage an endpoint name belongs to (SageMaker compares names case-insensitively), or None."""
        for stage in lifecycle.STAGES:
            if self.stage(stage).endpoint.lower() == (endpoint_name or "").lower():
                return stage
        return None


def serverless_config(text: str) -> dict[str, int] | None:
    """SERVERLESS_CONFIG's ServerlessConfig ({"MemorySizeInMB", "MaxConcurrency"[, "ProvisionedConcurrency"]}), None
    when empty; ValueError for anything else."""
    if not text.strip():
        return None
    expected = f"SERVERLESS_CONFIG={text!r}: expected JSON like {{\"MemorySizeInMB\": 2048, \"MaxConcurrency\": 5}}"
    try:
        config = json.loads(text)
    except ValueError:
        raise ValueError(expected) from None
    keys = {"MemorySizeInMB", "MaxConcurrency"}
    if not (isinstance(config, dict) and keys <= set(config) <= keys | {"ProvisionedConcurrency"}
            and all(isinstance(v, int) and v > 0 for v in config.values())
            and config["MemorySizeInMB"] in targets.SERVERLESS_MEMORY_MB):
        raise ValueError(expected)
    return config


def _version(package: dict) -> lifecycle.Version:
    return lifecycle.Version(int(package["ModelPackageVersion"]), package.get("ModelApprovalStatus", ""),
                             dict(package.get("CustomerMetadataProperties") or {}), package["ModelPackageArn"])


def subject(line: str) -> str:
    """An SNS subject (Publish: no line breaks or control characters, under 100 characters; printable ASCII, as
    e-mail subjects want): the line's runs of whitespace and control characters as one space, at most 99."""
    text = " ".join("".join(c if " " <= c <= "~" else "?" if c.isprintable() else " " for c in line).split())
    text = text or "alert"
    return text if len(text) <= SUBJECT_LIMIT else text[: SUBJECT_LIMIT - 3] + "..."


class SageMakerAccount:
    """lifecycle.Account on boto3 clients: `sagemaker`, and where needed `s3`, `sns`, `autoscaling` and `runtime`."""

    def __init__(self, settings: Settings, sagemaker: Any, *, s3: Any = None, sns: Any = None,
                 autoscaling: Any = None, runtime: Any = None) -> None:
        self.settings, self.sm, self.s3, self.sns = settings, sagemaker, s3, sns
        self.autoscaling, self._runtime = autoscaling, runtime
        self.alerts: list[str] = []
        self.deadline: float | None = None  # time.monotonic() when the Lambda invocation is killed (None: never)

    @classmethod
    def from_boto3(cls, settings: Settings, session: Any = None) -> SageMakerAccount:
        """Clients of the default session (the Lambda's role), the runtime with honest latencies: no retries."""
        import boto3
        from botocore.config import Config

        session = session or boto3.session.Session()
        runtime = session.client("sagemaker-runtime", config=Config(
            read_timeout=RUNTIME_READ_TIMEOUT_S, connect_timeout=5, retries={"max_attempts": 1, "mode": "standard"}))
        return cls(settings, session.client("sagemaker"), s3=session.client("s3"), sns=session.client("sns"),
                   autoscaling=session.client("application-autoscaling"), runtime=runtime)

    def _packages(self, status: str | None = None) -> list[dict]:
        request: dict[str, Any] = {"ModelPackageGroupName": self.settings.group}
        if status:
            request["ModelApprovalStatus"] = status
        pages = self.sm.get_paginator("list_model_packages").paginate(**request)
        return [summary for page in pages for summary in page["ModelPackageSummaryList"]]

    def approved(self) -> list[lifecycle.Version]:
        return [_version(self.sm.describe_model_package(ModelPackageName=summary["ModelPackageArn"]))
                for summary in self._packages(lifecycle.APPROVED)]

    def version(self, number: int) -> lifecycle.Version | None:
        for summary in self._packages():
            if int(summary.get("ModelPackageVersion", 0)) == int(number):
                return _version(self.sm.describe_model_package(ModelPackageName=summary["ModelPackageArn"]))
        return None

    def _marker(self, key: str) -> tuple[str, str]:
        bucket, _, prefix = (self.settings.markers_s3_uri or "")[5:].partition("/")
        return bucket, f"{prefix.rstrip('/')}/{key}".lstrip("/")

    def claim(self, key: str, abandoned_after_s: float | None = None) -> bool:
        """Create the marker `key`; False when it exists (claimed before), unless `abandoned_after_s` is given and
        the marker is a claim not finished that long after it was made (its holder is dead): then it is taken over.
        True when there is nowhere to keep one."""
        if not self.settings.markers_s3_uri or self.s3 is None:
            return True
        bucket, name = self._marker(key)
        try:
            _put_conditionally(self.s3, Bucket=bucket, Key=name, Body=b"", IfNoneMatch="*")
        except Exception as e:
            if not _lost_race(e):
                raise
            return abandoned_after_s is not None and self._take_over(key, abandoned_after_s)
        return True

    def _take_over(self, key: str, abandoned_after_s: float) -> bool:
        """Claim the marker `key` again if it is unfinished and older than `abandoned_after_s`: overwritten only while
        it is the object read (If-Match), so of two takers one wins."""
        bucket, name = self._marker(key)
        try:
            held = self.s3.get_object(Bucket=bucket, Key=name)
        except Exception as e:
            # released meanwhile: claimed afresh (the role has no s3:ListBucket, so S3 says 403 for a missing key)
            if endpoints._error_code(e)[0] in ("NoSuchKey", "AccessDenied"):
                return self.claim(key)
            raise
        age = (datetime.now(timezone.utc) - held["LastModified"]).total_seconds()
        if held["Body"].read() == FINISHED or age < abandoned_after_s:
            return False
        try:
            _put_conditionally(self.s3, Bucket=bucket, Key=name, Body=b"", IfMatch=held["ETag"])
        except Exception as e:
            if _lost_race(e):
                return False
            raise
        return True

    def finish(self, key: str) -> None:
        """Mark the claim `key` finished: a later delivery of what it marks is a duplicate however late it comes."""
        if self.settings.markers_s3_uri and self.s3 is not None:
            bucket, name = self._marker(key)
            self.s3.put_object(Bucket=bucket, Key=name, Body=FINISHED)

    def release(self, key: str) -> None:
        """Delete the marker `key` (what it marked did not happen after all)."""
        if self.settings.markers_s3_uri and self.s3 is not None:
            bucket, name = self._marker(key)
            self.s3.delete_object(Bucket=bucket, Key=name)

    def _read_and_claim(self, version: lifecycle.Version) -> tuple[dict, str]:
        """The package, and the next revision of its metadata, claimed; a claim held by a live writer is waited out
        (then read again), one claimed ABANDONED_S ago and never written is passed over."""
        first_seen: dict[str, float] = {}
        while True:
            package = self.sm.describe_model_package(ModelPackageName=version.arn)
            read = int((package.get("CustomerMetadataProperties") or {}).get(REVISION) or 0)
            for number in itertools.count(read + 1):
                key = f"revisions/{self.settings.group}/{version.number}/{number}"
                if self.claim(key):
                    return package, str(number)
                if time.monotonic() - first_seen.setdefault(key, time.monotonic()) < ABANDONED_S:
                    break
            time.sleep(0.2)

    def set_metadata(self, version: lifecycle.Version, values: dict[str, str]) -> None:
        """Read, merge, write the whole map (moto would otherwise drop the keys not sent) as the next claimed
        revision, so a concurrent write is merged, not lost. The approval status is not sent (a stale one could undo
        a rejection made meanwhile); moto drops it then, so it is restored if gone."""
        package, revision = self._read_and_claim(version)
        merged = {**(package.get("CustomerMetadataProperties") or {}), **values}
        if self.settings.markers_s3_uri and self.s3 is not None:
            merged[REVISION] = revision
        try:
            self.sm.update_model_package(ModelPackageArn=version.arn, CustomerMetadataProperties=merged)
        except Exception:
            self.release(f"revisions/{self.settings.group}/{version.number}/{revision}")
            raise
        status = package.get("ModelApprovalStatus")
        if status and not self.sm.describe_model_package(ModelPackageName=version.arn).get("ModelApprovalStatus"):
            kept = {"ApprovalDescription": package["ApprovalDescription"]} if package.get("ApprovalDescription") else {}
            self.sm.update_model_package(ModelPackageArn=version.arn, ModelApprovalStatus=status,
                                         CustomerMetadataProperties=merged, **kept)

    def endpoint(self, stage: str) -> lifecycle.Endpoint:
        name = self.settings.stage(stage).endpoint
        described = endpoints.describe(self.sm.describe_endpoint, EndpointName=name)
        if described is None:
            return lifecycle.Endpoint(name)
        config = endpoints.target_config(described)
        instances = sum(int(v.get("CurrentInstanceCount") or 0) for v in described.get("ProductionVariants") or [])
        return lifecycle.Endpoint(name, endpoints.config_version(config), described.get("EndpointStatus", ""),
                                  instances or None, config)

    def failure_reason(self, stage: str) -> str:
        described = endpoints.describe(self.sm.describe_endpoint, EndpointName=self.settings.stage(stage).endpoint)
        return (described or {}).get("FailureReason", "")

    def deploy(self, stage: str, version: lifecycle.Version) -> dict[str, Any]:
        target, production = self.settings.stage(stage), stage == lifecycle.PRODUCTION
        return endpoints.deploy(
            self.sm, version.arn, target.endpoint, target.instance_type, target.instance_count,
            role_arn=self.settings.role_arn,
            data_capture_s3_uri=self.settings.data_capture_s3_uri if production else None,
            guardrails_alarm=self.settings.guardrails_alarm if production else None,
            autoscaling=self.autoscaling if production else None, serverless=self.settings.serverless,
        )

    def in_service(self, stage: str) -> str:
        if stage != lifecycle.PRODUCTION or self.autoscaling is None:
            return ""
        if self.settings.serverless:
            return "serverless: SageMaker scales it, no autoscaling policy"
        low, high, target = self.settings.scaling
        endpoints.apply_autoscaling(self.autoscaling, self.settings.production.endpoint, low, high, target)
        return f"autoscaling {low}-{high} instances, target {target:g} invocations per instance per minute"

    def runtime(self, stage: str) -> Any:
        return self._runtime

    def test_seconds(self) -> float | None:
        """Until the invocation's end, less one request's read timeout and the time to record the verdict."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic() - RUNTIME_READ_TIMEOUT_S - VERDICT_S)

    def sample(self, version: lifecycle.Version) -> list[dict[str, Any]]:
        package = self.sm.describe_model_package(ModelPackageName=version.arn)
        report = package.get("ModelMetrics", {}).get("ModelQuality", {}).get("Statistics", {}).get("S3Uri", "")
        if not report.startswith("s3://"):
            raise endpoint_check.SampleError(f"version {version.number} has no evaluation report in its metrics")
        uri = f"{report.rsplit('/', 1)[0]}/{endpoint_check.SAMPLE_FILE}"
        bucket, _, key = uri[5:].partition("/")
        try:
            body = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except Exception as e:
            code = (getattr(e, "response", None) or {}).get("Error", {}).get("Code", type(e).__name__)
            raise endpoint_check.SampleError(f"{uri}: {code}") from None
        return endpoint_check.read_sample(body.splitlines(), uri)

    def expected(self, version: lifecycle.Version) -> dict[str, Any]:
        package = self.sm.describe_model_package(ModelPackageName=version.arn)
        containers = package.get("InferenceSpecification", {}).get("Containers") or [{}]
        report = package.get("ModelMetrics", {}).get("ModelQuality", {}).get("Statistics", {}).get("S3Uri", "")
        evaluation: dict[str, Any] = {}
        if report.startswith("s3://"):
            bucket, _, key = report[5:].partition("/")
            try:
                evaluation = json.loads(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            except Exception as e:  # no report: the variant is still checked, the latency is not (said in the log)
                code = (getattr(e, "response", None) or {}).get("Error", {}).get("Code", type(e).__name__)
                print(json.dumps({"warning": f"cannot read {report}: {code}: the endpoint test checks no latency"}))
                evaluation = {}
        device = targets.DEVICES[targets.serving_target(self.settings.staging.instance_type)]
        expected = endpoint_check.expectation(containers[0].get("Environment") or {}, evaluation, device)
        # Serverless compute is not the evaluation's instance: its p50 is no reference there
        return {**expected, "p50_ms": None} if self.settings.serverless else expected

    def alert(self, line: str, detail: dict[str, Any]) -> None:
        """One readable line plus the JSON, to the alerts topic (when configured) and the log."""
        self.alerts.append(line)
        print(json.dumps({"alert": line, **detail}, default=str))
        if self.sns is not None and self.settings.topic_arn:
            self.sns.publish(TopicArn=self.settings.topic_arn, Subject=subject(line),
                             Message=f"{line}\n{json.dumps(detail, default=str, indent=2)}")


def _lost_race(error: Exception) -> bool:
    """S3's answer to a conditional write whose condition no longer holds (412): another claimant won."""
    return endpoints._error_code(error)[0] == "PreconditionFailed"


CONFLICT_ATTEMPTS = 5  # a 409 is tried again up to 4 times, 0.1 to 0.8 s apart


def _put_conditionally(s3: Any, **request: Any) -> None:
    """PutObject with If-None-Match or If-Match. S3's 409 ConditionalRequestConflict means that a conflicting
    operation ran during the upload and the write should be tried again (PutObject's documentation), not that another
    claimant won: it is retried with backoff; a 412 (or a 409 that outlasts the attempts) reaches the caller."""
    for attempt in range(CONFLICT_ATTEMPTS):
        try:
            s3.put_object(**request)
            return
        except Exception as e:
            if endpoints._error_code(e)[0] != "ConditionalRequestConflict" or attempt == CONFLICT_ATTEMPTS - 1:
                raise
            time.sleep(0.1 * 2**attempt)
