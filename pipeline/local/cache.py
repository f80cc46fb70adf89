"""Step caching as SageMaker's: a job step reuses the properties, and so the outputs, of its latest run whose cache key
attributes (per step type, resolved, the execution's id included where a step names it) were the same and that
ended within the step's `CacheConfig.ExpireAfter`. Like SageMaker, the key holds S3 URIs, not what lies behind
them. Locally an entry is also skipped when an output it names is gone (a cleaned `local.root`)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from pipeline.dag.durations import expire_after
from pipeline.local.storage import LocalS3

# "Default cache key attributes by pipeline step type" (SageMaker developer guide, pipelines-default-keys)
KEY_ATTRIBUTES = {
    "Processing": ("AppSpecification", "Environment", "ProcessingInputs"),
    "Training": ("AlgorithmSpecification", "CheckpointConfig", "DebugHookConfig", "DebugRuleConfigurations",
                 "Environment", "HyperParameters", "InputDataConfig"),
}
ENDED = "__cached_at"  # when the run ended (epoch seconds), beside its properties


class StepCache:
    """Job step properties by cache key, one JSON file each in `folder`."""

    def __init__(self, folder: Path, s3: LocalS3, enabled: bool = True) -> None:
        self.folder = folder
        self.s3 = s3
        self.enabled = enabled

    def key(self, step: dict, args: dict) -> str | None:
        """The step's key (None: not cached): its name and type and its resolved key attributes (every argument for
        a type without a documented list): SageMaker looks for an earlier run of the same step."""
        config = step.get("CacheConfig", {})
        if not (self.enabled and config.get("Enabled")):
            return None
        attributes = KEY_ATTRIBUTES.get(step["Type"])
        keyed = {name: args.get(name) for name in attributes} if attributes else args
        return hashlib.sha256(json.dumps([step["Name"], step["Type"], keyed], sort_keys=True).encode()).hexdigest()

    def _file(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def get(self, key: str | None, step: dict) -> dict | None:
        """The properties stored under `key` if that run ended within the step's ExpireAfter and every output they
        name still exists, else None."""
        if key is None or not self._file(key).exists():
            return None
        properties = json.loads(self._file(key).read_text())
        ended = properties.pop(ENDED, 0.0)
        limit = step.get("CacheConfig", {}).get("ExpireAfter")
        if limit and time.time() - ended > expire_after(limit).total_seconds():
            return None
        outputs = [
            o["S3Output"]["S3Uri"] for o in properties.get("ProcessingOutputConfig", {}).get("Outputs", {}).values()
        ]
        outputs += [properties["ModelArtifacts"]["S3ModelArtifacts"]] if "ModelArtifacts" in properties else []
        return properties if all(self.s3.path(uri).exists() for uri in outputs) else None

    def put(self, key: str | None, properties: dict) -> None:
        if key is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._file(key).write_text(json.dumps({**properties, ENDED: time.time()}, indent=2))
