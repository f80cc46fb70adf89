"""Every detached endpoint process of a local root, found by its command line, whatever killed the command that
started it: `strays()` are those its state file does not record (a deploy to another port killed midway leaves the
old or the new one behind), `stop_strays()` stops them, `stop_all()` stops every one, and `died()` tells an endpoint
whose recorded process ended without stopping (killed: its worker, when it dies, is restarted by that process).

An endpoint process runs `python -m pipeline.local.endpoint ... --state-file <folder>/<name>.json`; its state file
records its pid and start time (`process_started`), so a reused pid is never taken for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

from pipeline.local.endpoint.handler import LOG
from pipeline.local.endpoint.process import MODULE, load_state, reap

STOP_TIMEOUT = 15.0  # seconds between SIGTERM (the endpoint drains) and SIGKILL


@dataclass(frozen=True)
class EndpointProcess:
    """A live endpoint process and what its command line says."""

    process: psutil.Process
    state_file: Path
    version: str | None

    @property
    def pid(self) -> int:
        return self.process.pid

    def recorded(self) -> bool:
        """Whether its state file names this very process (pid and start time)."""
        state = load_state(self.state_file) or {}
        if state.get("pid") != self.pid:
            return False
        started = state.get("process_started")
        try:
            return not isinstance(started, (int, float)) or abs(self.process.create_time() - started) < 1.0
        except psutil.Error:
            return False


def _argument(cmdline: list[str], flag: str) -> str | None:
    return cmdline[cmdline.index(flag) + 1] if flag in cmdline[:-1] else None


def processes(folder: Path) -> list[EndpointProcess]:
    """The live endpoint processes whose state file is in `folder` (a local root's endpoints/)."""
    folder, found = Path(folder).resolve(), []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        state_file = _argument(cmdline, "--state-file")
        if MODULE not in cmdline or state_file is None or process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if Path(state_file).parent == folder:
            found.append(EndpointProcess(process, Path(state_file), _argument(cmdline, "--model-version")))
    return found


def strays(folder: Path) -> list[EndpointProcess]:
    """The endpoint processes of `folder` that no state file records."""
    return [found for found in processes(folder) if not found.recorded()]


def _stop(found: list[EndpointProcess], timeout: float) -> list[str]:
    """SIGTERM each (it drains), SIGKILL what is left after `timeout`; the lines of those that could not be stopped."""
    failed = []
    for item in found:
        try:
            item.process.terminate()
        except psutil.NoSuchProcess:
            pass
        except psutil.AccessDenied:
            failed.append(f"pid {item.pid} (version {item.version}): permission denied")
    _, alive = psutil.wait_procs([item.process for item in found], timeout=timeout, callback=lambda p: reap(p.pid))
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(alive, timeout=timeout, callback=lambda p: reap(p.pid))
    failed += [f"pid {p.pid}: still running after SIGKILL" for p in alive]
    return failed


def stop_strays(folder: Path, timeout: float = STOP_TIMEOUT) -> list[str]:
    """Stop every endpoint process of `folder` that no state file records; one line per process stopped."""
    found = strays(folder)
    for item in found:
        LOG.warning("endpoint %s: stopping pid %d (version %s), which no state file records", item.state_file.stem,
                    item.pid, item.version)
    failed = _stop(found, timeout)
    return [f"{item.state_file.stem}: stopped a stray endpoint process (pid {item.pid}, version {item.version}) left "
            f"by an interrupted command" for item in found] + failed


def stop_all(folder: Path, timeout: float = STOP_TIMEOUT) -> tuple[int, list[str]]:
    """Stop every endpoint process of `folder` and remove its state files: (how many ran, what could not be
    stopped)."""
    found = processes(folder)
    failed = _stop(found, timeout)
    if not failed:
        for state_file in Path(folder).glob("*.json"):
            state_file.unlink(missing_ok=True)
    return len(found), failed


def died(state_file: Path) -> dict | None:
    """The state of an endpoint whose recorded process ended without stopping (SIGKILL), else None."""
    state = load_state(state_file)
    if not state or state.get("status") != "InService" or not isinstance(state.get("pid"), int):
        return None
    alive = [p for p in processes(state_file.parent) if p.state_file == state_file and p.recorded()]
    return None if alive else state
