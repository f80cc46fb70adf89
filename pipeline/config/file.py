"""Edit `section.key: value` lines of pipeline.yaml in place, keeping its comments and layout (for `bootstrap`)."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

from pipeline.config.overrides import load
from pipeline.errors import ConfigError


def set_lines(updates: dict[str, str]) -> list[str]:
    """The `--set key=value` options that give a config these values without editing it."""
    return [f"--set {shlex.quote(f'{key}={value}')}" for key, value in updates.items()]


def _scalar(value: str | None) -> str:
    """`value` as a YAML scalar: plain when it reads back as the same string, else double-quoted."""
    if value is None:
        return "null"
    plain_ok = value and " #" not in value and not value.startswith(("#", " ")) and load(f"k: {value}") == {"k": value}
    return value if plain_ok else json.dumps(value)


def _set_key(lines: list[str], section: str, name: str, value: str, newline: str) -> list[str]:
    header = next((i for i, line in enumerate(lines) if re.match(rf"^{re.escape(section)}:\s*(#.*)?$", line)), None)
    if header is None:
        if any(re.match(rf"^{re.escape(section)}:", line) for line in lines):
            raise ConfigError(f"{section}: written inline in the config file; expected a block section")
        tail = [] if not lines or lines[-1].strip() == "" else [newline]
        return [*lines, *tail, f"{section}:{newline}", f"  {name}: {value}{newline}"]
    end, indent = len(lines), None
    for j in range(header + 1, len(lines)):
        line = lines[j]
        if line.strip() and not line[0].isspace():
            end = j
            break
        if indent is None and line.strip() and not line.lstrip().startswith("#"):
            indent = line[: len(line) - len(line.lstrip())]
    indent = indent or "  "
    for j in range(header + 1, end):
        match = re.match(rf"^{indent}{re.escape(name)}:(?P<gap>\s*)(?P<value>.*?)(?P<comment>\s+#.*)?$", lines[j])
        if not match:
            continue
        nested = j + 1 < end and lines[j + 1].startswith(indent + " ") and not lines[j + 1].strip().startswith("#")
        if not match["value"] and nested:
            raise ConfigError(f"{section}.{name}: a nested block in the config file; expected a single value")
        text = f"{indent}{name}: {value}"
        comment = match["comment"]
        if comment:
            column = len(lines[j].rstrip("\r\n")) - len(comment.lstrip())
            text += " " * max(2, column - len(text)) + comment.lstrip()  # same column, or two spaces
        lines[j] = text + newline
        return lines
    lines.insert(header + 1, f"{indent}{name}: {value}{newline}")
    return lines


def write_config(path: str | Path, updates: dict[str, str | None]) -> list[str]:
    """Set `section.key: value` lines of the config file in place, keeping comments and layout (checked by reading
    it back; written atomically, only when something changed); the keys whose value changed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    newline = "\r\n" if "\r\n" in text else "\n"
    before = load(text) or {}
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += newline
    changed = []
    for key, value in updates.items():
        section, _, name = key.partition(".")
        if not name or "." in name:
            raise ConfigError(f"{key}: expected a SECTION.KEY config key")
        if (before.get(section) or {}).get(name) != value:
            changed.append(key)
        lines = _set_key(lines, section, name, _scalar(value), newline)
    new = "".join(lines)
    after = load(new) or {}
    for key, value in updates.items():
        section, _, name = key.partition(".")
        if (after.get(section) or {}).get(name) != value:
            raise ConfigError(f"{path}: could not set {key} safely; set it by hand to {value}")
    if new != text:
        tmp = path.with_name(f".{path.name}.bootstrap")
        tmp.write_text(new, encoding="utf-8")
        os.replace(tmp, path)
    return changed
