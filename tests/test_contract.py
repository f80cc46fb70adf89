"""The contract: steps/ imports steps/contract.py; training/ (its own bundle) keeps copies of the values it needs, and
each copy must equal the contract. And the code's shape: a thin CLI, no import cycle in pipeline/."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import pipeline
from pipeline.config import load_config
from steps import contract

ROOT = Path(__file__).resolve().parents[1]
COPIES = [  # (script, its constant, the contract's value): training/ runs from its own bundle, without steps/
    ("training/train.py", "STATS_FILE", contract.STATS_FILE),
    ("training/train.py", "PREDICTIONS_FILE", contract.PREDICTIONS_FILE),
    ("training/inference.py", "MAX_PAYLOAD_BYTES", contract.MAX_PAYLOAD_BYTES),
    ("training/inference.py", "VARIANT_ATTRIBUTE", contract.VARIANT_ATTRIBUTE),
    ("steps/tracking.py", "TRACKING_URI_ENV", contract.TRACKING_URI_ENV),
    ("steps/tracking.py", "EXPERIMENT_ENV", contract.EXPERIMENT_ENV),
    ("steps/tracking.py", "EXECUTION_ENV", contract.EXECUTION_ENV),
    ("steps/tracking.py", "EXECUTION_TAG", contract.EXECUTION_TAG),
    ("steps/tracking.py", "UNTRACKED", contract.UNTRACKED),
    ("steps/tracking.py", "TRACKING_FILE", contract.TRACKING_FILE),
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
    source = (ROOT / "steps" / "evaluation" / "evaluate.py").read_text()
    first, second = contract.ACCURACY_PATH.split(".")[:2]
    assert f'"{first}"' in source and f'"{second}"' in source
    for path in (contract.QUANTIZE_PATH, contract.RUNTIME_PATH):  # the registered environment's JsonGet paths
        assert all(f'"{key}"' in source for key in path.split(".")), path


def test_train_py_requires_what_the_train_step_passes_and_defaults_none_of_it():
    """The config is the one home of the hyperparameters' defaults: train.py requires each one the Train step
    passes (none silently defaulted), and parses the step's command line to the config's values."""
    from pipeline.definition import step_arguments

    spec = importlib.util.spec_from_file_location("train_required", ROOT / "training" / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    cfg = load_config(ROOT / "pipeline.yaml", environ={})
    given = step_arguments(cfg, "Train")
    keys = given[::2]
    assert len(keys) >= 16 and "--epochs" in keys and "--learning-rate" in keys
    parsed = train.parse_args(given)
    assert (parsed.epochs, parsed.max_length, parsed.seed) == (cfg.training.epochs, cfg.training.max_length,
                                                               cfg.training.seed)
    for key in keys:
        left_out = [part for k, v in zip(given[::2], given[1::2], strict=True) if k != key for part in (k, v)]
        with pytest.raises(SystemExit):
            train.parse_args(left_out)
    for refused in ("0", "-2"):  # as the config refuses them: -1 is the one value meaning "no limit"
        with pytest.raises(SystemExit):
            train.parse_args([*given, "--max-steps", refused])
    assert train.parse_args([*given, "--max-steps", "1"]).max_steps == 1


@pytest.mark.parametrize("step, module, values", [
    ("Tokenize", "steps.tokenize.preprocess", {"max_length": 128, "validation_share": 0.05, "max_bad_share": 0.01}),
    ("Evaluate", "steps.evaluation.evaluate", {"sample_size": 4000, "min_agreement": 0.99, "int8_tolerance": 0.005,
                                                "fp16_tolerance": 0.005}),
])
def test_the_step_scripts_require_what_their_step_passes_and_default_none_of_it(step, module, values):
    """As train.py: each value the config gives a processing step is required by its script (the container's
    folders keep the defaults of the container contract)."""
    from pipeline.definition import step_arguments

    script = importlib.import_module(module)
    given = step_arguments(load_config(ROOT / "pipeline.yaml", environ={}), step)
    parsed = script.parse_args(given)
    assert {key: getattr(parsed, key) for key in values} == values
    options = [i for i, part in enumerate(given) if part.startswith("--") and not part.startswith("--no-")]
    assert len(options) >= 5
    for i in options:
        flag = i + 1 == len(given) or given[i + 1].startswith("--")
        left_out = given[:i] + given[i + (1 if flag else 2):]
        with pytest.raises(SystemExit):
            script.parse_args(left_out)


def modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(pipeline.__path__, "pipeline.")]


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
