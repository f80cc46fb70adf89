"""The local account on disk, one folder (`local.root`, default `.local/`) with one layout:

    s3/<bucket>/<key>                      S3 (`LocalS3`)
    pipelines/<pipeline>/definition.json   what `upsert --local` stored
    executions/<pipeline>/<id>/            one execution: execution.json, definition.json (what it ran), a log and a
                                           working folder per step
    cache/<pipeline>/<key>.json            step caching: the properties of a job step, by its cache key
    registry.sqlite                        the model registry
    endpoints/<endpoint>.json              the state of a detached local endpoint (staging and production)
    endpoints/<endpoint>.restarts          how many times it was restarted after its process died
    endpoints/lifecycle.lock               held by every deploy, approval, rejection, promotion: one at a time
    alerts.jsonl                           the lifecycle's alerts (what goes to the SNS topic on AWS), one per line
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

LOCAL_ARN = "arn:aws:sagemaker:local:000000000000"  # the local account in ARNs
DEFINITION_FILE = "definition.json"
RECORD_FILE = "execution.json"


@dataclass(frozen=True)
class Layout:
    """Where each thing of the local account lives under `root`."""

    root: Path

    @classmethod
    def at(cls, root: str | Path) -> Layout:
        return cls(Path(root).resolve())

    @property
    def s3(self) -> LocalS3:
        return LocalS3(self.root)

    def pipeline_definition(self, pipeline: str) -> Path:
        return self.root / "pipelines" / pipeline / DEFINITION_FILE

    def executions(self, pipeline: str) -> Path:
        return self.root / "executions" / pipeline

    def execution(self, pipeline: str, execution_id: str) -> Path:
        return self.executions(pipeline) / execution_id

    def cache(self, pipeline: str) -> Path:
        return self.root / "cache" / pipeline

    @property
    def registry(self) -> Path:
        return self.root / "registry.sqlite"

    def endpoint_state(self, endpoint: str) -> Path:
        return self.root / "endpoints" / f"{endpoint}.json"

    @property
    def lifecycle_lock(self) -> Path:
        return self.root / "endpoints" / "lifecycle.lock"

    @property
    def alerts(self) -> Path:
        return self.root / "alerts.jsonl"


class LocalS3:
    """Maps S3 URIs to paths under `<root>/s3` and copies between them and job folders."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()

    def path(self, uri: str) -> Path:
        if not uri.startswith("s3://"):
            raise ValueError(f"{uri!r}: expected an S3 URI")
        return self.root / "s3" / uri[5:].rstrip("/")

    def uri(self, path: Path) -> str:
        return "s3://" + Path(path).resolve().relative_to(self.root / "s3").as_posix()

    def download(self, uri: str, destination: Path) -> None:
        """Copy the object or every object under the prefix `uri` into the folder `destination`; FileNotFoundError
        when there is none (SageMaker refuses a job input with no objects under its URI)."""
        source = self.path(uri)
        if source.is_file():
            destination.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / source.name)
        elif source.is_dir() and any(p.is_file() for p in source.rglob("*")):
            destination.mkdir(parents=True, exist_ok=True)
            shutil.copytree(source, destination, dirs_exist_ok=True)
        else:
            raise FileNotFoundError(f"No S3 objects found under S3 URL {uri} (looked in {source})")

    def upload(self, source: Path, uri: str) -> None:
        """Put each file of the folder `source` (or the file) under the prefix `uri`, as S3 uploads do: objects
        already there stay, and an empty folder puts nothing."""
        target = self.path(uri)
        files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
        for file in files:
            destination = target / file.relative_to(source) if source.is_dir() else target
            destination.parent.mkdir(parents=True, exist_ok=True)
            if destination.is_dir():  # S3 holds an object and a prefix of one name; a folder cannot
                raise FileExistsError(f"{uri}: {destination} is a prefix here, cannot put an object there")
            shutil.copy2(file, destination)

    def put_bytes(self, uri: str, data: bytes) -> None:
        target = self.path(uri)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    def digest(self, uri: str) -> str:
        """SHA-256 over the names and contents of everything under `uri` (for step caching)."""
        source = self.path(uri)
        digest = hashlib.sha256()
        files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
        for file in files:
            digest.update(file.relative_to(source.parent).as_posix().encode() + b"\0")
            with file.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        return digest.hexdigest()
