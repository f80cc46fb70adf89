"""The Evaluate step's part of the execution's MLflow run (see tracking.py): its metrics, the serving variant and the
int8 decision."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from steps import tracking
from steps.evaluation import quality


def log(result: dict[str, Any], args: argparse.Namespace, report: Path) -> None:
    """The metrics, the serving variant and its int8 decision to the execution's MLflow run (best effort, see
    tracking.py), then the run into the `report` as its "tracking" section: the run's id, "none" when untracked (the
    registered version's metadata value it becomes cannot be empty)."""
    inference = result["inference"]
    layout = result.get("binary_classification_metrics") or result.get("multiclass_classification_metrics") or {}
    metrics = {f"eval_{name}": m["value"] for name, m in {**layout, **result["classification"]}.items()
               if isinstance(m, dict) and isinstance(m.get("value"), int | float)}
    tracker = tracking.Tracker("Evaluate", settings_dir=args.tracking_dir)
    tracker.log(
        metrics={**metrics, "eval_cpu_agreement": result["check"]["agreement"],
                 "serving_accuracy": inference.get("accuracy"),
                 "serving_accuracy_loss": inference.get("accuracy_loss")},
        params={"serving_variant": inference["variant"], "serving_runtime": inference["runtime"],
                "serving_quantize": inference["quantize"], "int8_considered": args.int8,
                "int8_tolerance": args.int8_tolerance, "eval_sample_size": args.sample_size,
                "gpu_precision": inference["gpu"]["precision"], "fp16_tolerance": args.fp16_tolerance},
        tags={"serving.variant": inference["variant"], "serving.int8": str(inference["quantize"] == "int8").lower(),
              "serving.reason": inference["reason"][:5000]},
    )
    tracker.finish()
    result["tracking"] = {"run_id": tracker.run_id or tracking.UNTRACKED, "experiment": tracker.experiment}
    report.write_text(quality.report_json(result))


def failed(args: argparse.Namespace) -> None:
    """Mark the execution's run FAILED (the Train step made it; best effort, see tracking.py)."""
    tracking.Tracker("Evaluate", settings_dir=args.tracking_dir).fail()
