"""The local endpoint lifecycle under faults (issue 32): real CLI processes killed with SIGKILL, a keep-alive client
across model swaps, 64 clients with a new connection per request, a full and a read-only root, a crashed worker and
a killed endpoint, a variant fallback. Torch-free keyword classifiers serve (tests/fixtures_lifecycle.py)."""

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

import psutil
import pytest
from fixtures_lifecycle import HANDLER, toy_version
from test_lifecycle_local import GROUP, Account
from test_local_e2e import cli
from test_local_endpoint import CONTRACT_HANDLER

from pipeline.local.endpoint import read_state, restarts, start_background, stop_background, supervisor

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


def two_promoted_versions(account: Account, capsys) -> None:
    for number in (1, 2):
        account.register()
        code, out, err = account.cli(capsys, "models", "approve", str(number))
        assert code == 0, out + err
    assert account.serving("production") == 2


def ping(port: int) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/ping")
        return json.loads(connection.getresponse().read())["version"]
    finally:
        connection.close()


def test_a_lifecycle_command_killed_midway_leaves_one_process_per_endpoint(account, capsys):
    """Item 1: `promote 1` SIGKILLed while the production endpoint loads version 1 beside version 2: the endpoint
    is still one recorded process serving one version; the next command serves what the registry says."""
    two_promoted_versions(account, capsys)
    log = account.root / "endpoints" / f"{GROUP}.log"
    loads = log.read_text().count("version 1)")
    command = cli_process(account, "promote", "1")
    deadline = time.monotonic() + 120
    while log.read_text().count("version 1)") == loads:  # until it loads version 1
        assert command.poll() is None and time.monotonic() < deadline, command.communicate()[0]
        time.sleep(0.01)
    command.kill()
    command.wait()
    (left,) = production_processes(account)
    assert left.recorded()
    port = int(account.sets[0].split("=")[1])
    assert len({ping(port) for _ in range(10)}) == 1  # one version, whichever the swap reached
    code, out, err = account.cli(capsys, "promote", "2")
    assert code == 0, out + err
    (left,) = production_processes(account)
    assert left.recorded() and account.serving("production") == 2
    assert {ping(port) for _ in range(30)} == {"2"}


def test_serve_stop_stops_every_endpoint_process_of_the_root(account, capsys):
    """Item 1: `serve --stop` stops an endpoint process that no state file records (as a command killed between
    starting an endpoint on a new port and stopping the old one leaves it), and the workers with their managers."""
    two_promoted_versions(account, capsys)
    folder = account.root / "endpoints"
    model = Path(account.backend.registry.get(GROUP, 1).model_data)
    stray = start_background(model, "stray", port=0, state_file=folder / "stray.json")
    (folder / "stray.json").unlink()
    assert [p.pid for p in supervisor.strays(folder)] == [stray["pid"]]
    workers = [read_state(folder / f"{name}.json")["worker_pid"] for name in (GROUP, f"{GROUP}-staging")]
    flags = [arg for s in account.sets for arg in ("--set", s)]
    code, (out, err) = cli(capsys, *flags, "serve", "--stop", "--root", str(account.root), split=True)
    assert code == 0 and "local endpoints stopped" in out, out + err
    assert supervisor.processes(folder) == []
    assert not any(psutil.pid_exists(pid) for pid in [*workers, stray["worker_pid"]])
    with pytest.raises(OSError):
        ping(stray["port"])


def test_keep_alive_client_loses_nothing_across_ten_switches(tmp_path, no_network):
    """Item 2: one HTTP/1.1 connection reused for every request while the endpoint's model is swapped 10 times."""
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
            before = len(answered)
            start_background(model, "keepalive", port=port, state_file=state_file, version=str(switch))
            while len(answered) < before + 3 and thread.is_alive():  # requests on both sides of each switch
                time.sleep(0.001)
    finally:
        stop = True
        thread.join()
        stop_background(state_file)
    print(f"keep-alive client: {len(answered)} answers, {len(failures)} lost across 10 switches")
    log = [line for line in state_file.with_suffix(".log").read_text().splitlines() if " 200 " not in line]
    assert failures == [] and set(answered) == {200} and len(answered) >= 30, (failures, log[-40:])


def test_64_clients_each_with_a_new_connection_per_request_lose_nothing(tmp_path, no_network):
    """Item 2: 64 threads, each opening a new connection for every request (the kernel queues them at the
    manager's listening socket), 20 requests each: every one answered."""
    model = tmp_path / "contract"
    (model / "code").mkdir(parents=True)
    (model / "code" / "inference.py").write_text(CONTRACT_HANDLER)
    state_file = tmp_path / "endpoints" / "crowd.json"
    port = start_background(model, "crowd", port=0, state_file=state_file)["port"]
    failures: list[str] = []

    def client() -> None:
        for _ in range(20):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                connection.request("POST", "/invocations", body=b'"x"', headers={"Content-Type": "application/json"})
                answer = connection.getresponse()
                if answer.status != 200 or b'"text"' not in answer.read():
                    failures.append(f"status {answer.status}")
            except (OSError, http.client.HTTPException) as e:
                failures.append(repr(e))
            finally:
                connection.close()

    threads = [threading.Thread(target=client) for _ in range(64)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        stop_background(state_file)
    assert failures == [], f"{len(failures)} of 1280 requests failed: {failures[:5]}"


def test_a_crashed_worker_is_restarted_within_seconds_with_no_command_and_alerted(account, capsys):
    """Item 6: SIGKILL of the production endpoint's worker (where the model runs); with no command run, its manager
    starts another, which serves the same version; a request made meanwhile waits at the socket and is answered."""
    account.register()
    assert account.cli(capsys, "models", "approve", "1")[0] == 0
    state_file = account.root / "endpoints" / f"{GROUP}.json"
    state = read_state(state_file)
    worker = psutil.Process(state["worker_pid"])
    worker.kill()
    worker.wait(10)
    killed = time.monotonic()
    assert account.invoke("production", ["great", "awful"]) == ["positive", "negative"]
    print(f"answered {time.monotonic() - killed:.1f} s after the worker was killed")
    after = read_state(state_file)
    assert after["pid"] == state["pid"] and after["worker_pid"] != worker.pid and after["version"] == "1"
    assert restarts(state_file) == 1
    assert any(f"its worker (pid {worker.pid}) died; restarted" in line for line in account.alerts())
    production = [v for v in account.backend.endpoints() if v.stage == "production"][0]
    assert production.version == 1 and production.status.startswith("InService, 1 restart")


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
    """Item 6: SIGKILL of the production endpoint's manager (its worker leaves after it); `endpoints` restarts the
    endpoint, alerts, and shows the restart."""
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
