"""Run processing and training jobs on this machine under the SageMaker container contract."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import IO

from pipeline.local import orphans
from pipeline.local.storage import LOCAL_ARN, LocalS3

PROCESSING = "/opt/ml/processing"
TRAINING_MODULE = "sagemaker_pytorch_container.training:main"
FAILURE_CHARS = 1024  # how much of /opt/ml/output/failure becomes a training job's FailureReason


class StepFailed(RuntimeError):
    """A job ended in failure; the message is the reason SageMaker would show."""


def run_logged(command: list[str], env: dict[str, str], log: IO[str], cwd: Path) -> None:
    """Run `command` with its output in `log`, in a session of its own, its processes tagged with this process as
    their owner (see pipeline.local.orphans); on Ctrl-C or SIGTERM stop the whole job, then re-raise."""
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    tag = orphans.job_tag(f"{Path(cwd).name}-{secrets.token_hex(4)}")
    process = subprocess.Popen(command, env={**env, orphans.VARIABLE: tag}, cwd=cwd, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = process.wait()
    except KeyboardInterrupt:  # Terminated (SIGTERM, SIGHUP) too
        _stop(process, tag)
        raise
    if code != 0:
        raise StepFailed(f"exit code {code}: {last_error_line(Path(log.name))}")


def _stop(process: subprocess.Popen, tag: str) -> None:
    """As SageMaker stops a job: SIGTERM (train.py checkpoints), SIGKILL after a grace period. What the job's leader
    started goes first (torchrun and its ranks, in sessions of their own), so that the leader (the training toolkit)
    still relays their last lines to the log; then the leader's process group, then any straggler."""
    followers = [p for p in orphans.tagged(tag) if p.pid != process.pid]
    try:
        if followers:
            orphans.signal_all(followers, signal.SIGTERM)
        else:
            os.killpg(process.pid, signal.SIGTERM)
        for escalate in (signal.SIGTERM, signal.SIGKILL, None):
            try:
                process.wait(timeout=orphans.GRACE)
                break
            except subprocess.TimeoutExpired:
                if escalate:
                    os.killpg(process.pid, escalate)
    except ProcessLookupError:
        pass
    orphans.stop_job(tag)


def last_error_line(log: Path) -> str:
    """The most telling line of a failed job's log: the last line that looks like an error, else the last line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error:" in line or line.startswith("FAILED"):
            return line[:500]
    return lines[-1][:500] if lines else "no output"


def _environment(extra: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_processing(name: str, args: dict, workdir: Path, s3: LocalS3, log: IO[str]) -> dict:
    """A ProcessingStep: stage inputs, run the entry point with `/opt/ml/processing` rooted in `workdir`, upload."""
    root = workdir / "processing"

    def local(value: str) -> str:
        if isinstance(value, str) and (value == PROCESSING or value.startswith(PROCESSING + "/")):
            return str(root / value[len(PROCESSING) :].lstrip("/"))
        return value

    for item in args.get("ProcessingInputs", []):
        if "S3Input" not in item:
            raise StepFailed(f"input {item.get('InputName')}: only S3 inputs are supported locally")
        s3.download(item["S3Input"]["S3Uri"], Path(local(item["S3Input"]["LocalPath"])))
    outputs = args.get("ProcessingOutputConfig", {}).get("Outputs", [])
    for item in outputs:
        Path(local(item["S3Output"]["LocalPath"])).mkdir(parents=True, exist_ok=True)
    app = args["AppSpecification"]
    entrypoint = [
        sys.executable if part in ("python", "python3") else local(part) for part in app["ContainerEntrypoint"]
    ]
    command = entrypoint + [local(str(a)) for a in app.get("ContainerArguments", [])]
    run_logged(command, _environment(args.get("Environment", {})), log, workdir)
    properties: dict = {  # DescribeProcessingJob's answer: the request's fields, the job's name, ARN and status
        **{k: args[k] for k in ("AppSpecification", "Environment", "ProcessingInputs", "ProcessingResources",
                                "StoppingCondition", "RoleArn") if k in args},
        "ProcessingJobName": name, "ProcessingJobArn": f"{LOCAL_ARN}:processing-job/{name}",
        "ProcessingJobStatus": "Completed", "ProcessingOutputConfig": {},
    }
    properties["ProcessingOutputConfig"]["Outputs"] = {}
    for item in outputs:
        s3.upload(Path(local(item["S3Output"]["LocalPath"])), item["S3Output"]["S3Uri"])
        properties["ProcessingOutputConfig"]["Outputs"][item["OutputName"]] = item
    return properties


def _tar(folder: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(target, "w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)


def run_training(name: str, args: dict, workdir: Path, s3: LocalS3, log: IO[str], processes: int) -> dict:
    """A TrainingStep, launched by the real SageMaker training toolkit with SAGEMAKER_BASE_DIR as /opt/ml."""
    base = workdir / "opt_ml"
    config = base / "input" / "config"
    for folder in (config, base / "model", base / "output" / "data", base / "code", base / "checkpoints"):
        folder.mkdir(parents=True, exist_ok=True)
    hyperparameters = {k: str(v) for k, v in args.get("HyperParameters", {}).items()}
    submit = json.loads(hyperparameters.get("sagemaker_submit_directory", '""'))
    if submit.startswith("s3://"):
        hyperparameters["sagemaker_submit_directory"] = json.dumps(str(s3.path(submit)))
    hyperparameters["sagemaker_mpi_num_of_processes_per_host"] = str(processes)
    channels = {}
    for channel in args.get("InputDataConfig", []):
        source = channel["DataSource"]["S3DataSource"]["S3Uri"]
        s3.download(source, base / "input" / "data" / channel["ChannelName"])
        channels[channel["ChannelName"]] = {
            "TrainingInputMode": args["AlgorithmSpecification"].get("TrainingInputMode", "File"),
            "S3DistributionType": channel["DataSource"]["S3DataSource"].get(
                "S3DataDistributionType", "FullyReplicated"
            ),
            "RecordWrapperType": "None",
        }
    (config / "hyperparameters.json").write_text(json.dumps(hyperparameters, indent=2))
    (config / "inputdataconfig.json").write_text(json.dumps(channels, indent=2))
    (config / "resourceconfig.json").write_text(
        json.dumps(
            {
                "current_host": "algo-1",
                "hosts": ["algo-1"],
                "current_instance_type": "local",
                "network_interface_name": "lo",
            }
        )
    )
    checkpoint_uri = args.get("CheckpointConfig", {}).get("S3Uri")
    if checkpoint_uri:
        try:
            s3.download(checkpoint_uri, base / "checkpoints")
        except FileNotFoundError:  # nothing to resume from
            pass
    env = _environment(args.get("Environment", {}))
    env.update(SAGEMAKER_BASE_DIR=str(base), SAGEMAKER_TRAINING_MODULE=TRAINING_MODULE, SM_STUDIO_LOCAL_MODE="true")
    try:
        run_logged([str(Path(sys.executable).parent / "train")], env, log, workdir)
    except StepFailed as failure:
        reason = base / "output" / "failure"
        detail = reason.read_text(errors="replace").strip()[:FAILURE_CHARS] if reason.exists() else ""
        raise StepFailed(f"AlgorithmError: {detail}" if detail else str(failure)) from None
    finally:
        if checkpoint_uri:
            s3.upload(base / "checkpoints", checkpoint_uri)
    output = args["OutputDataConfig"]["S3OutputPath"].rstrip("/") + f"/{name}/output"
    _tar(base / "model", s3.path(output + "/model.tar.gz"))
    _tar(base / "output" / "data", s3.path(output + "/output.tar.gz"))
    log.flush()
    return {  # DescribeTrainingJob's answer: the request's fields, the job's name, ARN, status, artifacts, metrics
        **{k: args[k] for k in ("AlgorithmSpecification", "ResourceConfig", "StoppingCondition", "RoleArn",
                                "InputDataConfig", "CheckpointConfig", "Environment") if k in args},
        "TrainingJobName": name,
        "TrainingJobArn": f"{LOCAL_ARN}:training-job/{name}",
        "TrainingJobStatus": "Completed",
        "SecondaryStatus": "Completed",
        "ModelArtifacts": {"S3ModelArtifacts": output + "/model.tar.gz"},
        "OutputDataConfig": args["OutputDataConfig"],
        "HyperParameters": args.get("HyperParameters", {}),
        "FinalMetricDataList": final_metrics(args, Path(log.name).read_text(errors="replace")),
    }


def final_metrics(args: dict, log: str) -> dict[str, dict]:
    """The last value each of the job's MetricDefinitions matched in its log, as SageMaker reports them (keyed by
    name here, so that `FinalMetricDataList['test:accuracy'].Value` resolves as the SDK writes it)."""
    found = {}
    for metric in args.get("AlgorithmSpecification", {}).get("MetricDefinitions", []):
        values = re.findall(metric["Regex"], log)
        if values:
            try:
                found[metric["Name"]] = {"MetricName": metric["Name"], "Value": float(values[-1])}
            except (TypeError, ValueError):
                continue
    return found
