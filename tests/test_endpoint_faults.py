"""The local endpoint lifecycle under faults (issue 32): real CLI processes killed with SIGKILL, real endpoint
processes on a shared port, a keep-alive client across blue/green switches, a full and a read-only root, a crashed
endpoint, a variant fallback. Torch-free keyword classifiers serve (tests/fixtures_lifecycle.py)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fixtures_lifecycle import HANDLER, toy_version
from test_lifecycle_local import GROUP, Account
from test_local_e2e import cli
from test_local_endpoint import CONTRACT_HANDLER

from pipeline.local.endpoint import LocalEndpoint, start_background, stop_background, supervisor

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def account(tmp_path, no_network):
    made = Account(tmp_path)
    yield made
    for item in supervisor.processes(made.root / "endpoints"):
        item.process.kill()


def cli_process(account: Account, *args: str) -> subprocess.Popen:
    flags = [arg for s in account.sets for arg in ("--set", s)]
    return subprocess.Popen([sys.executable, "-m", "pipeline", "--config", str(ROOT / "pipeline.yaml"), *flags, *args,
                             "--local", "--root", str(account.root)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def production_processes(account: Account) -> list[supervisor.EndpointProcess]:
    return [p for p in supervisor.processes(account.root / "endpoints") if p.state_file.stem == GROUP]


def kill_when_two_serve_production(account: Account, *args: str) -> None:
    """Run a lifecycle command and SIGKILL it once it has launched the new production process beside the old."""
    command = cli_process(account, *args)
    deadline = time.monotonic() + 120
    while len(production_processes(account)) < 2:
        assert command.poll() is None and time.monotonic() < deadline, command.communicate()[0]
        time.sleep(0.01)
    command.kill()
    command.wait()


def two_promoted_versions(account: Account, capsys) -> None:
    for number in (1, 2):
        account.register()
        code, out, err = account.cli(capsys, "models", "approve", str(number))
        assert code == 0, out + err
    assert account.serving("production") == 2


def test_a_lifecycle_command_killed_midway_leaves_no_endpoint_behind(account, capsys):
    """Item 1: `promote 1` SIGKILLed between starting the new endpoint and stopping the old leaves two processes
    on the port; the next command stops the one no state file records, and serves with exactly one."""
    two_promoted_versions(account, capsys)
    kill_when_two_serve_production(account, "promote", "1")
    time.sleep(1.0)  # the orphaned new process finishes loading and takes over the state file
    assert len(production_processes(account)) == 2
    code, out, err = account.cli(capsys, "promote", "2")
    assert code == 0, out + err
    assert "stopped a stray endpoint process" in out
    left = production_processes(account)
    assert len(left) == 1 and left[0].recorded() and account.serving("production") == 2
    port = int(account.sets[0].split("=")[1])
    assert {ping(port) for _ in range(30)} == {"2"}


def ping(port: int) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/ping")
        return json.loads(connection.getresponse().read())["version"]
    finally:
        connection.close()


def test_serve_stop_stops_every_endpoint_process_of_the_root(account, capsys):
    """Item 1: after a killed command, `serve --stop` stops the stray too, not only the recorded process."""
    two_promoted_versions(account, capsys)
    kill_when_two_serve_production(account, "promote", "1")
    assert len(production_processes(account)) == 2
    flags = [arg for s in account.sets for arg in ("--set", s)]
    code, (out, err) = cli(capsys, *flags, "serve", "--stop", "--root", str(account.root), split=True)
    assert code == 0 and "local endpoints stopped" in out, out + err
    assert supervisor.processes(account.root / "endpoints") == []


def test_keep_alive_client_loses_nothing_across_ten_switches(tmp_path, no_network):
    """Item 2: one HTTP/1.1 connection reused for every request while the endpoint is replaced 10 times."""
    model = tmp_path / "contract"
    (model / "code").mkdir(parents=True)
    (model / "code" / "inference.py").write_text(CONTRACT_HANDLER)
    state_file = tmp_path / "endpoints" / "keepalive.json"
    first = start_background(model, "keepalive", port=0, state_file=state_file, version="0")
    port, failures, answered, stop, switch = first["port"], [], [], False, 0

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while not stop:
            try:
                connection.request("POST", "/invocations", body=b'"x"', headers={"Content-Type": "application/json"})
                answer = connection.getresponse()
                answer.read()
                answered.append(answer.status)
            except (OSError, http.client.HTTPException) as e:
                failures.append(f"{e!r} after answer {len(answered)}, during switch {switch}")
                connection.close()

    thread = threading.Thread(target=client)
    thread.start()
    try:
        for switch in range(1, 11):
            start_background(model, "keepalive", port=port, state_file=state_file, version=str(switch))
    finally:
        stop = True
        thread.join()
        stop_background(state_file)
    print(f"keep-alive client: {len(answered)} answers, {len(failures)} lost across 10 switches")
    log = [line for line in state_file.with_suffix(".log").read_text().splitlines() if " 200 " not in line]
    assert failures == [] and set(answered) == {200} and len(answered) > 10, (failures, log[-40:])


def test_a_connection_queued_at_the_listener_when_it_stops_is_answered(tmp_path, no_network):
    """Stopping closes the listener; a connection the kernel already accepted into its queue is answered first (a
    closed listener resets what it queues)."""
    model = tmp_path / "contract"
    (model / "code").mkdir(parents=True)
    (model / "code" / "inference.py").write_text(CONTRACT_HANDLER)
    endpoint = LocalEndpoint()
    endpoint.start(model, "queued", port=0)
    endpoint._server.shutdown()  # the accept loop ends, as the first thing stop() does: the next connection queues
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=30) as client:
        client.sendall(b"GET /ping HTTP/1.1\r\nHost: localhost\r\n\r\n")
        endpoint.stop(drain=1.0)
        answer = client.makefile("rb").read()
    assert answer.startswith(b"HTTP/1.1 200 ") and b"Connection: close" in answer, answer


def test_a_failed_promotion_is_not_recorded_and_says_so(account, capsys):
    """Item 4: production cannot start version 2 (its port is held): the registry keeps version 1 as production,
    version 2 carries the failure, an alert says so."""
    for _ in range(2):
        account.register(status="Approved")
    assert account.cli(capsys, "deploy", "1")[0] == 0
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        code, out, err = account.cli(capsys, "deploy", "2", sets=(f"local.port={held.getsockname()[1]}",))
    assert code == 1 and "Address already in use" in err
    metadata = account.backend.registry.get(GROUP, 2).customer_metadata
    assert "promoted_at" not in metadata, metadata
    assert metadata["production_deploy_failure"].startswith("endpoint trainium-bert: cannot listen")
    assert "promoted_at" in account.backend.registry.get(GROUP, 1).customer_metadata
    assert any("deploying version 2 failed" in line for line in account.alerts())
    assert account.serving("production") == 1
    code, out, err = account.cli(capsys, "endpoints")
    assert code == 0 and "registry" not in out, out  # registry and endpoint agree: version 1


def test_a_killed_endpoint_is_restarted_by_the_next_command_and_counted(account, capsys):
    """Item 6: SIGKILL of the production process; `endpoints` restarts it, alerts, and shows the restart."""
    account.register()
    assert account.cli(capsys, "models", "approve", "1")[0] == 0
    (victim,) = production_processes(account)
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(10)
    code, out, err = account.cli(capsys, "endpoints")
    assert code == 0, err
    assert "died; restarted at" in out and "(restart 1)" in out
    production = [v for v in account.backend.endpoints() if v.stage == "production"][0]
    assert production.version == 1 and production.status.startswith("InService, 1 restart")
    assert any("died; restarted" in line for line in account.alerts())
    assert account.invoke("production", ["great"]) == ["positive"]


FALLBACK_HANDLER = HANDLER.replace("def predict_fn(texts, model):", '''def predict_fn(texts, model, context=None):
    if hasattr(context, "set_response_header"):
        context.set_response_header(0, "X-Amzn-SageMaker-Custom-Attributes", "inference-variant=" + model["serves"])''')


def test_a_variant_fallback_fails_the_endpoint_test(account, capsys):
    """Item 3: the version's environment names onnxruntime int8, its handler fell back to torch fp32 (as
    training/inference.py does with corrupted ONNX weights): the staging test fails, nothing is promoted."""
    environment = {"INFERENCE_RUNTIME": "onnxruntime", "INFERENCE_QUANTIZE": "int8"}
    for number, serves in ((1, "onnxruntime-int8"), (2, "torch-fp32")):
        model, report = toy_version(account.folder / f"v{number}", "good")
        (model / "code" / "inference.py").write_text(FALLBACK_HANDLER)
        (model / "toy.json").write_text(json.dumps({"kind": "good", "serves": serves}))
        account.backend.registry.register(GROUP, model, approval_status="PendingManualApproval", metrics=report,
                                          environment=environment)
        code, out, err = account.cli(capsys, "models", "approve", str(number))
        assert code == 0, out + err
    metadata = account.backend.registry.get(GROUP, 2).customer_metadata
    assert metadata["staging_test"] == "fail", metadata
    assert "the endpoint serves torch-fp32, not the onnxruntime-int8" in out
    assert account.backend.registry.get(GROUP, 1).customer_metadata["staging_test"] == "pass"
    assert account.serving("production") == 1 and "promoted_at" not in metadata


def unshared(script: str) -> subprocess.CompletedProcess:
    """`script` in a user and mount namespace of its own (where this test may mount a tmpfs), or skip."""
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if shutil.which("unshare") is None or probe.returncode != 0:
        pytest.skip("unshare -rm is not permitted here")
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_storage_fault_says_what_could_not_be_done_where(tmp_path):
    """A permission error may come from a read: it names the path, not "cannot write"; no path, no guess."""
    import errno

    from pipeline.errors import storage_fault

    target = tmp_path / "registry.json"
    assert storage_fault(PermissionError(errno.EACCES, "Permission denied", str(target))) == (
        f"cannot access {target}: permission denied (check the folder's owner and mode)")
    assert storage_fault(PermissionError(errno.EACCES, "Permission denied")) is None
    assert storage_fault(OSError(errno.ENOSPC, "No space left on device", str(target))) == (
        f"cannot write in {tmp_path}: the disk is full (free some space)")
    assert storage_fault(OSError(errno.ENOSPC, "No space left on device")) == (
        "cannot write: the disk is full (free some space)")
    assert storage_fault(FileNotFoundError(errno.ENOENT, "No such file", str(target))) is None


@pytest.mark.parametrize("fault, cause", [
    ("full", "the disk is full (free some space)"),
    ("read-only", "the file system is read-only (use a writable folder, e.g. --root)"),
])
def test_a_full_or_read_only_root_is_one_line_naming_the_folder(account, fault, cause):
    """Item 5: approving on a root whose disk is full, or that is read-only: one line, the folder, exit 1."""
    account.register()
    root = account.root
    flags = " ".join(f"--set {s}" for s in account.sets)
    command = (f"{sys.executable} -m pipeline --config {ROOT / 'pipeline.yaml'} {flags} models approve 1 --local "
               f"--root {root}")
    if fault == "full":  # a tmpfs holding a copy of the root, then filled up
        setup = (f"mount -t tmpfs -o size=2m tmpfs {root} && cp -a {account.folder}/copy/. {root}/ && "
                 f"(dd if=/dev/zero of={root}/filler bs=4k 2>/dev/null; true)")
        shutil.copytree(root, account.folder / "copy")
    else:
        setup = f"mount --bind {root} {root} && mount -o remount,bind,ro {root}"
    done = unshared(f"{setup} && {command}")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stdout + done.stderr
    assert lines[0].startswith(f"error: cannot write in {root}") and lines[0].endswith(cause), lines
