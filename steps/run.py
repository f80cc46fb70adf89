"""Entry point of the processing containers: `python3 run.py STEP [ARGS...]`.

Installs what the image lacks of `requirements.txt` (next to this file), then runs `STEP.py` with ARGS as
if it had been started directly. With a `wheels` input (a VPC without internet, `images.wheels`), pip
installs from those files only; otherwise from PyPI with short timeouts, so that a missing route fails
in seconds rather than hangs.
"""

from __future__ import annotations

import importlib.util
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHEELS = Path(os.environ.get("STEP_WHEELS_DIR", "/opt/ml/processing/input/wheels"))
NEEDED_MODULES = ("transformers", "datasets", "evaluate", "pyarrow")
STEPS = ("preprocess", "evaluate")  # the scripts a processing step may run; the other modules are their helpers


def requirements(path: Path = HERE / "requirements.txt") -> dict[str, str]:
    """Module name -> requirement line of requirements.txt (a project's name is its module's here)."""
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {re.split(r"[<>=!~\[; ]", line)[0].replace("-", "_"): line for line in lines if line}


def pip_command(lines: list[str], wheels: Path = WHEELS) -> list[str]:
    """The pip command that installs `lines`: from `wheels` alone when that folder holds any."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if wheels.is_dir() and any(wheels.iterdir()):
        return [*command, "--no-index", "--find-links", str(wheels), *lines]
    return [*command, "--timeout", "20", "--retries", "2", *lines]


def ensure_requirements() -> None:
    """pip-install the requirement of each module of NEEDED_MODULES that cannot be imported."""
    missing = [m for m in NEEDED_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return
    wanted = requirements()
    lines = [wanted[m] for m in missing if m in wanted]
    print(f"run.py: installing {', '.join(lines)} (missing: {', '.join(missing)})", flush=True)
    subprocess.run(pip_command(lines), check=True)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in STEPS:
        sys.exit(f"usage: run.py STEP [ARGS...], STEP one of: {', '.join(STEPS)}")
    script = HERE / f"{sys.argv[1]}.py"
    ensure_requirements()
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path.insert(0, str(HERE))
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
