"""config.yaml as a section test starts from: its paths made absolute, some sections replaced, and
the errors a load of it raises."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import pytest
import yaml

from daemon.config.loader import load_config
from daemon.config.reader import absolute_paths
from daemon.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def example_config(tmp_path: Path, edit: Optional[Callable[[dict], None]] = None, **sections) -> Path:
    """A copy of config.yaml in `tmp_path` with `sections` replaced (and `edit` applied to the raw dict)."""
    raw = absolute_paths(yaml.safe_load((ROOT / "config.yaml").read_text()), ROOT)
    raw.update(sections)
    if edit is not None:
        edit(raw)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def config_errors(path: Path) -> str:
    """Every problem of the config at `path` (it must have some), one per line."""
    with pytest.raises(ConfigError) as caught:
        load_config(path, check_models=False)
    return "\n".join(caught.value.errors)
