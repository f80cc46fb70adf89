"""`cost`: job costs of SageMaker executions (moto + recorded responses) and local executions; the prices config."""

from __future__ import annotations

import json
import re
from pathlib import Path

import botocore.session
import pytest
from botocore.parsers import create_parser
from botocore.validate import ParamValidator
from fixtures_recorded import BUCKET, RECORDED, ROOT, cli, recorded_sagemaker, stats_tarball, train_stats
from rich.console import Console

from pipeline.config import ConfigError, load_config
from pipeline.local.backend import LocalBackend
from pipeline.prices import DEFAULT_PRICES
from pipeline.sagemaker.aws import Aws, AwsError
from pipeline.sagemaker.cost import sagemaker_costs
from pipeline.views import cost_table, throughput_lines

SHIPPED = ROOT / "pipeline.yaml"
EXECUTION = "k3j9x2m5q7wz"  # Tokenize, Train with managed spot on ml.trn1.32xlarge, Evaluate
CACHED = "7pd2w9c4n1hs"  # Tokenize cache hit, Train on 2 x ml.trn2.48xlarge (no default price), Evaluate
PIPELINE_ARN = "arn:aws:sagemaker:us-east-1:123456789012:pipeline/trainium-bert"
TRAIN_OUTPUT = f"s3://{BUCKET}/trainium-bert/executions/{EXECUTION}/model/pipelines-{EXECUTION}-Train-9sKf3LmQ2a"
STATS = train_stats(samples=6_840_000, seconds=1520.4, loss=0.2131, accuracy=0.9412)


def config(*overrides: str, local: bool = False):
    return load_config(SHIPPED, [f"aws.bucket={BUCKET}", *overrides], environ={}, local=local)


@pytest.fixture
def aws(moto_session):
    mock, _ = moto_session
    mock.reset()
    with recorded_sagemaker() as recorder:
        aws = Aws("us-east-1")  # created inside: its clients get the recorded responses
        aws.s3.create_bucket(Bucket=BUCKET)
        key = f"{TRAIN_OUTPUT.split('/', 3)[3]}/output/output.tar.gz"
        aws.s3.put_object(Bucket=BUCKET, Key=key, Body=stats_tarball(STATS))
        yield aws, recorder


def test_recorded_responses_are_valid_service_responses():
    model = botocore.session.get_session().get_service_model("sagemaker")
    files = sorted(RECORDED.rglob("*.json"))
    assert {f.parent.name for f in files} == {
        "DescribeTrainingJob",
        "DescribeProcessingJob",
        "ListPipelineExecutionSteps",
    }
    for path in files:
        shape = model.operation_model(path.parent.name).output_shape
        parsed = create_parser("json").parse({"body": path.read_bytes(), "headers": {}, "status_code": 200}, shape)
        parsed.pop("ResponseMetadata")
        assert set(parsed) == set(json.loads(path.read_text())), f"{path.name}: members botocore does not know"
        report = ParamValidator().validate(parsed, shape)
        assert not report.has_errors(), f"{path.name}: {report.generate_report()}"


def test_costs_are_billable_seconds_times_count_times_price(aws):
    aws, recorder = aws
    report = sagemaker_costs(aws, f"{PIPELINE_ARN}/execution/{EXECUTION}", config().prices)

    assert [(j.step, j.kind, j.instance_type, j.count) for j in report.jobs] == [
        ("Tokenize", "Processing", "ml.m5.4xlarge", 1),
        ("Train", "Training", "ml.trn1.32xlarge", 1),
        ("Evaluate", "Processing", "ml.m5.xlarge", 1),
    ]  # condition and register steps cost nothing and are left out
    tokenize, train, evaluate = report.jobs
    assert tokenize.seconds == 1234.0 and tokenize.basis == "ProcessingEndTime - ProcessingStartTime"
    assert tokenize.cost == pytest.approx(1234 / 3600 * 0.922)
    assert train.seconds == 2160 and train.basis == "BillableTimeInSeconds"
    assert train.cost == pytest.approx(2160 / 3600 * 24.725)  # 14.835
    assert evaluate.cost == pytest.approx(600 / 3600 * 0.23)
    assert report.total == pytest.approx(1234 / 3600 * 0.922 + 14.835 + 600 / 3600 * 0.23)
    assert not report.unknown

    # managed spot: billable 2160 s of 5400 s training time -> 60% saved, AWS's definition
    assert train.spot and train.training_seconds == 5400
    assert train.savings == pytest.approx(0.6)
    assert train.on_demand_cost == pytest.approx(5400 / 3600 * 24.725)
    assert not tokenize.spot and tokenize.savings is None

    # throughput from the job's training_stats.json (its metric says 5012.3, the stats file wins)
    assert report.training.source == "training_stats.json"
    assert report.training.samples == 6_840_000
    assert report.training.samples_per_sec == pytest.approx(6_840_000 / 1520.4)
    assert report.cost_per_million_samples == pytest.approx(14.835 / 6.84)
    assert ("ListPipelineExecutionSteps", EXECUTION) in recorder.served

    text = _render(report)
    assert "60% (on-demand $37.09)" in text
    assert "$14.84" in text and "billable" in text and "run time" in text
    assert f"{6_840_000 / 1520.4:,.1f} samples/s" in "\n".join(throughput_lines(report))


def test_unknown_price_is_flagged_never_zero_and_cache_hits_cost_nothing(aws):
    aws, _ = aws
    report = sagemaker_costs(aws, f"{PIPELINE_ARN}/execution/{CACHED}", config().prices)
    tokenize, train, evaluate = report.jobs

    assert tokenize.cached and tokenize.cost == 0.0
    assert f"execution {EXECUTION}" in tokenize.note
    assert train.instance_type == "ml.trn2.48xlarge" and train.count == 2
    assert train.price is None and train.cost is None
    assert [j.step for j in report.unknown] == ["Train"]
    assert report.total == pytest.approx(300 / 3600 * 0.23)
    data = report.to_dict()
    assert data["total_complete"] is False and data["unknown_cost_steps"] == ["Train"]
    assert data["jobs"][1]["cost"] is None and data["training_cost"] is None

    # no output.tar.gz for this job: throughput from its final metrics, no sample count, so no cost per sample
    assert report.training.source == "final metrics"
    assert report.training.samples_per_sec == pytest.approx(14100.7)
    assert report.training.samples is None and report.cost_per_million_samples is None

    text = _render(report)
    assert re.search(r"Train .*unknown", text)
    assert ">= $0.0192" in text and "1 job(s) of unknown cost: Train" in text

    priced = sagemaker_costs(
        aws, f"{PIPELINE_ARN}/execution/{CACHED}", config("prices.on_demand.ml.trn2.48xlarge=40").prices
    )
    assert priced.jobs[1].cost == pytest.approx(2 * 1800 / 3600 * 40)  # instance count counts
    assert not priced.unknown


def _render(report) -> str:
    console = Console(width=250, record=True)
    console.print(cost_table(report))
    return console.export_text()


def test_cost_command_latest_execution_table_and_json(aws, capsys):
    aws, recorder = aws
    aws.sagemaker.create_pipeline(
        PipelineName="trainium-bert", PipelineDefinition="{}", RoleArn="arn:aws:iam::123456789012:role/Role"
    )
    arn = aws.sagemaker.start_pipeline_execution(PipelineName="trainium-bert")["PipelineExecutionArn"]
    recorder.alias(arn.rsplit("/", 1)[-1], EXECUTION)  # moto's new execution has the recorded steps

    code, out, err = cli(capsys, "cost")
    assert code == 0, err
    assert "ml.trn1.32xlarge" in out and "$14.84" in out and "60%" in out
    assert "training cost per million samples: $2.17" in out
    assert "total" in out and f"${1234 / 3600 * 0.922 + 14.835 + 600 / 3600 * 0.23:,.2f}" in out

    code, out, err = cli(capsys, "cost", CACHED, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["execution"] == CACHED and data["where"] == "sagemaker" and data["currency"] == "USD"
    assert [j["cost"] for j in data["jobs"]] == [0.0, None, pytest.approx(300 / 3600 * 0.23)]
    assert data["total_complete"] is False


def test_cost_without_step_listing_is_one_clear_line(aws, capsys):
    aws, _ = aws
    code, out, err = cli(capsys, "cost", "0000notrecorded")
    assert code == 1
    assert "ListPipelineExecutionSteps is not available from this endpoint" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err

    code, out, err = cli(capsys, "cost")  # latest execution of a pipeline that does not exist
    assert code == 1 and err.startswith("error: list executions of trainium-bert:") and len(err.splitlines()) == 1


def test_sagemaker_costs_raise_when_steps_cannot_be_listed(moto_session):
    mock, aws = moto_session
    mock.reset()
    with pytest.raises(AwsError, match="ListPipelineExecutionSteps"):
        sagemaker_costs(aws, f"{PIPELINE_ARN}/execution/{EXECUTION}", config().prices)


# local executions
def _local_execution(tmp_path: Path):
    """A finished local execution as the runner records it, with train.py's stats in the local S3 folder."""
    from pipeline.dag.parameters import resolve
    from pipeline.local.execution import Execution, StepRecord

    account = LocalBackend(config(local=True), tmp_path)
    definition = account.definition
    parameters = resolve(definition, {"TrainInstanceType": "ml.trn1.2xlarge"})
    execution_id = "20250301100000-a1b2c3"
    model = f"s3://{BUCKET}/trainium-bert/executions/{execution_id}/model/train-20250301T100030-9f2e/output"
    when = "2025-03-01T10:00:00+00:00"
    steps = {
        "Tokenize": StepRecord(
            "Tokenize",
            "Processing",
            "Succeeded",
            when,
            when,
            12.5,
            properties={"ProcessingJobName": "tokenize-20250301T100000-77aa", "ProcessingJobStatus": "Completed"},
        ),
        "Train": StepRecord(
            "Train",
            "Training",
            "Succeeded",
            when,
            when,
            90.0,
            properties={
                "TrainingJobName": "train-20250301T100030-9f2e",
                "ModelArtifacts": {"S3ModelArtifacts": f"{model}/model.tar.gz"},
            },
        ),
        "Evaluate": StepRecord("Evaluate", "Processing", "Succeeded", when, when, 0.04, cached=True),
        "AccuracyGate": StepRecord("AccuracyGate", "Condition", "Succeeded", when, when, 0.0),
        "Deploy": StepRecord("Deploy", "Lambda", "Skipped"),
    }
    record = Execution(
        execution_id,
        f"arn:aws:sagemaker:local:000000000000:pipeline/trainium-bert/execution/{execution_id}",
        "trainium-bert",
        "Succeeded",
        when,
        parameters,
        steps,
        ended=when,
    )
    folder = tmp_path / "executions" / "trainium-bert" / execution_id
    folder.mkdir(parents=True)
    (folder / "execution.json").write_text(record.to_json())
    (folder / "definition.json").write_text(json.dumps(definition))  # what the runner saves beside the record
    account.s3.put_bytes(f"{model}/output.tar.gz", stats_tarball(train_stats(32_000, 80.0, 0.41, 0.88, "cpu")))
    return account, execution_id


def test_local_cost_prices_wall_time_as_would_be_cost(tmp_path):
    account, execution_id = _local_execution(tmp_path)
    report = account.cost(None)

    assert report.where == "local" and report.execution == execution_id
    assert [(j.step, j.instance_type, j.basis) for j in report.jobs] == [
        ("Tokenize", "ml.m5.4xlarge", "local wall time"),  # from the definition's step arguments
        ("Train", "ml.trn1.2xlarge", "local wall time"),  # the TrainInstanceType this execution ran with
        ("Evaluate", "ml.m5.xlarge", "local wall time"),
    ]
    tokenize, train, evaluate = report.jobs
    assert tokenize.cost == pytest.approx(12.5 / 3600 * 0.922)
    assert train.cost == pytest.approx(90 / 3600 * 1.5435)
    assert evaluate.cached and evaluate.cost == 0.0 and evaluate.note == "cache hit: no job ran"
    assert report.training.samples == 32_000 and report.training.samples_per_sec == pytest.approx(400.0)
    assert report.cost_per_million_samples == pytest.approx(90 / 3600 * 1.5435 / 32_000 * 1e6)
    assert "nothing was billed" in report.notes[0]
    assert "cost (if billed)" in _render(report)

    with pytest.raises(LookupError, match="no local execution nope"):
        account.cost("nope")


def test_local_cost_prices_the_definition_the_execution_ran_not_todays_config(tmp_path):
    """The runner saves the definition beside execution.json; a config changed since does not re-price the past."""
    _, execution_id = _local_execution(tmp_path)
    changed = config("tokenize.instance_type=ml.m5.xlarge", local=True)
    report = LocalBackend(changed, tmp_path).cost(execution_id)
    assert report.jobs[0].instance_type == "ml.m5.4xlarge"  # what ran, not today's ml.m5.xlarge
    (tmp_path / "executions" / "trainium-bert" / execution_id / "definition.json").unlink()
    with pytest.raises(LookupError, match="has no definition.json"):
        LocalBackend(changed, tmp_path).cost(execution_id)


def test_cost_local_command_json(tmp_path, capsys):
    _, execution_id = _local_execution(tmp_path)
    code, out, err = cli(capsys, "cost", "--local", "--root", str(tmp_path), execution_id, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["where"] == "local" and data["total"] == pytest.approx(12.5 / 3600 * 0.922 + 90 / 3600 * 1.5435)


# prices in the config
def test_shipped_prices_are_the_documented_defaults():
    shipped = config().prices
    assert shipped.currency == "USD"
    assert shipped.on_demand == DEFAULT_PRICES  # pipeline.yaml lists exactly the defaults in code
    page = (ROOT / "docs" / "price-performance.md").read_text()
    for instance_type, price in DEFAULT_PRICES.items():
        assert f"| `{instance_type}` | {price} |" in page, f"docs/price-performance.md lacks {instance_type}"
    for used in ("ml.trn1.2xlarge", "ml.trn1.32xlarge", "ml.p4d.24xlarge", "ml.g5.xlarge", "ml.c5.xlarge"):
        assert shipped.price(used) is not None
    for used in (config().tokenize.instance_type, config().evaluation.instance_type, config().deploy.instance_type):
        assert shipped.price(used) is not None


def test_prices_override_add_and_unset():
    prices = config(
        "prices.on_demand.ml.trn1.32xlarge=20",  # nested by the dots of --set: joined back into the type
        "prices.on_demand.ml.p5.48xlarge=55.04",
        "prices.on_demand.ml.g5.xlarge=null",
    ).prices
    assert prices.price("ml.trn1.32xlarge") == 20.0
    assert prices.price("ml.p5.48xlarge") == 55.04
    assert prices.price("ml.g5.xlarge") is None  # unknown, not zero
    assert prices.price("ml.p4d.24xlarge") == DEFAULT_PRICES["ml.p4d.24xlarge"]
    assert prices.price("ml.inf2.xlarge") is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("prices.on_demand.trn1=3", "prices.on_demand.trn1: expected an instance type like ml.trn1.32xlarge"),
        ("prices.on_demand.ml.trn1.32xlarge=cheap", "prices.on_demand.ml.trn1.32xlarge='cheap': expected a price"),
        ("prices.on_demand.ml.trn1.32xlarge=0", "prices.on_demand.ml.trn1.32xlarge=0: expected a price per hour > 0"),
        ("prices.currency=dollars", "prices.currency='dollars': expected a 3-letter currency code like USD"),
        ("prices.discount=0.1", "prices.discount: unknown key"),
    ],
)
def test_bad_prices_are_one_line_errors(override, message):
    with pytest.raises(ConfigError) as error:
        config(override)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_jobs_still_running_or_never_started(aws):
    from pipeline.prices import processing_job_cost, training_job_cost

    aws, _ = aws
    processing = aws.sagemaker.describe_processing_job(ProcessingJobName=f"pipelines-{EXECUTION}-Evaluate-Hc4Rw7YpNe")
    running = {k: v for k, v in processing.items() if k != "ProcessingEndTime"} | {"ProcessingJobStatus": "InProgress"}
    job = processing_job_cost(running, 0.23, "Evaluate")
    assert job.cost is None and job.note == "still running"
    never = {k: v for k, v in running.items() if k != "ProcessingStartTime"} | {"ProcessingJobStatus": "Failed"}
    job = processing_job_cost(never, 0.23, "Evaluate")
    assert job.cost == 0.0 and job.note == "never started"

    training = aws.sagemaker.describe_training_job(TrainingJobName=f"pipelines-{EXECUTION}-Train-9sKf3LmQ2a")
    running = {k: v for k, v in training.items() if k != "BillableTimeInSeconds"} | {"TrainingJobStatus": "InProgress"}
    job = training_job_cost(running, 24.725, "Train")
    assert job.cost is None and job.note == "still running" and job.savings is None
