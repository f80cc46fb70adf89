"""The lifecycle commands of the real console script against `moto_server` on 127.0.0.1: approve (staging and its
endpoint test), promote (production and its autoscaling), endpoints, reject (no rollback target), alerts on the SNS
topic. The endpoint test's `sagemaker-runtime` calls go to a real local endpoint (AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME),
everything else to moto_server (AWS_ENDPOINT_URL), as boto3 routes them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from fixtures_lifecycle import toy_version
from moto.server import ThreadedMotoServer

from pipeline.local.endpoint import LocalEndpoint

ROOT = Path(__file__).resolve().parent.parent
BUCKET, GROUP = "lifecycle-server-bucket", "trainium-bert"


@pytest.fixture
def server(tmp_path, no_network):
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    model, report = toy_version(tmp_path / "v1")
    staging = LocalEndpoint()
    staging.start(model, "trainium-bert-staging", port=0, version="1")
    yield f"http://{host}:{port}", staging.url, report
    staging.stop()
    moto.stop()


@pytest.mark.slow  # the console script, one process per command
def test_approve_promote_endpoints_reject_through_the_console_script(server):
    url, runtime_url, report = server

    def client(service: str):
        return boto3.client(service, endpoint_url=url, region_name="us-east-1")

    client("s3").create_bucket(Bucket=BUCKET)
    prefix = "trainium-bert/executions/e1/evaluation"
    for path in report.parent.iterdir():
        client("s3").put_object(Bucket=BUCKET, Key=f"{prefix}/{path.name}", Body=path.read_bytes())
    sm = client("sagemaker")
    sm.create_model_package_group(ModelPackageGroupName=GROUP)
    sm.create_model_package(
        ModelPackageGroupName=GROUP, ModelApprovalStatus="PendingManualApproval",
        InferenceSpecification={"Containers": [{"Image": "763104351884.dkr.ecr.us-east-1.amazonaws.com/hf:cpu",
                                                "ModelDataUrl": f"s3://{BUCKET}/model.tar.gz"}],
                                "SupportedContentTypes": ["application/json"],
                                "SupportedResponseMIMETypes": ["application/json"]},
        ModelMetrics={"ModelQuality": {"Statistics": {"ContentType": "application/json",
                                                      "S3Uri": f"s3://{BUCKET}/{prefix}/evaluation.json"}}})
    topic = client("sns").create_topic(Name="trainium-bert-alerts")["TopicArn"]
    queue = client("sqs").create_queue(QueueName="alerts")["QueueUrl"]
    queue_arn = client("sqs").get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]
    client("sns").subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn["QueueArn"],
                            Attributes={"RawMessageDelivery": "true"})

    env = {**os.environ, "AWS_ENDPOINT_URL": url, "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": runtime_url, "COLUMNS": "250"}
    exe = Path(sys.executable).parent / "trainium-pipeline"
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "pipeline"]
    sets = ["--set", f"aws.bucket={BUCKET}", "--set", f"alerts.topic_arn={topic}"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*command, *sets, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)

    approved = run("models", "approve", "1")
    assert approved.returncode == 0, approved.stderr
    assert "staging trainium-bert-staging: version 1 created" in approved.stdout
    assert "staging test of version 1 on trainium-bert-staging: PASS on 40 rows: accuracy 1.0000" in approved.stdout
    promoted = run("promote", "1")
    assert promoted.returncode == 0, promoted.stderr
    assert "production trainium-bert: version 1 promoted by hand" in promoted.stdout
    assert "production trainium-bert: version 1 created" in promoted.stdout
    assert "autoscaling 1-2 instances, target 100 invocations per instance per minute" in promoted.stdout
    listed = run("endpoints")
    assert listed.returncode == 0, listed.stderr
    rows = [line for line in listed.stdout.splitlines() if "trainium-bert" in line]
    assert len(rows) == 2 and "InService" in rows[0] and "none (staging)" in rows[0] and "pass: accuracy" in rows[0]
    assert "1-2 instances" in rows[1]
    rejected = run("models", "reject", "1")
    assert rejected.returncode == 0, rejected.stderr
    assert ("production trainium-bert: version 1 is no longer Approved and no other Approved version passed its "
            "staging test: trainium-bert keeps serving it") in rejected.stdout
    messages = client("sqs").receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    lines = [m["Body"].split("\n", 1)[0] for m in messages]
    assert any(line.startswith("staging test of version 1") for line in lines)
    assert "production trainium-bert: version 1 promoted by hand" in lines
    assert any("keeps serving it" in line for line in lines)
    assert all(json.loads(m["Body"].split("\n", 1)[1])["version"] == 1 for m in messages)
