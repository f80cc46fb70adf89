"""The `training` section of the config: the Train step's instances, model, data order and hyperparameters."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.config.backend import NeuronBackend
from pipeline.config.base import INSTANCE_TYPE, S3_URI, Section
from pipeline.config.devices import (
    MULTI_NODE_NEURON_TYPES,
    REFERENCE_GLOBAL_BATCH,
    REFERENCE_LEARNING_RATE,
    default_batch_size,
    device_kind,
)
from steps.contract import source_kind

AUTO = "auto"
PACKAGE = "package:"  # training.model_id "package:NAME": the model folder that the Python package NAME ships


class Spot(Section):
    enabled: bool = False
    max_wait_seconds: int = Field(default=48 * 3600, ge=60, le=28 * 24 * 3600)


class Training(NeuronBackend):
    instance_type: str = Field(pattern=INSTANCE_TYPE)
    instance_count: int = Field(default=1, ge=1)
    volume_size_gb: int = Field(default=200, ge=1, le=16384)
    max_runtime_seconds: int = Field(default=24 * 3600, ge=60, le=28 * 24 * 3600)
    spot: Spot = Spot()
    checkpoint_s3_uri: str | None = Field(default=None, pattern=S3_URI)
    compile_cache_s3_uri: str | None = Field(default=None, pattern=S3_URI)
    model_id: str = Field(default="bert-base-uncased", min_length=1)
    epochs: int = Field(default=2, ge=1)
    max_steps: int = -1  # -1: train for `epochs`; else exactly this many optimizer steps
    batch_size: int = Field(ge=1)  # per device; `auto` (the default): pipeline/config/devices.py DEVICE_BATCH_SIZE
    grad_accum: int = Field(default=1, ge=1)
    # auto: REFERENCE_LEARNING_RATE at REFERENCE_GLOBAL_BATCH (devices.py), which train.py scales to the run's global
    # batch by the square-root rule (see learning_rate_for)
    learning_rate: float | Literal["auto"] = AUTO
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1)
    weight_decay: float = Field(default=0.01, ge=0)
    max_length: int = Field(default=128, ge=8, le=512)
    seed: int = Field(default=42, ge=0, le=2**32 - 1)  # a seed that numpy and torch take everywhere
    log_interval: int = Field(default=50, ge=1)
    checkpoint_interval: int = Field(default=500, ge=1)
    checkpoint_minutes: float = Field(default=30.0, ge=0)  # also checkpoint after this long; 0: steps only
    bf16: Literal["auto"] | bool = "auto"

    @model_validator(mode="before")
    @classmethod
    def _device_defaults(cls, data: Any) -> Any:
        """`batch_size` absent or `auto`: what suits the instance type's devices."""
        if not isinstance(data, dict) or not isinstance(data.get("instance_type"), str):
            return data
        data = dict(data)
        for key in ("batch_size", "learning_rate"):
            if isinstance(data.get(key), str) and data[key] != AUTO:
                raise ValueError(f"training.{key}={data[key]!r}: expected a number or {AUTO!r}")
        if data.get("batch_size", AUTO) == AUTO:
            data["batch_size"] = default_batch_size(data["instance_type"])
        return data

    @field_validator("learning_rate")
    @classmethod
    def _a_rate(cls, v: float | str) -> float | str:
        if v != AUTO and not 0 < v < 1:
            raise ValueError("greater than 0" if v <= 0 else "less than 1")
        return v

    @field_validator("model_id")
    @classmethod
    def _packaged_model(cls, v: str) -> str:
        """`package:NAME`: the model folder that the installed Python package NAME ships (its get_model_path())."""
        if not v.startswith(PACKAGE):
            return v
        name = v.removeprefix(PACKAGE)
        try:
            module = importlib.import_module(name)
        except ImportError:
            raise ValueError(f"training.model_id={v!r}: expected an installed package {name} "
                             "(pip install -e '.[ml]')") from None
        return str(Path(module.get_model_path()).resolve())

    @property
    def learning_rate_for(self) -> tuple[float, int]:
        """(the rate, the global batch it is set for; 0: the rate as given), as the Train step passes them
        (`--learning-rate`, `--lr-global-batch`): `auto` is resolved in train.py alone, the one place that knows the
        run's world size, whatever instance type, count or batch size an execution picks."""
        if self.learning_rate == AUTO:
            return REFERENCE_LEARNING_RATE, REFERENCE_GLOBAL_BATCH
        return self.learning_rate, 0

    @property
    def model_from_hub(self) -> bool:
        """A Hugging Face Hub model id (told by its spelling, as data.source: a folder is written as a path)."""
        return source_kind(self.model_id) == "hub"

    @field_validator("max_steps")
    @classmethod
    def _max_steps(cls, v: int) -> int:
        if v == 0 or v < -1:
            raise ValueError(f"training.max_steps={v}: expected a number of optimizer steps >= 1, or -1 for "
                             "no limit (train for training.epochs)")
        return v

    @model_validator(mode="after")
    def _multi_node(self) -> Training:
        if (self.instance_count > 1 and device_kind(self.instance_type) == "neuron"
                and self.instance_type not in MULTI_NODE_NEURON_TYPES):
            raise ValueError(f"training.instance_count={self.instance_count}: expected 1 on {self.instance_type} "
                             f"(Neuron's collectives between instances need EFA: use one of "
                             f"{', '.join(MULTI_NODE_NEURON_TYPES)} for several)")
        return self

    @model_validator(mode="after")
    def _spot_wait(self) -> Training:
        if self.spot.enabled and self.spot.max_wait_seconds < self.max_runtime_seconds:
            raise ValueError(
                f"training.spot.max_wait_seconds={self.spot.max_wait_seconds}: expected >= "
                f"training.max_runtime_seconds ({self.max_runtime_seconds})"
            )
        return self
