"""No job process outlives the command that runs it.

A local job's processes cannot all be found through one process group: the job runs in a session of its own, and
torchrun starts each rank in yet another. So every job process carries, in its environment, a tag naming its
owner (the CLI process running the execution, by pid and start time, so that a reused pid is never taken for it)
and its job: `TRAINIUM_PIPELINE_JOB=<pid>:<start time>/<job>`. Environments are inherited by every descendant.

- `stop_job(tag)` ends what is left of one job after its leader (Ctrl-C, SIGTERM).
- A guardian (`python -m pipeline.local.orphans TAG`, started with the first job, in its own session) waits for
  its owner to die in any way, SIGKILL included (its stdin is a pipe only the owner holds, so it reads EOF then),
  and stops every process still carrying the owner's tag.
- `Owner.alive()` and `stop_owned()` let a later command reap an execution whose owner died (see
  `Execution.reap`), for when the guardian could not (killed too, or the machine rebooted).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

VARIABLE = "TRAINIUM_PIPELINE_JOB"
GRACE = 10.0  # seconds between SIGTERM and SIGKILL (train.py checkpoints on SIGTERM)
MODULE = "pipeline.local.orphans"
_ROOT = Path(__file__).resolve().parents[2]
_guardian: subprocess.Popen | None = None


@dataclass(frozen=True)
class Owner:
    """A process identified by its pid and its start time (seconds since the epoch) on machine `host`."""

    pid: int
    started: float
    host: str = ""

    @classmethod
    def current(cls) -> Owner:
        me = psutil.Process()
        return cls(me.pid, me.create_time(), socket.gethostname())

    @property
    def tag(self) -> str:
        return f"{self.pid}:{self.started:.2f}"

    def alive(self) -> bool:
        """Whether this very process still runs (not a later one that reuses its pid, not a zombie). On another
        machine (or container) it cannot be told: taken as alive."""
        if self.host and self.host != socket.gethostname():
            return True
        try:
            process = psutil.Process(self.pid)
            return abs(process.create_time() - self.started) < 0.5 and process.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False


def tagged(prefix: str) -> list[psutil.Process]:
    """The processes (other than this one) whose job tag starts with `prefix`."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if process.environ().get(VARIABLE, "").startswith(prefix):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue  # gone, another user's, or unreadable
    return found


def signal_all(processes: list[psutil.Process], sig: int) -> None:
    for process in processes:
        try:
            process.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def terminate(processes: list[psutil.Process], grace: float = GRACE) -> None:
    """SIGTERM `processes`, then SIGKILL those still there after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        signal_all(processes, sig)
        processes = psutil.wait_procs(processes, timeout=grace)[1]
        if not processes:
            return


def job_tag(job: str) -> str:
    """The tag of job `job` of this process; starts the guardian of this process's jobs if it is not running."""
    owner = Owner.current()
    _guard(owner)
    return f"{owner.tag}/{job}"


def stop_job(tag: str, grace: float = GRACE) -> None:
    """Stop whatever still carries job tag `tag` (ranks in sessions of their own, after their group's leader)."""
    terminate(tagged(tag), grace)


def stop_owned(owner: Owner, grace: float = GRACE) -> int:
    """Stop every job process of `owner`; how many were left."""
    leftovers = tagged(owner.tag + "/")
    terminate(leftovers, grace)
    return len(leftovers)


def _guard(owner: Owner) -> None:
    global _guardian
    if _guardian is not None and _guardian.poll() is None:
        return
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))
    _guardian = subprocess.Popen(
        [sys.executable, "-m", MODULE, owner.tag],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )


def _main(owner_tag: str) -> None:
    """The guardian: block until the owner's end of stdin closes (it exited or was killed), then clean up."""
    while sys.stdin.buffer.read(1 << 16):
        pass
    terminate(tagged(owner_tag + "/"))


if __name__ == "__main__":
    _main(sys.argv[1])
