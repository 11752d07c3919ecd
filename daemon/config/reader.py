"""YAML with line numbers, and a reader that collects every error instead of stopping.

`load_yaml` returns plain dicts and lists that also remember the line of each key or
item, so messages can say `routes[1].model: unknown model 'x' (line 31)`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import yaml

from daemon.model import preprocess
from daemon.errors import ConfigError

_MISSING = object()


class LineDict(dict):
    """A dict that knows the 1-based YAML line of each key, and the keys it saw twice."""

    lines: dict
    start: int  # the line the mapping starts on: where a missing key is reported
    duplicates: list  # (key, first line, repeated line, the first value)


class LineList(list):
    """A list that knows the 1-based YAML line of each item."""

    lines: list


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    own = {id(key_node) for key_node, _ in node.value}  # not the keys a `<<` merge brings in
    loader.flatten_mapping(node)
    out = LineDict()
    out.lines, out.duplicates, out.start = {}, [], node.start_mark.line + 1
    own_lines: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(None, None, "a key must be a plain value, not a list or mapping",
                                                    key_node.start_mark) from None
        line = key_node.start_mark.line + 1
        if id(key_node) in own:
            if key in own_lines:  # the value it replaces goes along, to report what is wrong inside it too
                out.duplicates.append((key, own_lines[key], line, out[key]))
            own_lines.setdefault(key, line)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = line
    return out


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    out = LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.lines = [child.start_mark.line + 1 for child in node.value]
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_yaml(path: Path) -> tuple[Any, list[str]]:
    """The parsed file and the problems found while reading it (not UTF-8, duplicate keys);
    ConfigError when nothing can be read (missing file, YAML syntax)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError([f"{path}: config file not found"]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read config file: {exc.strerror or exc}"]) from None
    try:
        text, bad_byte = data.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        # Read on with U+FFFD in place of the bad bytes, so every other mistake is reported too.
        text, bad_byte = data.decode("utf-8", errors="replace"), exc.start
    try:
        raw = yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_problem(path, exc)]) from None
    problems = [] if bad_byte is None else [_encoding_problem(path, data, bad_byte, raw)]
    return raw, problems + _duplicate_problems(raw, "")


def _yaml_problem(path: Path, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if "\t" in problem or "'\\t'" in problem:
        problem += " (YAML indents with spaces, never tabs)"
    return f"{path}: invalid YAML: {problem}" + (f" (line {mark.line + 1})" if mark else "")


def _encoding_problem(path: Path, data: bytes, offset: int, raw: Any) -> str:
    line = data.count(b"\n", 0, offset) + 1
    where = _key_at_line(raw, line, "") or "config"
    return (f"{where}: {path} is not UTF-8 text: byte 0x{data[offset]:02x} at offset {offset} cannot be decoded "
            f"(line {line})")


def _key_at_line(node: Any, line: int, path: str) -> Optional[str]:
    """The path of the deepest key or item that starts at or before `line`."""
    lines = getattr(node, "lines", None)
    if isinstance(node, dict) and lines:
        spots = [(n, k) for k, n in lines.items() if n <= line]
    elif isinstance(node, list) and lines:
        spots = [(n, i) for i, n in enumerate(lines) if n <= line]
    else:
        return None
    if not spots:
        return None
    _, key = max(spots, key=lambda spot: spot[0])
    here = _join(path, key)
    return _key_at_line(node[key], line, here) or here


def _duplicate_problems(node: Any, path: str) -> list[str]:
    problems = []
    for key, first, again, replaced in getattr(node, "duplicates", None) or ():
        problems.append(f"{_join(path, key)}: duplicate key, first set on line {first} (line {again})")
        problems += _duplicate_problems(replaced, _join(path, key))
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        problems += _duplicate_problems(child, _join(path, key))
    return problems


def _join(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


_TYPE_NAMES = {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number",
               bool: "true or false", type(None): "null"}


def _type_name(types: Any) -> str:
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in _as_tuple(types))


def kind(value: Any) -> str:
    """What a YAML value is, in the words of the docs: 'a list', 'a string', ... (never a class name)."""
    for t in (bool, dict, list, str, int, float, type(None)):  # bool first: it is also an int
        if isinstance(value, t):
            return _TYPE_NAMES[t]
    return "a " + type(value).__name__.lower()  # dates and the like, which YAML also parses


class Reader:
    """Typed access to the raw YAML that records errors and returns a default instead.

    It also remembers which key paths had a problem, so the cross-field pass can skip
    whatever rests on them (`ok`) instead of reporting follow-on errors."""

    def __init__(self, raw: Any, problems: Iterable[str] = ()):
        self.raw = raw
        self.errors: list[str] = list(problems)
        self._bad: set[str] = set()

    def error(self, container: Any, key: Any, path: str, message: str) -> None:
        line = self._line(container, key)
        self.fail(_join(path, key), message, line)

    def fail(self, path: str, message: str, line: Optional[int] = None) -> None:
        """Record a problem at a key path that may have no line (a missing key, the root)."""
        self._bad.add(path)
        self.errors.append(f"{path or 'config'}: {message}" + (f" (line {line})" if line else ""))

    def ok(self, *paths: str) -> bool:
        """No problem was recorded at any of these key paths, below them, or above them (a
        section that is not a mapping spoils every key in it)."""
        return not any(_related(bad, p) for p in paths for bad in self._bad if bad)

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
        line = 1 if key == "" else self._line(parent, key) or getattr(parent, "start", None)
        if value is _MISSING or value is None:
            if required:
                self.fail(path, "is required and must be a mapping" if key != "" else
                          "the file is empty: it needs at least the mqtt, models and routes sections", line)
            return {}
        if not isinstance(value, dict):
            self.fail(path, f"must be a mapping, got {kind(value)}", line)
            return {}
        names = field_names(known) if dataclasses.is_dataclass(known) else tuple(known)
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
                self.fail(_join(path, key), "is required", getattr(m, "start", None))
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
            return f"must be {_type_name(types)}, got {_shown(value)}"
        if choices is not None and value not in tuple(choices):
            return f"must be one of {', '.join(map(str, choices))}, got {value!r}"
        if minimum is not None and value is not None and value < minimum:
            return f"must be >= {minimum}, got {value!r}"
        return check(value) if check else None


def _related(a: str, b: str) -> bool:
    """One key path is the other, or lies inside it."""
    inner, outer = (a, b) if len(a) >= len(b) else (b, a)
    return inner == outer or inner.startswith((outer + ".", outer + "["))


def _shown(value: Any) -> str:
    """A wrong value as the message shows it: scalars as written, containers by kind."""
    return kind(value) if isinstance(value, (dict, list)) else repr(value)


def _as_tuple(types: Any) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def absolute_paths(raw: dict, base_dir: Path) -> dict:
    """A raw config's model, labels and validate-data paths made absolute against `base_dir`
    (for a copy of the config written elsewhere: the bench's and the tests')."""
    for model in (raw.get("models") or {}).values():
        for key in ("path", "labels"):
            if model.get(key):  # labels are optional (anomaly and values routes)
                model[key] = str((base_dir / model[key]).resolve())
    for route in raw.get("routes") or []:
        gate = route.get("validate") or {}
        if gate.get("data"):
            gate["data"] = str((base_dir / gate["data"]).resolve())
    return raw


def systemd_base(variable: str, config_dir: Path) -> Path:
    """Where a relative path of a config lives: the first directory systemd put in `variable`
    ($CACHE_DIRECTORY for CacheDirectory=, $STATE_DIRECTORY for StateDirectory=), so a config
    under /etc never writes there; else the config file's own directory."""
    directory = os.environ.get(variable, "").split(":")[0]
    return Path(directory) if directory else config_dir


def read_steps(r: Reader, m: Any, p: str, sample_rate: Optional[int] = None) -> tuple:
    """`p.preprocess`: a list of daemon.model.preprocess steps (each bad one reported by its index);
    `sample_rate` is the route's input.sample_rate, a `log_mel` step's default."""
    steps = r.get(m, "preprocess", p, list, []) or []
    out = []
    for j, item in enumerate(steps):
        try:
            out.append(preprocess.parse_step(item, sample_rate))
        except ValueError as exc:
            r.error(steps, j, f"{p}.preprocess", str(exc))
    return tuple(out)


def unknown_model(name: str, models: Iterable[str]) -> str:
    """The error of a key that names a model `models` lacks (a route's, a stage's, a cascade tier's)."""
    return f"unknown model {name!r} (known: {', '.join(sorted(models)) or 'none'})"


def optional_float(value: Any) -> Optional[float]:
    """A number read from YAML as a float, None as None."""
    return None if value is None else float(value)


def field_names(cls: type) -> tuple[str, ...]:
    """The YAML keys of a section: its dataclass's fields, less those derived after reading."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)
