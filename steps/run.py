"""Entry point of the processing containers: `python3 steps/run.py STEP [ARGS...]`, STEP a subpackage of `steps`
with a `__main__` (tokenize, evaluation).

Installs what the image lacks of the libraries STEP imports (the lines of `steps/STEP/requirements.txt`), then runs
the package `steps.STEP` with ARGS as `python3 -m steps.STEP ARGS` would. With a `wheels` input (a VPC without
internet, `images.wheels`), pip installs from those files only; otherwise from PyPI with short timeouts, so that
a missing route fails in seconds rather than hangs.

pip only ever adds packages: every distribution the image has is pinned to its version in a constraints
file, so pip picks versions of the missing packages that fit the image (e.g. a datasets release that accepts
the image's huggingface_hub) or fails. Either way the step stops with one line unless afterwards every needed
module imports and every package of the image is unchanged (pip exits 0 on some resolver conflicts).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import importlib.metadata
import os
import re
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    from packaging.version import InvalidVersion, Version
except ImportError:  # an image without packaging still has pip, which run.py needs anyway
    from pip._vendor.packaging.version import InvalidVersion, Version

HERE = Path(__file__).resolve().parent
if Path(sys.path[0] or ".").resolve() == HERE:  # started as a file: the package's root, not its folder, on sys.path
    sys.path[0] = str(HERE.parent)
WHEELS = Path(os.environ.get("STEP_WHEELS_DIR", "/opt/ml/processing/input/wheels"))
HUB_SOURCE_NEEDS = ("datasets",)  # tokenize reads a Hub dataset with datasets.load_dataset, and only that needs it


class StepError(Exception):
    """An expected failure: main() prints it as one line and exits 1."""


def steps() -> list[str]:
    """The steps run.py runs: the subpackages with a `__main__`."""
    return sorted(path.parent.name for path in HERE.glob("*/__main__.py"))


def requirements(step: str) -> dict[str, str]:
    """Module name -> requirement line of the step's requirements.txt (a project's name is its module's there)."""
    path = HERE / step / "requirements.txt"
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {re.split(r"[<>=!~\[; ]", line)[0].replace("-", "_"): line for line in lines if line}


def importable(module: str) -> bool:
    """Whether `module` is found among the libraries."""
    return importlib.machinery.PathFinder.find_spec(module) is not None


def import_error(modules: tuple[str, ...]) -> str | None:
    """The first error of importing `modules` in a fresh interpreter, as `module: Error: message`, else None."""
    code = (
        "import importlib, sys\n"
        f"for module in {list(modules)!r}:\n"
        "    try:\n"
        "        importlib.import_module(module)\n"
        "    except Exception as e:\n"
        "        sys.exit(f'{module}: {type(e).__name__}: ' + (str(e).splitlines() or [''])[0])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return (result.stderr.strip().splitlines() or ["(no message)"])[-1] if result.returncode else None


def installed() -> dict[str, str]:
    """Normalized project name -> version of every distribution on sys.path; the first one found wins, as in
    `import`."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name, version = dist.metadata["Name"], dist.version
        if name and version:
            found.setdefault(re.sub(r"[-_.]+", "-", name).lower(), version)
    return found


def pin(name: str, version: str) -> str:
    """`name==version`, or `name===version` (string equality) for a version that is not PEP 440."""
    try:
        Version(version)
    except InvalidVersion:
        return f"{name}==={version}"
    return f"{name}=={version}"


def pins(packages: dict[str, str]) -> str:
    """A pip constraints file holding each package at its version."""
    return "".join(pin(name, version) + "\n" for name, version in sorted(packages.items()))


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """'name old -> new' for each package of `before` whose version changed or that is gone."""
    return [f"{name} {old} -> {after.get(name, 'removed')}" for name, old in sorted(before.items())
            if after.get(name) != old]


def pip_command(lines: list[str], constraints: Path, wheels: Path = WHEELS) -> list[str]:
    """The pip command that installs `lines` within `constraints`: from `wheels` alone when that folder holds any."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
               "--constraint", str(constraints)]
    if wheels.is_dir() and any(wheels.iterdir()):
        return [*command, "--no-index", "--find-links", str(wheels), *lines]
    return [*command, "--timeout", "20", "--retries", "2", *lines]


def needed_modules(step: str, args: list[str]) -> tuple[str, ...]:
    """The libraries `step` imports with these arguments: those of its requirements.txt, but tokenize needs datasets
    for a Hub dataset source only (not `sample[:N]`, `s3://...` or a local folder)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--source")
    try:
        source = parser.parse_known_args(args)[0].source  # as the step's own parser reads it: the last one given
    except SystemExit:  # `--source` without a value: the step's parser says so
        source = None
    local = step == "tokenize" and source and (source.startswith(("sample", "s3://")) or Path(source).exists())
    return tuple(m for m in requirements(step) if not (local and m in HUB_SOURCE_NEEDS))


def ensure_requirements(needed: tuple[str, ...], wanted: dict[str, str], wheels: Path = WHEELS) -> None:
    """pip-install the requirement of each module of `needed` that cannot be imported, changing nothing installed.

    Raises StepError when pip fails, when a package changed, or when a needed module does not import afterwards."""
    missing = [m for m in needed if not importable(m)]
    if not missing:
        return
    lines = [wanted[m] for m in missing if m in wanted]
    before = installed()
    print(f"run.py: installing {', '.join(lines)} (missing: {', '.join(missing)}), "
          f"the image's {len(before)} packages pinned", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        constraints = Path(scratch) / "image-constraints.txt"
        constraints.write_text(pins(before))
        code = subprocess.run(pip_command(lines, constraints, wheels)).returncode
    if code != 0:
        raise StepError(f"pip could not install {', '.join(lines)} with the image's packages pinned "
                        f"(exit {code}; pip's reason is above)")
    importlib.invalidate_caches()
    changed = changes(before, installed())
    if changed:
        raise StepError(f"pip changed packages of the image: {', '.join(changed)}")
    error = import_error(needed)
    if error:
        raise StepError(f"after installing {', '.join(lines)}, {error}")


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in steps():
        sys.exit(f"usage: run.py STEP [ARGS...], STEP one of: {', '.join(steps())}")
    step = sys.argv[1]
    try:
        ensure_requirements(needed_modules(step, sys.argv[2:]), requirements(step))
    except StepError as error:
        sys.exit(f"run.py: {error}")
    sys.argv = [str(HERE / step), *sys.argv[2:]]
    runpy.run_module(f"steps.{step}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
