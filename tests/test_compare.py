"""`compare`: one Train-step request per instance type (dry run), starting jobs on moto, and the report of
finished jobs from recorded DescribeTrainingJob responses with train.py's stats in moto S3."""

from __future__ import annotations

import json

import pytest
from fixtures_recorded import BUCKET, ROOT, cli, recorded_sagemaker, stats_tarball, train_stats
from hypothesis import given
from hypothesis import strategies as st

from pipeline import compare as cmp
from pipeline import views
from pipeline.config import load_config
from pipeline.sagemaker.aws import Aws

DATA = f"s3://{BUCKET}/trainium-bert/executions/k3j9x2m5q7wz"
RUN = "250301120000"
JOBS = [f"trainium-bert-cmp-{RUN}-{slug}" for slug in ("trn1-32xlarge", "p4d-24xlarge", "g5-12xlarge")]
PER_TYPE = {"batch-size", "grad-accum", "sagemaker_instance_type"}  # all other hyperparameters must be identical


@pytest.fixture(scope="module")
def cfg():
    return load_config(ROOT / "pipeline.yaml", [f"aws.bucket={BUCKET}"], environ={})


@pytest.fixture(scope="module")
def definition(cfg):
    from pipeline.definition import definition as build

    return json.loads(build(cfg))


def test_dry_run_one_request_per_type_with_its_image_and_the_same_work(cfg, definition, no_network, capsys):
    types = ["ml.trn1.32xlarge", "ml.p4d.24xlarge", "ml.g5.xlarge", "ml.trn1.2xlarge"]
    code, out, err = cli(capsys, "compare", "--instance-types", *types, "--data", DATA + "/", "--dry-run")
    assert code == 0, err
    planned = json.loads(out)  # stdout is the JSON alone; nothing was started (no AWS: the network guard holds)
    requests = planned["requests"]
    assert [r["ResourceConfig"]["InstanceType"] for r in requests] == types
    assert planned["global_batch"] == 512 and planned["max_steps"] == 1000
    assert "4 job(s): global batch 512, 1000 steps" in err

    names = [r["TrainingJobName"] for r in requests]
    assert len(set(names)) == 4
    run_id = planned["run_id"]
    assert names == [f"trainium-bert-cmp-{run_id}-{t.removeprefix('ml.').replace('.', '-')}" for t in types]

    images = [r["AlgorithmSpecification"]["TrainingImage"] for r in requests]
    assert images == [
        cfg.image("training"),
        cfg.image("training_cuda"),
        cfg.image("training_cuda"),
        cfg.image("training"),
    ]
    assert "pytorch-training-neuronx" in images[0] and "-gpu-" in images[1]

    hyperparameters = [{k: v for k, v in r["HyperParameters"].items() if k not in PER_TYPE} for r in requests]
    assert all(h == hyperparameters[0] for h in hyperparameters)
    assert hyperparameters[0]["max-steps"] == "1000"
    assert hyperparameters[0]["learning-rate"] == "5e-05" and hyperparameters[0]["model-id"] == "bert-base-uncased"
    work = [
        (cmp.DEVICES[t], int(r["HyperParameters"]["batch-size"]), int(r["HyperParameters"]["grad-accum"]))
        for t, r in zip(types, requests, strict=True)
    ]
    assert work == [(32, 16, 1), (8, 64, 1), (1, 64, 8), (2, 64, 4)]
    assert all(d * b * a == 512 for d, b, a in work)
    assert [r["HyperParameters"]["sagemaker_instance_type"] for r in requests] == types

    # everything else is the Train step of the pipeline, resolved for this data
    train = next(s for s in definition["Steps"] if s["Name"] == "Train")["Arguments"]
    for request in requests:
        assert request["RoleArn"] == train["RoleArn"]
        assert request["StoppingCondition"] == train["StoppingCondition"]
        assert (
            request["AlgorithmSpecification"]["MetricDefinitions"]
            == train["AlgorithmSpecification"]["MetricDefinitions"]
        )
        channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"]}
        assert channels == {"train": f"{DATA}/train", "validation": f"{DATA}/validation", "test": f"{DATA}/test"}
        assert request["OutputDataConfig"]["S3OutputPath"] == f"s3://{BUCKET}/trainium-bert/compare/{run_id}"
        assert request["CheckpointConfig"]["S3Uri"].endswith(f"/checkpoints/compare/{request['TrainingJobName']}")
        assert {"Key": "trainium-pipeline:compare", "Value": run_id} in request["Tags"]
    assert "NEURON_COMPILE_CACHE_URL" in requests[0]["Environment"]
    assert "NEURON_COMPILE_CACHE_URL" not in requests[1]["Environment"]


def test_plan_options_and_errors(cfg, definition):
    data = cmp.tokenized_at(DATA)
    planned = cmp.plan(cfg, definition, ["ml.p4d.24xlarge"], data, max_steps=51, global_batch=256, max_device_batch=16)
    hp = planned.requests[0]["HyperParameters"]
    assert (hp["batch-size"], hp["grad-accum"], hp["max-steps"]) == ("16", "2", "51")

    cases = [
        (["ml.c5.xlarge"], {}, "--instance-types ml.c5.xlarge: not a known Trainium or GPU training type"),
        (["ml.p4d.24xlarge", "ml.p4d.24xlarge"], {}, "--instance-types ml.p4d.24xlarge: listed twice"),
        ([], {}, "--instance-types: expected at least one"),
        (
            ["ml.trn1.32xlarge"],
            {"global_batch": 100},
            "--global-batch 100: cannot be split evenly over the 32 devices of ml.trn1.32xlarge; "
            "expected a multiple of 32",
        ),
        (["ml.trn1.2xlarge"], {"max_steps": 0}, "--max-steps 0: expected a number of steps >= 1"),
        (["ml.trn1.2xlarge"], {"max_steps": 50}, "--max-steps 50: the jobs read out every 50 steps"),
    ]
    for types, options, message in cases:
        with pytest.raises(cmp.CompareError) as error:
            cmp.plan(cfg, definition, types, data, **options)
        assert message in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(cmp.CompareError, match="--data 'bucket/prefix': expected an S3 prefix"):
        cmp.tokenized_at("bucket/prefix")


@given(
    world=st.sampled_from(sorted(set(cmp.DEVICES.values()))),
    per_world=st.integers(1, 512),
    max_device_batch=st.integers(1, 128),
)
def test_split_batch_keeps_the_global_batch(world, per_world, max_device_batch):
    batch, accum = cmp.split_batch(world * per_world, world, max_device_batch, "ml.x.y")
    assert world * batch * accum == world * per_world
    assert batch <= max_device_batch
    assert all(per_world % a or per_world // a > max_device_batch for a in range(1, accum))  # fewest accumulations


def test_bad_instance_type_is_one_line_before_any_work(capsys):
    code, out, err = cli(capsys, "compare", "--instance-types", "ml.trn1.32xlarge", "ml.c5.xlarge", "--dry-run")
    assert code == 1 and out == ""
    assert err.startswith("error: --instance-types ml.c5.xlarge: not a known Trainium or GPU training type")
    assert len(err.strip().splitlines()) == 1


@pytest.fixture
def aws(moto_session):
    mock, _ = moto_session
    mock.reset()
    with recorded_sagemaker() as recorder:
        aws = Aws("us-east-1")
        aws.s3.create_bucket(Bucket=BUCKET)
        yield aws, recorder


def test_dry_run_defaults_to_the_latest_succeeded_tokenize_outputs(aws, capsys):
    aws, recorder = aws
    aws.sagemaker.create_pipeline(
        PipelineName="trainium-bert", PipelineDefinition="{}", RoleArn="arn:aws:iam::123456789012:role/Role"
    )
    arn = aws.sagemaker.start_pipeline_execution(PipelineName="trainium-bert")["PipelineExecutionArn"]
    recorder.alias(arn.rsplit("/", 1)[-1], "k3j9x2m5q7wz")

    code, out, err = cli(capsys, "compare", "-i", "ml.trn1.32xlarge", "--dry-run")
    assert code == 0, err
    (request,) = json.loads(out)["requests"]
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"]}
    assert channels == {  # from DescribeProcessingJob
        "train": f"{DATA}/train", "validation": f"{DATA}/validation", "test": f"{DATA}/test"
    }
    assert ("DescribeProcessingJob", "pipelines-k3j9x2m5q7wz-tokenize-q8mzt2lxva") in recorder.served
    assert aws.sagemaker.list_training_jobs()["TrainingJobSummaries"] == []


def test_start_creates_the_jobs_and_reports_unknown_billable_time(aws, capsys, tmp_path):
    aws, _ = aws
    code, out, err = cli(
        capsys,
        "compare",
        "-i",
        "ml.trn1.32xlarge",
        "ml.g5.xlarge",
        "--data",
        DATA,
        "--out",
        str(tmp_path),
        "--poll",
        "0",
    )
    assert code == 0, err
    started = json.loads((tmp_path / "requests.json").read_text())["requests"]
    for request in started:  # moto holds exactly the planned jobs
        job = aws.sagemaker.describe_training_job(TrainingJobName=request["TrainingJobName"])
        assert job["AlgorithmSpecification"]["TrainingImage"] == request["AlgorithmSpecification"]["TrainingImage"]
        assert job["ResourceConfig"]["InstanceType"] == request["ResourceConfig"]["InstanceType"]
        assert job["HyperParameters"] == request["HyperParameters"]
    code_key = json.loads(started[0]["HyperParameters"]["sagemaker_submit_directory"]).split("/", 3)[3]
    aws.s3.head_object(Bucket=BUCKET, Key=code_key)  # the training code was uploaded first

    report = json.loads((tmp_path / "compare.json").read_text())
    assert [j["instance_type"] for j in report["jobs"]] == ["ml.trn1.32xlarge", "ml.g5.xlarge"]
    assert all(j["billable_seconds"] is None and j["cost"] is None for j in report["jobs"])  # moto has no billing
    assert "unknown" in (tmp_path / "compare.md").read_text()


def test_report_of_finished_jobs(aws, capsys, tmp_path):
    aws, recorder = aws
    stats = {
        "trn1-32xlarge": train_stats(
            samples=512_000, seconds=205.0, loss=0.3101, accuracy=0.9034, test_accuracy=0.9031
        ),
        "p4d-24xlarge": train_stats(
            samples=512_000, seconds=240.0, loss=0.3097, accuracy=0.9029, device="cuda", test_accuracy=0.9026
        ),
    }  # the g5.12xlarge job left no output.tar.gz: its numbers come from its final metrics
    for slug, content in stats.items():
        key = f"trainium-bert/compare/{RUN}/trainium-bert-cmp-{RUN}-{slug}/output/output.tar.gz"
        aws.s3.put_object(Bucket=BUCKET, Key=key, Body=stats_tarball(content))

    code, out, err = cli(capsys, "compare", "--jobs", *JOBS, "--out", str(tmp_path))
    assert code == 0, err
    assert [op for op, _ in recorder.served].count("DescribeTrainingJob") >= 3
    report = json.loads((tmp_path / "compare.json").read_text())
    trn, p4d, g5 = report["jobs"]
    assert report["baseline"] == "ml.trn1.32xlarge" and report["currency"] == "USD"

    assert trn["cost"] == pytest.approx(900 / 3600 * 24.725)
    assert p4d["cost"] == pytest.approx(620 / 3600 * 37.688)
    assert g5["cost"] == pytest.approx(2400 / 3600 * 7.09)
    assert [j["global_batch"] for j in (trn, p4d, g5)] == [512, 512, 512]  # 32x16, 8x64, 4x64x2
    assert [j["steps"] for j in (trn, p4d, g5)] == [1000, 1000, 1000]
    assert trn["wall_seconds"] == pytest.approx(241.0 + 900)  # creation to end of training
    assert trn["samples_per_sec"] == pytest.approx(512_000 / 205.0) and trn["stats_source"] == "training_stats.json"
    assert trn["val_accuracy"] == pytest.approx(0.9034) and p4d["final_loss"] == pytest.approx(0.3097)
    assert g5["stats_source"] == "final metrics" and g5["samples_per_sec"] == pytest.approx(230.5)
    assert g5["val_accuracy"] == pytest.approx(0.9022) and g5["cost_per_million_samples"] is None
    assert [j["test_accuracy"] for j in (trn, p4d, g5)] == pytest.approx([0.9031, 0.9026, 0.9017])
    assert trn["cost_per_million_samples"] == pytest.approx(900 / 3600 * 24.725 / 0.512)

    assert trn["ratios_to_first"]["cost"] == pytest.approx(1.0)
    assert p4d["ratios_to_first"]["billable_seconds"] == pytest.approx(620 / 900)
    assert p4d["ratios_to_first"]["samples_per_sec"] == pytest.approx(205.0 / 240.0)
    assert p4d["ratios_to_first"]["cost_per_million_samples"] == pytest.approx((620 * 37.688) / (900 * 24.725))
    assert g5["ratios_to_first"]["cost_per_million_samples"] is None

    markdown = (tmp_path / "compare.md").read_text()
    rows = {line.split(" | ")[0][2:]: line for line in markdown.splitlines() if line.startswith("| ")}
    assert rows[""] == "| | ml.trn1.32xlarge | ml.p4d.24xlarge | ml.g5.12xlarge |"
    assert rows["job"] == f"| job | {' | '.join(JOBS)} |"
    assert rows["global batch x steps"] == "| global batch x steps | 512 x 1000 | 512 x 1000 | 512 x 1000 |"
    assert rows["billable time"] == "| billable time | 15m00s | 10m20s (0.69x) | 40m00s (2.67x) |"
    assert rows["cost (USD)"] == "| cost (USD) | $6.18 | $6.49 (1.05x) | $4.73 (0.76x) |"
    per_m_p4d = 620 / 3600 * 37.688 / 0.512
    ratio = per_m_p4d / (900 / 3600 * 24.725 / 0.512)
    assert rows["cost per M samples"] == f"| cost per M samples | $12.07 | ${per_m_p4d:.2f} ({ratio:.2f}x) | unknown |"
    assert rows["test accuracy"] == "| test accuracy | 0.9031 | 0.9026 | 0.9017 |"
    assert rows["val accuracy"] == "| val accuracy | 0.9034 | 0.9029 | 0.9022 |"
    assert "the trained model on the test and validation splits" in markdown

    png = (tmp_path / "compare.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    from matplotlib.image import imread

    assert imread(tmp_path / "compare.png").shape[:2] == (504, 1200)  # 10 x 4.2 inches at 120 dpi
    assert "ml.p4d.24xlarge" in out and "10m20s (0.69x)" in out  # the console table, with ratios to the first


def test_jobs_and_instance_types_together_is_an_error(capsys):
    code, out, err = cli(capsys, "compare", "--jobs", JOBS[0], "-i", "ml.trn1.32xlarge")
    assert code == 1 and "--jobs and --instance-types: expected one of them, not both" in err


def test_a_failed_job_is_billed_and_shows_its_reason(aws, cfg):
    from rich.console import Console

    aws, _ = aws
    (job,) = cmp.describe(aws, [JOBS[0]])
    job.update(
        TrainingJobStatus="Failed", FailureReason="AlgorithmError: [Errno 2] No such file [/opt/ml/code/train.py]"
    )
    result = cmp.report(aws, cfg, [job])
    assert result.rows[0].job.cost == pytest.approx(900 / 3600 * 24.725)  # failed jobs are billed too
    console = Console(width=250, record=True)
    console.print(views.compare_table(result))
    assert "Failed (AlgorithmError: [Errno 2] No such file [/opt/ml/code/train.py])" in console.export_text()
    markdown = views.compare_markdown(result)
    assert "| status | Failed (AlgorithmError: [Errno 2] No such file [/opt/ml/code/train.py]) |" in markdown
