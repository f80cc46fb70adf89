"""The steps of a definition: flattened out of condition branches, with their dependencies and run order."""

from __future__ import annotations

import json
from typing import Any

from pipeline.dag.durations import expire_after
from pipeline.dag.expressions import ExpressionError

BRANCHES = ("IfSteps", "ElseSteps")


def branch_steps(step: dict) -> list[dict]:
    """The steps in a condition step's branches (none for other steps)."""
    if step.get("Type") != "Condition":
        return []
    return [s for branch in BRANCHES for s in step.get("Arguments", {}).get(branch, [])]


def flatten_steps(steps: list[dict]) -> dict[str, dict]:
    """Step name -> step, including the steps nested in condition branches."""
    found: dict[str, dict] = {}
    for step in steps:
        found[step["Name"]] = step
        found.update(flatten_steps(branch_steps(step)))
    return found


def step_references(node: Any, found: set[str] | None = None) -> set[str]:
    """Names of the steps a definition fragment refers to (its data dependencies)."""
    found = set() if found is None else found
    if isinstance(node, dict):
        reference = node.get("Get")
        if isinstance(reference, str) and reference.startswith("Steps."):
            found.add(reference.split(".")[1])
        for value in node.values():
            step_references(value, found)
    elif isinstance(node, list):
        for value in node:
            step_references(value, found)
    return found


def changed_steps(old: dict | None, new: dict) -> dict[str, list[str]]:
    """Steps added, removed and changed between two definitions (a condition counts its branches apart)."""

    def own(step: dict) -> str:
        if step.get("Type") != "Condition":
            return json.dumps(step, sort_keys=True)
        args = dict(step["Arguments"])
        for branch in BRANCHES:
            args[branch] = [s["Name"] for s in args.get(branch, [])]
        return json.dumps({**step, "Arguments": args}, sort_keys=True)

    before = flatten_steps(old["Steps"]) if old else {}
    after = flatten_steps(new["Steps"])
    return {
        "added": sorted(after.keys() - before.keys()),
        "removed": sorted(before.keys() - after.keys()),
        "changed": sorted(n for n in after.keys() & before.keys() if own(after[n]) != own(before[n])),
    }



class StepGraph:
    """Every step of the definition (condition branches included) with its dependencies, in run order."""

    def __init__(self, definition: dict) -> None:
        self.steps: dict[str, dict] = {}
        self.branch_of: dict[str, tuple[str, str]] = {}
        self._collect(definition["Steps"], None)
        self.depends: dict[str, set[str]] = {}
        for name, step in self.steps.items():
            args = step.get("Arguments", {})
            if step["Type"] == "Condition":
                args = args.get("Conditions", [])
            needs = step_references(args) | set(step.get("DependsOn", []))
            if name in self.branch_of:
                needs.add(self.branch_of[name][0])
            unknown = needs - self.steps.keys()
            if unknown:
                raise ExpressionError(f"step {name}: depends on unknown step {sorted(unknown)[0]}")
            fails = sorted(n for n in needs if self.steps[n]["Type"] == "Fail")
            if fails:  # a FailStep ends the execution: CreatePipeline refuses a step that waits on one
                raise ExpressionError(f"step {name}: depends on the FailStep {fails[0]}; SageMaker lets no step "
                                      f"depend on or refer to a FailStep")
            cache = step.get("CacheConfig") or {}
            if cache.get("Enabled") and cache.get("ExpireAfter"):
                try:
                    expire_after(cache["ExpireAfter"])
                except ValueError as e:
                    raise ExpressionError(f"step {name}: {e}") from None
            self.depends[name] = needs
        self.order = self._topological()

    def _collect(self, steps: list[dict], parent: tuple[str, str] | None) -> None:
        for step in steps:
            if step["Name"] in self.steps:
                raise ExpressionError(f"step {step['Name']}: defined twice")
            self.steps[step["Name"]] = step
            if parent:
                self.branch_of[step["Name"]] = parent
            for branch in BRANCHES if step["Type"] == "Condition" else ():
                self._collect(step["Arguments"].get(branch, []), (step["Name"], branch))

    def _topological(self) -> list[str]:
        order, done = [], set()
        pending = list(self.steps)
        while pending:
            ready = [n for n in pending if self.depends[n] <= done]
            if not ready:
                raise ExpressionError(f"steps {', '.join(pending)}: circular dependency")
            order.append(ready[0])
            done.add(ready[0])
            pending.remove(ready[0])
        return order
