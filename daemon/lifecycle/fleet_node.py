"""The fleet agent (daemon/fleet/node/agent.py) inside the running service: its topics, its host, its boot.

- `boot` runs before the models load: each managed model's store is recovered (a swap that a
  SIGKILL interrupted is finished, so one whole release is current), and a release whose
  canary saw more than `fleet.canary.max_restarts` daemon starts is reverted before it can
  crash the daemon again.
- `ServiceHost` is what the agent may ask of the service: the running config and models, the
  link's publish, the internal-error count, and `apply`, which the service's main loop carries
  out (a re-read config, checked in a child process and hot-swapped, as SIGHUP does).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable, Optional, Sequence

from daemon.config.model_files import open_model
from daemon.config.schema import Config
from daemon.errors import ConfigError, INTERNAL
from daemon.fleet.node.agent import Agent, Host
from daemon.fleet.node.fetch import FetchPolicy
from daemon.fleet.node.install import Installer
from daemon.fleet.release.minisign import MinisignError, load_public_key
from daemon.fleet.node.records import CANARY, ROLLED_BACK, ModelRecord
from daemon.fleet.release.refusal import CANARY as CANARY_CODE
from daemon.fleet.node.store import ModelStore
from daemon.model.runtime import Model

logger = logging.getLogger(__name__)

# How long the agent waits for the main loop to apply a swap (the child's check included).
APPLY_TIMEOUT_S = 300.0


def boot(config: Config) -> bool:
    """Before the models load: recover each managed model's store; revert a release whose canary
    the daemon restarted too often during. True when a `current` link changed (re-read the config)."""
    changed = False
    for name, mc in config.models.items():
        if not mc.managed:
            continue
        store = ModelStore(config.fleet.store_dir, name)
        before = store.current()
        done = store.recover()
        if done:
            logger.warning("fleet: %s: %s", name, done)
        record = ModelRecord.from_state(name, store.read_state())
        if record.state == CANARY and record.canary_serial == store.current():
            record.restarts += 1
            if record.restarts > config.fleet.canary.max_restarts:
                serial = store.current()
                store.back(record.refused())
                message = (f"the daemon started {record.restarts} times during the canary "
                           f"(fleet.canary.max_restarts {config.fleet.canary.max_restarts})")
                record.reject(serial, (record.target or {}).get("version", ""), CANARY_CODE, message)
                record.state, record.canary_serial = ROLLED_BACK, None
                logger.error("fleet: %s serial %s rolled back to %s at start: %s", name, serial, store.current(),
                             message)
            store.write_state(record.as_state())
        changed = changed or store.current() != before
    return changed


def trusted_keys(config: Config) -> list:
    """The pinned keys; ConfigError naming the entry that cannot be read."""
    keys, problems = [], []
    base = config.source.parent if config.source else Path(".")
    for i, entry in enumerate(config.fleet.trusted_keys):
        try:
            keys.append(load_public_key(entry, base))
        except (OSError, ValueError, MinisignError) as exc:
            problems.append(f"fleet.trusted_keys[{i}]: {exc}")
    if problems:
        raise ConfigError(problems)
    return keys


def fetch_policy(config: Config) -> FetchPolicy:
    fetch = config.fleet.fetch
    headers = {}
    if fetch.token_file is not None:
        headers["Authorization"] = "Bearer " + fetch.token_file.read_text(encoding="utf-8").strip()
    return FetchPolicy(timeout_s=fetch.timeout_s, stall_s=fetch.stall_s, attempts=fetch.attempts,
                       backoff_s=fetch.backoff_s, max_backoff_s=fetch.max_backoff_s,
                       max_bytes=config.fleet.fetch_max_bytes, min_free_bytes=config.fleet.min_free_bytes,
                       ca_file=fetch.ca_file, headers=headers)


def make_agent(host: Host) -> Agent:
    config = host.config()

    def installer(cfg: Config, trusted: Sequence, store: ModelStore, set_state: Callable, cancel: threading.Event):
        return Installer(cfg, trusted, fetch_policy(cfg), store, set_state, cancel)

    return Agent(host, trusted_keys(config), installer)


class ServiceHost:
    """The agent's view of the service; `apply` waits for the service's main loop to do it."""

    def __init__(self, service, post: Callable[[Callable[[], None]], None]):
        self._service = service
        self._post = post
        self.watch = service.watch

    def config(self) -> Config:
        return self._service.config

    def publish(self, topic: str, payload: bytes, retain: bool) -> None:
        link = self._service.link
        if link is not None:
            link.publish(topic, payload, retain=retain)

    def apply(self, reason: str) -> Optional[str]:
        done = threading.Event()
        outcome: list = []

        def run() -> None:
            try:
                outcome.append(self._service.reload(reason))
            finally:
                done.set()

        self._post(run)
        if not done.wait(APPLY_TIMEOUT_S):
            return f"the service did not apply the swap within {APPLY_TIMEOUT_S:g} s"
        return outcome[0] if outcome else "the swap raised"

    def internal_errors(self, routes: Sequence[str]) -> int:
        outcomes = self._service.stats.histograms()["outcomes"]
        wanted = set(routes)
        return sum(n for (route, code), n in outcomes.items() if route in wanted and code == INTERNAL)

    def model_sha256(self, model: str) -> str:
        info = self._service.models.get(model)
        return info.sha256 if info is not None else ""

    def open_model(self, model: str) -> Model:
        """A copy of model `model` as the config names it now, at its native batch (the canary's probe)."""
        return open_model(self._service.config, model, max_batch=1)

    def uptime_s(self) -> float:
        return self._service.uptime_s()
