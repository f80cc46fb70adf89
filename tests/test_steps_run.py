"""steps/run.py: what the processing entry point installs, and from where."""

from __future__ import annotations

from fixtures_ml import load_step


def test_requirements_cover_every_needed_module():
    run = load_step("run")
    wanted = run.requirements()
    assert set(run.NEEDED_MODULES) <= set(wanted)
    assert wanted["evaluate"].startswith("evaluate>=")


def test_pip_installs_from_staged_wheels_only_when_there_are_some(tmp_path):
    run = load_step("run")
    online = run.pip_command(["datasets>=2.19"], wheels=tmp_path / "absent")
    assert "--no-index" not in online and online[online.index("--timeout") + 1] == "20"
    (tmp_path / "datasets-3.0.0-py3-none-any.whl").write_bytes(b"")
    staged = run.pip_command(["datasets>=2.19"], wheels=tmp_path)
    assert staged[-4:] == ["--no-index", "--find-links", str(tmp_path), "datasets>=2.19"]


def test_only_step_scripts_can_be_run_and_each_exists():
    run = load_step("run")
    assert all((run.HERE / f"{step}.py").is_file() for step in run.STEPS)
    assert "reviews" not in run.STEPS and "readers" not in run.STEPS  # helpers of preprocess, not steps
