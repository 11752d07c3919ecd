"""The package as a user installs it: a built wheel, not the checkout, serves config.yaml."""

from __future__ import annotations

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
