"""steps/run.py: what the processing entry point installs, from where, and that pip may only add packages.

The install tests run the real pip offline in a fresh venv over a stand-in image: a folder holding `shipped` 1.0
(like the inference image's huggingface_hub 0.30) and a wheels folder where the newest `needed` requires
`shipped>=2` (like datasets 5.2 and huggingface_hub>=1.31).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from steps import run


def test_each_step_has_its_own_requirements():
    assert run.steps() == ["evaluation", "tokenize"]
    tokenize, evaluation = run.requirements("tokenize"), run.requirements("evaluation")
    assert set(run.HUB_SOURCE_NEEDS) <= set(tokenize) and "evaluate" not in tokenize and "onnxruntime" not in tokenize
    assert evaluation["evaluate"].startswith("evaluate>=") and "onnxruntime" in evaluation


@pytest.mark.parametrize("args, datasets", [
    (["--source", "sample:2000"], False),
    (["--source=s3://bucket/polarity/"], False),
    (["--source", "amazon_polarity"], True),
    ([], True),  # no --source (the step refuses that): all it could need
])
def test_tokenize_needs_datasets_for_a_hub_source_only(args, datasets, tmp_path):
    assert ("datasets" in run.needed_modules("tokenize", args)) is datasets
    assert "datasets" not in run.needed_modules("tokenize", ["--source", str(tmp_path)])  # a local folder
    # the last --source counts, as in the step's own parser (a test's arguments follow the config's)
    assert "datasets" not in run.needed_modules("tokenize", ["--source", "owner/name", "--source=sample:5"])
    assert "datasets" in run.needed_modules("tokenize", ["--source", "sample:5", "--source", "owner/name"])
    assert {"datasets", "evaluate"} <= set(run.needed_modules("evaluation", args))


def test_pip_installs_within_the_constraints_from_staged_wheels_only_when_there_are_some(tmp_path):
    pins = tmp_path / "pins.txt"
    online = run.pip_command(["datasets>=2.19"], pins, wheels=tmp_path / "absent")
    assert "--no-index" not in online and online[online.index("--timeout") + 1] == "20"
    (tmp_path / "datasets-3.0.0-py3-none-any.whl").write_bytes(b"")
    staged = run.pip_command(["datasets>=2.19"], pins, wheels=tmp_path)
    assert staged[-4:] == ["--no-index", "--find-links", str(tmp_path), "datasets>=2.19"]
    assert all(command[command.index("--constraint") + 1] == str(pins) for command in (online, staged))


def test_pins_hold_every_version_exactly_and_changes_name_what_moved():
    assert run.pins({"torch": "2.6.0+cpu", "odd-tool": "1.0-custom-build", "numpy": "1.26.4"}) == (
        "numpy==1.26.4\nodd-tool===1.0-custom-build\ntorch==2.6.0+cpu\n")
    assert run.changes({"hub": "0.30.0", "numpy": "1.26.4", "gone": "1"}, {"hub": "2.4.0", "numpy": "1.26.4"}) == [
        "gone 1 -> removed", "hub 0.30.0 -> 2.4.0"]


def test_only_step_packages_can_be_run_and_run_py_puts_the_package_root_on_the_path(tmp_path):
    """Started as a file (the container's entry point, where the project is not installed), run.py puts the package's
    root on sys.path, not its own folder (where `tokenize` would shadow the standard library's module)."""
    import shutil

    assert "deploy" not in run.steps()  # the Lambda: no __main__
    shutil.copytree(run.HERE, tmp_path / "code" / "steps", ignore=shutil.ignore_patterns("__pycache__"))
    script = tmp_path / "code" / "steps" / "run.py"
    code = (f"import runpy, sys\nsys.argv, sys.path[0] = [{str(script)!r}, 'deploy'], {str(script.parent)!r}\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit as e:\n    print(e)\n"
            "import steps.contract, tokenize\nprint(steps.contract.__file__)\nprint(tokenize.__file__)\n")
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                           check=True).stdout.splitlines()
    assert lines[0] == "usage: run.py STEP [ARGS...], STEP one of: evaluation, tokenize"
    assert lines[1] == str(tmp_path / "code" / "steps" / "contract.py")  # the shipped copy, as in the container
    assert "steps" not in Path(lines[2]).parts  # the standard library's tokenize


def wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (), body: str = "") -> None:
    """A pure-Python wheel of module `name` whose VERSION is `version`."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": f"{body}\nVERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{dist}/RECORD", "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"]))


@pytest.fixture
def image(tmp_path: Path):
    """(job python, wheels folder): a fresh venv over `shipped` 1.0 and this Python's pip."""
    shipped = tmp_path / "image"
    (shipped / "shipped-1.0.dist-info").mkdir(parents=True)
    (shipped / "shipped-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: shipped\nVersion: 1.0\n")
    (shipped / "shipped.py").write_text("VERSION = '1.0'\n")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "job")], check=True)
    (site,) = (tmp_path / "job" / "lib").glob("python3*/site-packages")
    (site / "image.pth").write_text(f"{shipped}\n{sysconfig.get_paths()['purelib']}\n")  # the latter for pip
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel(wheels, "shipped", "2.0")
    wheel(wheels, "needed", "1.0", ("shipped>=2",))
    return tmp_path / "job" / "bin" / "python", wheels


def ensure(python: Path, wheels: Path, module: str = "needed") -> subprocess.CompletedProcess:
    """run.ensure_requirements for `module` from `wheels`, failing as run.py's main does."""
    code = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); import run\n"
            "try: run.ensure_requirements((sys.argv[3],), {sys.argv[3]: sys.argv[3]}, Path(sys.argv[2]))\n"
            "except run.StepError as e: sys.exit(f'run.py: {e}')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(python), "-c", code, str(run.HERE), str(wheels), module],
                          capture_output=True, text=True, env=env, timeout=300)


def version(python: Path, module: str) -> str:
    return subprocess.run([str(python), "-c", f"import {module}; print({module}.VERSION)"], capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.mark.slow  # pip installs into an image-like venv
def test_a_plain_pip_install_would_upgrade_what_the_image_ships(image):
    python, wheels = image
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels), "needed"],
                   check=True, capture_output=True)
    assert version(python, "shipped") == "2.0"  # the defect run.py must not have


@pytest.mark.slow  # pip installs into an image-like venv
def test_pip_adds_a_version_that_fits_the_image_and_changes_nothing(image):
    python, wheels = image
    wheel(wheels, "needed", "0.9", ("shipped>=1",))
    proc = ensure(python, wheels)
    assert proc.returncode == 0, proc.stderr
    assert (version(python, "needed"), version(python, "shipped")) == ("0.9", "1.0")


@pytest.mark.slow  # pip installs into an image-like venv
def test_no_version_that_fits_is_a_one_line_error_and_changes_nothing(image):
    python, wheels = image
    proc = ensure(python, wheels)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("run.py: pip could not install needed with the image's packages pinned (exit 1;")
    assert version(python, "shipped") == "1.0"


@pytest.mark.slow  # pip installs into an image-like venv
def test_a_package_that_installs_but_does_not_import_is_a_one_line_error(image):
    python, wheels = image
    wheel(wheels, "broken", "1.0", body="raise ImportError('broken requires NumPy 2.0 or newer, found 1.26.4')")
    proc = ensure(python, wheels, "broken")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "run.py: after installing broken, broken: ImportError: broken requires NumPy 2.0 or newer, found 1.26.4")
