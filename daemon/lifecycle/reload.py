"""Hot reload (SIGHUP): what changed, and the check a new config passes before it is applied.

A reload re-reads the config and the model files. Nothing is applied until the new
config has passed `edge-inferd check-config --deep` **in a child process**: it loads
every model (its pinned sha256 when set), runs each once and passes each route's
`validate` gate. A malformed model can crash the TFLite runtime natively, which must
not take the serving daemon with it. The model files are hashed before the check and
loaded pinned to those digests after it, so a file swapped again in between is refused.

`plan` then says how to apply it (the Service does):
- only model files or labels changed: a hot swap (`Serving.swap`, daemon/serve/wiring.py); a batch in flight
  finishes on the old models, queued requests run on the new ones;
- routes, workers, batching, drift, the broker or `homeassistant` changed: an ordered restart from the first
  affected start-up step (intake closes, the workers drain while MQTT still carries their
  replies, the persistent session holds what arrives meanwhile);
- only `http` changed: the listener is restarted (its requests in flight answered first);
- `metrics` changed: only a restart of the daemon can rebind the endpoint (logged).
On any failure the running config and models keep serving; the error is logged and counted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional

from daemon.config.schema import Config
from daemon.lifecycle.steps import StepName
from daemon.model.runtime import file_sha256

# A model check that takes longer than this counts as failed.
VERIFY_TIMEOUT_S = 120.0
# Lines of the child's output quoted in the log when the check fails.
VERIFY_TAIL_LINES = 8
# While the check runs, the caller's `while_waiting` runs this often: the main loop waits on
# it, and its watchdog (systemd's WatchdogSec=30, a worker process's heartbeat judged at
# 30 s) must still be fed, or a check longer than that gets the daemon killed.
VERIFY_TICK_S = 1.0
# The check's child runs this much below the daemon (nice(2) increments: 10 is a background job's).
CHECK_NICENESS = 10


@dataclass(frozen=True)
class Plan:
    changed_models: frozenset[str]
    """Models whose file, digest pin or labels changed (hot-swapped when nothing else did)."""
    restart_from: Optional[StepName]
    """The first start-up step to restart, or None when a hot swap (or nothing) will do."""
    digests: Mapping[str, str]
    """sha256 of every model file as read before the check; the new models are pinned to them."""
    ignored: tuple[str, ...] = ()
    """Sections that changed but need a restart of the daemon to apply."""

    @property
    def changed(self) -> bool:
        return bool(self.changed_models or self.restart_from)


def fingerprint(config: Config, name: str) -> tuple[str, str]:
    """sha256 of a model's file and of its labels file."""
    mc = config.models[name]
    return file_sha256(mc.path), file_sha256(mc.labels) if mc.labels else ""


def plan(old: Config, new: Config, loaded: Mapping[str, tuple[str, str]]) -> Plan:
    """`loaded` maps each running model's name to the `fingerprint` it was loaded with.
    Raises OSError on an unreadable model or labels file."""
    prints = {name: fingerprint(new, name) for name in new.models}
    digests = {name: model_sha for name, (model_sha, _) in prints.items()}
    changed = frozenset(name for name, mc in new.models.items()
                        if name not in old.models or mc != old.models[name] or prints[name] != loaded.get(name))
    restart_from = None
    if set(new.models) != set(old.models) or (new.runtime, new.xnnpack) != (old.runtime, old.xnnpack):
        restart_from = StepName.MODELS
    elif new.cache != old.cache:
        restart_from = StepName.CACHE
    elif (new.routes, new.workers, new.batching, new.mqtt, new.stats_interval_s, new.drift, new.homeassistant,
          new.fleet) != (old.routes, old.workers, old.batching, old.mqtt, old.stats_interval_s, old.drift,
                         old.homeassistant, old.fleet):
        restart_from = StepName.SERVING
    elif new.http != old.http:
        restart_from = StepName.HTTP
    ignored = ("metrics",) if new.metrics != old.metrics else ()
    return Plan(changed, restart_from, digests, ignored)


def _lower_priority() -> None:
    """The check runs beside serving: below the daemon's priority, so requests keep their cores."""
    os.nice(CHECK_NICENESS)


def verify(path: Path, timeout_s: float = VERIFY_TIMEOUT_S,
           while_waiting: Callable[[], None] = lambda: None) -> Optional[str]:
    """Run `check-config --deep` on `path` in a child process: None when it passes, else why not.
    `while_waiting` runs every VERIFY_TICK_S until the child is done."""
    command = [sys.executable, "-m", "daemon", "check-config", "--deep", "--config", str(path)]
    deadline = time.monotonic() + timeout_s
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=_lower_priority) as child:
        while True:
            try:
                out, err = child.communicate(timeout=min(VERIFY_TICK_S, max(0.0, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:  # retrying communicate loses no output
                if time.monotonic() >= deadline:
                    child.kill()
                    child.communicate()
                    return f"the model check did not finish within {timeout_s:g} s"
                while_waiting()
    if child.returncode == 0:
        return None
    lines = [line for line in (err + out).splitlines() if line.strip()]
    cause = f"exit {child.returncode}" if child.returncode >= 0 else f"killed by signal {-child.returncode}"
    return f"{cause}: " + " | ".join(lines[-VERIFY_TAIL_LINES:])
