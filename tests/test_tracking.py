"""Experiment tracking: steps/tracking.py (the steps' tracker) against MLflow's own tracking server and a local
store, a server that cannot be reached, the steps' MLflow environment and MlflowConfig in the definition, and the
execution role's permissions. The end-to-end check (a `run --local` logs one run equal to the step files) is in
test_local_e2e.py."""

from __future__ import annotations

import io
import json
import math
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import botocore.session
import pytest
from botocore.validate import ParamValidator

from pipeline.code import bundles
from pipeline.config import load_config
from pipeline.config.tracking import tracking_prefix, tracking_settings
from pipeline.definition import definition
from steps import contract, tracking

ROOT = Path(__file__).resolve().parent.parent

ARN = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/trainium-bert"


def env(uri: str, execution: str = "exec-1", **more: str) -> dict[str, str]:
    return {contract.TRACKING_URI_ENV: uri, contract.EXPERIMENT_ENV: "bert", contract.EXECUTION_ENV: execution,
            "TRACKING_TIMEOUT_S": "120", "TRACKING_BUDGET_S": "120", **more}


def log_two_steps(environ: dict[str, str]) -> tuple[str | None, str | None]:
    """What Train then Evaluate log, each with its own tracker (as two jobs do)."""
    train = tracking.Tracker("Train", environ)
    train.log(metrics={"samples_per_sec": 123.5, "val_accuracy": None}, params={"learning_rate": 5e-5},
              curves={"train_loss": [(10, 0.69), (20, 0.41)]})
    evaluate = tracking.Tracker("Evaluate", environ)
    evaluate.log(metrics={"eval_accuracy": 0.91}, tags={"serving.int8": "true"})
    evaluate.finish()
    return train.run_id, evaluate.run_id


def check_run(uri: str, run_id: str, execution: str = "exec-1") -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == execution
    assert run.data.tags[contract.EXECUTION_TAG] == execution and run.data.tags["serving.int8"] == "true"
    assert run.data.params == {"learning_rate": "5e-05"}
    assert run.data.metrics == {"samples_per_sec": 123.5, "eval_accuracy": 0.91, "train_loss": 0.41}
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train_loss")] == [(10, 0.69), (20, 0.41)]
    assert client.get_experiment(run.info.experiment_id).name == "bert"


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """MLflow's own tracking server app (its REST handlers on a SQLite store), on a free port of 127.0.0.1."""
    folder = tmp_path_factory.mktemp("mlflow-server")
    os.environ.update(_MLFLOW_SERVER_FILE_STORE=f"sqlite:///{folder / 'mlflow.db'}",
                      _MLFLOW_SERVER_ARTIFACT_ROOT=str(folder / "artifacts"), _MLFLOW_SERVER_SERVE_ARTIFACTS="false")
    from mlflow.server import app
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_train_and_evaluate_log_to_one_run_of_a_tracking_server(mlflow_server, capsys):
    train, evaluate = log_two_steps(env(mlflow_server))
    assert train and train == evaluate  # Evaluate found the run Train created, by the execution's tag
    check_run(mlflow_server, train)
    assert "warning" not in capsys.readouterr().err
    other, _ = log_two_steps(env(mlflow_server, execution="exec-2"))
    assert other != train  # another execution, another run


def test_nan_infinite_values_and_a_long_curve_reach_a_server_whole(mlflow_server, capsys):
    """A NaN or infinite metric is sent as protobuf JSON spells it, and a curve longer than one LogBatch request
    takes (1000 entities, 100 params and tags) is split: the server keeps every point, param and tag."""
    from mlflow.tracking import MlflowClient

    curve = [(step, 1.0 / step) for step in range(1, 2502)]
    params = {f"p{i}": i for i in range(150)}
    tracker = tracking.Tracker("Train", env(mlflow_server, execution="exec-long"))
    tracker.log(metrics={"eval_auc": float("nan"), "big": float("inf"), "small": float("-inf"), "ok": 0.5},
                params=params, tags={"t": "x"}, curves={"train_loss": [(0, float("nan")), *curve]})
    tracker.finish()
    assert "warning" not in capsys.readouterr().err
    client = MlflowClient(mlflow_server)
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {k: str(v) for k, v in params.items()}
    assert run.data.tags["t"] == "x" and run.data.metrics["ok"] == 0.5
    assert math.isnan(run.data.metrics["eval_auc"]) and run.data.metrics["big"] > 1e300
    assert run.data.metrics["small"] < -1e300
    history = sorted((m.step, m.value) for m in client.get_metric_history(tracker.run_id, "train_loss"))
    assert len(history) == 2502 and history[1:] == curve and math.isnan(history[0][1])


@pytest.mark.parametrize("points", [0, 1, 999, 1000, 1001, 2500])
@pytest.mark.parametrize(("params", "tags"), [(0, 0), (1, 1), (99, 2), (150, 60)])
def test_a_batch_is_split_within_log_batch_limits_and_keeps_every_entity(points, params, tags):
    split = tracking.batches(list(range(points)), [f"p{i}" for i in range(params)], [f"t{i}" for i in range(tags)])
    assert all(len(m) + len(p) + len(t) <= 1000 and len(p) + len(t) <= 100 for m, p, t in split)
    assert [x for m, _, _ in split for x in m] == list(range(points))
    assert [x for _, p, _ in split for x in p] == [f"p{i}" for i in range(params)]
    assert [x for _, _, t in split for x in t] == [f"t{i}" for i in range(tags)]


def test_a_refused_request_is_one_warning_with_the_servers_reason(mlflow_server, capsys):
    tracker = tracking.Tracker("Train", env(mlflow_server, execution="exec-refused"))
    tracker.log(params={"learning_rate": 1})
    tracker.log(params={"learning_rate": 2})  # MLflow refuses to change a param
    assert not tracker.enabled
    (warning,) = capsys.readouterr().err.strip().splitlines()
    assert "HTTP Error 400" in warning and "INVALID_PARAMETER_VALUE" in warning


def test_a_failing_evaluate_marks_the_run_failed(mlflow_server, tmp_path):
    """The Evaluate step's failure (here: no model) ends the execution's run FAILED, not RUNNING for ever."""
    from mlflow.tracking import MlflowClient

    train = tracking.Tracker("Train", env(mlflow_server, execution="exec-failed"))
    train.log(metrics={"test_accuracy": 0.5})
    from fixtures_ml import step_arguments

    done = subprocess.run([sys.executable, "-m", "steps.evaluation", *step_arguments("Evaluate"),
                           "--model-dir", str(tmp_path / "none"),
                           "--test-dir", str(tmp_path), "--output-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **env(mlflow_server, execution="exec-failed")})
    assert done.returncode == 1 and "evaluate failed" in done.stderr
    assert MlflowClient(mlflow_server).get_run(train.run_id).info.status == "FAILED"


def test_runs_and_the_version_tag_reach_a_managed_server_by_its_arn(mlflow_server, tmp_path):
    """`runs` and the registered version's tag through the sagemaker-mlflow plugin, which signs for the process's
    tracking URI: the CLI sets it to the ARN (the plugin's custom endpoint stands in for AWS)."""
    from mlflow.tracking import MlflowClient

    train, _ = log_two_steps({**env(mlflow_server, execution="exec-arn"), contract.EXPERIMENT_ENV: "trainium-bert"})
    aws = {**os.environ, "SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT": mlflow_server, "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
           "AWS_SECRET_ACCESS_KEY": "secret", "AWS_DEFAULT_REGION": "us-east-1", "MLFLOW_TRACKING_URI": ""}
    listed = subprocess.run([sys.executable, "-m", "pipeline", "--set", f"tracking.server_arn={ARN}", "runs"],
                            capture_output=True, text=True, cwd=ROOT, env={**aws, "COLUMNS": "200"})
    assert listed.returncode == 0, listed.stderr
    assert "exec-arn" in listed.stdout
    code = (f"from pipeline.tracking.store import tag_version\n"
            f"print(tag_version({ARN!r}, {train!r}, 7, 'arn:aws:sagemaker:us-east-1:1:model-package/g/7'))")
    tagged = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=aws)
    assert tagged.stdout.strip() == "None", tagged.stdout + tagged.stderr
    assert MlflowClient(mlflow_server).get_run(train).data.tags["model_version"] == "7"


def test_a_local_store_needs_no_server(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    train, evaluate = log_two_steps(env(uri))
    assert train and train == evaluate
    check_run(uri, train)


TRACK_AT = """
import sys, time
sys.path.insert(0, sys.argv[1])
import tracking
start = float(sys.argv[4])
while time.time() < start:
    pass
tracking.Tracker("Train", {"MLFLOW_TRACKING_URI": sys.argv[2], "MLFLOW_EXPERIMENT_NAME": "bert",
                           "PIPELINE_EXECUTION_ID": sys.argv[3]}).log(metrics={"train_loss": 0.5})
"""


@pytest.mark.slow  # two local executions
def test_two_executions_starting_together_on_a_new_local_store_are_both_tracked(tmp_path):
    """MLflow migrates a new SQLite store on first use; two first steps at the same instant both did it (one failed
    with "table experiments already exists" and its step went untracked)."""
    import time

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    start = str(time.time() + 5)  # both processes imported mlflow by then
    procs = [subprocess.Popen([sys.executable, "-c", TRACK_AT, str(shipped_tracker(tmp_path)), uri, name, start],
                              stderr=subprocess.PIPE, text=True) for name in ("exec-a", "exec-b")]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert not [e for e in errors if "tracking off" in e], errors
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("bert").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["exec-a", "exec-b"]


def test_an_experiment_another_execution_creates_first_is_used(mlflow_server, monkeypatch, capsys):
    """Two executions' first steps on a server: the one whose create comes second reads the experiment back."""
    from mlflow.tracking import MlflowClient

    store = tracking.RestStore(mlflow_server, 30)
    call = store._call

    def racing(method: str, path: str, body: dict | None = None, query: dict | None = None) -> dict:
        if path == "experiments/create":
            MlflowClient(mlflow_server).create_experiment(body["name"])
        return call(method, path, body, query)

    monkeypatch.setattr(store, "_call", racing)
    made = store.experiment_id("raced")
    assert made == MlflowClient(mlflow_server).get_experiment_by_name("raced").experiment_id


@pytest.fixture
def sagemaker_api(monkeypatch):
    """SageMaker as moto, in this process: the tracker asks it for an execution's own experiment."""
    from moto import mock_aws

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        yield


def test_the_deploy_lambda_ends_the_run_of_a_failed_or_stopped_execution_left_running(mlflow_server, sagemaker_api):
    """On AWS a step killed outright (its instance, memory, the execution stopped) leaves the run RUNNING; the
    execution's Failed / Stopped event reaches the deploy Lambda, which ends it FAILED / KILLED, and only then."""
    from types import SimpleNamespace

    from mlflow.tracking import MlflowClient

    from steps.deploy import handler
    from steps.deploy.sagemaker_account import Settings

    killed = {}
    for execution in ("killed-train", "stopped", "succeeded"):
        train = tracking.Tracker("Train", env(mlflow_server, execution))
        train.log(metrics={"train_loss": 0.5})
        killed[execution] = train.run_id
    log_two_steps(env(mlflow_server, "evaluated"))  # Evaluate ended it FINISHED; a later step failed
    settings = Settings.from_env({"MODEL_PACKAGE_GROUP": "g", "ENDPOINT_NAME": "e",
                                  contract.TRACKING_URI_ENV: mlflow_server, contract.EXPERIMENT_ENV: "bert"})
    account = SimpleNamespace(settings=settings)
    arn = "arn:aws:sagemaker:us-east-1:123456789012:pipeline/trainium-bert/execution/"

    def ended(execution: str, status: str) -> dict:
        return handler.handle({"detail-type": handler.EXECUTION_EVENT, "id": execution, "detail": {
            "pipelineExecutionArn": arn + execution, "currentPipelineExecutionStatus": status}}, account)

    assert ended("killed-train", "Failed")["action"] == "run-ended"
    assert ended("stopped", "Stopped")["action"] == "run-ended"
    assert ended("succeeded", "Succeeded")["action"] == "ignored"
    assert ended("evaluated", "Failed")["reason"] == "no RUNNING MLflow run of execution evaluated"
    client = MlflowClient(mlflow_server)
    status = {e: client.get_run(run).info.status for e, run in killed.items()}
    assert status == {"killed-train": "FAILED", "stopped": "KILLED", "succeeded": "RUNNING"}
    evaluated = client.search_runs([client.get_experiment_by_name("bert").experiment_id],
                                   f"tags.`{contract.EXECUTION_TAG}` = 'evaluated'")
    assert evaluated[0].info.status == "FINISHED"
    assert ended("killed-train", "Failed")["reason"].startswith("no RUNNING")  # a second delivery: nothing to end


class BlackHole:
    """A port that accepts connections and never answers; counts them."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.accepted.append(self.socket.accept()[0])
            except OSError:
                return

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.socket.getsockname()[1]}"


def test_a_server_that_does_not_answer_costs_each_step_its_budget_and_one_warning(capsys):
    hole = BlackHole()
    started = time.monotonic()
    train, evaluate = log_two_steps(env(hole.url, TRACKING_TIMEOUT_S="0.5", TRACKING_BUDGET_S="1.2"))
    assert (train, evaluate) == (None, None)
    assert time.monotonic() - started < 2 * 1.2 + 1.0  # each step gives up within its budget
    assert len(hole.accepted) == 4  # per step: 0.5 s, a 0.5 s wait, 0.5 s; no wait then fits; nothing after that
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 2 and all("experiment tracking off" in w and "timed out" in w for w in warnings)


def test_a_server_that_restarts_is_asked_again_after_a_refused_connection(mlflow_server, capsys):
    """As MLflow's client retries a connection error: the run is logged once the server answers again (here it
    starts 1 s after the first request was refused)."""
    from mlflow.server import app
    from werkzeug.serving import make_server

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    later = threading.Timer(1.0, lambda: threading.Thread(
        target=make_server("127.0.0.1", port, app, threaded=True).serve_forever, daemon=True).start())
    later.start()
    train, evaluate = log_two_steps(env(url, "restarted", TRACKING_TIMEOUT_S="2", TRACKING_BUDGET_S="20"))
    later.join()
    check_run(url, train, "restarted")
    assert "tracking off" not in capsys.readouterr().err


class Faults:
    """MLflow's server app with answers put before it: path (after /api/2.0/mlflow/) -> [(status, body), ...]."""

    def __init__(self, app) -> None:
        self.app, self.planned = app, {}

    def __call__(self, environ, start_response):
        queue = self.planned.get(environ["PATH_INFO"].split("/api/2.0/mlflow/")[-1])
        if queue:
            status, body = queue.pop(0)
            start_response(status, [("Content-Type", "text/html"), ("Content-Length", str(len(body)))])
            return [body]
        return self.app(environ, start_response)


@pytest.fixture(scope="module")
def faulty(mlflow_server):
    from mlflow.server import app
    from werkzeug.serving import make_server

    faults = Faults(app)
    server = make_server("127.0.0.1", 0, faults, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield faults, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_a_busy_server_is_asked_again_as_mlflow_s_client_does(faulty, capsys):
    faults, url = faulty
    faults.planned["runs/log-batch"] = [("503 Service Unavailable", b"try again"), ("429 Too Many Requests", b"")]
    train, evaluate = log_two_steps(env(url, "busy"))
    check_run(url, train, "busy")
    assert "tracking off" not in capsys.readouterr().err and faults.planned["runs/log-batch"] == []


def test_a_run_whose_logging_failed_is_still_ended(faulty, capsys):
    from mlflow.tracking import MlflowClient

    faults, url = faulty
    train = tracking.Tracker("Train", env(url, "refused-batch"))
    train.log(metrics={"a": 1.0})
    faults.planned["runs/log-batch"] = [("400 Bad Request", b'{"error_code": "INVALID_PARAMETER_VALUE"}')]
    evaluate = tracking.Tracker("Evaluate", env(url, "refused-batch"))
    evaluate.log(metrics={"b": 2.0})
    evaluate.finish()
    assert MlflowClient(url).get_run(train.run_id).info.status == "FINISHED"  # not left RUNNING
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if "tracking off" in line]
    assert "tracking off for step Evaluate: HTTPError: HTTP Error 400: Bad Request" in warning


def test_an_answer_that_is_not_json_or_not_mlflow_s_is_the_reason_said(faulty, capsys, sagemaker_api):
    from types import SimpleNamespace

    from steps.deploy import handler
    from steps.deploy.sagemaker_account import Settings

    faults, url = faulty
    faults.planned["experiments/get-by-name"] = [("200 OK", b"<html><body>Please sign in</body></html>")]
    tracking.Tracker("Train", env(url)).log(metrics={"a": 1.0})
    warning = capsys.readouterr().err
    assert "is not JSON: b'<html><body>Please sign in</body></html>'" in warning, warning
    settings = Settings.from_env({"MODEL_PACKAGE_GROUP": "g", "ENDPOINT_NAME": "e", contract.EXPERIMENT_ENV: "bert",
                                  contract.TRACKING_URI_ENV: url + "/wrong-prefix"})  # a 404 page, not MLflow's own
    event = {"detail-type": handler.EXECUTION_EVENT, "id": "e1", "detail": {
        "pipelineExecutionArn": "arn:aws:sagemaker:us-east-1:123456789012:pipeline/p/execution/e1",
        "currentPipelineExecutionStatus": "Failed"}}
    reason = handler.handle(event, SimpleNamespace(settings=settings))["reason"]
    assert reason.startswith("could not ask MLflow for the run of execution e1: HTTPError: HTTP Error 404"), reason


def test_a_closed_port_is_asked_within_the_budget_then_one_warning_and_the_step_goes_on(capsys):
    with socket.create_server(("127.0.0.1", 0)) as s:
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    tracker = tracking.Tracker("Train", env(closed, TRACKING_BUDGET_S="2"))  # refused: asked again for 1.5 s
    tracker.log(metrics={"a": 1.0})
    tracker.log(metrics={"b": 2.0})
    tracker.finish()
    assert not tracker.enabled and tracker.run_id is None
    (warning,) = capsys.readouterr().err.strip().splitlines()
    assert "experiment tracking off for step Train: URLError" in warning and "files keep its metrics" in warning


@pytest.mark.parametrize(("uri", "timeout", "error"), [("arn:aws:sagemaker", "5", "IndexError"),
                                                     ("http://127.0.0.1:9", "soon", "ValueError")])
def test_a_malformed_uri_or_timeout_is_one_warning_and_the_step_goes_on(uri, timeout, error, capsys):
    tracker = tracking.Tracker("Train", env(uri, TRACKING_TIMEOUT_S=timeout, TRACKING_BUDGET_S="2"))
    tracker.log(metrics={"a": 1.0})
    tracker.finish()
    assert not tracker.enabled and tracker.run_id is None
    (warning,) = capsys.readouterr().err.strip().splitlines()
    assert f"experiment tracking off for step Train: {error}" in warning


def test_nothing_is_tracked_without_an_execution_or_a_uri(capsys):
    assert not tracking.Tracker("Train", {contract.EXECUTION_ENV: "x"}).enabled
    assert not tracking.Tracker("Train", {contract.TRACKING_URI_ENV: "http://127.0.0.1:9"}).enabled
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("uri", ["http://127.0.0.1:9", "sqlite:////nonexistent/mlflow.db"])
def test_the_tracker_needs_nothing_outside_the_standard_library(uri, tmp_path):
    """The images' Python: no mlflow (a server is spoken to with the standard library; a local store says it needs
    mlflow, in one line), and the step exits 0 either way."""
    code = ("import tracking\nt = tracking.Tracker('Train')\nt.log(metrics={'a': 1.0})\nt.finish()\n"
            "print('enabled', t.enabled)")
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                          cwd=shipped_tracker(tmp_path),
                          env={**env(uri, TRACKING_TIMEOUT_S="2", TRACKING_BUDGET_S="2"),
                               "PATH": os.environ.get("PATH", "")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "enabled False"
    (warning,) = done.stderr.strip().splitlines()
    assert "experiment tracking off" in warning
    if uri.startswith("sqlite"):
        assert "the mlflow library is not installed" in warning


def test_an_arn_is_the_regional_endpoint_signed_for_sagemaker_mlflow(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    store = tracking.RestStore(ARN, timeout=1)
    assert store.base == "https://us-east-1.experiments.sagemaker.aws/api/2.0/mlflow/"
    headers = store._signed("POST", store.base + "runs/create", b"{}", dict(store.headers))
    assert headers["x-mlflow-sm-tracking-server-arn"] == ARN
    assert "/us-east-1/sagemaker-mlflow/aws4_request" in headers["Authorization"]
    assert "x-mlflow-sm-tracking-server-arn" in headers["Authorization"]  # the ARN header is signed too


def shipped_tracker(folder: Path) -> Path:
    """`folder` holding tracking.py as the training bundle ships it (a top-level module beside train.py)."""
    (folder / "tracking.py").write_bytes(bundles()["training"].files["tracking.py"])
    return folder


def test_every_bundle_that_tracks_carries_the_one_tracker():
    """steps/tracking.py is the one home: the steps' bundles hold it at its path, the training bundle beside
    train.py (no symlink, no copy in the tree)."""
    home = (ROOT / "steps" / "tracking.py").read_bytes()
    found = bundles()
    assert found["evaluation"].files["steps/tracking.py"] == home and found["deploy"].files["steps/tracking.py"] == home
    assert found["training"].files["tracking.py"] == home and "train.py" in found["training"].files
    with tarfile.open(fileobj=io.BytesIO(found["training"].tarball())) as archive:
        assert archive.extractfile("tracking.py").read() == home
    folders = ("pipeline", "steps", "training", "infra", "benchmarks")  # the project's own: not its venvs
    copies = [p for folder in folders for p in (ROOT / folder).glob("**/tracking.py")
              if p.is_symlink() or p.read_bytes() == home]
    assert copies == [ROOT / "steps" / "tracking.py"], copies


# the definition


def tracked_config(**sets: str):
    return load_config(ROOT / "pipeline.yaml", [f"tracking.server_arn={ARN}", *(f"{k}={v}" for k, v in sets.items())],
                       environ={})


@pytest.fixture(scope="module")
def tracked_dag(no_network_module) -> dict:
    return json.loads(definition(tracked_config()))


def test_mlflow_config_names_the_server_and_the_experiment(tracked_dag):
    assert tracked_dag["MlflowConfig"] == {"MlflowResourceArn": ARN, "MlflowExperimentName": "trainium-bert"}
    # the API's MlflowConfig shape (the published definition schema has none: see test_schema.py's lags)
    shape = botocore.session.get_session().get_service_model("sagemaker").shape_for("MlflowConfig")
    assert not ParamValidator().validate(tracked_dag["MlflowConfig"], shape).has_errors()
    pattern = shape.members["MlflowResourceArn"].metadata["pattern"]
    assert __import__("re").fullmatch(pattern, ARN)


def test_tracking_changes_no_job_step_so_no_cache_key(tracked_dag, no_network_module):
    """Turning tracking on or renaming the experiment re-runs no step: every job step's arguments (its cache key
    attributes, Train's checkpoint folder included) are those of the untracked pipeline; Train and Evaluate read
    the server and the experiment from the tracking file at a fixed S3 key, which `upsert` writes."""
    untracked = json.loads(definition(load_config(ROOT / "pipeline.yaml", environ={})))
    renamed = json.loads(definition(tracked_config(**{"tracking.experiment": "another"})))
    for dag in (tracked_dag, renamed):
        assert [s for s in dag["Steps"] if s["Type"] != "Condition"] == [
            s for s in untracked["Steps"] if s["Type"] != "Condition"]
    steps = {s["Name"]: s for s in tracked_dag["Steps"]}
    for name in ("Tokenize", "Train", "Evaluate"):
        assert not {contract.TRACKING_URI_ENV, contract.EXPERIMENT_ENV} & set(steps[name]["Arguments"]["Environment"])
    (channel,) = [c for c in steps["Train"]["Arguments"]["InputDataConfig"] if c["ChannelName"] == "tracking"]
    (given,) = [i for i in steps["Evaluate"]["Arguments"]["ProcessingInputs"] if i["InputName"] == "tracking"]
    assert channel["DataSource"]["S3DataSource"]["S3Uri"] == given["S3Input"]["S3Uri"] == tracking_prefix(
        tracked_config())
    uri, data = tracking_settings(tracked_config(**{"tracking.experiment": "another"}))
    assert uri == tracking_prefix(tracked_config()) + contract.TRACKING_FILE
    assert json.loads(data) == {"uri": ARN, "experiment": "another", "pipeline_arn": tracked_config().pipeline_arn}


def test_a_step_reads_the_tracking_file_and_its_environment_wins(tmp_path):
    (tmp_path / contract.TRACKING_FILE).write_text(json.dumps({"uri": ARN, "experiment": "from-file"}))
    job = {"TRAINING_JOB_NAME": "pipelines-7pd2w9c4n1hs-Train-tn2bx5qwc8", "TRACKING_TIMEOUT_S": "1"}
    found = tracking.Tracker("Train", job, settings_dir=str(tmp_path))
    assert (found.uri, found.experiment, found.execution) == (ARN, "from-file", "7pd2w9c4n1hs")
    local = tracking.Tracker("Train", {**job, contract.TRACKING_URI_ENV: "http://127.0.0.1:9"}, str(tmp_path))
    assert (local.uri, local.experiment) == ("http://127.0.0.1:9", "from-file")  # the local runner's store
    assert tracking.Tracker("Train", job, settings_dir=str(tmp_path / "absent")).uri == ""  # untracked
    (tmp_path / contract.TRACKING_FILE).write_text("{not json")
    assert tracking.Tracker("Train", job, settings_dir=str(tmp_path)).uri == ""


def test_a_sagemaker_job_finds_its_execution_in_its_name(tmp_path):
    """Pipelines name their jobs pipelines-<execution id>-<step>-<suffix>: training jobs see it in TRAINING_JOB_NAME,
    processing jobs in /opt/ml/config/processingjobconfig.json."""
    assert tracking.execution_id({"TRAINING_JOB_NAME": "pipelines-7pd2w9c4n1hs-Train-tn2bx5qwc8"}) == "7pd2w9c4n1hs"
    config = tmp_path / "processingjobconfig.json"
    config.write_text(json.dumps({"ProcessingJobName": "pipelines-k3j9x2m5q7wz-evaluate-hc4rw7ypne"}))
    assert tracking.execution_id({}, str(config)) == "k3j9x2m5q7wz"
    assert tracking.execution_id({contract.EXECUTION_ENV: "local-1"}, str(config)) == "local-1"
    assert tracking.execution_id({"TRAINING_JOB_NAME": "my-own-job"}, str(tmp_path / "absent")) == ""


def test_the_registered_version_carries_the_run_id(tracked_dag):
    gate = next(s for s in tracked_dag["Steps"] if s["Name"] == contract.ACCURACY_GATE)
    register = next(s for s in gate["Arguments"]["IfSteps"] if s["Type"] == "RegisterModel")
    value = register["Arguments"]["CustomerMetadataProperties"][contract.RUN_ID_METADATA]
    assert value["Std:JsonGet"]["Path"] == contract.RUN_ID_PATH


def test_without_a_server_there_is_no_mlflow_config_and_no_server_uri(no_network_module):
    cfg = load_config(ROOT / "pipeline.yaml", environ={})
    assert json.loads(definition(cfg))["MlflowConfig"] is None
    assert json.loads(tracking_settings(cfg)[1]) == {"uri": "", "experiment": "trainium-bert"}


@pytest.mark.parametrize("arn", [
    "arn:aws:sagemaker:us-east-1:1:model/x",
    "arn:aws:sagemaker:us-east-1:123456789012:mlflow-app/app-abc123",  # an MLflow App: another host and signing
    "arn:aws-cn:sagemaker:cn-north-1:123456789012:mlflow-tracking-server/x",  # no sagemaker-mlflow host there
])
def test_a_server_arn_the_steps_cannot_log_to_is_one_clear_error(arn):
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="tracking.server_arn.*mlflow-tracking-server"):
        load_config(ROOT / "pipeline.yaml", [f"tracking.server_arn={arn}"], environ={})
    load_config(ROOT / "pipeline.yaml", ["tracking.server_arn=arn:aws-us-gov:sagemaker:us-gov-west-1:123456789012:"
                                         "mlflow-tracking-server/x"], environ={})


def test_subnets_without_internet_track_only_through_mlflow_s_interface_endpoint():
    """Without internet and without MLflow's PrivateLink endpoint every step would wait out its budget for nothing:
    refused, naming the field; with the endpoint declared, accepted."""
    from pipeline.errors import ConfigError

    staged = ["images.wheels=s3://bkt/wheels/", "training.model_id=s3://bkt/models/m/", "data.source=s3://bkt/d/"]
    vpc = "aws.vpc={subnets: [subnet-1], security_group_ids: [sg-1], internet: false%s}"
    for tracked in (f"tracking.server_arn={ARN}", "tracking.create_server=true"):
        with pytest.raises(ConfigError, match=r"aws.vpc.mlflow_endpoint=False: .*interface VPC endpoint"):
            load_config(ROOT / "pipeline.yaml", [vpc % "", *staged, tracked], environ={})
        cfg = load_config(ROOT / "pipeline.yaml", [vpc % ", mlflow_endpoint: true", *staged, tracked], environ={})
        assert cfg.aws.vpc.mlflow_endpoint
    assert load_config(ROOT / "pipeline.yaml", [vpc % "", *staged], environ={}).tracking.server_arn is None


def test_an_execution_started_with_its_own_experiment_logs_there(mlflow_server, tmp_path, monkeypatch, capsys):
    """StartPipelineExecution's MlflowExperimentName is honoured: a step reads it with DescribePipelineExecution
    (its pipeline's ARN is in the tracking file, its execution id in its job's name), the deploy Lambda with the
    event's ARN; an execution without one, or a call that fails, logs to the configured experiment."""
    import boto3
    from mlflow.tracking import MlflowClient
    from moto import mock_aws
    from moto.sagemaker import models

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        sm = boto3.client("sagemaker", region_name="us-east-1")
        pipeline_arn = sm.create_pipeline(PipelineName="trainium-bert", PipelineDefinition='{"Steps": []}',
                                          RoleArn="arn:aws:iam::123456789012:role/r")["PipelineArn"]
        named, plain = (sm.start_pipeline_execution(PipelineName="trainium-bert")["PipelineExecutionArn"]
                        for _ in range(2))
        described = models.SageMakerModelBackend.describe_pipeline_execution

        def with_mlflow(backend, arn):  # moto keeps no MlflowExperimentName: the answer the service gives for it
            answer = described(backend, arn)
            return {**answer, "MLflowConfig": {"MlflowResourceArn": ARN, "MlflowExperimentName": "campaign-7"}
                    } if arn == named else answer

        monkeypatch.setattr(models.SageMakerModelBackend, "describe_pipeline_execution", with_mlflow)
        folder = tmp_path / "tracking"
        folder.mkdir()
        (folder / contract.TRACKING_FILE).write_text(json.dumps(
            {"uri": mlflow_server, "experiment": "bert", "pipeline_arn": pipeline_arn}))

        def step(arn: str, name: str = "Train") -> tracking.Tracker:
            job = {"TRAINING_JOB_NAME": f"pipelines-{arn.rsplit('/', 1)[1]}-{name.lower()}-abc"}
            tracker = tracking.Tracker(name, job, settings_dir=str(folder))
            tracker.log(metrics={"a": 1.0})
            return tracker

        client = MlflowClient(mlflow_server)
        assert client.get_experiment(client.get_run(step(named).run_id).info.experiment_id).name == "campaign-7"
        assert client.get_experiment(client.get_run(step(plain).run_id).info.experiment_id).name == "bert"
        lambda_view = tracking.Tracker("deploy", {contract.TRACKING_URI_ENV: mlflow_server, contract.EXPERIMENT_ENV:
                                                  "bert", contract.EXECUTION_ENV: named.rsplit("/", 1)[1],
                                                  tracking.EXECUTION_ARN_ENV: named})
        assert lambda_view.experiment == "campaign-7" and lambda_view.end_open("FAILED")  # the step's run, found
        assert "logging there, not to bert" in capsys.readouterr().out
        (folder / contract.TRACKING_FILE).write_text(json.dumps(
            {"uri": mlflow_server, "experiment": "bert", "pipeline_arn": pipeline_arn.replace("trainium", "other")}))
        unknown = step(named)
        assert unknown.enabled and unknown.experiment == "bert"
        assert "could not read the execution's own MLflow experiment" in capsys.readouterr().err


# the execution role


def test_the_execution_role_may_make_the_trackers_calls_on_the_tracking_server_only():
    from test_infra_policies import TEMPLATE, cfg, rendered, statements

    assert "ExecutionRoleTrackingPolicy" not in rendered()  # no server configured: no MLflow permission
    resources = rendered(config=cfg(**{"tracking.server_arn": ARN}))
    statement, described = statements(resources["ExecutionRoleTrackingPolicy"]["Properties"]["PolicyDocument"])
    assert sorted(statement["Action"]) == sorted(f"sagemaker-mlflow:{a}" for a in tracking.SERVER_ACTIONS)
    assert statement["Resource"] == [ARN]
    assert described["Action"] == [tracking.EXPERIMENT_ACTION]  # the execution's own experiment, of this pipeline
    assert described["Resource"] == [f"{cfg().pipeline_arn}/execution/*"]
    assert "TrackingServer" not in resources  # an existing server is taken as it is
    # bootstrap can create one instead: the stack's own server, with the execution role, and only it
    from pipeline.sagemaker.bootstrap import stack_parameters

    params = stack_parameters(cfg(**{"tracking.create_server": "true", "tracking.server_arn": ARN}), bucket="")
    assert (params["CreateTrackingServer"], params["TrackingServerResource"]) == ("true", "")
    server = TEMPLATE["Resources"]["TrackingServer"]
    assert server["Condition"] == "CreatesTrackingServer"
    assert server["Properties"]["RoleArn"] == {"Fn::GetAtt": ["ExecutionRole", "Arn"]}
    # the role's S3 access is a policy resource of its own, which the role's ARN does not wait for
    assert server["DependsOn"] == "ExecutionRolePolicy"
    assert "PrefixObjects" in json.dumps(TEMPLATE["Resources"]["ExecutionRolePolicy"])
    policy = TEMPLATE["Resources"]["ExecutionRoleTrackingPolicy"]["Properties"]["PolicyDocument"]
    created, configured = policy["Statement"][0]["Resource"]["Fn::If"][1:]
    assert policy["Statement"][0]["Resource"]["Fn::If"][0] == "CreatesTrackingServer"
    assert created == {"Fn::GetAtt": ["TrackingServer", "TrackingServerArn"]} and "Fn::Sub" in configured


def test_the_deploy_lambda_may_end_runs_on_the_tracking_server_only():
    from test_infra_policies import cfg, rendered, statements

    assert "DeployLambdaTrackingPolicy" not in rendered()
    config = cfg(**{"tracking.server_arn": ARN})
    statement, described = statements(
        rendered(config=config)["DeployLambdaTrackingPolicy"]["Properties"]["PolicyDocument"])
    assert sorted(statement["Action"]) == sorted(f"sagemaker-mlflow:{a}" for a in tracking.END_RUN_ACTIONS)
    assert statement["Resource"] == [ARN]
    assert described["Action"] == [tracking.EXPERIMENT_ACTION]
    assert described["Resource"] == [f"{config.pipeline_arn}/execution/*"]


def test_runs_says_where_it_would_read_and_why_not(tmp_path):
    from pipeline.tracking.store import TrackingError, local_uri, store_uri

    cfg = load_config(ROOT / "pipeline.yaml", environ={})
    with pytest.raises(TrackingError, match="tracking.server_arn: not set"):
        store_uri(cfg, local=False)
    with pytest.raises(TrackingError, match="no MLflow store in .* yet: `run --local` creates it"):
        store_uri(cfg, local=True, root=tmp_path)
    assert store_uri(tracked_config(), local=False) == ARN
    (tmp_path / "mlflow.db").touch()
    assert store_uri(cfg, local=True, root=tmp_path) == local_uri(tmp_path) == f"sqlite:///{tmp_path}/mlflow.db"


def test_the_summary_plot_draws_what_the_step_files_hold(tmp_path):
    from pipeline.tracking.plot import write_summary_plot

    stats = {"intervals": [{"step": 10, "loss": 0.7, "samples_per_sec": 50.0},
                           {"step": 20, "loss": 0.4, "samples_per_sec": 80.0}],
             "samples_per_sec": 80.0}
    report = {"binary_classification_metrics": {"confusion_matrix": {"0": {"0": 30, "1": 10}, "1": {"0": 5, "1": 35}}}}
    path = write_summary_plot(tmp_path / "summary.png", stats, report, "execution x")
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert write_summary_plot(tmp_path / "none.png", None, None, "x") is None and not (tmp_path / "none.png").exists()


def test_a_run_whose_step_was_killed_ends_with_its_local_execution(tmp_path):
    """A step killed outright (kill -9) cannot end its run: the local runner marks it FAILED with the execution."""
    from mlflow.tracking import MlflowClient

    from pipeline.local.runner import LocalRunner
    from pipeline.local.storage import LocalS3

    job = ("import os, sys\nsys.path.insert(0, os.path.dirname(__file__))\nimport tracking\n"
           "tracking.Tracker('Train', settings_dir=sys.argv[1]).log(metrics={'a': 1.0})\nos.kill(os.getpid(), 9)\n")
    s3 = LocalS3(tmp_path)
    s3.put_bytes("s3://bucket/code/job.py", job.encode())
    s3.put_bytes("s3://bucket/code/tracking.py", (ROOT / "steps" / "tracking.py").read_bytes())
    s3.put_bytes("s3://bucket/tracking/tracking.json", json.dumps({"uri": "", "experiment": "bert"}).encode())
    code = "/opt/ml/processing/input/code"
    dag = {"Parameters": [], "Steps": [{"Name": "Train", "Type": "Processing", "Arguments": {
        "AppSpecification": {"ContainerEntrypoint": ["python3", f"{code}/job.py", contract.TRACKING_DIR]},
        "ProcessingInputs": [{"InputName": "code", "S3Input": {"S3Uri": "s3://bucket/code/", "LocalPath": code}},
                             {"InputName": "tracking", "S3Input": {"S3Uri": "s3://bucket/tracking/",
                                                                   "LocalPath": contract.TRACKING_DIR}}],
        "ProcessingOutputConfig": {"Outputs": []}}}]}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    execution = LocalRunner(dag, "demo", tmp_path, tracking_uri=uri).run({})
    assert execution.status == "Failed"
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("bert").experiment_id])
    assert run.info.run_name == execution.id and run.info.status == "FAILED"
