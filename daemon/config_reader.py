"""YAML with line numbers, and a reader that collects every error instead of stopping.

`load_yaml` returns plain dicts and lists that also remember the line of each key or
item, so messages can say `routes[1].model: unknown model 'x' (line 31)`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import yaml

from daemon.errors import ConfigError

_MISSING = object()


class LineDict(dict):
    """A dict that knows the 1-based YAML line of each key."""

    lines: dict


class LineList(list):
    """A list that knows the 1-based YAML line of each item."""

    lines: list


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict()
    out.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    out = LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.lines = [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{path}: config file not found"]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read config file: {exc.strerror or exc}"]) from None
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{path}: invalid YAML{where}: {problem}"]) from None


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _type_name(types: Any) -> str:
    names = {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number",
             bool: "true or false", type(None): "null"}
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(names.get(t, t.__name__) for t in types)


class Reader:
    """Typed access to the raw YAML that records errors and returns a default instead."""

    def __init__(self, raw: Any):
        self.raw = raw
        self.errors: list[str] = []

    def error(self, container: Any, key: Any, path: str, message: str) -> None:
        line = self._line(container, key)
        self.errors.append(f"{_join(path, key)}: {message}" + (f" (line {line})" if line else ""))

    @staticmethod
    def _line(container: Any, key: Any) -> Optional[int]:
        lines = getattr(container, "lines", None)
        if isinstance(lines, dict):
            return lines.get(key)
        if isinstance(lines, list) and isinstance(key, int) and 0 <= key < len(lines):
            return lines[key]
        return None

    def section(self, parent: Any, key: Any, known: Any, path: Optional[str] = None,
                required: bool = False) -> dict:
        """The mapping at parent[key] (the root when key is ''), with unknown keys reported."""
        path = _join("", key) if path is None else path
        value = parent if key == "" else self._lookup(parent, key)
        if value is _MISSING or value is None:
            if required:
                self.errors.append(f"{path or 'config'}: is required and must be a mapping")
            return {}
        if not isinstance(value, dict):
            self.errors.append(f"{path or 'config'}: must be a mapping, got {type(value).__name__}")
            return {}
        names = [f.name for f in dataclasses.fields(known)] if dataclasses.is_dataclass(known) else list(known)
        for k in value:
            if k not in names:
                self.error(value, k, path, f"unknown key (known: {', '.join(names)})")
        return value

    @staticmethod
    def _lookup(parent: Any, key: Any) -> Any:
        if isinstance(parent, dict):
            return parent.get(key, _MISSING)
        if isinstance(parent, list) and isinstance(key, int) and key < len(parent):
            return parent[key]
        return _MISSING

    def get(self, m: dict, key: str, path: str, types: Any, default: Any, *, required: bool = False,
            choices: Optional[Iterable] = None, minimum: Optional[float] = None,
            check: Optional[Callable[[Any], Optional[str]]] = None) -> Any:
        """m[key] checked against types, choices, minimum and check; default when absent or bad."""
        if key not in m:
            if required:
                self.errors.append(f"{_join(path, key)}: is required")
            return default
        value = m[key]
        problem = self._problem(value, types, choices, minimum, check)
        if problem:
            self.error(m, key, path, problem)
            return default
        wants_float = float in _as_tuple(types) and int not in _as_tuple(types)
        return float(value) if wants_float and isinstance(value, int) else value

    @staticmethod
    def _problem(value: Any, types: Any, choices: Optional[Iterable], minimum: Optional[float],
                 check: Optional[Callable[[Any], Optional[str]]]) -> Optional[str]:
        types = _as_tuple(types)
        numeric = float in types and isinstance(value, int)
        # YAML booleans are ints in Python: refuse `true` where a number is wanted.
        if isinstance(value, bool) and bool not in types or not (isinstance(value, types) or numeric):
            return f"must be {_type_name(types)}, got {value!r}"
        if choices is not None and value not in tuple(choices):
            return f"must be one of {', '.join(map(str, choices))}, got {value!r}"
        if minimum is not None and value < minimum:
            return f"must be >= {minimum}, got {value!r}"
        return check(value) if check else None


def _as_tuple(types: Any) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def absolute_paths(raw: dict, base_dir: Path) -> dict:
    """A raw config's model, labels and validate-data paths made absolute against `base_dir`
    (for a copy of the config written elsewhere: the bench's and the tests')."""
    for model in (raw.get("models") or {}).values():
        for key in ("path", "labels"):
            model[key] = str((base_dir / model[key]).resolve())
    for route in raw.get("routes") or []:
        gate = route.get("validate") or {}
        if gate.get("data"):
            gate["data"] = str((base_dir / gate["data"]).resolve())
    return raw
