"""Best-effort experiment tracking of a pipeline step: one MLflow run per pipeline execution, shared by its steps.

The step's environment says where (the definition sets it, the local runner points it at its own store):

    MLFLOW_TRACKING_URI     a SageMaker managed MLflow ARN, an http(s) URL, or a local store (sqlite:///...)
    MLFLOW_EXPERIMENT_NAME  the experiment (default trainium-bert)
    PIPELINE_EXECUTION_ID   the execution (set by the local runner; on SageMaker read from the job's name,
                            pipelines-<execution id>-<step>-<suffix>, so that the definition carries nothing that
                            differs per execution: that would change the steps' cache keys): the run's name and its
                            tag pipeline.execution_id, by which every step of the execution finds the same run
    TRACKING_TIMEOUT_S      seconds per request to a server (default 5)
    TRACKING_BUDGET_S       seconds this step may spend on a server in all, retries included (default 30)
    PIPELINE_EXECUTION_ARN  the execution (the deploy Lambda passes its event's): its own MLflow experiment, if it was
                            started with one (StartPipelineExecution's MlflowExperimentName), wins over the
                            configured one. On SageMaker the steps build it from the tracking file's pipeline_arn.

A server (ARN or URL) is spoken to over MLflow's REST API with the standard library alone (an ARN's requests are
signed with SigV4 by botocore, as the sagemaker-mlflow plugin signs them), so nothing is installed into the
images; a batch is split within the server's LogBatch limits and a NaN or infinite value is sent as protobuf JSON
spells it ("NaN", "Infinity"), as MLflow's own client does. A local store needs the `mlflow` library. Tracking
never fails a step: the first error disables it with one warning (with the server's reason), and the step's own
files keep every value. A step that fails marks the execution's run FAILED. As MLflow's own client does, a request
is asked again, with exponential backoff, after an answer that means "later" (TRANSIENT_STATUS) and after a
connection error or a timeout, but only within the step's TRACKING_BUDGET_S: a server that is down costs a step at
most that long.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TRACKING_FILE = "tracking.json"  # {"uri", "experiment"}: in the folder the step is given (its "tracking" input)
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
EXECUTION_ENV = "PIPELINE_EXECUTION_ID"
EXECUTION_ARN_ENV = "PIPELINE_EXECUTION_ARN"
EXECUTION_TAG = "pipeline.execution_id"
UNTRACKED = "none"  # the run id of an untracked step, for the report
# the IAM actions (sagemaker-mlflow:ACTION) of RestStore's calls: what the execution role is granted on the server,
# and of end_open's: what the deploy Lambda's role is
SERVER_ACTIONS = ("GetExperimentByName", "CreateExperiment", "SearchRuns", "CreateRun", "LogBatch", "UpdateRun")
END_RUN_ACTIONS = ("GetExperimentByName", "SearchRuns", "UpdateRun")
EXPERIMENT_ACTION = "sagemaker:DescribePipelineExecution"  # the execution's own experiment (execution_experiment)
DEFAULT_EXPERIMENT = "trainium-bert"
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_BUDGET_S = 30.0
# answers MLflow's own client retries (mlflow.utils.request_utils: rate limits, a busy or restarting server)
TRANSIENT_STATUS = (408, 429, 500, 502, 503, 504)
RETRIES, RETRY_WAIT_S = 5, 0.5  # waits 0.5, 1, 2, 4, 8 s, as long as the step's budget lasts
# Where a SageMaker job finds its own name: training jobs in the environment, processing jobs in this file.
TRAINING_JOB_ENV = "TRAINING_JOB_NAME"
PROCESSING_JOB_CONFIG = "/opt/ml/config/processingjobconfig.json"
PIPELINE_JOB = re.compile(r"^pipelines-([a-z0-9]+)-")  # the names SageMaker Pipelines gives its steps' jobs
ARN_HEADER = "x-mlflow-sm-tracking-server-arn"  # names the tracking server, as sagemaker-mlflow sends it
# one LogBatch request's limits (mlflow.utils.validation: MAX_ENTITIES_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH)
BATCH_ITEMS = 1000
BATCH_PARAMS_TAGS = 100


def _now_ms() -> int:
    return int(time.time() * 1000)


def json_double(value: float) -> float | str:
    """A double as protobuf's JSON mapping writes it: NaN and the infinities as strings (a bare NaN token is not
    JSON, and MLflow's server drops the rest of a request it cannot parse)."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"


def batches(metrics: list, params: list, tags: list) -> list[tuple[list, list, list]]:
    """The (metrics, params, tags) of one logging call split into requests within LogBatch's limits: at most 100
    params and tags, 1000 entities in all (as MLflow's client splits them); params and tags first."""
    keyed = [("p", p) for p in params] + [("t", t) for t in tags]
    out = []
    for i in range(0, len(keyed), BATCH_PARAMS_TAGS):
        chunk = keyed[i:i + BATCH_PARAMS_TAGS]
        out.append(([], [v for kind, v in chunk if kind == "p"], [v for kind, v in chunk if kind == "t"]))
    first_room = BATCH_ITEMS - (len(out[-1][1]) + len(out[-1][2]) if out else 0)
    if out and metrics:
        out[-1][0].extend(metrics[:first_room])
        metrics = metrics[first_room:]
    out += [(metrics[i:i + BATCH_ITEMS], [], []) for i in range(0, len(metrics), BATCH_ITEMS)]
    return out or [([], [], [])]


def run_filter(execution: str, running: bool = False) -> str:
    """MLflow's search filter of the execution's run (only while it is RUNNING with `running`)."""
    return f"tags.`{EXECUTION_TAG}` = '{execution}'" + (" and attributes.status = 'RUNNING'" if running else "")


class RestStore:
    """The six MLflow REST calls a step makes, to a server at an http(s) URL or a SageMaker managed MLflow ARN."""

    def __init__(self, uri: str, timeout: float, budget: float = DEFAULT_BUDGET_S) -> None:
        self.timeout, self.headers, self.region = timeout, {}, None
        self.budget, self.spent = budget, 0.0  # seconds spent in requests and waits: the budget is of those
        self.deadline = time.monotonic() + budget  # of the request under way
        base = uri
        if uri.startswith("arn:"):
            self.region = uri.split(":")[3]  # arn:aws:sagemaker:REGION:ACCOUNT:mlflow-tracking-server/NAME
            base = f"https://{self.region}.experiments.sagemaker.aws"  # also for aws-us-gov (as sagemaker-mlflow)
            self.headers = {ARN_HEADER: uri}
        self.base = base.rstrip("/") + "/api/2.0/mlflow/"

    def _call(self, method: str, path: str, body: dict | None = None, query: dict | None = None) -> dict:
        started = time.monotonic()
        self.deadline = started + self.budget - self.spent
        try:
            return self._ask(method, path, body, query)
        finally:
            self.spent += time.monotonic() - started

    def _ask(self, method: str, path: str, body: dict | None, query: dict | None) -> dict:
        url = self.base + path + (f"?{urllib.parse.urlencode(query, quote_via=urllib.parse.quote)}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(RETRIES + 1):
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"the step's {self.budget:g} s for tracking (TRACKING_BUDGET_S) are spent")
            headers = {**self.headers, "Content-Type": "application/json"}
            if self.region:
                headers = self._signed(method, url, data, headers)
            request = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=min(self.timeout, remaining)) as response:
                    status, answer = response.status, response.read()
                break
            except urllib.error.HTTPError as e:  # the server's reason (MLflow's JSON error) into the one warning
                if e.code in TRANSIENT_STATUS and self._backoff(attempt):
                    continue
                e.msg = f"{e.msg}: {e.read()[:300].decode(errors='replace')}"
                raise
            except (urllib.error.URLError, TimeoutError, ConnectionError):  # refused, reset, no answer in time
                if self._backoff(attempt):
                    continue
                raise
        try:
            return json.loads(answer or b"{}")
        except ValueError:  # a proxy's or sign-in page, say: its first bytes are the reason
            raise ValueError(f"HTTP {status} from {url} is not JSON: {answer[:200]!r}") from None

    def _backoff(self, attempt: int) -> bool:
        """Wait before asking again, if another attempt is left and its wait ends within the budget."""
        pause = RETRY_WAIT_S * 2**attempt
        if attempt >= RETRIES or time.monotonic() + pause >= self.deadline:
            return False
        time.sleep(pause)
        return True

    def _signed(self, method: str, url: str, data: bytes | None, headers: dict) -> dict:
        import botocore.session
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        headers = {**headers, "X-Amz-Content-SHA256": hashlib.sha256(data or b"").hexdigest()}  # as sagemaker-mlflow
        request = AWSRequest(method=method, url=url, data=data or b"", headers=headers)
        SigV4Auth(botocore.session.get_session().get_credentials(), "sagemaker-mlflow", self.region).add_auth(request)
        return dict(request.headers.items())

    def experiment_id(self, name: str, create: bool = True) -> str | None:
        try:
            return self._call("GET", "experiments/get-by-name", query={"experiment_name": name})["experiment"][
                "experiment_id"]
        except urllib.error.HTTPError as e:  # only MLflow's own "no such experiment", not a 404 of a wrong path
            if e.code != 404 or "RESOURCE_DOES_NOT_EXIST" not in e.msg:
                raise
        if not create:
            return None
        try:
            return self._call("POST", "experiments/create", {"name": name})["experiment_id"]
        except urllib.error.HTTPError as e:  # another execution's first step created it in between
            if "RESOURCE_ALREADY_EXISTS" not in e.msg:
                raise
        return self._call("GET", "experiments/get-by-name", query={"experiment_name": name})["experiment"][
            "experiment_id"]

    def find_run(self, experiment_id: str, execution: str, running: bool = False) -> str | None:
        found = self._call("POST", "runs/search", {"experiment_ids": [experiment_id], "max_results": 1,
                                                  "filter": run_filter(execution, running)})
        return found["runs"][0]["info"]["run_id"] if found.get("runs") else None

    def create_run(self, experiment_id: str, name: str, tags: dict[str, str]) -> str:
        body = {"experiment_id": experiment_id, "run_name": name, "start_time": _now_ms(),
                "tags": [{"key": k, "value": v} for k, v in tags.items()]}
        return self._call("POST", "runs/create", body)["run"]["info"]["run_id"]

    def log_batch(self, run_id: str, metrics: list[tuple[str, float, int]], params: dict[str, str],
                  tags: dict[str, str]) -> None:
        now = _now_ms()
        for points, keyed, tagged in batches(
                [{"key": k, "value": json_double(v), "timestamp": now, "step": s} for k, v, s in metrics],
                [{"key": k, "value": v} for k, v in params.items()],
                [{"key": k, "value": v} for k, v in tags.items()]):
            self._call("POST", "runs/log-batch", {"run_id": run_id, "metrics": points, "params": keyed,
                                                  "tags": tagged})

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self._call("POST", "runs/update", {"run_id": run_id, "status": status, "end_time": _now_ms()})


class LibraryStore:
    """The same calls on a local store (sqlite:///...), through the `mlflow` library."""

    def __init__(self, uri: str) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = uri
        with store_lock(uri):  # a new store is created and migrated once, not by two steps at the same moment
            self.client = MlflowClient(uri)
            self.client.search_experiments(max_results=1)

    def experiment_id(self, name: str, create: bool = True) -> str | None:
        with store_lock(self.uri):  # two executions' first steps create the experiment once
            found = self.client.get_experiment_by_name(name)
            if found or not create:
                return found.experiment_id if found else None
            folder = os.path.dirname(self.uri.removeprefix("sqlite:///")) if self.uri.startswith("sqlite:///") else "."
            return self.client.create_experiment(name, artifact_location=os.path.join(folder, "mlartifacts", name))

    def find_run(self, experiment_id: str, execution: str, running: bool = False) -> str | None:
        runs = self.client.search_runs([experiment_id], run_filter(execution, running), max_results=1)
        return runs[0].info.run_id if runs else None

    def create_run(self, experiment_id: str, name: str, tags: dict[str, str]) -> str:
        return self.client.create_run(experiment_id, run_name=name, tags=tags).info.run_id

    def log_batch(self, run_id: str, metrics: list[tuple[str, float, int]], params: dict[str, str],
                  tags: dict[str, str]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        now = _now_ms()
        self.client.log_batch(run_id, metrics=[Metric(k, v, now, s) for k, v, s in metrics],
                              params=[Param(k, v) for k, v in params.items()],
                              tags=[RunTag(k, v) for k, v in tags.items()])

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status)


@contextlib.contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Held while a local SQLite store is created, migrated or given an experiment: MLflow's schema migration and
    its get-or-create are not safe between processes (two new runs' steps fail with "table already exists")."""
    path = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else ""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        path = ""
    if not path:
        yield
        return
    with open(f"{path}.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def open_store(uri: str, timeout: float, budget: float = DEFAULT_BUDGET_S) -> RestStore | LibraryStore:
    """The store at `uri`: a server (ARN or http(s) URL) over REST, else a local store through `mlflow`."""
    if uri.startswith(("arn:", "http://", "https://")):
        return RestStore(uri, timeout, budget)
    return LibraryStore(uri)


def execution_id(env: dict[str, str] | os._Environ, processing_config: str = PROCESSING_JOB_CONFIG) -> str:
    """This step's pipeline execution: PIPELINE_EXECUTION_ID, else the id in the SageMaker job's name ("" if none)."""
    if env.get(EXECUTION_ENV):
        return env[EXECUTION_ENV]
    name = env.get(TRAINING_JOB_ENV, "")
    if not name:
        try:
            with open(processing_config) as f:
                name = json.load(f).get("ProcessingJobName", "")
        except (OSError, ValueError, AttributeError):
            name = ""
    found = PIPELINE_JOB.match(name)
    return found.group(1) if found else ""


def execution_experiment(execution_arn: str, timeout: float) -> str | None:
    """The MLflow experiment the execution was started with (StartPipelineExecution's MlflowExperimentName, which
    DescribePipelineExecution returns in MLflowConfig), None when it was started without one."""
    import botocore.session
    from botocore.config import Config

    client = botocore.session.get_session().create_client(
        "sagemaker", region_name=execution_arn.split(":")[3],
        config=Config(connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 3, "mode": "standard"}))
    answer = client.describe_pipeline_execution(PipelineExecutionArn=execution_arn)
    return (answer.get("MLflowConfig") or {}).get("MlflowExperimentName") or None


def settings(folder: str | None) -> dict[str, Any]:
    """The tracking file in `folder` (the step's "tracking" input: {"uri", "experiment"}), {} when there is none."""
    try:
        found = json.loads((Path(folder) / TRACKING_FILE).read_text()) if folder else {}
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


class Tracker:
    """This step's view of its execution's run. Once a request fails, tracking is off for the step (`off_reason`):
    logging stops, but finish() and fail() still try to end a run it has, so that none stays RUNNING."""

    def __init__(self, step: str, environ: dict[str, str] | None = None, settings_dir: str | None = None) -> None:
        env = os.environ if environ is None else environ
        self.step, self.run_id, self.store, self.off_reason = step, None, None, None
        given = settings(settings_dir)
        self.uri = env.get(TRACKING_URI_ENV) or given.get("uri") or ""
        self.experiment = env.get(EXPERIMENT_ENV) or given.get("experiment") or DEFAULT_EXPERIMENT
        self.execution = execution_id(env) if self.uri else ""
        if not (self.uri and self.execution):
            return
        try:
            timeout = float(env.get("TRACKING_TIMEOUT_S") or DEFAULT_TIMEOUT_S)
            self.store = open_store(self.uri, timeout, float(env.get("TRACKING_BUDGET_S") or DEFAULT_BUDGET_S))
        except ImportError:
            self._off("the mlflow library is not installed (a local store needs it)")
            return
        except Exception as e:  # a malformed URI or timeout: tracking never fails a step
            self._off(f"{type(e).__name__}: {str(e)[:200]}")
            return
        pipeline_arn = "" if env.get(TRACKING_URI_ENV) else given.get("pipeline_arn", "")  # the file's server only
        arn = env.get(EXECUTION_ARN_ENV) or (f"{pipeline_arn}/execution/{self.execution}" if pipeline_arn else "")
        if arn:
            self._execution_experiment(arn, timeout)

    def _execution_experiment(self, arn: str, timeout: float) -> None:
        """Log to the execution's own experiment when it was started with one (best effort: else the configured
        experiment, with a warning)."""
        try:
            own = execution_experiment(arn, timeout)
        except Exception as e:  # denied, unreachable: the configured experiment still takes the run
            print(f"warning: step {self.step} could not read the execution's own MLflow experiment "
                  f"({type(e).__name__}: {str(e)[:200]}); logging to {self.experiment}", file=sys.stderr, flush=True)
            return
        if own and own != self.experiment:
            print(f"tracking: execution {self.execution} was started with MLflow experiment {own}: logging there, "
                  f"not to {self.experiment}", flush=True)
            self.experiment = own

    @property
    def enabled(self) -> bool:
        return self.store is not None and self.off_reason is None

    def _off(self, why: str) -> None:
        if self.off_reason is None:  # one warning per step
            print(f"warning: experiment tracking off for step {self.step}: {why}; the step's files keep its "
                  "metrics", file=sys.stderr, flush=True)
        self.off_reason = why

    def _run(self) -> str:
        if self.run_id is None:
            experiment = self.store.experiment_id(self.experiment)
            self.run_id = self.store.find_run(experiment, self.execution) or self.store.create_run(
                experiment, self.execution, {EXECUTION_TAG: self.execution})
        return self.run_id

    def log(self, metrics: dict[str, Any] | None = None, params: dict[str, Any] | None = None,
            tags: dict[str, Any] | None = None, curves: dict[str, list[tuple[int, float]]] | None = None) -> None:
        """Log final `metrics` (numbers; None left out), `params`, `tags` and `curves` (name -> [(step, value)])
        to the execution's run, in one request."""
        if not self.enabled:
            return
        points = [(k, float(v), 0) for k, v in (metrics or {}).items() if isinstance(v, int | float)]
        points += [(k, float(v), int(s)) for k, curve in (curves or {}).items() for s, v in curve]
        try:
            self.store.log_batch(self._run(), points, {k: str(v)[:6000] for k, v in (params or {}).items()},
                                 {k: str(v) for k, v in {**(tags or {}), f"step.{self.step}": "logged"}.items()})
        except Exception as e:  # unreachable, refused, denied, a store that cannot be opened: never the step's end
            self._off(f"{type(e).__name__}: {str(e)[:200]}")

    def finish(self) -> None:
        """Mark the run finished (the last step that logs calls it), even when logging failed since."""
        if self.store is not None and self.run_id:
            try:
                self.store.finish(self.run_id)
            except Exception as e:
                self._off(f"{type(e).__name__}: {str(e)[:200]}")

    def end_open(self, status: str) -> str | None:
        """End the execution's run with `status` (FAILED, KILLED) if it is still RUNNING, which a step killed
        outright leaves it (the deploy Lambda calls this when the execution has ended); its id, else None (and
        `off_reason` says why when the server could not be asked)."""
        if not self.enabled:
            return None
        try:
            experiment = self.store.experiment_id(self.experiment, create=False)
            run_id = self.store.find_run(experiment, self.execution, running=True) if experiment else None
            if run_id:
                self.store.finish(run_id, status)
            return run_id
        except Exception as e:
            self._off(f"{type(e).__name__}: {str(e)[:200]}")
            return None

    def fail(self) -> None:
        """Mark the execution's run FAILED, if it has one (a failing step calls it; no run is created for it)."""
        if self.store is None or (self.off_reason and not self.run_id):
            return
        try:
            run_id = self.run_id or self.store.find_run(self.store.experiment_id(self.experiment), self.execution)
            if run_id:
                self.store.finish(run_id, "FAILED")
        except Exception as e:
            self._off(f"{type(e).__name__}: {str(e)[:200]}")
