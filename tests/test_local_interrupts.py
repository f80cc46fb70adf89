"""No orphaned job: a `run --local` stopped by SIGTERM, or killed by SIGKILL, leaves no process of its jobs behind
and no execution `Executing` forever.

The real CLI runs in a subprocess with a tiny random BERT and a training that would go on for 100,000 steps; the
processes of its jobs are found by their environment tag (pipeline.local.orphans), read here with psutil.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from fixtures_ml import build_model, build_tokenizer, run_overrides

from pipeline.cli import main
from pipeline.local import orphans
from pipeline.local.execution import Execution, StepRecord
from pipeline.local.storage import RECORD_FILE

ROOT = Path(__file__).resolve().parent.parent
STARTUP = 600.0  # seconds for the CLI to reach training (Tokenize, the toolkit, torchrun) on a loaded machine


def job_processes(owner_pid: int) -> list[psutil.Process]:
    """Live processes whose job tag names `owner_pid` as their owner."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("TRAINIUM_PIPELINE_JOB", "").startswith(f"{owner_pid}:") and \
                    process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def guardian_of(owner_pid: int) -> psutil.Process | None:
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if orphans.MODULE in cmdline and any(arg.startswith(f"{owner_pid}:") for arg in cmdline):
            return process
    return None


def kill_all(processes: list[psutil.Process]) -> None:
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.fixture(scope="module")
def account(tmp_path_factory):
    folder = tmp_path_factory.mktemp("interrupts")
    model = build_model(folder / "model", build_tokenizer(folder / "tokenizer"))
    sets = run_overrides(model, rows=240, max_steps=100_000)  # trains until stopped
    return folder / "local", [arg for s in sets for arg in ("--set", s)]


class Run:
    """`python -m pipeline run --local` in a subprocess, up to the point where both ranks train."""

    def __init__(self, account: tuple[Path, list[str]]) -> None:
        self.root, sets = account
        command = [sys.executable, "-m", "pipeline", "--config", str(ROOT / "pipeline.yaml"), *sets, "run", "--local",
                   "--root", str(self.root)]
        self.output = self.root.parent / f"cli-{time.monotonic_ns()}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        with open(self.output, "w") as out:
            self.cli = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self.folder = self._wait_for_training()

    def _wait_for_training(self) -> Path:
        deadline = time.monotonic() + STARTUP
        while time.monotonic() < deadline:
            assert self.cli.poll() is None, self.output.read_text()
            for log in self.root.glob("executions/*/*/Train.log"):  # of this run: its record names the CLI
                ours = Execution.load(log.parent / RECORD_FILE).owner_pid == self.cli.pid
                if ours and re.search(r"step=\d+ epoch=\d+ loss=", log.read_text(errors="replace")):
                    return log.parent
            time.sleep(1)
        raise AssertionError(f"no training step within {STARTUP:.0f} s: {self.output.read_text()}")

    def record(self) -> Execution:
        return Execution.load(self.folder / RECORD_FILE)

    def cleanup(self) -> None:
        kill_all([p for p in [guardian_of(self.cli.pid)] if p] + job_processes(self.cli.pid))
        if self.cli.poll() is None:
            self.cli.kill()
            self.cli.wait()


@pytest.mark.slow  # a local run, interrupted
def test_sigterm_stops_the_step_as_ctrl_c_does_and_leaves_no_process(account):
    run = Run(account)
    try:
        assert len(job_processes(run.cli.pid)) >= 4  # toolkit, torchrun, two ranks
        run.cli.send_signal(signal.SIGTERM)
        assert run.cli.wait(timeout=120) == 1
        execution = run.record()
        assert (execution.status, execution.failure_reason) == ("Stopped", "stopped by SIGTERM")
        assert execution.steps["Tokenize"].status == "Succeeded" and execution.steps["Train"].status == "Stopped"
        assert {execution.steps[name].status for name in ("Evaluate", "RegisterModel", "Deploy")} == {"NotStarted"}
        assert job_processes(run.cli.pid) == []  # torchrun's ranks run in sessions of their own: gone too
        assert "stopping on SIGTERM" in (run.folder / "Train.log").read_text()  # the ranks stopped as on spot
    finally:
        run.cleanup()


@pytest.mark.slow  # a local run, interrupted
def test_after_sigkill_the_next_status_fails_the_execution_and_stops_what_is_left(account, capsys):
    """The CLI and its guardian are both SIGKILLed: the job trains on, unwatched, until a command reads the record."""
    run = Run(account)
    try:
        guardian = guardian_of(run.cli.pid)
        assert guardian is not None
        for process in (run.cli, guardian):
            process.kill()
        run.cli.wait()
        time.sleep(2)
        left = job_processes(run.cli.pid)
        assert len(left) >= 3 and run.record().status == "Executing"  # torchrun and both ranks still train

        argv, sys.argv = sys.argv, ["trainium-pipeline", "--config", str(ROOT / "pipeline.yaml"), "status",
                                    "--local", "--root", str(run.root), run.folder.name]
        try:
            with pytest.raises(SystemExit) as done:
                main()
        finally:
            sys.argv = argv
        assert done.value.code in (0, None)
        out = capsys.readouterr().out
        execution = run.record()
        reason = f"the command running it (pid {run.cli.pid}) ended without finishing it (killed?)"
        assert execution.status == "Failed" and execution.failure_reason.startswith(reason)
        assert execution.steps["Train"].status == "Failed" and execution.steps["Train"].reason.startswith(reason)
        assert execution.steps["Evaluate"].status == "NotStarted"
        assert "Failed" in out and f"pid {run.cli.pid}" in out
        assert job_processes(run.cli.pid) == [] and not any(p.is_running() for p in left)
    finally:
        run.cleanup()


def sleeper(tag: str) -> subprocess.Popen:
    """A stand-in job process, in a session of its own, carrying job tag `tag`."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                            env={**os.environ, orphans.VARIABLE: tag}, start_new_session=True)


def test_the_guardian_stops_the_jobs_of_an_owner_killed_by_sigkill(tmp_path):
    """Without any later command: the guardian sees its owner's pipe close and stops the owner's job processes."""
    code = ("import subprocess, sys, time\n"
            "from pipeline.local import orphans\n"
            "tag = orphans.job_tag('Train-test')\n"
            "for _ in range(2):\n"
            "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],\n"
            "                     env={**__import__('os').environ, orphans.VARIABLE: tag}, start_new_session=True)\n"
            "print('ready', flush=True)\n"
            "time.sleep(300)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    owner = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "ready"
        jobs = job_processes(owner.pid)
        assert len(jobs) == 2 and guardian_of(owner.pid) is not None
        owner.kill()
        owner.wait()
        gone, alive = psutil.wait_procs(jobs, timeout=60)
        assert alive == [] and len(gone) == 2
    finally:
        kill_all(job_processes(owner.pid))
        owner.kill()


def test_reap_needs_the_very_owner_dead_not_just_its_pid(tmp_path):
    me = orphans.Owner.current()
    assert me.alive() and not orphans.Owner(me.pid, me.started - 3600, me.host).alive()  # a reused pid is not it
    assert orphans.Owner(1 << 30, 0.0, "another-host").alive()  # another machine's process: cannot be told
    owner_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    owner = orphans.Owner(owner_process.pid, psutil.Process(owner_process.pid).create_time(), me.host)
    job = sleeper(f"{owner.tag}/Train-1234")
    try:
        steps = {"Tokenize": StepRecord("Tokenize", "Processing", status="Succeeded"),
                 "Train": StepRecord("Train", "Training", status="Executing"),
                 "Evaluate": StepRecord("Evaluate", "Processing")}
        execution = Execution("x", "arn", "p", "Executing", "2026-01-01T00:00:00+00:00", {}, steps,
                              owner_pid=owner.pid, owner_started=owner.started, owner_host=owner.host)
        assert execution.reap() is False and job.poll() is None  # the owner is alive: nothing happens
        owner_process.kill()
        owner_process.wait()
        assert execution.reap() is True
        assert not psutil.pid_exists(job.pid)  # stopped (and, our child, reaped) before reap() returned
        assert execution.status == "Failed" and "1 process(es) of its jobs" in execution.failure_reason
        assert [s.status for s in execution.steps.values()] == ["Succeeded", "Failed", "NotStarted"]
        assert execution.reap() is False  # once
    finally:
        job.kill()
        owner_process.kill()
