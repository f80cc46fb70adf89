"""The detached local endpoint: a `python -m pipeline.local.endpoint` process, found through its JSON state file.

`start_background()` launches the process and returns once it serves (blue/green: it replaces a running one only
after the new one answers), `read_state()` tells whether it still runs (a pid from a stale state file may have been
reused, so the process's command line is checked), and `stop_background()` stops it (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from pipeline.errors import UserError
from pipeline.local.endpoint.handler import LOG, serving_environment
from pipeline.local.jobs import last_error_line

MODULE = "pipeline.local.endpoint"  # what the detached process runs, and what its command line is checked for
ROOT = Path(__file__).resolve().parents[3]
_DETACHED: dict[int, subprocess.Popen] = {}  # endpoints this process started: kept so that they are reaped quietly


SO_ATTACH_REUSEPORT_CBPF = 51  # Linux: a classic BPF program choosing the socket of a SO_REUSEPORT group
_SECOND_SOCKET = struct.pack("HBBI", 0x06, 0, 0, 1)  # BPF_RET | BPF_K 1: the socket that joined second


def steer_new_connections(sock: socket.socket) -> bool:
    """Send every new connection to the port to `sock`, the listener that joined the SO_REUSEPORT group last (the
    group holds the old endpoint, then this one): the old one only finishes what it has accepted, so stopping it
    resets nothing. Once it is gone the program's index is out of range and Linux picks by hash among the rest.
    False where this is not Linux (connections queued at the old listener when it stops may then be reset)."""
    if not sys.platform.startswith("linux"):
        return False
    program = ctypes.create_string_buffer(_SECOND_SOCKET, len(_SECOND_SOCKET))
    try:  # struct sock_fprog {unsigned short len; struct sock_filter *filter;}
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, struct.pack("HP", 1, ctypes.addressof(program)))
    except OSError:
        return False
    return True


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
    if not psutil.pid_exists(pid):
        return False
    try:
        return MODULE in psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False  # gone, exited but not reaped, or another user's process


def reap(pid: int) -> None:
    """Forget `pid` as a child of this process once it has been waited for (by psutil)."""
    _DETACHED.pop(pid, None)


def _signal(pid: int, kill: bool = False) -> None:
    """SIGTERM (or SIGKILL) `pid`; nothing when it has exited meanwhile."""
    try:
        process = psutil.Process(pid)
        if kill:
            process.kill()
        else:
            process.terminate()
    except psutil.NoSuchProcess:
        pass


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
    _signal(pid)
    deadline = time.monotonic() + timeout
    while _is_endpoint_process(pid):
        if time.monotonic() > deadline:
            _signal(pid, kill=True)
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


class EndpointStartError(UserError, RuntimeError):
    """An endpoint did not start: its port is taken, its model does not load, ... (one line, with the reason); the
    one it was to replace still serves."""

    @classmethod
    def cannot_listen(cls, name: str, host: str, port: int, error: OSError) -> EndpointStartError:
        return cls(f"endpoint {name}: cannot listen on {host}:{port}: {error.strerror or error} (choose another port)")


def _refuse_taken_port(name: str, host: str, port: int) -> None:
    """EndpointStartError when something listens on host:port. Detached endpoints share their port (SO_REUSEPORT, for
    blue/green), so one of another local root on the same port would silently take half of the connections: a new
    endpoint joins a port only to replace this endpoint's own process on it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # connections in TIME_WAIT do not hold it
        try:
            probe.bind((host, port))
        except OSError as error:
            raise EndpointStartError.cannot_listen(name, host, port, error) from None


def _answers(url: str, version: str | None, attempts: int = 50) -> bool:
    """Whether GET /ping at `url` reaches the endpoint serving `version` (with SO_REUSEPORT the old one may answer
    some connections until it stops, so a few tries are made)."""
    for _ in range(attempts):
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=10) as answer:
                if version is None or json.loads(answer.read()).get("version") == version:
                    return True
        except (OSError, ValueError):
            time.sleep(0.05)
    return False


def _launch(command: list[str], env: dict[str, str], log_file: Path) -> subprocess.Popen:
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    _DETACHED[process.pid] = process
    return process


def _wait_ready(process: subprocess.Popen, state_file: Path, name: str, log_file: Path, timeout: float) -> dict:
    """The state the new process wrote once it serves; EndpointStartError (process ended or killed) otherwise."""
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
            process.kill()
            process.wait()
            _DETACHED.pop(process.pid, None)
            raise EndpointStartError(f"endpoint {name} did not start within {timeout:.0f}s; see {log_file}")
        time.sleep(0.1)


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
) -> dict[str, Any]:
    """Serve from a detached process that outlives this one; returns its state once it answers.

    Blue/green: an endpoint already running for `state_file` keeps serving while the new process loads the model and
    binds `port` (beside it, through SO_REUSEPORT, when it is the same port; any other holder of the port is refused
    before anything starts); once the new one answers, the old one is stopped. If the new one fails (the port is
    held by another program, the model does not load), it is stopped, the old one serves on, and EndpointStartError
    says so. The process logs to `log_file` (default: the state file with suffix .log) and runs with `environment`
    (the model's container environment) added to this one's.
    """
    state_file = Path(state_file).resolve()
    old = read_state(state_file)
    old = old if old and old.get("running") else None
    log_file = Path(log_file).resolve() if log_file else state_file.with_suffix(".log")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", MODULE, "--model-data", str(Path(model_data).resolve()), "--name", name,
               "--port", str(port), "--host", host, "--state-file", str(state_file), "--reuse-port"]
    if version is not None:
        command += ["--model-version", str(version)]
    env = dict(os.environ, **serving_environment(environment))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    try:
        if port and not (old and old.get("port") == port and old.get("host", host) == host):
            _refuse_taken_port(name, host, port)
        process = _launch(command, env, log_file)
        state = _wait_ready(process, state_file, name, log_file, timeout)
        if not _answers(state.get("url") or f"http://{host}:{state['port']}", version):
            _terminate(process.pid, name, 15.0)
            raise EndpointStartError(f"endpoint {name} wrote its state but does not answer on port {state.get('port')}")
    except EndpointStartError as e:
        if old is not None:
            write_state(state_file, {k: v for k, v in old.items() if k != "running"})
            raise EndpointStartError(f"{e}; version {old.get('version')} still serves at {old.get('url')}") from None
        raise
    if old is not None and old.get("pid") != process.pid:
        _terminate(old["pid"], name, 15.0)
    return state | {"running": True, "log_file": str(log_file)}
