"""Config files as trees (YAML 1.2) and dotted `KEY.PATH=VALUE` overrides of such trees (no knowledge of the schema)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import ConfigError


class Loader(yaml.SafeLoader):
    """YAML 1.2 scalars: `5e-5` is a float and only true/false are booleans (`yes`, `on` stay strings)."""


Loader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def load(text: str) -> Any:
    """Parse YAML 1.2-style: `5e-5` is a float, only true/false are booleans."""
    return yaml.load(text, Loader=Loader)


def read_mapping(path: Path) -> dict[str, Any]:
    """The YAML file `path` as a mapping of sections; a missing, broken or non-mapping file is a ConfigError."""
    try:
        tree = load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return tree


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        flat.update(flatten(value, name) if isinstance(value, dict) else {name: value})
    return flat


def set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {'.'.join(parents)} is not a section")
        node = child
    node[leaf] = value


def parse_override(text: str) -> tuple[str, Any]:
    """Split `key.path=value`; the value is parsed as YAML (`2` is an int, `true` a bool, `a` a string)."""
    key, sep, raw = text.partition("=")
    if not sep or not re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)*", key):
        raise ConfigError(f"--set {text!r}: expected KEY.PATH=VALUE, e.g. training.epochs=2")
    return key, load(raw) if raw else ""


def merge(tree: dict[str, Any], overrides: dict[str, Any]) -> None:
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            merge(tree[key], value)
        else:
            tree[key] = value
