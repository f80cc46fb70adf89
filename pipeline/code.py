"""Code as content-addressed bundles, one per deployable: the same files always get the same S3 key.

The deployables are the folders of the `steps` package (each a processing step or the deploy Lambda) and
`training/` (the Train step). A `steps` bundle holds its folder and the package's top-level modules (`__init__`,
the contract, the tracker; a processing step's also the entry point `run.py`), at their paths in this project; the
training bundle holds `training/` at its root, and the tracker (`steps/tracking.py`) beside `train.py`. So an edit to
one deployable changes its bundle's hash alone, and so the code location (and SageMaker's cache key) of its step
alone; the deploy Lambda's bundle goes up as the Lambda's zip, in no job's code location.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from steps.contract import ENTRY_POINT

PROJECT_ROOT = Path(__file__).resolve().parent.parent
IGNORED = {"__pycache__"}  # and every name that starts with "." (.DS_Store, .ipynb_checkpoints/, caches)
LAMBDA = "deploy"  # the deployable that goes up as the deploy Lambda's zip, not to S3 for a job
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the zip's entries' time: the archive is a function of the files alone


def git_files(root: Path, sources: tuple[Path, ...]) -> set[str] | None:
    """The files under `sources` that git does not ignore (tracked or new), relative to `root`; None outside a git
    work tree or without git (an installed copy: every file counts)."""
    try:
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                                 "--full-name", "--", *(str(s) for s in sources)],
                                capture_output=True, check=True).stdout
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    top_path, root_path = Path(top).resolve(), root.resolve()  # the names themselves stay unresolved (symlinks)
    return {(top_path / name).relative_to(root_path).as_posix() for name in listed.decode().split("\0") if name}


@dataclass(frozen=True)
class CodeBundle:
    """Files or folders of code (`sources`, under `root`) and where they live in S3."""

    name: str
    root: Path
    sources: tuple[Path, ...]
    packed: bool
    extras: tuple[tuple[str, Path], ...] = ()  # (name in the bundle, file) for a file from outside `root`

    @cached_property
    def files(self) -> dict[str, bytes]:
        """Path relative to `root` -> content, sorted, without hidden files, caches, compiled files and what git
        ignores (a build/ folder): the same commit gives the same bundle on every machine."""
        paths = (p for source in self.sources for p in ([source] if source.is_file() else source.rglob("*")))
        kept = git_files(self.root, self.sources)
        found = {}
        for path in paths:
            rel = path.relative_to(self.root)
            hidden = any(part.startswith(".") or part in IGNORED for part in rel.parts)
            if path.is_file() and not hidden and path.suffix != ".pyc" and (kept is None or rel.as_posix() in kept):
                found[rel.as_posix()] = path.read_bytes()
        found.update((name, path.read_bytes()) for name, path in self.extras)
        if not found:
            raise FileNotFoundError(f"{', '.join(map(str, self.sources))}: no code to package")
        return dict(sorted(found.items()))

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

    def zip(self) -> bytes:
        """A reproducible zip of the files (fixed time and mode): the deploy Lambda's code."""
        raw = io.BytesIO()
        with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as archive:
            for rel, data in self.files.items():
                info = zipfile.ZipInfo(rel, date_time=FIXED_TIME)
                info.external_attr = 0o644 << 16
                archive.writestr(info, data)
        return raw.getvalue()

    def uri(self, s3_root: str) -> str:
        """What a step references: the tarball if packed (training), else the folder (processing)."""
        return self.s3_prefix(s3_root) + ("sourcedir.tar.gz" if self.packed else "")

    def uploads(self, s3_root: str) -> dict[str, bytes]:
        """S3 URI -> bytes to upload for this bundle."""
        if self.packed:
            return {self.uri(s3_root): self.tarball()}
        return {self.s3_prefix(s3_root) + rel: data for rel, data in self.files.items()}


def deployables(root: Path | None = None) -> list[str]:
    """The subpackages of `steps`, each one deployable with its own bundle."""
    return sorted(path.parent.name for path in ((root or PROJECT_ROOT) / "steps").glob("*/__init__.py"))


def bundles(root: Path | None = None) -> dict[str, CodeBundle]:
    """Name -> bundle of the project at `root` (this one by default): one per subpackage of `steps`, with the
    package's top-level modules (a processing step's with the entry point, the Lambda's without), and `training`."""
    root = root or PROJECT_ROOT
    steps, entry_point = root / "steps", root / ENTRY_POINT
    shared = [path for path in sorted(steps.glob("*.py")) if path != entry_point]
    found = {}
    for name in deployables(root):
        processing = (entry_point,) if (steps / name / "__main__.py").is_file() else ()
        found[name] = CodeBundle(name, root, (*shared, *processing, steps / name), packed=False)
    training = CodeBundle("training", root / "training", (root / "training",), packed=True,
                          extras=(("tracking.py", steps / "tracking.py"),))
    return {**found, "training": training}


def job_bundles() -> list[CodeBundle]:
    """The bundles that jobs read from S3 (every one but the deploy Lambda's, which goes up as the Lambda's zip)."""
    return [bundle for name, bundle in bundles().items() if name != LAMBDA]
