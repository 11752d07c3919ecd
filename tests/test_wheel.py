"""The package as a user installs it: a built wheel, not the checkout, serves config.yaml."""

from __future__ import annotations

import ast
import configparser
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 300
# Words in a test fixture's file name: the test brokers live in tests/integration/, not in the wheel.
FIXTURE_WORDS = ("rumqttd", "ejabberd")
# Modules the wheel ships that `edge-inferd` never runs, each with the reason it is still packed.
NOT_RUN_BY_EDGE_INFERD = {
    "daemon.tools.bench.detect": "the machinery of benchmarks/bench_detect.py, a dev benchmark (not a test fixture)",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"  # a copy: setuptools leaves build/ behind in the tree it builds
    shutil.copytree(ROOT / "daemon", source / "daemon", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
                           capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert build.returncode == 0, build.stderr[-3000:]
    (found,) = out.glob("edge_inferd-*.whl")
    return found


def test_the_wheel_holds_every_module_of_every_wing(wheel):
    with zipfile.ZipFile(wheel) as archive:
        packed = {name for name in archive.namelist() if name.startswith("daemon/") and name.endswith(".py")}
    assert packed == {p.relative_to(ROOT).as_posix() for p in (ROOT / "daemon").rglob("*.py")}


def _wheel_modules(archive: zipfile.ZipFile) -> dict[str, ast.Module]:
    """Every daemon module in the wheel, parsed from the wheel's own files: name -> its AST."""
    modules = {}
    for name in archive.namelist():
        if name.startswith("daemon/") and name.endswith(".py"):
            parts = name[:-len(".py")].split("/")
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = ast.parse(archive.read(name), name)
    return modules


def _named(tree: ast.Module) -> set[str]:
    """What a module may load at run time: every import (at module level or inside a function;
    `from a import b` names a.b too, in case b is a module) and every string that might name a
    module whole (`[sys.executable, "-m", "daemon.tools.baselines"]`; "-m daemon" runs daemon.__main__)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, "a relative import: resolve it here before counting on this check"
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= {node.value, f"{node.value}.__main__"}
    return found


def _run_by(entry: str, modules: dict[str, ast.Module]) -> set[str]:
    """The wheel's modules that `entry` (a module) loads, directly or through the others, with the
    packages above each (importing daemon.tools.bench.load runs daemon/tools/__init__.py)."""
    seen, todo = set(), [entry]
    while todo:
        module = todo.pop()
        if module in seen or module not in modules:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += [name for name in _named(modules[module]) if name in modules]
    return seen


def test_the_wheel_holds_no_test_fixture(wheel):
    with zipfile.ZipFile(wheel) as archive:
        fixtures = [name for name in archive.namelist() if any(word in name.lower() for word in FIXTURE_WORDS)]
        modules = _wheel_modules(archive)
        scripts = configparser.ConfigParser()
        (entry_points,) = [name for name in archive.namelist() if name.endswith(".dist-info/entry_points.txt")]
        scripts.read_string(archive.read(entry_points).decode())
    assert fixtures == []
    assert dict(scripts["console_scripts"]) == {"edge-inferd": "daemon.cli:main"}
    run = _run_by("daemon.cli", modules)
    assert "daemon.tools.broker" in run and "daemon.tools.bench.e2e" in run  # the demo's and the bench's mosquitto
    # A module edge-inferd never loads is a test's or a script's: it belongs outside daemon/ (or on the list).
    assert set(modules) - run == set(NOT_RUN_BY_EDGE_INFERD)


def test_the_installed_wheel_runs_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # A plain (not editable) install of the wheel alone, by this pip into the new venv; its
    # dependencies come from the test's own environment on PYTHONPATH (a path entry, so the
    # checkout's editable hook, a .pth file, stays off).
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # else pip may see the checkout as installed
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                   check=True, timeout=BUILD_TIMEOUT_S, env=clean)
    # Every site directory of the test's environment: on armv7 numpy and PyYAML come from Debian's
    # dist-packages (scripts/setup.sh's --system-site-packages venv), not from the venv's purelib.
    sites = [sysconfig.get_path("purelib")] + [p for p in site.getsitepackages() if p != sysconfig.get_path("purelib")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sites)}
    where = subprocess.run([str(python), "-c", "import daemon.serve.wiring as m; print(m.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert where.returncode == 0 and where.stdout.startswith(str(venv)), where.stdout + where.stderr
    entry = [str(venv / "bin" / "edge-inferd")]
    helped = subprocess.run([*entry, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert helped.returncode == 0 and "check-config" in helped.stdout, helped.stderr
    checked = subprocess.run([*entry, "check-config", "--config", str(ROOT / "config.yaml")],
                             capture_output=True, text=True, env=env, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "valid" in checked.stdout
