"""Entry point of the processing containers: `python3 run.py STEP [ARGS...]`.

Installs `requirements.txt` (next to this file) when a package the steps need is missing from the
image, then runs `STEP.py` with ARGS as if it had been started directly.
"""

from __future__ import annotations

import importlib.util
import runpy
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NEEDED_MODULES = ("transformers", "datasets", "evaluate", "pyarrow")


def ensure_requirements() -> None:
    """pip-install requirements.txt once if any module of NEEDED_MODULES cannot be imported."""
    missing = [m for m in NEEDED_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        print(f"run.py: installing requirements.txt (missing: {', '.join(missing)})", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "-r", str(HERE / "requirements.txt")],
            check=True,
        )


def main() -> None:
    if len(sys.argv) < 2 or not (HERE / f"{sys.argv[1]}.py").is_file():
        steps = sorted(p.stem for p in HERE.glob("*.py") if p.stem != "run")
        sys.exit(f"usage: run.py STEP [ARGS...], STEP one of: {', '.join(steps)}")
    script = HERE / f"{sys.argv[1]}.py"
    ensure_requirements()
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path.insert(0, str(HERE))
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
