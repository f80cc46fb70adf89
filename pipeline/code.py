"""Step code as content-addressed bundles: the same files always get the same S3 key."""

from __future__ import annotations

import gzip
import hashlib
import importlib
import io
import sys
import tarfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import ModuleType

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STEPS = PROJECT_ROOT / "steps"
IGNORED = {"__pycache__", ".pytest_cache", ".ipynb_checkpoints"}


@dataclass(frozen=True)
class CodeBundle:
    """A folder of step code (`steps/` or `training/`) and where it lives in S3."""

    name: str
    folder: Path
    packed: bool

    @cached_property
    def files(self) -> dict[str, bytes]:
        """Relative path -> content, sorted, without caches and compiled files."""
        found = {}
        for path in sorted(self.folder.rglob("*")):
            rel = path.relative_to(self.folder)
            if path.is_file() and not IGNORED.intersection(rel.parts) and path.suffix != ".pyc":
                found[rel.as_posix()] = path.read_bytes()
        if not found:
            raise FileNotFoundError(f"{self.folder}: no code to package")
        return found

    @cached_property
    def sha256(self) -> str:
        digest = hashlib.sha256()
        for rel, data in self.files.items():
            digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
        return digest.hexdigest()

    def s3_prefix(self, s3_root: str) -> str:
        """`s3://bucket/prefix/code/<sha256>/<name>/`: changes only when the code does."""
        return f"{s3_root}/code/{self.sha256}/{self.name}/"

    def tarball(self) -> bytes:
        """A reproducible `sourcedir.tar.gz` (sorted entries, zeroed times and owners)."""
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, data in self.files.items():
                info = tarfile.TarInfo(rel)
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))

        return gzip.compress(raw.getvalue(), mtime=0)

    def uri(self, s3_root: str) -> str:
        """What a step references: the tarball if packed (training), else the folder (processing)."""
        return self.s3_prefix(s3_root) + ("sourcedir.tar.gz" if self.packed else "")

    def uploads(self, s3_root: str) -> dict[str, bytes]:
        """S3 URI -> bytes to upload for this bundle."""
        if self.packed:
            return {self.uri(s3_root): self.tarball()}
        return {self.s3_prefix(s3_root) + rel: data for rel, data in self.files.items()}


def bundles() -> dict[str, CodeBundle]:
    """The project's two code bundles."""
    return {
        "steps": CodeBundle("steps", PROJECT_ROOT / "steps", packed=False),
        "training": CodeBundle("training", PROJECT_ROOT / "training", packed=True),
    }


def step_module(name: str) -> ModuleType:
    """`steps/<name>.py` imported under its own name, as the deploy Lambda imports it (its sibling imports too).

    steps/ is container code, not a package: it is on sys.path only while the import runs, so that later imports
    of libraries (steps/evaluate.py would shadow `evaluate`) are unaffected."""
    module = sys.modules.get(name)
    if module is not None and Path(getattr(module, "__file__", "") or "").parent == STEPS:
        return module
    sys.path.insert(0, str(STEPS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(STEPS))
