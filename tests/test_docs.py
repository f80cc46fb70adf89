"""The README stays a short introduction, and every link of it and of docs/ leads to a file of the project."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_short_and_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for page in (ROOT / "docs").glob("*.md"):
        assert f"(docs/{page.name})" in readme, f"the README does not link {page.name}"


def test_every_relative_link_leads_to_a_file():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: {target} does not exist"


def test_paths_the_docs_name_exist():
    """A moved or renamed file must not leave the docs pointing at its old place."""
    for page in PAGES:
        for path in re.findall(r"`((?:steps|pipeline|training|tests|benchmarks|infra)/[\w/.-]+\.(?:py|txt|yaml|json))`",
                               page.read_text()):
            assert (ROOT / path).exists(), f"{page.relative_to(ROOT)} names {path}, which does not exist"


def test_ci_sets_up_with_the_readmes_first_command():
    first = re.search(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text()).group(1)
    assert first.startswith("python3 -m venv .venv") and "uv pip install" in first
    assert first in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_lifecycle_defaults_pipeline_yaml_names_are_the_code_s():
    """pipeline.yaml leaves deploy.test and deploy.auto_promote out (their one home is Policy) and says their values."""
    from steps.deploy.lifecycle import Policy
    from steps.deploy.targets import P95_MS

    said = dict(re.findall(r"^  # ((?:test\.)?\w+): (\S+) ", (ROOT / "pipeline.yaml").read_text(), re.M))
    policy = Policy()
    assert said == {"test.rows": str(policy.test_rows), "test.max_accuracy_drop": str(policy.max_accuracy_drop),
                    "test.p95_ms": "null", "test.p50_factor": str(policy.p50_factor),
                    "test.p50_overhead_ms": str(policy.p50_overhead_ms),
                    "auto_promote": str(policy.auto_promote).lower()}
    budgets = "CPU {cpu:.0f}, GPU {gpu:.0f}, Inferentia2 {neuron:.0f}".format(**P95_MS)  # the target's default
    assert f"target's: {budgets}; steps/deploy/targets.py" in (ROOT / "pipeline.yaml").read_text()
