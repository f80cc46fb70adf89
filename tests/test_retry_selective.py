"""Retry and selective execution: the service's rules on the shipped definition, and the AWS requests (moto has no
RetryPipelineExecution nor ListPipelineExecutionSteps and keeps no SelectiveExecutionConfig: those calls are answered
by a `before-call` hook on real boto3 clients, after botocore has validated and serialized the request)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import pytest
from fixtures_recorded import BUCKET, before_call, cli, respond

from pipeline.dag.requests import RequestError, validate
from pipeline.dag.selection import (
    Selection,
    SelectionError,
    Source,
    check_retry,
    downstream_of,
    inherit,
    parse_steps,
    select,
)
from pipeline.records import ExecutionView, StepView
from pipeline.views import executions_table, lineage

ROOT = Path(__file__).resolve().parent.parent
DEFINITION = json.loads((ROOT / "tests" / "golden" / "definition.json").read_text())
ALL = ["Tokenize", "Train", "Evaluate", "AccuracyGate", "RegisterModel", "AccuracyTooLow", "ApprovedGate",
       "Deploy"]
PIPELINE_ARN = "arn:aws:sagemaker:us-east-1:123456789012:pipeline/trainium-bert"


def source(status: str = "Succeeded", **steps: str) -> Source:
    statuses = {name: "Succeeded" for name in ALL}
    statuses["AccuracyTooLow"] = "Skipped"
    return Source("src1", "trainium-bert", status, {**statuses, **steps})


# the rules, on the shipped definition


def test_selecting_evaluate_reuses_tokenize_and_train_and_runs_nothing_downstream():
    chosen = select(DEFINITION, ["Evaluate"], source(), "trainium-bert")
    assert chosen.steps == ["Evaluate"]
    assert chosen.reused == ["Tokenize", "Train"]
    assert chosen.not_run == ["AccuracyGate", "RegisterModel", "AccuracyTooLow", "ApprovedGate", "Deploy"]
    assert chosen.request("arn:x/execution/src1") == {
        "SelectedSteps": [{"StepName": "Evaluate"}], "SourcePipelineExecutionArn": "arn:x/execution/src1"
    }
    assert chosen.request(None) == {"SelectedSteps": [{"StepName": "Evaluate"}]}


def test_a_branch_step_needs_its_condition_and_steps_come_in_run_order():
    chosen = select(DEFINITION, ["RegisterModel", "Evaluate", "AccuracyGate"], source(), "trainium-bert")
    assert chosen.steps == ["Evaluate", "AccuracyGate", "RegisterModel"]
    assert chosen.not_run == ["AccuracyTooLow", "ApprovedGate", "Deploy"]
    assert select(DEFINITION, ["RegisterModel"], source(), "trainium-bert").reused == [
        "Tokenize", "Train", "Evaluate", "AccuracyGate"
    ]
    with pytest.raises(SelectionError, match=r"\[RegisterModel\] have dependencies on \[AccuracyGate\], which did "
                                             r"not succeed in src1 \(AccuracyGate: Failed\)"):
        select(DEFINITION, ["RegisterModel"], source(AccuracyGate="Failed"), "trainium-bert")


@pytest.mark.parametrize(
    ("steps", "origin", "message"),
    [
        (["Evalute"], source(), "--steps Evalute: no such step; the steps are Tokenize, Train, Evaluate"),
        ([], source(), "expected at least one step name"),
        (["Train", "AccuracyGate"], source(),
         "Evaluate lies between the selected steps Train and AccuracyGate; every step on a path"),
        (["Tokenize", "Deploy"], source(), "Train lies between the selected steps Tokenize and Deploy"),
        (["RegisterModel", "AccuracyTooLow"], source(),
         "must be connected in the DAG, and RegisterModel and AccuracyTooLow are not"),
        (["Evaluate"], None, "the selected steps [Evaluate] have dependencies on [Tokenize, Train]; select them "
                             "too or pass --from EXECUTION"),
        (["Evaluate", "AccuracyGate"], source(Train="Failed", Evaluate="NotStarted", AccuracyGate="NotStarted"),
         "--from src1: the selected steps [Evaluate] have dependencies on [Train], which did not succeed in src1 "
         "(Train: Failed)"),
        (["Evaluate"], source("Executing"), "--from src1: the execution is Executing; a source must have ended"),
        (["Evaluate"], Source("src1", "other-pipeline", "Succeeded", {}),
         "an execution of pipeline other-pipeline, not trainium-bert"),
    ],
)
def test_refused_selections_name_the_step_at_fault(steps, origin, message):
    with pytest.raises(SelectionError) as refused:
        select(DEFINITION, steps, origin, "trainium-bert")
    assert message in str(refused.value)


def test_a_stopped_execution_is_no_source_as_the_service_model_says():
    """botocore: SourcePipelineExecutionArn's execution "can be either Failed or Success"; Stopped is refused."""
    import botocore.session

    doc = (botocore.session.get_session().get_service_model("sagemaker").shape_for("SelectiveExecutionConfig")
           .members["SourcePipelineExecutionArn"].documentation)
    assert "<code>Failed</code> or <code>Success</code>" in doc
    with pytest.raises(SelectionError) as refused:
        select(DEFINITION, ["Evaluate"], source("Stopped"), "trainium-bert")
    assert str(refused.value) == ("--from src1: the execution is Stopped; a source must have ended Succeeded or Failed "
                                  "(SageMaker refuses any other as SourcePipelineExecutionArn)")
    chosen = select(DEFINITION, ["Evaluate"], source("Failed"), "trainium-bert")
    assert chosen.reused == ["Tokenize", "Train"]


def test_a_selection_without_dependencies_needs_no_source_and_unknown_source_steps_are_left_to_the_service():
    assert select(DEFINITION, ["Tokenize"], None, "trainium-bert").not_run == ALL[1:]
    unlisted = Source("src1", "trainium-bert", "Failed", None)  # moto cannot list the steps: the service judges
    assert select(DEFINITION, ["Evaluate"], unlisted, "trainium-bert").reused == ["Tokenize", "Train"]


def test_parsing_parameters_and_the_request_shape():
    assert parse_steps(["Evaluate,AccuracyGate", " RegisterModel ", "Evaluate", ""]) == [
        "Evaluate", "AccuracyGate", "RegisterModel"
    ]
    inherited = inherit(DEFINITION, {"Epochs": 3, "AccuracyThreshold": 0.5, "Gone": "x", "InputData": "sample:9"},
                        {"Epochs": "5"})
    assert inherited == {"Epochs": "5", "AccuracyThreshold": "0.5", "InputData": "sample:9"}
    assert inherit({"Parameters": [{"Name": "Flag", "Type": "Boolean"}]}, {"Flag": True}, {}) == {"Flag": "true"}
    request = {"PipelineName": "trainium-bert", "ClientRequestToken": "0" * 32,
               "SelectiveExecutionConfig": Selection(["Evaluate"]).request(None)}
    validate(request, "StartPipelineExecution", "start")  # the service model accepts it
    request["SelectiveExecutionConfig"] = {"SelectedSteps": [{"Name": "Evaluate"}]}
    with pytest.raises(RequestError, match="Unknown parameter in SelectiveExecutionConfig.SelectedSteps"):
        validate(request, "StartPipelineExecution", "start")


def test_a_retry_is_refused_unless_failed_and_when_the_definition_changed():
    check_retry("e1", "Failed", DEFINITION, DEFINITION, ["Evaluate"])
    check_retry("e1", "Stopped", DEFINITION, DEFINITION, ["Train"])
    with pytest.raises(SelectionError, match="e1 is Succeeded: there is nothing to retry"):
        check_retry("e1", "Succeeded", DEFINITION, DEFINITION, [])
    with pytest.raises(SelectionError, match="e1 is Executing: it is still running"):
        check_retry("e1", "Executing", DEFINITION, DEFINITION, [])
    with pytest.raises(SelectionError, match="e1 ended in its FailStep AccuracyTooLow, which a retry would only "
                                             "reach again"):
        check_retry("e1", "Failed", DEFINITION, DEFINITION, ["AccuracyTooLow"])
    changed = json.loads(json.dumps(DEFINITION).replace('"4000"', '"12"'))  # Evaluate's --sample-size
    with pytest.raises(SelectionError) as refused:
        check_retry("e1", "Failed", DEFINITION, changed, ["Train"])
    assert str(refused.value) == (
        "execution e1 ran another definition than the current code and config make (changed: Evaluate); a retry "
        "re-runs the one it ran, unchanged. To run the current one from where it stopped: upsert, then start "
        "--steps Train,Evaluate,AccuracyGate,RegisterModel,AccuracyTooLow,ApprovedGate,Deploy --from e1 "
        "(with the same --set options as that run)"
    )
    # the suggestion is itself a selection the service accepts
    steps = downstream_of(changed, ["Evaluate", "Train"])
    select(changed, steps, source(Train="Failed", Evaluate="NotStarted"), "trainium-bert")


def test_views_say_how_an_execution_came_about():
    steps = [StepView("Tokenize", "Succeeded", reused_from="src1"), StepView("Evaluate", "Succeeded", attempts=1)]
    selective = ExecutionView("e2", "arn", "trainium-bert", "Succeeded", steps=steps, selective_from="src1",
                              selected_steps=["Evaluate"])
    assert lineage(selective) == "selective from src1: Evaluate"
    assert lineage(ExecutionView("e3", "arn", "p", "Failed", retries=2)) == "retried 2x"
    attempts = [StepView("Train", "Succeeded", attempts=2)]
    assert lineage(ExecutionView("e4", "arn", "p", "Succeeded", steps=attempts)) == "retried"
    assert lineage(ExecutionView("e5", "arn", "p", "Succeeded", steps=[])) == ""
    assert executions_table([selective], "trainium-bert").columns[-1] == "how"


# the AWS calls


@contextlib.contextmanager
def answered(answers: dict[str, Callable[[dict], dict | None]]) -> Iterator[list[tuple[str, dict]]]:
    """Answer these SageMaker operations (name -> function of the request body giving the response body, or None to
    let moto answer) for every client created inside; yields the (operation, request body) pairs seen, each
    validated and serialized by botocore first."""
    seen: list[tuple[str, dict]] = []

    def hook(model, params: dict, **kwargs):
        body = json.loads(params.get("body") or b"{}")
        seen.append((model.name, body))
        response = answers[model.name](body)
        return None if response is None else respond(model, json.dumps(response).encode())

    with before_call(answers, hook):
        yield seen


def step(name: str, status: str, attempts: int = 1, **extra) -> dict:
    return {"StepName": name, "StepStatus": status, "AttemptCount": attempts, "StartTime": 1740823203.0, **extra}


FAILED_STEPS = [step("Tokenize", "Succeeded"), step("Train", "Succeeded"),
                step("Evaluate", "Failed", FailureReason="ClientError: capacity")]


@pytest.fixture
def aws(moto_session, capsys):
    mock, _ = moto_session
    mock.reset()
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    assert cli(capsys, "upsert")[0] == 0
    sagemaker = boto3.client("sagemaker", region_name="us-east-1")
    arn = sagemaker.start_pipeline_execution(
        PipelineName="trainium-bert", PipelineParameters=[{"Name": "Epochs", "Value": "3"}]
    )["PipelineExecutionArn"]
    return sagemaker, arn


def failed_execution(arn: str, status: str = "Failed", steps: list[dict] = FAILED_STEPS, **more):
    """Answers that make `arn` a failed execution with `steps` (moto's executions always succeed)."""
    def describe(body: dict) -> dict | None:
        if body["PipelineExecutionArn"] != arn:
            return None
        return {"PipelineArn": PIPELINE_ARN, "PipelineExecutionArn": arn, "PipelineExecutionStatus": status,
                "CreationTime": 1740823200.0, "LastModifiedTime": 1740830000.0}

    return {
        "DescribePipelineExecution": describe,
        "ListPipelineExecutionSteps": lambda body: {"PipelineExecutionSteps": steps},
        **more,
    }


def test_retry_calls_retry_pipeline_execution_with_the_execution_and_a_token(aws, capsys):
    sagemaker, arn = aws
    answers = failed_execution(arn, RetryPipelineExecution=lambda body: {"PipelineExecutionArn": body[
        "PipelineExecutionArn"]})
    with answered(answers) as seen:
        code, out, err = cli(capsys, "retry", arn.rsplit("/", 1)[-1])
    assert code == 0, err
    (request,) = [body for operation, body in seen if operation == "RetryPipelineExecution"]
    assert set(request) == {"PipelineExecutionArn", "ClientRequestToken"}
    assert request["PipelineExecutionArn"] == arn and len(request["ClientRequestToken"]) == 32
    assert f"retrying {arn}" in out and f"trainium-pipeline status {arn.rsplit('/', 1)[-1]}" in out


@pytest.mark.parametrize(
    ("status", "sets", "message"),
    [
        ("Succeeded", [], "is Succeeded: there is nothing to retry"),
        ("Executing", [], "is Executing: it is still running"),
        ("Failed", ["--set", "evaluation.sample_size=12"],
         "ran another definition than the current code and config make (changed: Evaluate); a retry re-runs the one "
         "it ran, unchanged. To run the current one from where it stopped: upsert, then start --steps Evaluate,"
         "AccuracyGate,RegisterModel,AccuracyTooLow,ApprovedGate,Deploy --from"),
    ],
)
def test_retry_refusals_call_nothing(aws, capsys, status, sets, message):
    sagemaker, arn = aws
    answers = failed_execution(arn, status, RetryPipelineExecution=lambda body: pytest.fail("retried"))
    with answered(answers):
        code, out, err = cli(capsys, *sets, "retry", arn)
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1


def test_retry_compares_the_definition_the_execution_ran_not_the_pipelines_current_one(aws, capsys):
    sagemaker, arn = aws
    assert cli(capsys, "--set", "evaluation.sample_size=12", "upsert")[0] == 0  # the pipeline changes, not the run
    with answered(failed_execution(arn)):
        code, out, err = cli(capsys, "--set", "evaluation.sample_size=12", "retry", arn)
    assert code == 1 and "(changed: Evaluate)" in err


def test_start_steps_from_sends_the_selective_config_with_the_sources_parameters(aws, capsys):
    sagemaker, arn = aws
    source_id = arn.rsplit("/", 1)[-1]
    answers = failed_execution(arn, StartPipelineExecution=lambda body: None)  # moto starts it
    with answered(answers) as seen:
        code, out, err = cli(capsys, "start", "--steps", "Evaluate,AccuracyGate", "--from", source_id,
                             "--param", "AccuracyThreshold=0.5")
    assert code == 0, err
    (request,) = [body for operation, body in seen if operation == "StartPipelineExecution"]
    assert request["SelectiveExecutionConfig"] == {
        "SourcePipelineExecutionArn": arn, "SelectedSteps": [{"StepName": "Evaluate"}, {"StepName": "AccuracyGate"}]
    }
    assert sorted(request["PipelineParameters"], key=lambda p: p["Name"]) == [
        {"Name": "AccuracyThreshold", "Value": "0.5"}, {"Name": "Epochs", "Value": "3"}
    ]
    assert len(request["ClientRequestToken"]) == 32
    assert "selected: Evaluate, AccuracyGate" in out
    assert f"outputs of {source_id}: Tokenize, Train" in out
    assert "not selected, so not run: RegisterModel, AccuracyTooLow, ApprovedGate, Deploy" in out


def test_start_steps_refused_before_anything_starts(aws, capsys):
    sagemaker, arn = aws
    steps = [step("Tokenize", "Succeeded"), step("Train", "Failed"), step("Evaluate", "NotStarted")]
    answers = failed_execution(arn, steps=steps, StartPipelineExecution=lambda body: pytest.fail("started"))
    with answered(answers):
        code, out, err = cli(capsys, "start", "--steps", "Evaluate", "--from", arn)
        assert code == 1 and "the selected steps [Evaluate] have dependencies on [Train], which did not succeed" in err
        code, out, err = cli(capsys, "start", "--steps", "Evaluate")
        assert code == 1 and "pass --from EXECUTION" in err
        code, out, err = cli(capsys, "start", "--from", arn)
        assert code == 1 and "--from: expected --steps too" in err
        code, out, err = cli(capsys, "start", "--steps", "Tokenize", "--from", arn, "--param", "Epoch=2")
        assert code == 1 and "--param Epoch: unknown parameter" in err


def test_status_and_executions_show_selective_and_retried_executions(aws, capsys):
    sagemaker, arn = aws
    source_id = arn.rsplit("/", 1)[-1]
    selective = sagemaker.start_pipeline_execution(PipelineName="trainium-bert")["PipelineExecutionArn"]
    reused = {"SelectiveExecutionResult": {"SourcePipelineExecutionArn": arn}}
    steps = {
        arn: [step("Tokenize", "Succeeded"), step("Train", "Succeeded"), step("Evaluate", "Succeeded", attempts=2)],
        selective: [step("Tokenize", "Succeeded", **reused), step("Train", "Succeeded", **reused),
                    step("Evaluate", "Succeeded")],
    }

    def describe(body: dict) -> dict:
        found = {"PipelineArn": PIPELINE_ARN, "PipelineExecutionArn": body["PipelineExecutionArn"],
                 "PipelineExecutionStatus": "Succeeded", "CreationTime": 1740823200.0}
        if body["PipelineExecutionArn"] == selective:
            found["SelectiveExecutionConfig"] = {"SourcePipelineExecutionArn": arn,
                                                 "SelectedSteps": [{"StepName": "Evaluate"}]}
        return found

    answers = {"DescribePipelineExecution": describe,
               "ListPipelineExecutionSteps": lambda body: {"PipelineExecutionSteps": steps[body[
                   "PipelineExecutionArn"]]}}
    with answered(answers):
        code, out, err = cli(capsys, "executions")
        assert code == 0, err
        rows = {line.split()[1]: line for line in out.splitlines() if source_id in line or "selective" in line}
        assert f"selective from {source_id}: Evaluate" in out and "retried" in rows[source_id]
        code, out, err = cli(capsys, "status", selective)
        assert code == 0, err
        assert f"(selective from {source_id}: Evaluate)" in out
        assert out.count(f"reused from {source_id}") == 2


def test_retry_wait_follows_the_same_execution_past_its_old_status(aws, capsys):
    sagemaker, arn = aws
    statuses = iter(["Failed", "Failed", "Failed", "Executing", "Succeeded"])  # before, then while the retry runs
    steps = [*FAILED_STEPS[:2], step("Evaluate", "Succeeded", attempts=2)]

    def describe(body: dict) -> dict:
        return {"PipelineArn": PIPELINE_ARN, "PipelineExecutionArn": arn, "PipelineExecutionStatus": next(statuses),
                "CreationTime": 1740823200.0, "LastModifiedTime": 1740830000.0}

    answers = {"DescribePipelineExecution": describe,
               "ListPipelineExecutionSteps": lambda body: {"PipelineExecutionSteps": steps},
               "RetryPipelineExecution": lambda body: {"PipelineExecutionArn": arn}}
    with answered(answers) as seen:
        code, out, err = cli(capsys, "retry", arn, "--wait", "--poll", "0.01")
    assert code == 0, err
    assert [operation for operation, _ in seen].count("RetryPipelineExecution") == 1
    assert next(statuses, "all read") == "all read"  # it waited through the stale Failed until Succeeded
    assert f"execution {arn.rsplit('/', 1)[-1]}: Succeeded" in out


def test_a_retry_compares_steps_and_parameters_not_what_the_service_keeps_beside_them():
    stored = {**DEFINITION, "Metadata": {"kept": "by the service"}}
    check_retry("e1", "Failed", stored, DEFINITION, [])
    other = json.loads(json.dumps(DEFINITION).replace('"DefaultValue": 0.85', '"DefaultValue": 0.9'))
    assert other != DEFINITION
    with pytest.raises(SelectionError, match=r"\(changed: the parameters\).*upsert, then start \(with the same"):
        check_retry("e1", "Failed", DEFINITION, other, [])
