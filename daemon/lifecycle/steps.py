"""The service's start-up steps, by one typed name shared with reload's plan.

`Service.steps()` lists one `Step` per `StepName`, in this order; `reload.plan` says which
of them to restart from. Both use the enum, so a renamed step cannot leave reload naming a
step that no longer exists (tests/lifecycle/test_reload.py checks that every name has its step).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Optional


class StepName(str, enum.Enum):
    """In start-up order; shutdown runs the started ones in reverse."""

    MODELS = "models"
    CACHE = "cache"
    SERVING = "serving"  # intake, the worker pool and the worker side, wired (daemon/serve/wiring.py)
    MQTT = "mqtt"
    WORKERS = "workers"
    METRICS = "metrics"
    INTAKE = "intake"
    FLEET = "fleet"  # the fleet agent (daemon/fleet/node/agent.py), once requests flow: its swaps are hot swaps
    HTTP = "http"  # the HTTP listener (daemon/lifecycle/http.py): last up, first down, so workers answer its requests

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Step:
    name: StepName
    start: Callable[[], None]
    stop: Optional[Callable[[], None]] = None
