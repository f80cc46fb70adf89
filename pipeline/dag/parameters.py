"""Pipeline parameters: `NAME=VALUE` pairs parsed once, checked against the definition and cast to their types."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pipeline.dag.graph import flatten_steps
from pipeline.errors import UserError
from steps.contract import INPUT_DATA

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
            raise ParameterError(f"{option}{name}=: empty; expected a {types[name]} (leave it out for the default)")
        if len(str(raw)) > 1024:
            raise ParameterError(f"{option}{name}: {len(str(raw))} characters; expected at most 1024")
        try:
            values[name] = CASTS[types[name]](raw)
        except (ValueError, KeyError):
            raise ParameterError(f"{option}{name}={raw!r}: expected a {types[name]}") from None
    missing = [name for name, value in values.items() if value is None]
    if missing:
        raise ParameterError(f"parameter {missing[0]} has no default; pass --param {missing[0]}=VALUE")
    check_data_source(definition, values, option)
    return values


def as_request(overrides: Mapping[str, str]) -> list[dict[str, str]]:
    """StartPipelineExecution's PipelineParameters (only the overridden ones: the others keep their defaults)."""
    return [{"Name": name, "Value": value} for name, value in overrides.items()]
