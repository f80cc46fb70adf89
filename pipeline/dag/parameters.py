"""Pipeline parameters: `NAME=VALUE` pairs parsed once, checked against the definition and cast to their types."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from pipeline.dag.graph import flatten_steps
from pipeline.errors import UserError
from steps.contract import ACCURACY_THRESHOLD, INPUT_DATA

CASTS: dict[str, Callable[[str], Any]] = {
    "String": str,
    "Integer": int,
    "Float": float,
    "Boolean": lambda v: {"true": True, "false": False}[str(v).lower()],
}


class ParameterError(UserError, ValueError):
    """A parameter the definition does not declare, of the wrong type, or that the definition cannot take."""


def parse_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """`NAME=VALUE` pairs (from --param) as a mapping; the value is everything after the first `=`."""
    parsed = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ParameterError(f"--param {pair!r}: expected NAME=VALUE")
        parsed[name] = value
    return parsed


def s3_inputs(definition: dict) -> set[str]:
    """Parameters that a job step stages as S3 data (a ProcessingInput or a training channel reads them)."""
    found = set()
    for step in flatten_steps(definition["Steps"]).values():
        args = step.get("Arguments", {})
        uris = [i.get("S3Input", {}).get("S3Uri") for i in args.get("ProcessingInputs", [])]
        uris += [c.get("DataSource", {}).get("S3DataSource", {}).get("S3Uri") for c in args.get("InputDataConfig", [])]
        gets = [u["Get"] for u in uris if isinstance(u, dict) and isinstance(u.get("Get"), str)]
        found |= {g.split(".", 1)[1] for g in gets if g.startswith("Parameters.")}
    return found


def check_data_source(definition: dict, values: Mapping[str, Any], option: str = "--param ") -> None:
    """InputData can switch between forms only within what the definition was built for: an s3:// source is staged
    by a ProcessingInput, which exists only if data.source was an s3:// URI when the definition was built."""
    value = values.get(INPUT_DATA)
    if not isinstance(value, str):
        return
    staged = INPUT_DATA in s3_inputs(definition)
    if staged and not value.startswith("s3://"):
        raise ParameterError(
            f"{option}{INPUT_DATA}={value!r}: this pipeline was built for an s3:// data.source and stages "
            f"{INPUT_DATA} from S3; pass an s3:// URI, or set data.source={value} and upsert again"
        )
    if value.startswith("s3://") and not staged:
        raise ParameterError(
            f"{option}{INPUT_DATA}={value!r}: this pipeline was built for a Hub or sample data.source, so its "
            f"Tokenize step has no S3 input to stage the data; set data.source={value} and upsert again"
        )


def article(kind: str) -> str:
    """`an Integer`, `a Float`: a parameter type with its article."""
    return f"{'an' if kind[0] in 'AEIOU' else 'a'} {kind}"


def resolve(definition: dict, overrides: Mapping[str, str], option: str = "--param ") -> dict[str, Any]:
    """Every declared parameter's value: its default, or its override cast to the declared type. `option` names
    where the overrides come from in errors (`--param NAME`, or a config key like `triggers.schedule_parameters.`)."""
    declared = definition.get("Parameters", [])
    types = {p["Name"]: p.get("Type", "String") for p in declared}
    unknown = sorted(set(overrides) - set(types))
    if unknown:
        raise ParameterError(f"{option}{unknown[0]}: unknown parameter; expected one of {', '.join(sorted(types))}")
    values = {p["Name"]: p.get("DefaultValue") for p in declared}
    for name, raw in overrides.items():
        if str(raw) == "":  # StartPipelineExecution: a Value is 1 to 1024 characters
            raise ParameterError(f"{option}{name}=: empty; expected {article(types[name])} (leave it out for the "
                                 "default)")
        if len(str(raw)) > 1024:
            raise ParameterError(f"{option}{name}: {len(str(raw))} characters; expected at most 1024")
        try:
            values[name] = CASTS[types[name]](raw)
        except (ValueError, KeyError):
            raise ParameterError(f"{option}{name}={raw!r}: expected {article(types[name])}") from None
    missing = [name for name, value in values.items() if value is None]
    if missing:
        raise ParameterError(f"parameter {missing[0]} has no default; pass --param {missing[0]}=VALUE")
    check_data_source(definition, values, option)
    check_request_values(definition, values, option, set(overrides))
    threshold = values.get(ACCURACY_THRESHOLD)
    if isinstance(threshold, float) and not 0 <= threshold <= 1:
        raise ParameterError(f"{option}{ACCURACY_THRESHOLD}={threshold:g}: expected an accuracy between 0 and 1 "
                             f"(0.85, not 85)")
    return values


def request_fields(definition: dict) -> Iterator[tuple[str, str, Any]]:
    """(parameter, where, botocore shape) of each job request field whose whole value is a parameter."""
    from pipeline.dag.requests import OPERATIONS, service

    def walk(node: Any, shape: Any, where: str) -> Iterator[tuple[str, str, Any]]:
        if isinstance(node, dict) and isinstance(node.get("Get"), str) and len(node) == 1:
            if node["Get"].startswith("Parameters."):
                yield node["Get"].split(".", 1)[1], where, shape
        elif shape.type_name == "structure" and isinstance(node, dict):
            for key, value in node.items():
                if key in shape.members:
                    yield from walk(value, shape.members[key], f"{where}.{key}")
        elif shape.type_name == "list" and isinstance(node, list):
            for value in node:
                yield from walk(value, shape.member, f"{where}[]")
        elif shape.type_name == "map" and isinstance(node, dict):
            for key, value in node.items():
                yield from walk(value, shape.value, f"{where}.{key}")

    for name, step in flatten_steps(definition["Steps"]).items():
        operation = OPERATIONS.get(step.get("Type"))
        if operation:
            yield from walk(step.get("Arguments", {}), service().operation_model(operation).input_shape, name)


def service_pattern(pattern: str) -> str:
    """A service model's pattern as Python's re reads it ("" where it cannot): its Unicode letter, separator and
    number classes as \\w and \\s, and without the length quantifier some patterns put after their end anchor."""
    pattern = re.sub(r"\$\{\d+,\d+\}$", "$", pattern.replace(r"\p{L}\p{Z}\p{N}", r"\w\s"))
    try:
        re.compile(pattern)
    except re.error:
        return ""
    return "" if r"\p{" in pattern else pattern


def check_request_values(definition: dict, values: Mapping[str, Any], option: str = "--param ",
                         overridden: set[str] | None = None) -> None:
    """A parameter that a job step's request takes as a whole field must fit that field as the service model
    says (an enum, a length, a pattern): StartPipelineExecution checks none of it, so a typo (ModelApprovalStatus=
    approved) would fail RegisterModel after the whole training."""
    for name, where, shape in request_fields(definition):
        value = values.get(name)
        if not isinstance(value, str) or shape.type_name != "string":
            continue
        rules, pattern = shape.metadata, service_pattern(shape.metadata.get("pattern", ""))
        enum = [] if shape.name.endswith("InstanceType") else getattr(shape, "enum", [])  # new types come often
        problem = (f"expected one of {', '.join(enum)}" if enum and value not in enum else
                   f"expected at most {rules['max']} characters" if len(value) > rules.get("max", len(value)) else
                   f"expected characters matching {rules['pattern']}"
                   if pattern and not re.fullmatch(pattern, value) else "")
        if problem:
            said = f"{option}{name}" if name in (overridden or set()) else f"the default of parameter {name}"
            raise ParameterError(f"{said}={value!r}: {where} takes it, and SageMaker would refuse it there: "
                                 f"{problem}")


def as_request(overrides: Mapping[str, str]) -> list[dict[str, str]]:
    """StartPipelineExecution's PipelineParameters (only the overridden ones: the others keep their defaults)."""
    return [{"Name": name, "Value": value} for name, value in overrides.items()]
