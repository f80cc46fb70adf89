"""Step caching like SageMaker's: a job step whose resolved arguments (output locations aside) and input contents are
unchanged reuses the properties, and so the outputs, of its previous run while those outputs still exist."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pipeline.local.storage import LocalS3


class StepCache:
    """Job step properties by cache key, one JSON file each in `folder`."""

    def __init__(self, folder: Path, s3: LocalS3, enabled: bool = True) -> None:
        self.folder = folder
        self.s3 = s3
        self.enabled = enabled

    def key(self, step: dict, masked_args: dict, args: dict) -> str | None:
        """The step's key (None: not cached): its type and arguments with the execution masked, and the content of
        every S3 input, the training code included."""
        if not (self.enabled and step.get("CacheConfig", {}).get("Enabled")):
            return None
        inputs = [i["S3Input"]["S3Uri"] for i in args.get("ProcessingInputs", []) if "S3Input" in i]
        inputs += [c["DataSource"]["S3DataSource"]["S3Uri"] for c in args.get("InputDataConfig", [])]
        submit = json.loads(str(args.get("HyperParameters", {}).get("sagemaker_submit_directory", '""')))
        inputs += [submit] if submit.startswith("s3://") else []
        digest = hashlib.sha256(json.dumps([step["Type"], masked_args], sort_keys=True).encode())
        for uri in inputs:
            digest.update(uri.encode() + self.s3.digest(uri).encode())
        return digest.hexdigest()

    def _file(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def get(self, key: str | None) -> dict | None:
        """The properties stored under `key` when every output they name still exists, else None."""
        if key is None or not self._file(key).exists():
            return None
        properties = json.loads(self._file(key).read_text())
        outputs = [
            o["S3Output"]["S3Uri"] for o in properties.get("ProcessingOutputConfig", {}).get("Outputs", {}).values()
        ]
        outputs += [properties["ModelArtifacts"]["S3ModelArtifacts"]] if "ModelArtifacts" in properties else []
        return properties if all(self.s3.path(uri).exists() for uri in outputs) else None

    def put(self, key: str | None, properties: dict) -> None:
        if key is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._file(key).write_text(json.dumps(properties, indent=2))
