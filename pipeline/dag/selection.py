"""Running part of a pipeline: selected steps (`--steps ... --from`) and retries, with the service's rules checked on
the flattened definition before anything starts. One check for both backends: the local runner obeys it, and on
AWS it refuses in one line what StartPipelineExecution or RetryPipelineExecution would refuse later.

The rules (SageMaker's "Selective execution of pipeline steps"): the selected steps are connected in the DAG and
every step on a path between two of them is selected too; a dependency of a selected step (a property or property
file it reads, a DependsOn, the condition of its branch) is selected or succeeded in the source execution, whose
outputs stand in for it; the source ended Succeeded or Failed (not Stopped); unselected steps downstream of the
selection do not run. A retry re-runs the definition the execution ran, so it is refused when the code and config
now make another one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.dag.graph import StepGraph, changed_steps, flatten_steps
from pipeline.errors import UserError

# StartPipelineExecution's SelectiveExecutionConfig.SourcePipelineExecutionArn: "Failed or Success" (botocore's
# model; the developer guide: Succeeded or Failed). A Stopped execution is refused by the service.
SOURCE_STATUSES = ("Succeeded", "Failed")
RETRYABLE = ("Failed", "Stopped")
RERUN = ("Failed", "Stopped")  # step statuses a retry (or the selection replacing one) runs again


class SelectionError(UserError, ValueError):
    """A selection of steps, a source execution or a retry that the service would refuse, said in one line."""


@dataclass(frozen=True)
class Source:
    """The execution whose outputs stand in for the unselected steps."""

    id: str
    pipeline: str
    status: str
    steps: dict[str, str] | None  # step -> status; None where the steps cannot be listed (moto)


@dataclass(frozen=True)
class Selection:
    """What a selective run does: `steps` run, `reused` (their unselected upstream steps) take their outputs
    from `source`, `not_run` (unselected steps downstream) do not run. All in run order."""

    steps: list[str]
    reused: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)
    source: Source | None = None

    def request(self, source_arn: str | None) -> dict:
        """StartPipelineExecution's SelectiveExecutionConfig (the source's ARN left out when there is none)."""
        config: dict[str, Any] = {"SelectedSteps": [{"StepName": name} for name in self.steps]}
        if source_arn:
            config["SourcePipelineExecutionArn"] = source_arn
        return config


def parse_steps(values: Iterable[str]) -> list[str]:
    """`--steps A,B --steps C` -> [A, B, C] (blanks and repeats dropped)."""
    names: list[str] = []
    for value in values:
        names += [n.strip() for n in value.split(",") if n.strip() and n.strip() not in names]
    return names


def _closure(start: Iterable[str], edges: Mapping[str, set[str]]) -> set[str]:
    found: set[str] = set()
    pending = list(start)
    while pending:
        for nxt in edges[pending.pop()] - found:
            found.add(nxt)
            pending.append(nxt)
    return found


def _children(graph: StepGraph) -> dict[str, set[str]]:
    children: dict[str, set[str]] = {name: set() for name in graph.steps}
    for name, needs in graph.depends.items():
        for parent in needs:
            children[parent].add(name)
    return children


def _ordered(graph: StepGraph, names: Iterable[str]) -> list[str]:
    chosen = set(names)
    return [name for name in graph.order if name in chosen]


def _listed(names: Iterable[str]) -> str:
    return "[" + ", ".join(names) + "]"


def _check_shape(graph: StepGraph, chosen: set[str], children: dict[str, set[str]]) -> None:
    """Every step between two selected ones is selected, and the selection is connected."""
    for name in graph.order:
        if name in chosen:
            continue
        above = _closure([name], graph.depends) & chosen
        below = _closure([name], children) & chosen
        if above and below:
            raise SelectionError(
                f"--steps: {name} lies between the selected steps {_ordered(graph, above)[0]} and "
                f"{_ordered(graph, below)[0]}; every step on a path between two selected steps must be selected too"
            )
    order = _ordered(graph, chosen)
    reached, pending = {order[0]}, [order[0]]
    while pending:
        name = pending.pop()
        for near in (graph.depends[name] | children[name]) & chosen - reached:
            reached.add(near)
            pending.append(near)
    apart = [name for name in order if name not in reached]
    if apart:
        raise SelectionError(
            f"--steps: the selected steps must be connected in the DAG, and {order[0]} and {apart[0]} are not "
            "(no path joins them through selected steps); select the steps between them or run them apart"
        )


def select(definition: dict, names: list[str], source: Source | None, pipeline: str) -> Selection:
    """The selection of `names` in `definition`, taking what it needs from `source`; SelectionError when the
    service would refuse it (the message names the step at fault)."""
    graph = StepGraph(definition)
    if not names:
        raise SelectionError("--steps: expected at least one step name")
    unknown = [n for n in names if n not in graph.steps]
    if unknown:
        raise SelectionError(f"--steps {unknown[0]}: no such step; the steps are {', '.join(graph.order)}")
    chosen = set(names)
    children = _children(graph)
    _check_shape(graph, chosen, children)
    if source is not None:
        if source.pipeline.lower() != pipeline.lower():
            raise SelectionError(f"--from {source.id}: an execution of pipeline {source.pipeline}, not {pipeline}")
        if source.status not in SOURCE_STATUSES:
            raise SelectionError(
                f"--from {source.id}: the execution is {source.status}; a source must have ended "
                f"{' or '.join(SOURCE_STATUSES)} (SageMaker refuses any other as SourcePipelineExecutionArn)"
            )
    needs = {d for name in chosen for d in graph.depends[name]} - chosen
    missing = set(needs)
    if source is not None:
        missing = {d for d in needs if source.steps is not None and source.steps.get(d) != "Succeeded"}
    if missing:
        dependants = _ordered(graph, {n for n in chosen if graph.depends[n] & missing})
        if source is None:
            raise SelectionError(
                f"--steps: the selected steps {_listed(dependants)} have dependencies on "
                f"{_listed(_ordered(graph, missing))}; select them too or pass --from EXECUTION, one where they "
                "succeeded"
            )
        status = {d: (source.steps or {}).get(d, "not run") for d in missing}
        raise SelectionError(
            f"--from {source.id}: the selected steps {_listed(dependants)} have dependencies on "
            f"{_listed(_ordered(graph, missing))}, which did not succeed in {source.id} ("
            + ", ".join(f"{d}: {status[d]}" for d in _ordered(graph, missing))
            + "); select them too or choose another execution"
        )
    upstream = _closure(chosen, graph.depends) - chosen
    if source is not None and source.steps is not None:
        upstream = {n for n in upstream if source.steps.get(n) == "Succeeded"}
    downstream = _closure(chosen, children) - chosen
    return Selection(_ordered(graph, chosen), _ordered(graph, upstream), _ordered(graph, downstream), source)


def inherit(definition: dict, source: Mapping[str, Any], overrides: Mapping[str, str]) -> dict[str, str]:
    """Parameters of a selective run: the source execution's values of the parameters the definition declares,
    then the --param overrides (as SageMaker's `build_parameters_from_execution` does)."""
    declared = {p["Name"] for p in definition.get("Parameters", [])}

    def text(value: Any) -> str:
        return str(value).lower() if isinstance(value, bool) else str(value)

    return {**{k: text(v) for k, v in source.items() if k in declared}, **overrides}


def downstream_of(definition: dict, names: Iterable[str]) -> list[str]:
    """`names` (those the definition has) and every step downstream of them, in run order."""
    graph = StepGraph(definition)
    start = set(names) & graph.steps.keys()
    return _ordered(graph, start | _closure(start, _children(graph)))


def check_retry(execution: str, status: str, ran: dict, current: dict, rerun: Iterable[str]) -> None:
    """Refuse a retry the service would refuse or that would not do what the user expects: the execution has not
    ended in failure, or the code and config now make another definition than the one it ran (a retry re-runs that
    one, unchanged). `rerun`: its failed and stopped steps, for the command to use instead."""
    if status not in RETRYABLE:
        why = "it is still running" if status in ("Executing", "Stopping") else "there is nothing to retry"
        raise SelectionError(f"execution {execution} is {status}: {why} (only a Failed or Stopped one can be retried)")
    steps = flatten_steps(ran.get("Steps", []))
    fail_steps = [name for name in rerun if steps.get(name, {}).get("Type") == "Fail"]
    if fail_steps:  # SageMaker: "You cannot retry a pipeline execution ending with a FailStep"
        raise SelectionError(f"execution {execution} ended in its FailStep {fail_steps[0]}, which a retry would only "
                             f"reach again (SageMaker retries no such execution): start a new one, or start --steps "
                             f"... --from {execution} to reuse the steps that succeeded")
    diff = changed_steps(ran, current)
    if not any(diff.values()) and ran.get("Parameters") == current.get("Parameters"):
        return  # the same steps and parameters (whatever else the service keeps beside them)
    changed = diff["changed"] + diff["added"]
    what = ", ".join(changed + [f"{n} (removed)" for n in diff["removed"]]) or "the parameters"
    steps = downstream_of(current, [*changed, *rerun])
    instead = (
        f"upsert, then start --steps {','.join(steps)} --from {execution}" if steps else "upsert, then start"
    )
    raise SelectionError(
        f"execution {execution} ran another definition than the current code and config make (changed: {what}); "
        f"a retry re-runs the one it ran, unchanged. To run the current one from where it stopped: {instead} "
        "(with the same --set options as that run)"
    )
