"""The contract: scripts under steps/ and training/ keep copies of pipeline/contract.py's values (they run in
AWS containers and cannot import pipeline/); each copy must equal the contract. And the code's shape: module
sizes and no import cycle in pipeline/."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import pipeline
from pipeline import contract
from pipeline.config import Training

ROOT = Path(__file__).resolve().parents[1]
COPIES = [  # (script, its constant, the contract's value)
    ("training/train.py", "STATS_FILE", contract.STATS_FILE),
    ("training/train.py", "PREDICTIONS_FILE", contract.PREDICTIONS_FILE),
    ("steps/evaluate.py", "PREDICTIONS_FILE", contract.PREDICTIONS_FILE),
    ("steps/evaluate.py", "REPORT_FILE", contract.REPORT_FILE),
    ("steps/evaluate.py", "MODEL_ARCHIVE", contract.MODEL_ARCHIVE),
    ("steps/evaluate.py", "SERVING_DIR", contract.SERVING_DIR),
    ("steps/preprocess.py", "SPLITS", contract.SPLITS),
    ("steps/deploy.py", "APPROVED", contract.APPROVED),
    ("steps/deploy.py", "MODEL_PACKAGE_EVENT", contract.MODEL_PACKAGE_EVENT),
    ("training/inference.py", "MAX_PAYLOAD_BYTES", contract.MAX_PAYLOAD_BYTES),
    ("steps/endpoint_sample.py", "SAMPLE_FILE", contract.SAMPLE_FILE),
    ("steps/endpoint_check.py", "SAMPLE_FILE", contract.SAMPLE_FILE),
    ("steps/lifecycle.py", "APPROVED", contract.APPROVED),
    ("steps/sagemaker_endpoints.py", "APPROVED", contract.APPROVED),
    ("training/tracking.py", "TRACKING_URI_ENV", contract.TRACKING_URI_ENV),
    ("training/tracking.py", "EXPERIMENT_ENV", contract.EXPERIMENT_ENV),
    ("training/tracking.py", "EXECUTION_ENV", contract.EXECUTION_ENV),
    ("training/tracking.py", "EXECUTION_TAG", contract.EXECUTION_TAG),
    ("training/tracking.py", "UNTRACKED", contract.UNTRACKED),
]


def constants(path: Path) -> dict[str, object]:
    """The module-level NAME = literal assignments of a script, read without running it."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if all(isinstance(n, (ast.Constant, ast.BinOp, ast.Tuple, ast.operator, ast.expr_context))
                   for n in ast.walk(node.value)):  # literals and arithmetic on them, like 6 * 1024 * 1024
                found[node.targets[0].id] = eval(compile(ast.Expression(node.value), str(path), "eval"), {})
    return found


@pytest.mark.parametrize(("script", "name", "value"), COPIES, ids=[f"{s}:{n}" for s, n, _ in COPIES])
def test_script_copies_equal_the_contract(script, name, value):
    copies = constants(ROOT / script)
    assert name in copies, f"{script} no longer defines {name}: drop it from COPIES or restore it"
    assert copies[name] == value, f"{script} {name}={copies[name]!r}, the contract says {value!r}"


def test_the_gate_reads_what_evaluate_writes():
    source = (ROOT / "steps" / "evaluate.py").read_text()
    first, second = contract.ACCURACY_PATH.split(".")[:2]
    assert f'"{first}"' in source and f'"{second}"' in source
    for path in (contract.QUANTIZE_PATH, contract.RUNTIME_PATH):  # the registered environment's JsonGet paths
        assert all(f'"{key}"' in source for key in path.split(".")), path


def test_train_argparse_defaults_equal_the_config_defaults():
    """Hyperparameters the definition leaves out fall back to train.py's defaults: they must be the config's."""
    spec = importlib.util.spec_from_file_location("train_defaults", ROOT / "training" / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    parsed = vars(train.parse_args([]))
    fields = {name: f.default for name, f in Training.model_fields.items()}
    shared = sorted(set(parsed) & set(fields))
    assert len(shared) >= 12, shared
    for name in shared:
        default = parsed[name]
        if name == "bf16":
            default = {"true": True, "false": False}.get(str(default).lower(), default)
        assert default == fields[name], f"train.py --{name.replace('_', '-')} {default!r} != training.{name}"
    for refused in ("0", "-2"):  # as the config refuses them: -1 is the one value meaning "no limit"
        with pytest.raises(SystemExit):
            train.parse_args(["--max-steps", refused])
    assert train.parse_args(["--max-steps", "1"]).max_steps == 1


def modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(pipeline.__path__, "pipeline.")]


def test_modules_stay_small():
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
        for folder in ("pipeline", "steps", "training")
        for path in (ROOT / folder).rglob("*.py")
    }
    too_big = {path: n for path, n in sizes.items() if n > 400 and path != "training/train.py"}
    assert not too_big, f"modules over 400 lines: {too_big}"
    assert sizes["pipeline/cli.py"] < 250


def test_pipeline_has_no_import_cycle():
    """Module-level imports between pipeline's modules form a DAG (imports inside functions are lazy by design)."""
    names = set(modules())
    graph: dict[str, set[str]] = {}
    for name in names:
        spec = importlib.util.find_spec(name)
        tree = ast.parse(Path(spec.origin).read_text())
        package = name if spec.submodule_search_locations else name.rpartition(".")[0]
        deps = set()
        for node in tree.body:
            if isinstance(node, ast.Import):
                deps |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
                deps |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        graph[name] = {d for d in deps if d in names and d != name}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(dep):], dep]))
            if dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
