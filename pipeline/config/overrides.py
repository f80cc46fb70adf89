"""Config files as trees (YAML 1.2) and dotted `KEY.PATH=VALUE` overrides of such trees (no knowledge of the schema)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import ConfigError


class Loader(yaml.SafeLoader):
    """YAML 1.2 scalars: `5e-5` is a float, only true/false are booleans (`yes`, `on` stay strings), integers are
    decimal (`042` is 42, `1:30` a string); a key twice in one mapping is an error (YAML 1.2), not a lost value."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice in one mapping",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


Loader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
Loader.add_constructor("tag:yaml.org,2002:int", lambda loader, node: int(loader.construct_scalar(node), 10))
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def load(text: str) -> Any:
    """Parse YAML 1.2-style: `5e-5` is a float, only true/false are booleans."""
    return yaml.load(text, Loader=Loader)


def read_mapping(path: Path) -> dict[str, Any]:
    """The YAML file `path` (UTF-8, whatever the locale) as a mapping of sections; a missing, unreadable, broken or
    non-mapping file is a ConfigError that says where."""
    try:
        tree = load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file: {e.strerror or e}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML: {e.problem or e.context}") from None
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
        child = node.get(key)
        child = node[key] = {} if child is None else child  # a section left empty (`vpc: null`) takes keys
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {'.'.join(parents)} is not a section")
        node = child
    node[leaf] = value


def parse_override(text: str) -> tuple[str, Any]:
    """Split `key.path=value`; the value is parsed as YAML (`2` is an int, `true` a bool, `a` a string)."""
    key, sep, raw = text.partition("=")
    if not sep or not re.fullmatch(r"[^=.\s]+(\.[^=.\s]+)*", key):
        raise ConfigError(f"--set {text!r}: expected KEY.PATH=VALUE, e.g. training.epochs=2")
    try:
        return key, load(raw) if raw else ""
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"--set {text!r}: the value is not valid YAML ({problem}); text that YAML cannot read "
                          f"plainly needs quotes: --set '{key}=\"{raw}\"'") from None


def merge(tree: dict[str, Any], overrides: dict[str, Any]) -> None:
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            merge(tree[key], value)
        else:
            tree[key] = value
