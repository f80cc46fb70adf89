"""`compare`: the Train step alone, once per instance type (Trainium vs GPU), side by side.

Each CreateTrainingJob request is the Train step's own arguments from the generated definition, resolved against
already tokenized data, with only what must differ per type replaced: the image (Neuron DLC for trn*, a GPU
DLC for p*/g*), the instance type, the job name, output and checkpoint locations, and the per-device batch size
and gradient accumulation, chosen so that every run has the same global batch and the same number of steps.
"""

from __future__ import annotations

import copy
import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from pipeline.aws import Aws, AwsError, explained
from pipeline.config import S3_URI, Config
from pipeline.cost import TrainingStats, duration, money, sagemaker_training_stats
from pipeline.prices import PRICING_URL, JobCost, per_million, training_job_cost

# Processes torchrun starts per instance: NeuronCores on Trainium, GPUs on p*/g* (as the DLC toolkit counts them).
DEVICES: dict[str, int] = {
    "ml.trn1.2xlarge": 2,
    "ml.trn1.32xlarge": 32,
    "ml.trn1n.32xlarge": 32,
    "ml.trn2.48xlarge": 64,
    "ml.p3.2xlarge": 1,
    "ml.p3.8xlarge": 4,
    "ml.p3.16xlarge": 8,
    "ml.p3dn.24xlarge": 8,
    "ml.p4d.24xlarge": 8,
    "ml.p4de.24xlarge": 8,
    "ml.p5.48xlarge": 8,
    "ml.p5e.48xlarge": 8,
    "ml.p5en.48xlarge": 8,
    **{f"ml.g5.{size}": 1 for size in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "ml.g5.12xlarge": 4,
    "ml.g5.24xlarge": 4,
    "ml.g5.48xlarge": 8,
    **{f"ml.g6.{size}": 1 for size in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge")},
    "ml.g6.12xlarge": 4,
    "ml.g6.24xlarge": 4,
    "ml.g6.48xlarge": 8,
}
TERMINAL = {"Completed", "Failed", "Stopped"}
COMPARE_TAG = "trainium-pipeline:compare"
DEFAULT_MAX_STEPS = 1000
DEFAULT_MAX_DEVICE_BATCH = 64
RATIOS = ("wall_seconds", "billable_seconds", "samples_per_sec", "cost", "cost_per_million_samples")


class CompareError(ValueError):
    """A comparison that cannot be planned or reported, said in one line."""


def devices(instance_type: str) -> int:
    """Training processes per instance of `instance_type` (NeuronCores or GPUs)."""
    if instance_type not in DEVICES:
        raise CompareError(
            f"--instance-types {instance_type}: not a known Trainium or GPU training type; expected one of "
            f"{', '.join(DEVICES)}"
        )
    return DEVICES[instance_type]


def check_instance_types(instance_types: list[str]) -> None:
    """At least one type, each known and listed once."""
    if not instance_types:
        raise CompareError("--instance-types: expected at least one instance type, e.g. ml.trn1.32xlarge")
    repeated = sorted({t for t in instance_types if instance_types.count(t) > 1})
    if repeated:
        raise CompareError(f"--instance-types {repeated[0]}: listed twice; expected each type once")
    for instance_type in instance_types:
        devices(instance_type)


def is_trainium(instance_type: str) -> bool:
    return instance_type.startswith("ml.trn")


def image_for(cfg: Config, instance_type: str) -> str:
    """The Neuron DLC (images.training) for trn*, the GPU DLC (images.training_cuda) for p*/g*."""
    devices(instance_type)
    return cfg.image("training") if is_trainium(instance_type) else cfg.image("training_cuda")


def split_batch(global_batch: int, world: int, max_device_batch: int, instance_type: str) -> tuple[int, int]:
    """(per-device batch, gradient accumulation) with world x batch x accumulation == global_batch,
    the fewest accumulation steps that keep the per-device batch <= max_device_batch."""
    if global_batch % world:
        raise CompareError(
            f"--global-batch {global_batch}: cannot be split evenly over the {world} devices of {instance_type}; "
            f"expected a multiple of {world}"
        )
    per_world = global_batch // world
    for accum in range(1, per_world + 1):
        if per_world % accum == 0 and per_world // accum <= max_device_batch:
            return per_world // accum, accum
    raise AssertionError("unreachable: accumulation = per-world batch gives a batch of 1")


def tokenized_at(prefix: str) -> dict[str, str]:
    """`--data s3://.../<execution>`: the Tokenize output folders train/, validation/, test/ under it."""
    prefix = prefix.rstrip("/")
    if not re.match(S3_URI, prefix):
        raise CompareError(f"--data {prefix!r}: expected an S3 prefix like s3://bucket/prefix/executions/ID")
    return {split: f"{prefix}/{split}" for split in ("train", "validation", "test")}


def _train_step(definition: dict) -> dict:
    found = [s for s in definition["Steps"] if s.get("Type") == "Training"]
    if len(found) != 1:
        raise CompareError(f"the definition has {len(found)} training steps; compare needs exactly one")
    return found[0]


def _data_step(train: dict) -> str:
    from pipeline.local.expressions import step_references

    referenced = step_references(train["Arguments"])
    if len(referenced) != 1:
        raise CompareError(f"the Train step reads from steps {sorted(referenced)}; compare expects one data step")
    return referenced.pop()


def latest_tokenized(aws: Aws, cfg: Config, definition: dict, scan: int = 20) -> dict[str, str]:
    """Output folders of the data step (Tokenize) of the newest Succeeded execution."""
    step_name = _data_step(_train_step(definition))
    with explained(f"list executions of {cfg.pipeline.name}"):
        summaries = aws.sagemaker.list_pipeline_executions(
            PipelineName=cfg.pipeline.name, SortBy="CreationTime", SortOrder="Descending", MaxResults=scan
        )["PipelineExecutionSummaries"]
    for summary in summaries:
        if summary.get("PipelineExecutionStatus") != "Succeeded":
            continue
        arn = summary["PipelineExecutionArn"]
        with explained(f"list steps of {arn}"):
            steps = aws.execution_steps(arn)
        if steps is None:
            raise AwsError("cannot list execution steps from this endpoint; pass --data s3://.../executions/ID")
        for step in steps:
            job = step.get("Metadata", {}).get("ProcessingJob", {}).get("Arn")
            if step["StepName"] == step_name and job:
                name = job.rsplit("/", 1)[-1]
                with explained(f"describe processing job {name}"):
                    described = aws.sagemaker.describe_processing_job(ProcessingJobName=name)
                outputs = described.get("ProcessingOutputConfig", {}).get("Outputs", [])
                return {o["OutputName"]: o["S3Output"]["S3Uri"] for o in outputs if "S3Output" in o}
    raise CompareError(
        f"no Succeeded execution of {cfg.pipeline.name} with a {step_name} step among the newest {scan}; "
        "run the pipeline first or pass --data s3://.../executions/ID"
    )


def _drop_none(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _drop_none(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_drop_none(v) for v in node]
    return node


def validate_request(request: dict) -> None:
    """Check a CreateTrainingJob request against botocore's service model (offline)."""
    import botocore.session
    from botocore.exceptions import ParamValidationError
    from botocore.validate import validate_parameters

    model = botocore.session.get_session().get_service_model("sagemaker")
    try:
        validate_parameters(request, model.operation_model("CreateTrainingJob").input_shape)
    except ParamValidationError as e:
        raise CompareError(f"job {request.get('TrainingJobName')}: invalid request: {' '.join(str(e).split())}") from e


def job_name(pipeline: str, run_id: str, instance_type: str) -> str:
    """`<pipeline>-cmp-<run id>-<type>`, e.g. trainium-bert-cmp-250101120000-trn1-32xlarge (<= 63 chars)."""
    slug = instance_type.removeprefix("ml.").replace(".", "-")
    head = pipeline[: 63 - len(run_id) - len(slug) - 6].rstrip("-")
    return f"{head}-cmp-{run_id}-{slug}"


@dataclass
class Plan:
    """The CreateTrainingJob requests of one comparison."""

    run_id: str
    data: dict[str, str]
    global_batch: int
    max_steps: int
    requests: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "run_id": self.run_id,
            "data": self.data,
            "global_batch": self.global_batch,
            "max_steps": self.max_steps,
            "requests": self.requests,
        }


def plan(
    cfg: Config,
    definition: dict,
    instance_types: list[str],
    data: dict[str, str],
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
    global_batch: int | None = None,
    max_device_batch: int = DEFAULT_MAX_DEVICE_BATCH,
    now: datetime | None = None,
) -> Plan:
    """One CreateTrainingJob request per instance type, from the Train step of `definition`."""
    from pipeline.local.expressions import Context, ExpressionError, evaluate
    from pipeline.local.runner import resolve_parameters

    check_instance_types(instance_types)
    if max_steps < 1:
        raise CompareError(f"--max-steps {max_steps}: expected a number of steps >= 1")
    if max_device_batch < 1:
        raise CompareError(f"--max-device-batch {max_device_batch}: expected >= 1")
    train = _train_step(definition)
    source = _data_step(train)
    missing = [split for split in ("train", "validation", "test") if split not in data]
    if missing:
        raise CompareError(f"tokenized data: no {missing[0]} split in {sorted(data)}")
    run_id = (now or datetime.now(timezone.utc)).strftime("%y%m%d%H%M%S")
    outputs = {name: {"S3Output": {"S3Uri": uri}} for name, uri in data.items()}
    properties = {source: {"ProcessingOutputConfig": {"Outputs": outputs}}}
    variables = {
        "PipelineExecutionId": f"compare-{run_id}",
        "PipelineExecutionArn": "",
        "PipelineName": cfg.pipeline.name,
        "PipelineExecutionDisplayName": f"compare-{run_id}",
    }
    parameters = resolve_parameters(definition.get("Parameters", []), {})
    try:
        resolved = evaluate(
            train["Arguments"], Context(parameters=parameters, execution=variables, properties=properties), "step Train"
        )
    except ExpressionError as e:
        raise CompareError(f"cannot resolve the Train step for compare: {e}") from None
    resolved = _drop_none(resolved)
    count = int(resolved["ResourceConfig"].get("InstanceCount", 1))
    if global_batch is None:
        reference = cfg.training.instance_type if cfg.training.instance_type in DEVICES else instance_types[0]
        global_batch = (
            DEVICES[reference] * cfg.training.instance_count * cfg.training.batch_size * cfg.training.grad_accum
        )
    if global_batch < 1:
        raise CompareError(f"--global-batch {global_batch}: expected >= 1")
    for key in ("batch-size", "grad-accum", "max-steps"):
        if key not in resolved.get("HyperParameters", {}):
            raise CompareError(f"the Train step has no hyperparameter {key!r}; compare cannot set the batch")
    result = Plan(run_id, dict(data), global_batch, max_steps)
    for instance_type in instance_types:
        per_device, accum = split_batch(global_batch, devices(instance_type) * count, max_device_batch, instance_type)
        request = copy.deepcopy(resolved)
        name = job_name(cfg.pipeline.name, run_id, instance_type)
        request["TrainingJobName"] = name
        request["AlgorithmSpecification"]["TrainingImage"] = image_for(cfg, instance_type)
        request["ResourceConfig"]["InstanceType"] = instance_type
        request["HyperParameters"].update(
            {
                "batch-size": str(per_device),
                "grad-accum": str(accum),
                "max-steps": str(max_steps),
                "sagemaker_instance_type": instance_type,
            }
        )
        request["OutputDataConfig"]["S3OutputPath"] = f"{cfg.s3_root}/compare/{run_id}"
        if "CheckpointConfig" in request:  # a fresh location: never resume from another run's checkpoint
            request["CheckpointConfig"]["S3Uri"] = f"{cfg.checkpoint_s3_uri}/compare/{name}"
        if not is_trainium(instance_type):
            request.get("Environment", {}).pop("NEURON_COMPILE_CACHE_URL", None)
        request["Tags"] = [*request.get("Tags", []), {"Key": COMPARE_TAG, "Value": run_id}]
        validate_request(request)
        result.requests.append(request)
    return result


def start(aws: Aws, cfg: Config, planned: Plan) -> list[str]:
    """Upload the training code (content-hashed, skipped when present) and create the jobs; return their names."""
    from pipeline.upsert import UpsertReport, upload_code

    upload_code(cfg, aws, UpsertReport())
    names = []
    for request in planned.requests:
        with explained(f"create training job {request['TrainingJobName']}"):
            aws.sagemaker.create_training_job(**request)
        names.append(request["TrainingJobName"])
    return names


def describe(aws: Aws, names: list[str]) -> list[dict]:
    found = []
    for name in names:
        with explained(f"describe training job {name}"):
            found.append(aws.sagemaker.describe_training_job(TrainingJobName=name))
    return found


def status_table(described: list[dict]) -> Table:
    table = Table(title="compare: training jobs")
    for column in ("instance", "job", "status", "detail", "elapsed"):
        table.add_column(column)
    for job in described:
        start_time = job.get("CreationTime")
        end = job.get("TrainingEndTime")
        if end is None and job["TrainingJobStatus"] in TERMINAL:
            end = job.get("LastModifiedTime")
        elapsed = ((end or datetime.now(timezone.utc)) - start_time).total_seconds() if start_time else None
        table.add_row(
            job["ResourceConfig"]["InstanceType"],
            job["TrainingJobName"],
            job["TrainingJobStatus"],
            job.get("SecondaryStatus", ""),
            duration(elapsed),
        )
    return table


def wait(aws: Aws, names: list[str], console: Console, poll_seconds: float = 60) -> list[dict]:
    """Show a live table until every job has ended; return their final descriptions."""
    described = describe(aws, names)
    with Live(status_table(described), console=console, refresh_per_second=1) as live:
        while any(job["TrainingJobStatus"] not in TERMINAL for job in described):
            time.sleep(poll_seconds)
            described = describe(aws, names)
            live.update(status_table(described))
    return described


@dataclass
class Row:
    """One training job of the comparison."""

    job: JobCost
    wall_seconds: float | None
    stats: TrainingStats
    global_batch: int | None
    steps: int | None
    failure: str = ""
    ratios: dict[str, float | None] = field(default_factory=dict)

    @property
    def cost_per_million_samples(self) -> float | None:
        return per_million(self.job.cost, self.stats.samples)

    def value(self, key: str) -> float | None:
        return {
            "wall_seconds": self.wall_seconds,
            "billable_seconds": self.job.seconds,
            "samples_per_sec": self.stats.samples_per_sec,
            "cost": self.job.cost,
            "cost_per_million_samples": self.cost_per_million_samples,
        }[key]

    def to_dict(self) -> dict:
        return {
            "instance_type": self.job.instance_type,
            "instance_count": self.job.count,
            "job": self.job.job,
            "status": self.job.status,
            "failure_reason": self.failure,
            "wall_seconds": self.wall_seconds,
            "billable_seconds": self.job.seconds,
            "training_seconds": self.job.training_seconds,
            "spot": self.job.spot,
            "spot_savings": self.job.savings,
            "global_batch": self.global_batch,
            "steps": self.steps,
            "samples": self.stats.samples,
            "samples_per_sec": self.stats.samples_per_sec,
            "final_loss": self.stats.final_loss,
            "val_accuracy": self.stats.val_accuracy,
            "test_accuracy": self.stats.test_accuracy,
            "stats_source": self.stats.source,
            "price_per_hour": self.job.price,
            "cost": self.job.cost,
            "cost_per_million_samples": self.cost_per_million_samples,
            "ratios_to_first": self.ratios,
        }


@dataclass
class Report:
    currency: str
    rows: list[Row]
    notes: list[str]

    def to_dict(self) -> dict:
        return {
            "currency": self.currency,
            "baseline": self.rows[0].job.instance_type if self.rows else None,
            "jobs": [row.to_dict() for row in self.rows],
            "notes": self.notes,
        }


def _int(value: Any) -> int | None:
    try:
        return int(str(value).strip('"'))
    except (TypeError, ValueError):
        return None


def report(aws: Aws, cfg: Config, described: list[dict]) -> Report:
    """The side-by-side report of finished training jobs; ratios are to the first job."""
    rows = []
    for job in described:
        instance = job["ResourceConfig"]["InstanceType"]
        cost = training_job_cost(job, cfg.prices.price(instance))
        end = job.get("TrainingEndTime")
        wall = (end - job["CreationTime"]).total_seconds() if end and job.get("CreationTime") else None
        hp = job.get("HyperParameters", {})
        per_device, accum = _int(hp.get("batch-size")), _int(hp.get("grad-accum"))
        world = DEVICES.get(instance)
        global_batch = world * cost.count * per_device * accum if world and per_device and accum else None
        max_steps = _int(hp.get("max-steps"))
        with explained(f"read the training stats of {job['TrainingJobName']}"):
            stats = sagemaker_training_stats(aws, job)
        rows.append(
            Row(
                job=cost,
                wall_seconds=wall,
                stats=stats,
                global_batch=global_batch,
                steps=max_steps if max_steps and max_steps > 0 else None,
                failure=job.get("FailureReason", ""),
            )
        )
    for row in rows:
        for key in RATIOS:
            base, value = rows[0].value(key), row.value(key)
            row.ratios[key] = value / base if base and value is not None else None
    notes = [
        "wall time: CreateTrainingJob to the end of training (includes provisioning and image download); "
        "billable: BillableTimeInSeconds, what is charged",
        "cost: instance count x billable seconds x the on-demand price per instance-hour from the config "
        f"(`prices`); check prices at {PRICING_URL}",
        "samples/s, final loss, accuracies: train.py's training_stats.json (samples/s over the training loop; "
        "test and val accuracy: the trained model on the test and validation splits, scored by train.py at the end "
        "of training on the instance itself), else the job's final metrics",
        "cost per M samples: job cost / samples trained x 1e6 (compile, download and startup time included)",
    ]
    return Report(cfg.prices.currency, rows, notes)


def _with_ratio(text: str, ratio: float | None, first: bool) -> str:
    return text if first or ratio is None else f"{text} ({ratio:.2f}x)"


def _number(value: float | None, fmt: str) -> str:
    return "unknown" if value is None else format(value, fmt)


def _lines(result: Report) -> list[tuple[str, list[str]]]:
    """(measure, one cell per instance type); a cell after the first carries its ratio to the first."""
    currency = result.currency
    measures: list[tuple[str, list[str]]] = [
        ("job", [r.job.job for r in result.rows]),
        ("status", [r.job.status + (f" ({r.failure[:100]})" if r.failure else "") for r in result.rows]),
        (
            "global batch x steps",
            [f"{r.global_batch} x {r.steps}" if r.global_batch and r.steps else "unknown" for r in result.rows],
        ),
    ]
    spec = (
        ("wall time", "wall_seconds", lambda r: duration(r.wall_seconds)),
        (
            "billable time",
            "billable_seconds",
            lambda r: duration(r.job.seconds) + (f" (spot -{r.job.savings:.0%})" if r.job.savings is not None else ""),
        ),
        ("samples/s", "samples_per_sec", lambda r: _number(r.stats.samples_per_sec, ",.1f")),
        ("final loss", None, lambda r: _number(r.stats.final_loss, ".4f")),
        ("test accuracy", None, lambda r: _number(r.stats.test_accuracy, ".4f")),
        ("val accuracy", None, lambda r: _number(r.stats.val_accuracy, ".4f")),
        (f"price per hour ({currency})", None, lambda r: money(r.job.price, currency)),
        (f"cost ({currency})", "cost", lambda r: money(r.job.cost, currency)),
        ("cost per M samples", "cost_per_million_samples", lambda r: money(r.cost_per_million_samples, currency)),
    )
    for label, key, render in spec:
        cells = [
            _with_ratio(render(r), r.ratios.get(key) if key else None, index == 0)
            for index, r in enumerate(result.rows)
        ]
        measures.append((label, cells))
    return measures


def _header(result: Report) -> list[str]:
    return [r.job.instance_type + (f" x{r.job.count}" if r.job.count > 1 else "") for r in result.rows]


def table(result: Report) -> Table:
    """The comparison as a rich table: one column per instance type, ratios to the first in parentheses."""
    out = Table(title=f"compare: price-performance ({result.currency}; (x) = ratio to {_header(result)[0]})")
    out.add_column("")
    for name in _header(result):
        out.add_column(name, justify="right")
    for label, cells in _lines(result):
        out.add_row(label, *(escape(cell) for cell in cells))  # failure reasons may hold [brackets]
    return out


def markdown(result: Report) -> str:
    """The comparison as a Markdown table with its notes, ready to paste into a report."""
    header = _header(result)
    lines = [
        "# Training price-performance: Trainium vs GPU",
        "",
        "The same `train.py`, tokenized data, hyperparameters, global batch and number of steps on each instance "
        f"type. In parentheses: the ratio to {header[0]}.",
        "",
        "| | " + " | ".join(header) + " |",
        "| --- |" + " ---: |" * len(header),
    ]
    for label, cells in _lines(result):
        lines.append(f"| {label} | " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
    lines += ["", *[f"- {note}" for note in result.notes], ""]
    return "\n".join(lines)


def chart(result: Report, path: Path) -> None:
    """A PNG with two bar panels: billable time and cost per instance type (Agg backend, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = [row.job.instance_type.removeprefix("ml.") for row in result.rows]
    figure = Figure(figsize=(10, 4.2), dpi=120)
    FigureCanvasAgg(figure)
    panels = (
        ("billable time (minutes)", [None if r.job.seconds is None else r.job.seconds / 60 for r in result.rows]),
        (f"cost ({result.currency})", [r.job.cost for r in result.rows]),
    )
    for index, (title, values) in enumerate(panels, start=1):
        axes = figure.add_subplot(1, 2, index)
        heights = [v or 0 for v in values]
        bars = axes.bar(labels, heights, color=["#ff9900" if is_trainium("ml." + x) else "#76b900" for x in labels])
        base = values[0]
        for bar, value in zip(bars, values, strict=True):
            text = "unknown" if value is None else f"{value:,.2f}" + (f"\n{value / base:.2f}x" if base else "")
            axes.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
        axes.set_title(title)
        axes.set_ylim(0, max(heights + [1e-9]) * 1.3)
        axes.tick_params(axis="x", labelrotation=15)
    figure.suptitle("Same training job per instance type: time and cost")
    figure.tight_layout()
    figure.savefig(path)


def write_outputs(result: Report, out: Path) -> list[Path]:
    """compare.md, compare.json and compare.png in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "compare.md", out / "compare.json", out / "compare.png"]
    paths[0].write_text(markdown(result))
    paths[1].write_text(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    chart(result, paths[2])
    return paths
