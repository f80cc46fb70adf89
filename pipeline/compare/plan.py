"""`compare`: the Train step alone, once per instance type (Trainium vs GPU), side by side.

Each CreateTrainingJob request is the Train step's own arguments from the generated definition, resolved against
already tokenized data, with only what must differ per type replaced: the image (Neuron DLC for trn*, a GPU
DLC for p*/g*), the instance type, the job name, output and checkpoint locations, and the per-device batch size
and gradient accumulation, chosen so that every run has the same global batch and the same number of steps.
"""

from __future__ import annotations

import copy
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from pipeline.config import S3_URI, Config
from pipeline.config.devices import DEVICES, device_kind, global_batch_size
from pipeline.dag.expressions import Context, ExpressionError
from pipeline.dag.graph import step_references
from pipeline.dag.parameters import resolve
from pipeline.dag.requests import RequestError, validate
from pipeline.dag.requests import resolve as resolve_request
from pipeline.errors import UserError
from steps.contract import SPLITS, TRACKING_INPUT, TRAIN

COMPARE_TAG = "trainium-pipeline:compare"
DEFAULT_MAX_STEPS = 1000
DEFAULT_MAX_DEVICE_BATCH = 64


class CompareError(UserError, ValueError):
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


def image_for(cfg: Config, instance_type: str) -> str:
    """The Neuron DLC (images.training) for trn*, the GPU DLC (images.training_cuda) for p*/g*."""
    devices(instance_type)
    return cfg.image("training") if device_kind(instance_type) == "neuron" else cfg.image("training_cuda")


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
    return {split: f"{prefix}/{split}" for split in SPLITS}


def train_step(definition: dict) -> dict:
    """The Train step."""
    for step in definition.get("Steps", []):
        if step.get("Name") == TRAIN and step.get("Type") == "Training":
            return step
    raise CompareError(f"compare needs the training step {TRAIN!r}: the definition has none")


def data_step(train: dict) -> str:
    """The step whose outputs the Train step reads (Tokenize)."""
    referenced = step_references(train["Arguments"])
    if len(referenced) != 1:
        raise CompareError(f"the Train step reads from steps {sorted(referenced)}; compare expects one data step")
    return referenced.pop()


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
        return asdict(self)


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
    check_instance_types(instance_types)
    if max_steps < 1:
        raise CompareError(f"--max-steps {max_steps}: expected a number of steps >= 1")
    if max_device_batch < 1:
        raise CompareError(f"--max-device-batch {max_device_batch}: expected >= 1")
    train = train_step(definition)
    source = data_step(train)
    missing = [split for split in SPLITS if split not in data]
    if missing:
        raise CompareError(f"tokenized data: no {missing[0]} split in {sorted(data)}")
    run_id = (now or datetime.now(timezone.utc)).strftime("%y%m%d%H%M%S")
    outputs = {name: {"S3Output": {"S3Uri": uri}} for name, uri in data.items()}
    # (the job name only names the checkpoint folder, which each compare job replaces with its own below)
    properties = {source: {"ProcessingJobName": f"compare-{run_id}", "ProcessingOutputConfig": {"Outputs": outputs}}}
    variables = {
        "PipelineExecutionId": f"compare-{run_id}",
        "PipelineExecutionArn": "",
        "PipelineName": cfg.pipeline.name,
        "PipelineExecutionDisplayName": f"compare-{run_id}",
    }
    try:
        ctx = Context(parameters=resolve(definition, {}), execution=variables, properties=properties)
        resolved = resolve_request(train, ctx)
    except ExpressionError as e:
        raise CompareError(f"cannot resolve the Train step for compare: {e}") from None
    count = int(resolved["ResourceConfig"].get("InstanceCount", 1))
    if global_batch is None:
        reference = cfg.training.instance_type if cfg.training.instance_type in DEVICES else instance_types[0]
        global_batch = global_batch_size(
            reference, cfg.training.instance_count, cfg.training.batch_size, cfg.training.grad_accum
        )
    if global_batch < 1:
        raise CompareError(f"--global-batch {global_batch}: expected >= 1")
    for key in ("batch-size", "grad-accum", "max-steps"):
        if key not in resolved.get("HyperParameters", {}):
            raise CompareError(f"the Train step has no hyperparameter {key!r}; compare cannot set the batch")
    interval = int(resolved["HyperParameters"].get("log-interval") or 0)
    if max_steps <= interval:  # samples/s leaves out the first interval (the warm-up): one interval measures nothing
        raise CompareError(f"--max-steps {max_steps}: the jobs read out every {interval} steps (training.log_interval) "
                           f"and the first interval is the warm-up, so they would measure no steady samples/s; "
                           f"expected more than {interval}, e.g. {DEFAULT_MAX_STEPS}")
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
        request["InputDataConfig"] = [  # a compare job is no execution: nothing to track (the file may not exist)
            c for c in request["InputDataConfig"] if c["ChannelName"] != TRACKING_INPUT]
        request["OutputDataConfig"]["S3OutputPath"] = f"{cfg.s3_root}/compare/{run_id}"
        if "CheckpointConfig" in request:  # a fresh location: never resume from another run's checkpoint
            request["CheckpointConfig"]["S3Uri"] = f"{cfg.checkpoint_s3_uri}/compare/{name}"
        if device_kind(instance_type) != "neuron":
            request.get("Environment", {}).pop("NEURON_COMPILE_CACHE_URL", None)
        request["Tags"] = [*request.get("Tags", []), {"Key": COMPARE_TAG, "Value": run_id}]
        try:
            validate(request, "CreateTrainingJob", f"job {name}")
        except RequestError as e:
            raise CompareError(str(e)) from e
        result.requests.append(request)
    return result


