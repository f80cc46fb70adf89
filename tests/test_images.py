"""Each processing step's real entry point, run with the Python packages of its image, install path included.

Tokenize (`images.processing`) and Evaluate (`images.evaluation`, default `images.inference`) both run on the CPU
inference image. CI builds a venv from its package set (`tests/images/venv.sh inference DIR`) and points
IMAGE_VENV_INFERENCE at it; the tests that need it are skipped without it. A test runs
`steps/run.py` in a fresh overlay of that venv: a venv of its own whose `.pth` file puts the image venv's packages
after its own, so that what pip installs lands in the overlay and the image venv stays as built (like a new
container each time). pip reaches PyPI, as a job with internet does. The step must succeed, and no package of the
image may change: run.py may only add.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from fixtures_ml import CORPUS, ROOT, step_arguments, write_tokenized

IMAGES = ROOT / "tests" / "images"
VENVS = {"inference": os.environ.get("IMAGE_VENV_INFERENCE")}
# images.KEY -> its package set (inference_neuron: the Dockerfile's pins alone, see its header)
SETS = {"processing": "inference", "training": "training", "inference": "inference",
        "inference_neuron": "inference_neuron"}


def needs(name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not VENVS[name], reason=f"IMAGE_VENV_{name.upper()} not set (CI sets it)")


def step_env() -> dict[str, str]:
    """This environment for a step, minus what would mix this project's Python into the image's; with bytecode kept
    (the images ship theirs)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV")}
    return {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def overlay(image_venv: Path, folder: Path) -> Path:
    """A fresh venv over `image_venv` (see the module docstring); returns its python."""
    subprocess.run([str(image_venv / "bin" / "python"), "-m", "venv", "--without-pip", str(folder)], check=True)
    (site,) = (folder / "lib").glob("python3*/site-packages")
    (base,) = (image_venv / "lib").glob("python3*/site-packages")
    (site / "image.pth").write_text(f"{base}\n")
    return folder / "bin" / "python"


def packages(python: Path) -> dict[str, str]:
    """Normalized name -> version of what `pip list` sees with this python."""
    out = subprocess.run([str(python), "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"],
                         capture_output=True, text=True, check=True, env=step_env()).stdout
    return {re.sub(r"[-_.]+", "-", p["name"]).lower(): p["version"] for p in json.loads(out)}


def image_set(name: str) -> dict[str, str]:
    """The pins of tests/images/NAME.txt that tests/images/venv.sh installs, with their `# here-python:` stand-ins."""
    text = (IMAGES / f"{name}.txt").read_text()
    lines = re.findall(r"^([A-Za-z0-9][^=\s]*)==(\S+)$", text, re.M)
    here = re.search(r"^# here-python: (.*)$", text, re.M)
    lines += [tuple(pin.split("==")) for pin in (here.group(1).split() if here else [])]
    return {re.sub(r"[-_.]+", "-", n).lower(): v for n, v in lines}


def image_tokenizer(python: Path, folder: Path) -> Path:
    """A tokenizer saved by the image's transformers (as a Hub model's files load there)."""
    build = "import sys; sys.path.insert(0, sys.argv[1]); import fixtures_ml as f; from pathlib import Path; " \
            "f.build_tokenizer(Path(sys.argv[2]))"
    subprocess.run([str(python), "-c", build, str(ROOT / "tests"), str(folder)], check=True, env=step_env())
    return folder


def run_step(python: Path, step: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), str(ROOT / "steps" / "run.py"), step, *args], capture_output=True, text=True,
                          env=step_env(), cwd=python.parents[2], timeout=1200)


def check_only_added(before: dict[str, str], after: dict[str, str], proc: subprocess.CompletedProcess) -> None:
    changed = [f"{n} {v} -> {after.get(n, 'removed')}" for n, v in sorted(before.items()) if after.get(n) != v]
    assert not changed, f"the step's install changed packages the image ships: {changed}\n{proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("name", ["inference"])
def test_the_venv_holds_its_images_package_set(name):
    if not VENVS[name]:
        pytest.skip(f"IMAGE_VENV_{name.upper()} not set (CI sets it)")
    have = packages(Path(VENVS[name]) / "bin" / "python")
    wrong = {n: (v, have.get(n)) for n, v in image_set(name).items() if have.get(n) != v}
    assert not wrong, f"rebuild it with tests/images/venv.sh {name}: set version vs installed {wrong}"


def test_the_package_sets_are_of_the_configured_images():
    config = (ROOT / "pipeline.yaml").read_text()
    for key, name in SETS.items():
        tag = re.search(rf"^\s*{key}: \S+/(\S+)$", config, re.M).group(1)
        assert (IMAGES / f"{name}.txt").read_text().startswith(f"# images.{name} = {tag} "), key


@needs("inference")
def test_tokenize_in_its_image_adds_packages_and_changes_none(tmp_path):
    python = overlay(Path(VENVS["inference"]), tmp_path / "job")
    tokenizer = image_tokenizer(python, tmp_path / "tokenizer")
    before = packages(python)
    assert "pyarrow" not in before, "the install path must run"
    proc = run_step(python, "tokenize", *step_arguments("Tokenize"),
                    "--source", "sample:120", "--model-id", str(tokenizer), "--max-length",
                    "64", "--validation-share", "0.2", "--output-dir", str(tmp_path / "out"))
    after = packages(python)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_only_added(before, after, proc)
    assert "pyarrow" in after and "datasets" not in after  # a Hub source alone needs datasets
    assert before["transformers"] == after["transformers"] == image_set("inference")["transformers"]
    stats = json.loads((tmp_path / "out" / "stats" / "stats.json").read_text())
    assert all(stats["output"][split]["rows"] > 0 for split in ("train", "validation", "test")), stats["output"]
    assert list((tmp_path / "out" / "test").glob("*.parquet"))


@needs("inference")
def test_evaluate_in_the_inference_image_adds_packages_and_changes_none(tmp_path):
    python = overlay(Path(VENVS["inference"]), tmp_path / "job")
    model = tmp_path / "model"
    build = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); import fixtures_ml as f; "
             "m = Path(sys.argv[2]); f.build_model(m, f.build_tokenizer(m.parent / 'tok')); f.add_serving_code(m)")
    subprocess.run([str(python), "-c", build, str(ROOT / "tests"), str(model)], check=True, env=step_env())
    from transformers import AutoTokenizer

    enc = AutoTokenizer.from_pretrained(str(model))(CORPUS * 4, return_token_type_ids=True)
    labels = [i % 2 for i in range(len(CORPUS) * 4)]
    write_tokenized(tmp_path / "test", enc["input_ids"], enc["token_type_ids"], labels)
    before = packages(python)
    assert "datasets" not in before and "pyarrow" not in before, "the install path must run"
    proc = run_step(python, "evaluation", *step_arguments("Evaluate"),
                    "--model-dir", str(model), "--test-dir", str(tmp_path / "test"),
                    "--output-dir", str(tmp_path / "evaluation"), "--sample-size", "16",
                    "--train-dir", str(tmp_path / "test"), "--baseline-rows", "1000")  # the baseline on the image's
    after = packages(python)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_only_added(before, after, proc)
    assert {"datasets", "evaluate", "pyarrow", "onnxruntime", "onnx"} <= set(after)
    assert before["transformers"] == after["transformers"] == image_set("inference")["transformers"]
    report = json.loads((tmp_path / "evaluation" / "evaluation.json").read_text())
    assert report["dataset"]["rows"] == len(labels) and report["baseline"]["train_rows"] == len(labels)
    assert 0 <= report["binary_classification_metrics"]["accuracy"]["value"] <= 1
    assert report["inference"]["quantize"] in ("int8", "none")
    assert report["inference"]["onnx"] and report["inference"]["onnx"]["onnxruntime"], report["inference"]  # built here


@needs("inference")
def test_tokenize_of_a_hub_dataset_installs_datasets_and_changes_nothing(tmp_path):
    """The default data.source is a Hub dataset: datasets must install and import in the image (the load itself
    then fails here, offline, as it should: the job has no Hub to reach)."""
    python = overlay(Path(VENVS["inference"]), tmp_path / "job")
    before = packages(python)
    assert "datasets" not in before, "the install path must run"
    proc = run_step(python, "tokenize", *step_arguments("Tokenize"), "--source", "amazon_polarity", "--model-id",
                    str(image_tokenizer(python, tmp_path / "tokenizer")), "--output-dir", str(tmp_path / "out"))
    after = packages(python)
    check_only_added(before, after, proc)
    assert "datasets" in after, proc.stdout + proc.stderr
    assert proc.returncode != 0 and "run.py:" not in proc.stderr, proc.stdout + proc.stderr  # not an install failure
    assert "offline" in (proc.stdout + proc.stderr).lower(), proc.stdout + proc.stderr
