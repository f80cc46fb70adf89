"""Evaluate the expressions of a SageMaker pipeline definition: Get, Std:Join, Std:JsonGet and conditions."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import UserError

TOKEN = re.compile(r"([^.\[\]]+)|\[(?:'([^']*)'|\"([^\"]*)\"|(\d+))\]")


class ExpressionError(UserError, ValueError):
    """An expression the local runner cannot evaluate; names the step and the expression."""


def property_path(path: str) -> list[str | int]:
    """`ProcessingOutputConfig.Outputs['test'].S3Output.S3Uri` -> ['ProcessingOutputConfig', 'Outputs', 'test', ...]."""
    tokens: list[str | int] = []
    position = 0
    for match in TOKEN.finditer(path):
        if match.start() != position and path[position : match.start()] != ".":
            raise ValueError(f"cannot parse property path {path!r}")
        name, single, double, index = match.groups()
        tokens.append(int(index) if index is not None else (name or single or double or ""))
        position = match.end()
    if position != len(path):
        raise ValueError(f"cannot parse property path {path!r}")
    return tokens


def lookup(data: Any, path: list[str | int], where: str) -> Any:
    for token in path:
        try:
            data = data[token]
        except (KeyError, IndexError, TypeError):
            raise ExpressionError(f"{where}: no value at {token!r}") from None
    return data


@dataclass
class Context:
    """What expressions can refer to: parameters, execution variables, step properties and property files."""

    parameters: dict[str, Any]
    execution: dict[str, Any]
    properties: dict[str, dict] = field(default_factory=dict)
    property_files: dict[tuple[str, str], Callable[[], Any]] = field(default_factory=dict)


def _get(reference: str, ctx: Context, where: str) -> Any:
    kind, _, rest = reference.partition(".")
    if kind == "Parameters":
        if rest not in ctx.parameters:
            raise ExpressionError(f"{where}: unknown parameter in {{'Get': {reference!r}}}")
        return ctx.parameters[rest]
    if kind == "Execution":
        if rest not in ctx.execution:
            raise ExpressionError(f"{where}: unsupported execution variable {{'Get': {reference!r}}}")
        value = ctx.execution[rest]
        return value() if callable(value) else value  # CurrentDateTime: the time it is read
    if kind == "Steps":
        step, _, path = rest.partition(".")
        if path.startswith("PropertyFiles."):
            loader = ctx.property_files.get((step, path.split(".", 1)[1]))
            if loader is None:
                raise ExpressionError(f"{where}: unknown property file {{'Get': {reference!r}}}")
            return loader
        if step not in ctx.properties:
            raise ExpressionError(f"{where}: step {step} has no properties yet in {{'Get': {reference!r}}}")
        return lookup(ctx.properties[step], property_path(path), f"{where}: {reference}")
    raise ExpressionError(f"{where}: unsupported reference {{'Get': {reference!r}}}")


def _stringify(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def evaluate(node: Any, ctx: Context, where: str) -> Any:
    """Resolve every expression inside `node` (a definition fragment) to plain JSON values."""
    if isinstance(node, list):
        return [evaluate(item, ctx, where) for item in node]
    if not isinstance(node, dict):
        return node
    if "Get" in node and len(node) == 1:
        value = _get(node["Get"], ctx, where)
        if callable(value):
            raise ExpressionError(f"{where}: a property file can only be read with Std:JsonGet: {node}")
        return value
    if "Std:Join" in node and len(node) == 1:
        spec = node["Std:Join"]
        values = evaluate(spec.get("Values", []), ctx, where)
        return _stringify(spec.get("On", "")).join(_stringify(v) for v in values)
    if "Std:JsonGet" in node and len(node) == 1:
        spec = node["Std:JsonGet"]
        source = spec.get("PropertyFile")
        if not (isinstance(source, dict) and set(source) == {"Get"}):
            raise ExpressionError(f"{where}: unsupported Std:JsonGet source {source}")
        loader = _get(source["Get"], ctx, where)
        if not callable(loader):
            raise ExpressionError(f"{where}: Std:JsonGet needs a property file, got {source}")
        path = re.sub(r"^\$\.?", "", spec["Path"])  # JsonPath's root `$` (`$.a.b`, `$['a']`) is the file itself
        return lookup(loader(), property_path(path), f"{where}: Std:JsonGet {spec['Path']}")
    unknown = [k for k in node if k.startswith("Std:")]
    if unknown:
        raise ExpressionError(f"{where}: unsupported expression {unknown[0]}: {json.dumps(node)[:200]}")
    return {key: evaluate(value, ctx, where) for key, value in node.items()}


def _compare(op: Callable[[Any, Any], bool]) -> Callable[[dict, Context, str], bool]:
    def check(cond: dict, ctx: Context, where: str) -> bool:
        left, right = evaluate(cond["LeftValue"], ctx, where), evaluate(cond["RightValue"], ctx, where)
        if isinstance(left, (int, float)) != isinstance(right, (int, float)):
            try:
                left, right = float(left), float(right)
            except (TypeError, ValueError):
                raise ExpressionError(f"{where}: cannot compare {left!r} with {right!r}") from None
        return op(left, right)

    return check


CONDITIONS: dict[str, Callable[[dict, Context, str], bool]] = {
    "Equals": _compare(lambda a, b: a == b),
    "GreaterThan": _compare(lambda a, b: a > b),
    "GreaterThanOrEqualTo": _compare(lambda a, b: a >= b),
    "LessThan": _compare(lambda a, b: a < b),
    "LessThanOrEqualTo": _compare(lambda a, b: a <= b),
    "In": lambda c, ctx, w: evaluate(c["QueryValue"], ctx, w) in evaluate(c["Values"], ctx, w),
    "Not": lambda c, ctx, w: not condition(c["Condition"], ctx, w),  # the SDK's ConditionNot.to_request()
    "Or": lambda c, ctx, w: any(condition(x, ctx, w) for x in c["Conditions"]),
}


def condition(cond: dict, ctx: Context, where: str) -> bool:
    """Evaluate one condition of a ConditionStep (every type the SDK emits)."""
    check = CONDITIONS.get(cond.get("Type", ""))
    if check is None:
        raise ExpressionError(f"{where}: unsupported condition type {cond.get('Type')!r}")
    try:
        return check(cond, ctx, where)
    except (KeyError, TypeError) as e:
        raise ExpressionError(f"{where}: malformed {cond['Type']} condition ({type(e).__name__}: {e}): "
                              f"{json.dumps(cond)[:200]}") from None


def json_file_loader(path: Path) -> Callable[[], Any]:
    """A property file reader for `Std:JsonGet`, reading the file when first needed."""

    def load() -> Any:
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise ExpressionError(f"property file {path} does not exist") from None
        except json.JSONDecodeError as e:
            raise ExpressionError(f"property file {path} is not JSON: {e}") from None

    return load
