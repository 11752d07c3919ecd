#!/usr/bin/env python3
"""The naive baseline most people write: JSON decode + INT8 invoke + publish inside on_message.

    python scripts/naive_baseline.py HOST:PORT   (serves the `activity` route of config.yaml)

A thin wrapper over `daemon.tools.baselines` (`python -m daemon.tools.baselines naive --broker HOST:PORT`),
which `edge-inferd bench e2e` runs side by side with the daemon.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.tools import baselines  # noqa: E402
from daemon.config.schema import RouteConfig  # noqa: E402


def make_answer() -> tuple[RouteConfig, Callable[[bytes], str]]:
    """The activity route and the naive per-message body (scripts/profile_worker.py times it)."""
    return baselines.make_answer(ROOT / "config.yaml", "activity")


if __name__ == "__main__":
    baselines.main(["naive", "--broker", sys.argv[1], "--config", str(ROOT / "config.yaml")])
