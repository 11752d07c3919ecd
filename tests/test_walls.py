"""The walls between the wings of `daemon/` (docs/architecture.md): read from the code's own imports.

Every import counts, at module level, inside functions and under `TYPE_CHECKING` alike:
a cycle through an annotation-only import is still a cycle a reader has to untangle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "daemon"
FRONT_DOOR = {"daemon", "daemon.__main__", "daemon.cli", "daemon.cli_parser", "daemon.errors", "daemon.topics"}
# What each wing may import besides itself, `errors` and `topics` (docs/architecture.md, "The wings").
ALLOWED = {
    "config": {"model"},
    "model": set(),
    "cache": set(),
    "pipeline": {"model", "cache", "config"},
    "transport": {"config", "obs"},
    "obs": {"config"},
    "serve": {"pipeline", "transport", "obs", "config"},
    "fleet": {"config", "model", "pipeline", "obs"},
    "lifecycle": {"config", "model", "cache", "pipeline", "transport", "serve", "obs", "fleet"},
    "tools": {"config", "model", "cache", "pipeline", "transport", "serve", "lifecycle", "obs", "fleet"},
}
# The pure request path: no threads or processes of its own, and no MQTT or storage library,
# not even through what it imports (the model's runtime may use threads: it is the model).
PURE = ("daemon.pipeline.request_path", "daemon.pipeline.route_pipeline", "daemon.pipeline.codecs",
        "daemon.pipeline.stream_window", "daemon.pipeline.stream_codec", "daemon.pipeline.stages",
        "daemon.pipeline.crops", "daemon.pipeline.sub_labels", "daemon.pipeline.pcm16")
NOT_IN_PURE = {"threading", "subprocess", "multiprocessing", "socket", "paho", "diskcache", "sqlite3"}
NOT_BELOW_PURE = {"paho", "diskcache", "sqlite3"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file; `from daemon.x import y` counts
    `daemon.x.y` when y is a module of the package, else `daemon.x`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.append((candidate if candidate in MODULES else node.module, node.lineno))
    return found


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
GRAPH = {name: [(m, line) for m, line in _imports(path) if m in MODULES and m != name]
         for name, path in MODULES.items()}


def _wing(module: str) -> str:
    return "front" if module in FRONT_DOOR else module.split(".")[1]


def test_nothing_but_the_front_door_and_wings_sits_in_daemon():
    loose = [name for name, path in MODULES.items()
             if name.count(".") == 1 and name not in FRONT_DOOR and path.name != "__init__.py"]
    assert loose == [], "modules directly in daemon/ that belong in a wing"


def test_there_is_no_import_cycle():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target, _ in GRAPH[module]:
            if state.get(target) == 1:
                cycle = stack[stack.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(MODULES):
        if module not in state:
            visit(module)


def test_each_wing_imports_only_the_wings_below_it():
    wrong = []
    for module, targets in GRAPH.items():
        wing = _wing(module)
        if wing == "front":
            continue
        for target, line in targets:
            other = _wing(target)
            if other not in {"front", wing} and other not in ALLOWED[wing]:
                wrong.append(f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}")
    front_up = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}" for m in ("daemon.errors", "daemon.topics")
                for t, line in GRAPH[m]]
    assert wrong + front_up == []


def test_only_the_cli_imports_the_tools():
    users = {module for module, targets in GRAPH.items() for target, _ in targets
             if _wing(target) == "tools" and _wing(module) != "tools"}
    assert users == {"daemon.cli"}


@pytest.mark.parametrize("low", ["pipeline", "model"])
def test_pipeline_and_model_import_no_transport_serve_or_lifecycle(low):
    above = {"transport", "serve", "lifecycle"}
    assert [(m, t) for m, targets in GRAPH.items() if _wing(m) == low
            for t, _ in targets if _wing(t) in above] == []


def test_model_stays_below_config():
    assert [(m, t) for m, targets in GRAPH.items() if _wing(m) == "model" for t, _ in targets
            if _wing(t) == "config"] == []


def test_the_pure_request_path_imports_no_threads_mqtt_or_storage():
    direct = {(module, name) for module in PURE for name, _ in _imports(MODULES[module])
              if name.split(".")[0] in NOT_IN_PURE}
    assert direct == set()


def test_the_pure_request_path_reaches_no_mqtt_or_storage_library_through_its_imports():
    seen, todo, outside = set(), list(PURE), {}
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name, _ in _imports(MODULES[module]):
            if name in MODULES:
                todo.append(name)
            elif name.split(".")[0] in NOT_BELOW_PURE:
                outside.setdefault(name.split(".")[0], module)
    assert outside == {}, "a pure module reaches these (first importer shown)"


def test_wing_init_files_hold_a_docstring_only():
    for name, path in MODULES.items():
        if path.name == "__init__.py" and name != "daemon":
            body = ast.parse(path.read_text()).body
            assert len(body) == 1 and isinstance(body[0], ast.Expr), f"{path}: no re-exports in a wing's __init__"


def _defined(path: Path) -> set[str]:
    """Top-level names a module defines itself (not the ones it imports)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {t.id for t in ast.walk(target) if isinstance(t, ast.Name)}
    return names


def _outside_the_package() -> list[Path]:
    """The Python files that use the package from outside it: tests, scripts, benchmarks, tools."""
    return [path for folder in ("tests", "scripts", "benchmarks", "tools") for path in (ROOT / folder).rglob("*.py")]


def test_names_are_imported_from_where_they_are_defined():
    """No facades: `from daemon.x import y` finds y defined in x (or y is a module), so reading
    an import always leads to the definition. Covers the package, the tests, the scripts, the
    benchmarks and the tools."""
    files = [*PACKAGE.rglob("*.py"), *_outside_the_package()]
    wrong = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in MODULES):
                continue
            defined = _defined(MODULES[node.module])
            for alias in node.names:
                if alias.name not in defined and f"{node.module}.{alias.name}" not in MODULES:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name} is not defined in {node.module}")
    assert wrong == []


def test_the_walls_cover_every_wing():
    wings = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert wings == set(ALLOWED), "a new wing needs its row in ALLOWED and in docs/architecture.md"


def test_nothing_outside_the_package_imports_a_private_name_of_it():
    """Tests, scripts, benchmarks and tools use the package through its public names only: a name
    with a leading underscore may change without a caller outside daemon/ to update."""
    private = []
    for path in _outside_the_package():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "daemon":
                private += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{alias.name}"
                            for alias in node.names if alias.name.startswith("_")]
    assert private == []


# The fleet wing's rooms (docs/architecture.md): the node's side and the operator's controller
# run in different places and share only `release` (the release format, its signatures, the
# desired documents, the refusal codes), which imports neither.
FLEET_ROOMS = {"release": set(), "node": {"release"}, "controller": {"release"}}


def test_the_fleet_rooms_keep_to_their_own_side():
    wrong = []
    for module, targets in GRAPH.items():
        parts = module.split(".")
        if parts[:2] != ["daemon", "fleet"] or len(parts) < 4:
            continue
        room = parts[2]
        for target, line in targets:
            other = target.split(".")
            if other[:2] == ["daemon", "fleet"] and len(other) >= 4 and other[2] not in {room} | FLEET_ROOMS[room]:
                wrong.append(f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}")
    assert sorted({m.split(".")[2] for m in MODULES if m.startswith("daemon.fleet.")}) == sorted(FLEET_ROOMS)
    assert wrong == []
