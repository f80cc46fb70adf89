"""The local runner on small hand-written definitions: order, branches, caching, failures, records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_ml import ctrl_c_reaches_it

from pipeline.dag.expressions import ExpressionError
from pipeline.dag.selection import SelectionError, Source, check_retry, select
from pipeline.local import runner as local_runner
from pipeline.local.execution import Execution
from pipeline.local.runner import LocalRunner
from pipeline.local.storage import LocalS3

JOB = """
import os, sys, pathlib
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
runs = pathlib.Path(args["--runs"])
runs.write_text(runs.read_text() + args["--name"] + "\\n" if runs.exists() else args["--name"] + "\\n")
if args.get("--fail") == "yes" or os.environ.get("FAIL_STEP") == args["--name"]:
    print("preparing"); print("ValueError: the input is broken", file=sys.stderr); sys.exit(3)
data = pathlib.Path("/opt/ml/processing/input/data".replace("/opt/ml/processing", args["--root"]))
text = (data / "result.txt").read_text() if (data / "result.txt").exists() else ""
out = pathlib.Path(args["--out"])
(out / "result.txt").write_text(text + args["--name"] + args.get("--value", "") + ";")
(out / "report.json").write_text('{"metrics": {"score": {"value": %s}}}' % args.get("--score", "0.5"))
"""


def processing(name: str, data=None, extra=(), cache=True) -> dict:
    root = "/opt/ml/processing"
    inputs = [{"InputName": "code", "S3Input": {"S3Uri": "s3://bucket/code/", "LocalPath": f"{root}/input/code"}}]
    if data is not None:
        inputs.append({"InputName": "data", "S3Input": {"S3Uri": data, "LocalPath": f"{root}/input/data"}})
    step = {
        "Name": name,
        "Type": "Processing",
        "Arguments": {
            "AppSpecification": {
                "ContainerEntrypoint": ["python3", f"{root}/input/code/job.py"],
                "ContainerArguments": [
                    "--name",
                    name,
                    "--runs",
                    "RUNS",
                    "--root",
                    root,
                    "--out",
                    f"{root}/output",
                    *extra,
                ],
            },
            "ProcessingInputs": inputs,
            "ProcessingOutputConfig": {
                "Outputs": [
                    {
                        "OutputName": "out",
                        "S3Output": {
                            "LocalPath": f"{root}/output",
                            "S3Uri": {
                                "Std:Join": {
                                    "On": "/",
                                    "Values": ["s3://bucket/run", {"Get": "Execution.PipelineExecutionId"}, name],
                                }
                            },
                        },
                    }
                ]
            },
        },
        "PropertyFiles": [{"PropertyFileName": "Report", "OutputName": "out", "FilePath": "report.json"}],
    }
    if cache:
        step["CacheConfig"] = {"Enabled": True, "ExpireAfter": "P30D"}
    return step


def output_of(step: str) -> dict:
    return {"Get": f"Steps.{step}.ProcessingOutputConfig.Outputs['out'].S3Output.S3Uri"}


def definition(runs: Path, fail_b: bool = False) -> dict:
    dag = {
        "Version": "2020-12-01",
        "Parameters": [
            {"Name": "Value", "Type": "String", "DefaultValue": "v1"},
            {"Name": "Threshold", "Type": "Float", "DefaultValue": 0.5},
        ],
        "Steps": [
            processing("A", extra=["--value", {"Get": "Parameters.Value"}]),
            processing("B", data=output_of("A"), extra=["--fail", "yes" if fail_b else "no", "--score", "0.7"]),
            {
                "Name": "Gate",
                "Type": "Condition",
                "Arguments": {
                    "Conditions": [
                        {
                            "Type": "GreaterThanOrEqualTo",
                            "RightValue": {"Get": "Parameters.Threshold"},
                            "LeftValue": {
                                "Std:JsonGet": {
                                    "PropertyFile": {"Get": "Steps.B.PropertyFiles.Report"},
                                    "Path": "metrics.score.value",
                                }
                            },
                        }
                    ],
                    "IfSteps": [processing("C", data=output_of("B"), cache=False)],
                    "ElseSteps": [
                        {
                            "Name": "TooLow",
                            "Type": "Fail",
                            "Arguments": {
                                "ErrorMessage": {
                                    "Std:Join": {"On": " ", "Values": ["score below", {"Get": "Parameters.Threshold"}]}
                                }
                            },
                        }
                    ],
                },
            },
        ],
    }
    return json.loads(json.dumps(dag).replace('"RUNS"', json.dumps(str(runs))))


@pytest.fixture
def root(tmp_path):
    LocalS3(tmp_path).put_bytes("s3://bucket/code/job.py", JOB.encode())
    return tmp_path


def run(root: Path, params=None, fail_b=False, use_cache=True) -> Execution:
    runner = LocalRunner(definition(root / "runs.txt", fail_b), "demo", root, use_cache=use_cache)
    return runner.run(params or {})


def runs(root: Path) -> list[str]:
    path = root / "runs.txt"
    lines = path.read_text().split() if path.exists() else []
    path.unlink(missing_ok=True)
    return lines


def statuses(execution: Execution) -> dict[str, str]:
    return {name: record.status for name, record in execution.steps.items()}


def test_runs_in_order_follows_the_branch_and_records_the_execution(root):
    execution = run(root)
    assert execution.status == "Succeeded"
    assert statuses(execution) == {
        "A": "Succeeded",
        "B": "Succeeded",
        "Gate": "Succeeded",
        "C": "Succeeded",
        "TooLow": "Skipped",
    }
    assert runs(root) == ["A", "B", "C"]
    c_out = LocalS3(root).path(f"s3://bucket/run/{execution.id}/C") / "result.txt"
    assert c_out.read_text() == "Av1;B;C;"
    saved = Execution.load(root / "executions" / "demo" / execution.id / "execution.json")
    assert saved.status == "Succeeded" and saved.parameters == {"Value": "v1", "Threshold": 0.5}
    assert Path(saved.steps["A"].log).read_text().startswith("$ ")


def test_else_branch_fails_with_the_message(root):
    execution = run(root, {"Threshold": "0.9"})
    assert execution.status == "Failed"
    assert statuses(execution)["C"] == "Skipped"
    assert execution.steps["TooLow"].reason == "score below 0.9"
    assert execution.failure_reason == "step TooLow failed: score below 0.9"


def test_cache_reuses_unchanged_steps_and_reruns_from_a_changed_parameter(root):
    first = run(root)
    assert runs(root) == ["A", "B", "C"]
    second = run(root)
    assert runs(root) == ["C"]  # C has no cache config: it always runs
    assert second.steps["A"].cached and second.steps["B"].cached and not second.steps["C"].cached
    assert LocalS3(root).path(f"s3://bucket/run/{first.id}/C").exists()
    third = run(root, {"Value": "v2"})
    assert runs(root) == ["A", "B", "C"]
    assert (LocalS3(root).path(f"s3://bucket/run/{third.id}/C") / "result.txt").read_text() == "Av2;B;C;"
    run(root, use_cache=False)
    assert runs(root) == ["A", "B", "C"]


def test_a_key_attribute_naming_the_execution_is_never_a_cache_hit_and_an_output_location_is(root):
    """SageMaker's cache key is the step type's key attributes, resolved: the execution id in an output location
    (not a key attribute) leaves the key alone; in the container's arguments it changes it every execution."""
    run(root)
    runs(root)
    dag = definition(root / "runs.txt")
    dag["Steps"][0]["Arguments"]["AppSpecification"]["ContainerArguments"] += [
        "--value", {"Get": "Execution.PipelineExecutionId"}]
    for _ in range(2):
        LocalRunner(dag, "demo", root).run({})
        assert runs(root)[0] == "A"


def test_a_cache_entry_older_than_expire_after_is_a_miss(root):
    run(root)
    runs(root)
    for entry in (root / "cache" / "demo").glob("*.json"):
        properties = json.loads(entry.read_text())
        properties["__cached_at"] -= 31 * 24 * 3600  # ExpireAfter is P30D
        entry.write_text(json.dumps(properties))
    second = run(root)
    assert runs(root) == ["A", "B", "C"] and not second.steps["A"].cached


@pytest.mark.parametrize(("text", "days"), [("P30D", 30), ("PT12H", 0.5), ("P1Y2M", 425), ("P2W", 14),
                                           ("P1DT30M", 1 + 1 / 48), ("pt16m", 16 / 1440),
                                           # the developer guide's own examples (pipelines-caching-enabling)
                                           ("30d", 30), ("5y", 5 * 365), ("T16m", 16 / 1440), ("30dT5h", 30 + 5 / 24)])
def test_expire_after_reads_iso_8601_durations(text, days):
    from pipeline.dag.durations import expire_after

    assert expire_after(text).total_seconds() == pytest.approx(days * 86400)


@pytest.mark.parametrize("text", ["", "P", "PT", "T", "P1H", "P1DT", "30 days", "1.5D"])
def test_an_expire_after_that_is_not_a_duration_is_an_error(text):
    from pipeline.dag.durations import expire_after

    with pytest.raises(ValueError, match="ISO 8601"):
        expire_after(text)


def test_a_definition_with_a_bad_expire_after_fails_before_any_step_runs(root):
    dag = definition(root / "runs.txt")
    dag["Steps"][1]["CacheConfig"] = {"Enabled": True, "ExpireAfter": "30 days"}
    with pytest.raises(ExpressionError, match="step B: CacheConfig.ExpireAfter '30 days': expected an ISO 8601"):
        LocalRunner(dag, "demo", root).run({})
    assert not (root / "runs.txt").exists()


def test_a_job_step_names_its_own_job(root):
    dag = definition(root / "runs.txt")
    dag["Steps"][0]["Arguments"]["AppSpecification"]["ContainerArguments"] += [
        "--value", {"Get": "Execution.ProcessingJobName"}]
    execution = LocalRunner(dag, "demo", root).run({})
    result = LocalS3(root).path(f"s3://bucket/run/{execution.id}/A") / "result.txt"
    assert result.read_text().startswith("Aa-") and execution.status == "Succeeded"


def test_a_fault_of_the_runner_fails_the_step_and_ends_the_execution(root, monkeypatch):
    def broken(run):
        raise KeyError("Expression")

    monkeypatch.setitem(local_runner.EXECUTORS, "Processing", broken)
    execution = run(root)
    assert execution.status == "Failed" and statuses(execution)["A"] == "Failed"
    assert execution.steps["A"].reason == "the local runner failed: KeyError: 'Expression'"


def test_a_failing_step_stops_its_dependents_and_reports_the_reason(root):
    execution = run(root, fail_b=True)
    assert execution.status == "Failed"
    assert statuses(execution) == {
        "A": "Succeeded",
        "B": "Failed",
        "Gate": "NotStarted",
        "C": "NotStarted",
        "TooLow": "NotStarted",
    }
    assert execution.steps["B"].reason == "exit code 3: ValueError: the input is broken"
    assert execution.failure_reason.startswith("step B failed: exit code 3")
    assert runs(root) == ["A", "B"]


def test_unknown_step_type_is_an_error_naming_the_step(root):
    dag = {"Parameters": [], "Steps": [{"Name": "Odd", "Type": "EMR", "Arguments": {}}]}
    execution = LocalRunner(dag, "demo", root).run()
    assert execution.steps["Odd"].reason == "step Odd: step type 'EMR' is not supported by the local runner"


def test_ctrl_c_stops_the_running_step_and_marks_the_execution_stopped(root):
    import os
    import signal
    import subprocess
    import sys
    import time

    LocalS3(root).put_bytes(
        "s3://bucket/code/job.py",
        b"import time, pathlib, os\n"
        b"pathlib.Path(os.environ['PID_FILE']).write_text(str(os.getpid()))\ntime.sleep(120)\n",
    )
    script = (
        "import json, sys\nfrom pathlib import Path\nfrom pipeline.local.runner import LocalRunner\n"
        f"dag = json.loads({json.dumps(json.dumps(definition(root / 'runs.txt')))})\n"
        f"execution = LocalRunner(dag, 'demo', Path({str(root)!r})).run()\n"
        "print(execution.status)\n"
    )
    pid_file = root / "job.pid"
    process = subprocess.Popen(
        [sys.executable, "-c", script], env={**os.environ, "PID_FILE": str(pid_file)}, stdout=subprocess.PIPE,
        text=True, preexec_fn=ctrl_c_reaches_it,
    )
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid_file.exists(), "the step never started"
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=60)
    assert out.strip() == "Stopped"
    job = int(pid_file.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{job}").exists() or "zombie" in Path(f"/proc/{job}/status").read_text().lower()
    (saved,) = (root / "executions" / "demo").glob("*/execution.json")
    execution = Execution.load(saved)
    assert execution.status == "Stopped"
    assert execution.steps["A"].status == "Stopped" and execution.steps["B"].status == "NotStarted"


def test_retry_reruns_the_failed_and_not_run_steps_in_place_and_keeps_the_rest(root, monkeypatch):
    monkeypatch.setenv("FAIL_STEP", "B")  # a transient failure: the definition stays the same
    failed = run(root)
    assert statuses(failed)["B"] == "Failed" and runs(root) == ["A", "B"]
    a_log = Path(failed.steps["A"].log).read_text()
    monkeypatch.delenv("FAIL_STEP")
    runner = LocalRunner(definition(root / "runs.txt"), "demo", root)
    retried = runner.retry(Execution.load(root / "executions" / "demo" / failed.id / "execution.json"))
    assert retried.id == failed.id and retried.status == "Succeeded" and retried.retries == 1
    assert runs(root) == ["B", "C"]  # A kept its outputs
    assert {n: r.attempts for n, r in retried.steps.items()} == {"A": 1, "B": 2, "C": 1, "Gate": 1, "TooLow": 0}
    assert statuses(retried)["TooLow"] == "Skipped"
    assert Path(retried.steps["A"].log).read_text() == a_log
    assert retried.steps["B"].log.endswith("B.attempt-2.log")
    assert "ValueError: the input is broken" in (Path(retried.steps["B"].log).parent / "B.log").read_text()
    c_out = LocalS3(root).path(f"s3://bucket/run/{failed.id}/C") / "result.txt"
    assert c_out.read_text() == "Av1;B;C;"
    (saved,) = (root / "executions" / "demo").glob("*/execution.json")  # one record, updated in place
    assert Execution.load(saved).steps["B"].attempts == 2
    with pytest.raises(SelectionError, match="is Succeeded: there is nothing to retry"):
        check_retry(retried.id, retried.status, runner.definition, runner.definition, [])


def test_a_retried_step_starts_in_an_empty_working_folder(root, monkeypatch):
    monkeypatch.setenv("FAIL_STEP", "B")
    failed = run(root)
    leftover = root / "executions" / "demo" / failed.id / "B" / "processing" / "output" / "partial.txt"
    leftover.write_text("from the failed attempt")
    monkeypatch.delenv("FAIL_STEP")
    LocalRunner(definition(root / "runs.txt"), "demo", root).retry(failed)
    assert not leftover.exists()
    assert not (LocalS3(root).path(f"s3://bucket/run/{failed.id}/B") / "partial.txt").exists()


def source_of(execution: Execution) -> Source:
    return Source(execution.id, execution.pipeline, execution.status,
                  {n: r.status for n, r in execution.steps.items()})


def test_a_selective_run_reuses_the_sources_outputs_and_runs_nothing_downstream(root):
    first = run(root)
    runs(root)
    dag = definition(root / "runs.txt")
    chosen = select(dag, ["B"], source_of(first), "demo")
    assert (chosen.reused, chosen.not_run) == (["A"], ["Gate", "C", "TooLow"])
    selective = LocalRunner(dag, "demo", root, use_cache=False).run({}, selection=chosen, source=first)
    assert selective.status == "Succeeded" and runs(root) == ["B"]
    assert list(selective.steps) == ["A", "B"]
    assert selective.selective_from == first.id and selective.selected_steps == ["B"]
    assert selective.steps["A"].reused_from == first.id and selective.steps["A"].attempts == 0
    assert selective.steps["A"].properties == first.steps["A"].properties
    # B read A's output from the source execution and wrote its own under the new execution's id
    assert (LocalS3(root).path(f"s3://bucket/run/{selective.id}/B") / "result.txt").read_text() == "Av1;B;"
    view = selective.view()
    assert view.selective_from == first.id and view.steps[0].reused_from == first.id


def test_a_selective_run_of_a_branch_step_follows_the_sources_condition(root):
    first = run(root, {"Threshold": "0.9"})  # the gate took the else branch
    runs(root)
    dag = definition(root / "runs.txt")
    chosen = select(dag, ["C"], source_of(first), "demo")
    assert chosen.reused == ["A", "B", "Gate"]
    selective = LocalRunner(dag, "demo", root).run({"Threshold": "0.9"}, selection=chosen, source=first)
    assert statuses(selective)["C"] == "Skipped" and runs(root) == []
    assert selective.steps["C"].reason == "Gate took the other branch"


def test_two_steps_with_equal_key_attributes_are_cached_apart(root):
    """SageMaker looks for an earlier run of the same step: a second step whose key attributes equal the first's
    (only its output differs, which is no key attribute) still runs and writes its output."""
    twin = processing("A")
    twin["Name"] = "Twin"
    twin["Arguments"]["ProcessingOutputConfig"]["Outputs"][0]["S3Output"]["S3Uri"]["Std:Join"]["Values"][-1] = "Twin"
    dag = {"Version": "2020-12-01", "Steps": [processing("A"), twin]}
    dag = json.loads(json.dumps(dag).replace('"RUNS"', json.dumps(str(root / "runs.txt"))))
    execution = LocalRunner(dag, "demo", root).run({})
    assert runs(root) == ["A", "A"] and not execution.steps["Twin"].cached
    assert LocalS3(root).path(f"s3://bucket/run/{execution.id}/Twin/result.txt").exists()


def test_local_s3_adds_objects_puts_nothing_for_an_empty_folder_and_refuses_an_empty_input(tmp_path):
    """S3 semantics the runner keeps: an upload leaves the objects already under the prefix; an empty output puts
    no object, and a job input with no object under its URI is refused as SageMaker refuses it."""
    s3, out = LocalS3(tmp_path), tmp_path / "out"
    s3.put_bytes("s3://bucket/data/part-old.parquet", b"old")
    out.mkdir()
    (out / "part-new.parquet").write_bytes(b"new")
    s3.upload(out, "s3://bucket/data")
    assert sorted(p.name for p in s3.path("s3://bucket/data").iterdir()) == ["part-new.parquet", "part-old.parquet"]
    empty = tmp_path / "empty"
    (empty / "nested").mkdir(parents=True)
    s3.upload(empty, "s3://bucket/nothing")
    assert not s3.path("s3://bucket/nothing").exists()
    for uri in ("s3://bucket/nothing", "s3://bucket/missing"):
        with pytest.raises(FileNotFoundError, match=f"No S3 objects found under S3 URL {uri}"):
            s3.download(uri, tmp_path / "in")


def test_a_failed_training_job_gives_the_failure_file_as_its_reason(tmp_path):
    """SageMaker's FailureReason is what the job wrote to /opt/ml/output/failure (the toolkit writes the exit code
    and the error after a first line of its own), not that first line alone."""
    from pipeline.local.jobs import StepFailed, run_training

    s3 = LocalS3(tmp_path)
    s3.put_bytes("s3://bucket/code/fail.py", b"raise ValueError('learning rate must be positive, got -1.0')\n")
    args = {"AlgorithmSpecification": {"TrainingInputMode": "File"},
            "HyperParameters": {"sagemaker_program": '"fail.py"', "sagemaker_submit_directory": '"s3://bucket/code"'},
            "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"}}
    with (tmp_path / "log").open("w") as log, pytest.raises(StepFailed) as failed:
        run_training("fail-job", args, tmp_path / "work", s3, log, 1)
    reason = str(failed.value)
    assert reason.startswith("AlgorithmError: ") and "learning rate must be positive, got -1.0" in reason
    assert len(reason) <= len("AlgorithmError: ") + 1024


def with_steps(root: Path, *steps: dict) -> dict:
    dag = definition(root / "runs.txt")
    dag["Steps"] += json.loads(json.dumps(list(steps)).replace('"RUNS"', json.dumps(str(root / "runs.txt"))))
    return dag


def test_a_fail_step_ends_the_execution_and_only_the_steps_beside_it_finish(root):
    """SageMaker: the steps running when a FailStep fires complete, no other starts. X (no upstream step) runs
    beside it; Y waits on X, so it would only have started after the FailStep ended the execution."""
    dag = with_steps(root, processing("X"), {**processing("Y"), "DependsOn": ["X"]}, processing("D", output_of("C")),
                     processing("E", output_of("D")))
    execution = LocalRunner(dag, "demo", root).run({"Threshold": 0.9})  # B scores 0.7: the gate fails
    steps = {name: (record.status, record.reason) for name, record in execution.steps.items()}
    assert execution.status == "Failed" and steps["TooLow"] == ("Failed", "score below 0.9")
    assert steps["X"][0] == "Succeeded" and steps["Y"] == ("NotStarted", "the FailStep TooLow ended the execution")
    assert steps["D"] == steps["E"] == ("Skipped", "an upstream step was skipped")  # after the branch not taken
    assert runs(root) == ["A", "B", "X"]


def test_no_step_may_depend_on_a_fail_step(root):
    dag = with_steps(root, {**processing("Z"), "DependsOn": ["TooLow"]})
    with pytest.raises(ExpressionError, match="step Z: depends on the FailStep TooLow; SageMaker lets no step"):
        LocalRunner(dag, "demo", root).run({})
