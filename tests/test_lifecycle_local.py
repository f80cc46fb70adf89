"""The model lifecycle on this machine, through the CLI: approve -> staging -> endpoint test -> promotion, rejection
-> rollback, `endpoints`, blue/green deploys and racing approvals. Real local endpoints (detached processes on their
own ports) serve torch-free keyword classifiers; the endpoint test goes through the stock boto3 client."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError
from fixtures_lifecycle import toy_version
from test_local_e2e import cli

from pipeline.config import load_config
from pipeline.local.backend import LocalBackend

ROOT = Path(__file__).resolve().parent.parent
GROUP, PRODUCTION, STAGING = "trainium-bert", "trainium-bert", "trainium-bert-staging"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Account:
    """A local root with its config, backend and CLI."""

    def __init__(self, folder: Path, *sets: str) -> None:
        self.folder, self.root = folder, folder / "local"
        self.sets = [f"local.port={free_port()}", f"local.staging_port={free_port()}",
                     "deploy.challenge.tolerance=0.05", *sets]  # 40 sample rows: equal models' interval is +-0.047
        self.backend = LocalBackend(load_config(ROOT / "pipeline.yaml", self.sets, environ={}, local=True), self.root)

    def register(self, kind: str = "good", status: str = "PendingManualApproval") -> int:
        number = len(self.backend.registry.list(GROUP)) + 1
        model, report = toy_version(self.folder / f"v{number}-{kind}", kind)
        return self.backend.registry.register(GROUP, model, approval_status=status, metrics=report).version

    def cli(self, capsys, *args: str, sets: tuple[str, ...] = ()) -> tuple[int, str, str]:
        flags = [arg for s in [*self.sets, *sets] for arg in ("--set", s)]
        code, out = cli(capsys, *flags, *args, "--local", "--root", str(self.root), split=True)
        return code, *out

    def serving(self, stage: str) -> int | None:
        return self.backend.services.endpoint(stage).version

    def invoke(self, stage: str, texts: list[str]) -> list[str]:
        """The stock boto3 sagemaker-runtime client, EndpointName = the stage's endpoint."""
        endpoint = self.backend.services.endpoint(stage)
        runtime = boto3.client("sagemaker-runtime", endpoint_url=endpoint.where, region_name="us-east-1")
        answer = runtime.invoke_endpoint(EndpointName=endpoint.name, ContentType="application/json",
                                         Body=json.dumps({"inputs": texts}))
        return [p["label"] for p in json.loads(answer["Body"].read())]

    def alerts(self) -> list[str]:
        path = self.root / "alerts.jsonl"
        return [json.loads(line)["line"] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def account(tmp_path, no_network):
    made = Account(tmp_path)
    yield made
    made.backend.stop_endpoint()


def test_approve_test_promote_reject_roll_back(account, capsys):
    assert account.register() == 1
    code, out, err = account.cli(capsys, "models", "approve", "1")
    assert code == 0, err
    assert "model version 1: Approved" in out
    assert f"staging {STAGING}: version 1 created" in out
    assert f"staging test of version 1 on {STAGING}: PASS on 40 rows: accuracy 1.0000 (evaluation 0.9500)" in out
    assert f"production {PRODUCTION}: version 1 promoted automatically after its staging test passed" in out
    assert f"production {PRODUCTION}: version 1 created" in out
    assert account.invoke("staging", ["great", "awful"]) == ["positive", "negative"]
    assert account.invoke("production", ["love it"]) == ["positive"]
    metadata = account.backend.registry.get(GROUP, 1).customer_metadata
    assert metadata["staging_test"] == "pass" and metadata["staging_test_rows"] == "40"
    assert float(metadata["staging_test_p95_ms"]) > 0 and "promoted_at" in metadata

    # A broken model: every request is an error answer; it stays on staging and never reaches production.
    assert account.register("broken") == 2
    code, out, err = account.cli(capsys, "models", "approve", "2")
    assert code == 0, err
    assert f"staging test of version 2 on {STAGING}: FAIL on 40 rows: accuracy 0.0000 (evaluation 0.9500)" in out
    assert "40 of 40 requests got an error answer (ModelError: " in out and "this model is broken" in out
    assert "promoted" not in out
    assert (account.serving("staging"), account.serving("production")) == (2, 1)
    assert account.backend.registry.get(GROUP, 2).customer_metadata["staging_test"] == "fail"
    code, _, err = account.cli(capsys, "promote", "2")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "version 2 has not passed its staging test: it failed (40 of 40 requests got an error answer" in err
    assert account.serving("production") == 1

    # `endpoints`: per stage the version, status, instances, scaling and the last test.
    code, out, err = account.cli(capsys, "endpoints")
    assert code == 0 and "there is no scaling locally" in out, err
    staging, production = account.backend.endpoints()
    assert (staging.stage, staging.endpoint, staging.version, staging.status) == ("staging", STAGING, 2, "InService")
    assert (production.endpoint, production.version, production.instances) == (PRODUCTION, 1, "1")
    assert staging.test.startswith("fail: 40 of 40 requests got an error answer")
    assert production.test.startswith("pass: accuracy 1.0 (evaluation 0.95), p95 ")
    assert production.scaling == "none (local)" and production.where.startswith("http")

    # Champion/challenger: a weaker version (it takes only "great" for praise: wrong on 4 of the 40 rows production
    # gets right) passes its staging test, yet both endpoints are sent its sample and it is held for a person.
    assert account.register("weak") == 3
    code, out, err = account.cli(capsys, "models", "approve", "3")
    assert code == 0, err
    assert f"staging test of version 3 on {STAGING}: PASS on 40 rows" in out
    held = (f"production {PRODUCTION}: version 3 scores accuracy -0.1000 against production version 1 on the same 40 "
            f"rows (95% interval -0.1955 to +0.0051): may be worse by more than 0.05, left for a person (promote N)")
    assert held in out and "promoted" not in out and held in account.alerts()
    assert (account.serving("staging"), account.serving("production")) == (3, 1)
    assert account.backend.registry.get(GROUP, 3).customer_metadata["challenge"] == "hold"

    # A good fourth version goes through; rejecting it rolls both stages back to the newest other passed version.
    assert account.register() == 4
    code, out, err = account.cli(capsys, "models", "approve", "4")
    assert code == 0 and (account.serving("staging"), account.serving("production")) == (4, 4), out + err
    assert f"production {PRODUCTION}: version 4 scores accuracy +0.0000 against production version 1" in out
    code, out, err = account.cli(capsys, "models", "reject", "4", "--note", "bad labels")
    assert code == 0, err
    assert (f"production {PRODUCTION}: version 4 is no longer Approved: back to version 1, the newest other "
            f"Approved version that passed its staging test") in out
    assert f"production {PRODUCTION}: version 1 updated" in out
    assert (account.serving("staging"), account.serving("production")) == (1, 1)
    assert account.invoke("production", ["great"]) == ["positive"]

    # Rejecting the last passed version: nothing to roll back to; the endpoint stays and the CLI and alert say so.
    code, out, err = account.cli(capsys, "models", "reject", "1")
    assert code == 0, err
    assert (f"production {PRODUCTION}: version 1 is no longer Approved and no other Approved version passed its "
            f"staging test: {PRODUCTION} keeps serving it") in out
    assert account.serving("production") == 1
    alerts = account.alerts()
    assert any(a.startswith("staging test of version 2") and "FAIL" in a for a in alerts)
    assert any("version 1 promoted automatically" in a for a in alerts)
    assert any("back to version 1" in a for a in alerts) and any("keeps serving it" in a for a in alerts)


def test_a_deploy_that_cannot_start_leaves_the_running_endpoint_serving(account, capsys):
    for _ in range(2):
        account.register(status="Approved")
    assert account.cli(capsys, "deploy", "1")[0] == 0  # staging, tested, promoted
    before = account.backend.services.endpoint("production")
    with socket.socket() as held:  # another program holds the port production is moved to
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code, out, err = account.cli(capsys, "deploy", "2", sets=(f"local.port={port}",))
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "Address already in use" in err and f"version 1 still serves at {before.where}" in err
    assert "Traceback" not in out + err
    assert account.serving("production") == 1 and account.invoke("production", ["great"]) == ["positive"]


def test_blue_green_on_the_same_port_answers_every_request_during_the_switch(account, capsys):
    for _ in range(2):
        account.register(status="Approved")
    assert account.cli(capsys, "deploy", "1")[0] == 0
    url = account.backend.services.endpoint("staging").where
    failures, answered, stop = [], [], threading.Event()

    def ping() -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=10) as answer:
                    answered.append(json.loads(answer.read())["version"])
            except OSError as e:
                failures.append(repr(e))

    pinger = threading.Thread(target=ping)
    pinger.start()
    try:
        code, out, err = account.cli(capsys, "deploy", "2")
    finally:
        stop.set()
        pinger.join()
    assert code == 0, err
    assert failures == [] and "1" in answered and answered[-1] == "2"
    assert account.backend.services.endpoint("staging").where == url and account.serving("staging") == 2


def test_racing_approvals_end_as_a_serial_order(account):
    for _ in range(3):
        account.register()
    flags = [arg for s in account.sets for arg in ("--set", s)]

    def approve(version: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "pipeline", "--config", str(ROOT / "pipeline.yaml"), *flags,
                                 "models", "approve", str(version), "--local", "--root", str(account.root)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    racers = [approve(2), approve(3)]
    for racer in racers:
        _, err = racer.communicate(timeout=300)
        assert racer.returncode == 0 and "Traceback" not in err, err
    statuses = {v.version: v.status for v in account.backend.registry.list(GROUP)}
    assert statuses == {1: "PendingManualApproval", 2: "Approved", 3: "Approved"}
    # Either order ends with version 3 on both endpoints (approve 2 then 3, or 3 then 2: 3 is newest and tested).
    assert (account.serving("staging"), account.serving("production")) == (3, 3)
    assert account.backend.registry.get(GROUP, 3).customer_metadata["staging_test"] == "pass"
    with pytest.raises(ClientError, match="Endpoint nope of account"):
        boto3.client("sagemaker-runtime", endpoint_url=account.backend.services.endpoint("staging").where,
                     region_name="us-east-1").invoke_endpoint(EndpointName="nope", Body=b"{}",
                                                              ContentType="application/json")


def test_the_endpoint_name_is_no_parameter(tmp_path, capsys):
    """Issue 19 item 6: the deploy Lambda's role is scoped to the configured endpoints; no run may name another."""
    code, (_, err) = cli(capsys, "run", "--local", "--root", str(tmp_path), "-p", "EndpointName=other", split=True)
    assert code == 1 and "--param EndpointName: unknown parameter" in err and "Traceback" not in err
    assert not list(tmp_path.rglob("execution.json"))
