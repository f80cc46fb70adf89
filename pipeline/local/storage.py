"""S3 on the local disk: `s3://bucket/key` is the folder (or file) `<root>/s3/bucket/key`."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path


class LocalS3:
    """Maps S3 URIs to paths under `root` and copies between them and job folders."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()

    def path(self, uri: str) -> Path:
        if not uri.startswith("s3://"):
            raise ValueError(f"{uri!r}: expected an S3 URI")
        return self.root / "s3" / uri[5:].rstrip("/")

    def uri(self, path: Path) -> str:
        return "s3://" + Path(path).resolve().relative_to(self.root / "s3").as_posix()

    def download(self, uri: str, destination: Path) -> None:
        """Copy the object or every object under the prefix `uri` into the folder `destination`."""
        source = self.path(uri)
        destination.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, destination, dirs_exist_ok=True)
        elif source.is_file():
            shutil.copy2(source, destination / source.name)
        else:
            raise FileNotFoundError(f"{uri}: no such object or prefix (looked in {source})")

    def upload(self, source: Path, uri: str) -> None:
        """Copy the folder `source` to the prefix `uri` (replacing what was there)."""
        target = self.path(uri)
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)

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
