"""The detached local endpoint: `python -m pipeline.local.endpoint ... --state-file F`, found by its state file.

The process is uvicorn's process manager (`uvicorn.supervisors.Multiprocess`, one worker). It holds the listening
socket, so connections queue at it while a worker starts; when its worker dies (killed, crashed), it starts another,
which loads the model the state file names: a crashed endpoint serves again within seconds with no command run, and
the worker counts the restart and appends an alert to the alerts file. A worker leaves when its manager is gone.
Deploying to a running endpoint swaps the model inside its worker (`PUT /local/model`, see `app`): no new process,
no connection dropped, and the old model serves on when the new one does not load.

`start_background()` launches an endpoint, or swaps the model of the running one, and returns once it serves;
`read_state()` tells whether it still runs (a pid from a stale state file may have been reused, so the process's
command line is checked); `stop_background()` stops it (SIGTERM, then SIGKILL). The processes that outlive the
command that started them, by design: the manager, its worker and multiprocessing's resource tracker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from uvicorn.supervisors import Multiprocess
from uvicorn.supervisors.multiprocess import SIGNALS

from pipeline.local.endpoint.app import (
    MODEL_ROUTE,
    READ_TIMEOUT,
    EndpointStartError,
    Serving,
    build_app,
    listen,
    load_failure,
    server_config,
)
from pipeline.local.endpoint.handler import LOG
from pipeline.local.jobs import last_error_line

MODULE = "pipeline.local.endpoint"  # what the detached process runs, and what its command line is checked for
STATE_VARIABLE = "LOCAL_ENDPOINT_STATE_FILE"  # how a worker finds its endpoint's state file
ROOT = Path(__file__).resolve().parents[3]
_DETACHED: dict[int, subprocess.Popen] = {}  # endpoints this process started: kept so that they are reaped quietly


def write_state(state_file: Path, state: dict[str, Any]) -> None:
    """Write `state` to `state_file` atomically (through a temporary file in the same folder)."""
    state_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = state_file.with_name(f".{state_file.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, state_file)


def load_state(state_file: Path) -> dict[str, Any] | None:
    """The JSON object recorded in `state_file` as is, or None when it is missing or unreadable."""
    try:
        state = json.loads(Path(state_file).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _update_state(state_file: Path, **values: Any) -> dict[str, Any]:
    state = (load_state(state_file) or {}) | values
    write_state(state_file, state)
    return state


def append_alert(alerts_file: Path, line: str, detail: dict[str, Any]) -> None:
    """One alert as a JSON line {"time", "line", "detail"} (the local account's alerts file)."""
    alerts_file.parent.mkdir(parents=True, exist_ok=True)
    record = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"), "line": line, "detail": detail}
    with alerts_file.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record, default=str) + "\n")


def restarts(state_file: Path) -> int:
    """How many times the endpoint of `state_file` was restarted after its process died."""
    try:
        return int(state_file.with_suffix(".restarts").read_text())
    except (OSError, ValueError):
        return 0


def count_restart(state_file: Path) -> int:
    """Count one more restart; the new count."""
    count = restarts(state_file) + 1
    state_file.with_suffix(".restarts").write_text(str(count))
    return count


# The worker: uvicorn's app factory, called in each worker process.

def worker_app() -> Starlette:
    """The endpoint's app in a worker: loads the model its state file names at startup, records each swap there."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    state_file = Path(os.environ[STATE_VARIABLE])
    state = load_state(state_file) or {}
    serving = Serving(state["name"], read_timeout=state.get("read_timeout", READ_TIMEOUT))
    manager = os.getppid()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await run_in_threadpool(serving.load, Path(state["model_data"]), state.get("version"),
                                    state.get("environment"))
        except Exception as error:
            _update_state(state_file, status="Failed", reason=load_failure(error))
            raise
        before = _update_state(state_file, status="InService", worker_pid=os.getpid(), reason=None)
        if state.get("worker_pid") not in (None, os.getpid()):
            _restarted(state_file, before, state["worker_pid"])
        threading.Thread(target=_leave_with, args=(manager,), name="manager-watch", daemon=True).start()
        yield
        serving.close()

    def recorded(wanted: dict) -> None:
        _update_state(state_file, model_data=wanted["model_data"], version=wanted.get("version"),
                      environment=wanted.get("environment") or {})

    return build_app(serving, recorded, lifespan)


def _restarted(state_file: Path, state: dict[str, Any], died: int) -> None:
    count = count_restart(state_file)
    line = (f"endpoint {state.get('name')}: its worker (pid {died}) died; restarted as pid {os.getpid()} serving "
            f"version {state.get('version')} (restart {count})")
    LOG.warning(line)
    if state.get("alerts_file"):
        append_alert(Path(state["alerts_file"]), line, {"action": "restarted", "endpoint": state.get("name"),
                                                        "version": state.get("version")})


def _leave_with(manager: int) -> None:
    """End this worker (gracefully, as uvicorn does on SIGTERM) once its manager is gone (SIGKILL)."""
    while os.getppid() == manager:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)


# The manager: the detached process (or the foreground `serve`).

def serve(
    model_data: Path,
    name: str,
    port: int = 8080,
    host: str = "127.0.0.1",
    *,
    version: str | None = None,
    state_file: Path | None = None,
    on_ready: Callable[[str], Any] | None = None,
    environment: dict[str, str] | None = None,
    alerts_file: Path | None = None,
    read_timeout: float = READ_TIMEOUT,
) -> None:
    """Serve in the foreground until Ctrl-C or SIGTERM, recording pid/port/version in `state_file`; an
    EndpointStartError when the model does not load (or the port is taken)."""
    with tempfile.TemporaryDirectory(prefix="local-endpoint-") as scratch:
        state_file = Path(state_file or Path(scratch) / "endpoint.json").resolve()
        sock = listen(name, host, port)
        url = f"http://{host}:{sock.getsockname()[1]}"
        write_state(state_file, {
            "pid": os.getpid(), "name": name, "host": host, "port": sock.getsockname()[1], "url": url,
            "model_data": str(Path(model_data).resolve()), "version": version, "environment": environment or {},
            "alerts_file": str(alerts_file) if alerts_file else None, "read_timeout": read_timeout,
            "status": "Starting", "process_started": psutil.Process().create_time(),
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        })
        os.environ[STATE_VARIABLE] = str(state_file)
        config = server_config(f"{__name__}:worker_app", read_timeout, factory=True, workers=1, lifespan="on")
        handlers = {signum: signal.getsignal(signum) for signum in SIGNALS}
        manager = Multiprocess(config, sockets=[sock])  # takes SIGINT, SIGTERM and SIGHUP (restart the worker)
        if on_ready is not None:
            threading.Thread(target=_when_serving, args=(state_file, url, on_ready), daemon=True).start()
        try:
            manager.run()
        finally:
            sock.close()
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            state = load_state(state_file) or {}
            ours = state.get("pid") == os.getpid()  # not replaced by another endpoint process
            if ours:
                state_file.unlink(missing_ok=True)
        LOG.info("endpoint %s: stopped", name)
        if ours and "worker_pid" not in state:  # it never served
            reason = state.get("reason") or "its worker did not start"
            raise EndpointStartError(f"endpoint {name}: the model at {model_data} did not load: {reason}")


def _when_serving(state_file: Path, url: str, on_ready: Callable[[str], Any]) -> None:
    while (load_state(state_file) or {}).get("status") not in ("InService", "Failed", None):
        time.sleep(0.05)
    if (load_state(state_file) or {}).get("status") == "InService":
        on_ready(url)


# The command's side: start, swap, find and stop detached endpoints.

def _is_endpoint_process(pid: int) -> bool:
    """Whether `pid` is alive and runs this module (a pid from a stale state file may have been reused)."""
    if pid in _DETACHED and _DETACHED[pid].poll() is not None:
        del _DETACHED[pid]
        return False  # started and now reaped by this process
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False  # our own child, exited just now: reaped
    except ChildProcessError:
        pass
    try:
        return MODULE in psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False  # gone, exited but not reaped, or another user's process


def reap(pid: int) -> None:
    """Forget `pid` as a child of this process once it has been waited for (by psutil)."""
    _DETACHED.pop(pid, None)


def read_state(state_file: Path) -> dict[str, Any] | None:
    """The state of the detached endpoint recorded in `state_file`, with "running" (is its process alive), or None."""
    state = load_state(Path(state_file))
    if state is not None:
        state["running"] = isinstance(state.get("pid"), int) and _is_endpoint_process(state["pid"])
    return state


def _terminate(pid: int, name: str, timeout: float) -> bool:
    """SIGTERM the endpoint process `pid`, SIGKILL it after `timeout`; False when it was not running."""
    if not _is_endpoint_process(pid):
        return False
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).terminate()
    deadline = time.monotonic() + timeout
    while _is_endpoint_process(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
            deadline = time.monotonic() + timeout
        time.sleep(0.05)
    if (child := _DETACHED.pop(pid, None)) is not None:
        child.wait(timeout)  # our own child: reaped, not left a zombie that still holds its pid
    LOG.info("endpoint %s: stopped pid %d", name, pid)
    return True


def stop_background(state_file: Path, timeout: float = 15.0) -> bool:
    """Stop the detached endpoint of `state_file` (SIGTERM, then SIGKILL); False when none was running."""
    state_file = Path(state_file)
    state = load_state(state_file)
    if state is None:
        return False
    pid = state.get("pid")
    stopped = isinstance(pid, int) and _terminate(pid, str(state.get("name")), timeout)
    state_file.unlink(missing_ok=True)
    return stopped


def _refuse_taken_port(name: str, host: str, port: int) -> None:
    """EndpointStartError when something listens on host:port, before anything starts."""
    listen(name, host, port).close()


def worker_of(state_file: Path, pid: Any) -> psutil.Process | None:
    """The live worker process `pid` of the endpoint of `state_file` (its environment names that file), or None."""
    try:
        process = psutil.Process(pid) if isinstance(pid, int) else None
        return process if process and process.environ().get(STATE_VARIABLE) == str(state_file) else None
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def _end_orphaned_worker(state_file: Path, state: dict[str, Any] | None, timeout: float = 10.0) -> None:
    """A worker whose manager was killed leaves by itself within a second; wait for it (it holds the port), then
    SIGKILL it."""
    worker = worker_of(state_file, (state or {}).get("worker_pid"))
    if worker is not None:
        _, alive = psutil.wait_procs([worker], timeout=timeout)
        for process in alive:
            process.kill()
        psutil.wait_procs(alive, timeout=timeout)


def _launch(command: list[str], env: dict[str, str], log_file: Path) -> subprocess.Popen:
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    _DETACHED[process.pid] = process
    return process


def _wait_ready(process: subprocess.Popen, state_file: Path, name: str, log_file: Path, timeout: float) -> dict:
    """The state the new process recorded once its worker serves; EndpointStartError (ended, killed) otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        state = load_state(state_file)
        if state is not None and state.get("pid") == process.pid and state.get("status") == "InService":
            return state
        if process.poll() is not None:
            _DETACHED.pop(process.pid, None)
            reason = last_error_line(log_file).removeprefix("error: ")
            raise EndpointStartError(
                f"endpoint {name} exited with code {process.returncode} before serving: {reason} (log: {log_file})"
            )
        if time.monotonic() > deadline:
            _terminate(process.pid, name, 15.0)
            raise EndpointStartError(f"endpoint {name} did not start within {timeout:.0f}s; see {log_file}")
        time.sleep(0.1)


def _swap(state: dict[str, Any], state_file: Path, model_data: Path, version: str | None,
          environment: dict[str, str] | None, timeout: float) -> dict[str, Any]:
    """Load `model_data` into the running endpoint of `state`, which keeps serving its model if that fails."""
    wanted = {"model_data": str(model_data), "version": version, "environment": environment or {}}
    request = urllib.request.Request(f"{state['url']}{MODEL_ROUTE}", json.dumps(wanted).encode(), method="PUT",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            answer.read()
    except urllib.error.HTTPError as error:
        reason = json.loads(error.read() or b"{}").get("message", error.reason)
        raise EndpointStartError(f"endpoint {state.get('name')}: version {version} did not load: {reason}; "
                                 f"version {state.get('version')} still serves at {state['url']}") from None
    except OSError as error:
        raise EndpointStartError(f"endpoint {state.get('name')}: the swap to version {version} got no answer: "
                                 f"{error}; see {state_file.with_suffix('.log')}") from None
    return (read_state(state_file) or {}) | {"log_file": str(state_file.with_suffix(".log"))}


def start_background(
    model_data: Path,
    name: str,
    port: int = 8080,
    state_file: Path = Path("endpoint.json"),
    *,
    host: str = "127.0.0.1",
    version: str | None = None,
    log_file: Path | None = None,
    timeout: float = 180.0,
    environment: dict[str, str] | None = None,
    alerts_file: Path | None = None,
) -> dict[str, Any]:
    """Serve `model_data` from a detached process that outlives this one; returns its state once it serves.

    An endpoint already running for `state_file` on the same host and port (or any port, with `port` 0) takes the new
    model in place (see `_swap`). Otherwise a new process starts (any other holder of `port` is refused before
    anything starts) and, once it serves, the endpoint it replaces is stopped; if it fails, that one serves on and
    EndpointStartError says so. The process logs to `log_file` (default: the state file with suffix .log) and sets
    `environment` (the model's container environment) before the model loads."""
    state_file, model_data = Path(state_file).resolve(), Path(model_data).resolve()
    recorded = read_state(state_file)
    old = recorded if recorded and recorded.get("running") and recorded.get("status") == "InService" else None
    if old is not None and old.get("host", host) == host and port in (0, old.get("port")):
        return _swap(old, state_file, model_data, version, environment, timeout)
    log_file = Path(log_file).resolve() if log_file else state_file.with_suffix(".log")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", MODULE, "--model-data", str(model_data), "--name", name, "--port", str(port),
               "--host", host, "--state-file", str(state_file), "--environment", json.dumps(environment or {})]
    command += ["--model-version", str(version)] if version is not None else []
    command += ["--alerts-file", str(alerts_file)] if alerts_file else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if old is None:
        _end_orphaned_worker(state_file, recorded)
    try:
        if port:
            _refuse_taken_port(name, host, port)
        process = _launch(command, env, log_file)
        state = _wait_ready(process, state_file, name, log_file, timeout)
    except EndpointStartError as e:
        if old is not None:
            write_state(state_file, {k: v for k, v in old.items() if k != "running"})
            raise EndpointStartError(f"{e}; version {old.get('version')} still serves at {old.get('url')}") from None
        raise
    if old is not None and old.get("pid") != process.pid:
        _terminate(old["pid"], name, 15.0)
    return state | {"running": True, "log_file": str(log_file)}
