"""The node's fleet agent: desired documents and commands in, releases installed, a report out.

One thread of its own: nothing it does (a download, the gate's child, a canary) waits on the
MQTT thread or a worker, and the running release serves throughout. The MQTT thread only
hands it messages (`on_message`: parse the topic, queue; a `cancel` also sets the model's
cancel flag at once, so a download stops at its next chunk). The main loop of the service
applies a swap (`Host.apply`: re-read the config, whose managed models resolve to the store's
`current` release, check it in a child and hot-swap, daemon/lifecycle/service.py).

Per managed model the agent reconciles what runs with what the documents ask for
(`_reconcile`): nothing to do, a refusal remembered, a staged release waiting for `install`,
or an install (install.py) followed by the swap and a canary (canary.py); a canary that fails
sends the model back to the previous release. Every change is written to the model's
`state.json` and published in the retained reported document.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, Optional, Protocol, Sequence

from daemon.config.fleet import MANUAL, release_files
from daemon.config.mqtt import fleet_group_topic
from daemon.config.schema import Config
from daemon.fleet.node import canary, canary_probe, commands_node, ha_update
from daemon.fleet.release import desired
from daemon.fleet.node.install import Installer
from daemon.fleet.node.records import (ACTIVE, CANARY, DOWNLOADING, FAILED, IDLE, ROLLED_BACK, STAGED, VERIFYING,
                                  ModelRecord, Release)
from daemon.fleet.release.refusal import CANARY as CANARY_CODE, CLAIM, GATE, LOAD, UNKNOWN_VERSION, Refused
from daemon.fleet.release.release import claimed
from daemon.fleet.node.store import ModelStore
from daemon.obs import ha_discovery
from daemon.obs.model_watch import ModelWatch, ReleaseWindow
from daemon.pipeline import codecs
from daemon.pipeline.route_pipeline import SHA_PREFIX  # replies carry this much of the digest: the watch's key

logger = logging.getLogger(__name__)

# The agent looks at its canaries this often when no message comes.
TICK_S = 1.0
# A download's progress goes into the reported document at most this often.
PROGRESS_INTERVAL_S = 0.5
_STOP = object()
# Refusals a new rev of a desired document clears: a later try may get past them.
TRANSIENT = ("download", "no_space")


class Host(Protocol):
    """What the agent asks of the running service (daemon/lifecycle/fleet_node.py)."""

    watch: ModelWatch

    def config(self) -> Config: ...
    def publish(self, topic: str, payload: bytes, retain: bool) -> None: ...
    def apply(self, reason: str) -> Optional[str]: ...
    def internal_errors(self, routes: Sequence[str]) -> int: ...
    def model_sha256(self, model: str) -> str: ...
    def open_model(self, model: str) -> canary_probe.Probed: ...
    def uptime_s(self) -> float: ...


class _Canary:
    """A canary under way: since when, the new release's sha256, the previous release's answers
    just before the swap, the internal count before it, and the releases' probe (canary_probe.py)."""

    def __init__(self, started: float, new_sha: str, previous: ReleaseWindow, internal_before: int,
                 probe: Optional[canary_probe.Probe] = None):
        self.started, self.new_sha, self.previous, self.internal_before = started, new_sha, previous, internal_before
        self.probe = probe


class Agent:
    def __init__(self, host: Host, trusted: Sequence, make_installer: Callable[..., Installer],
                 clock: Callable[[], float] = time.monotonic):
        self._host = host
        self._trusted = trusted
        self._make_installer = make_installer
        self._clock = clock
        config = host.config()
        self._fleet = config.fleet
        self._node = config.mqtt.client_id
        self._topics = {config.mqtt.fleet_desired_topic: desired.NODE,
                        **{fleet_group_topic(g): desired.group_source(g) for g in self._fleet.groups}}
        self._cmd_topic = config.mqtt.fleet_cmd_topic
        self._reported_topic = config.mqtt.fleet_reported_topic
        self.stores = {name: ModelStore(self._fleet.store_dir, name) for name, mc in config.models.items()
                       if mc.managed}
        self.records = {name: ModelRecord.from_state(name, store.read_state()) for name, store in self.stores.items()}
        self._cancel = {name: threading.Event() for name in self.stores}
        self._docs = commands_node.DocBook(self._fleet.store_dir)
        self._canaries: dict[str, _Canary] = {}
        self._events: queue.Queue = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._last_report = b""
        self._progress_at = 0.0
        self.last_cmd: Optional[dict] = None
        self._ha = config.homeassistant if config.homeassistant.discovery else None
        self._resume_canaries()

    @property
    def filters(self) -> list[str]:
        return [*self._topics, self._cmd_topic]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fleet-agent", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        for event in self._cancel.values():
            event.set()  # a download under way stops at its next chunk (the part is kept)
        self._events.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def on_message(self, topic: str, payload: bytes) -> bool:
        """MQTT thread: queue a fleet message (True), or say it is not one (False)."""
        if topic == self._cmd_topic:
            cmd = commands_node.peek(payload)
            if cmd and cmd.get("cmd") == commands_node.CANCEL and cmd.get("model") in self._cancel:
                self._cancel[cmd["model"]].set()
            self._events.put(("cmd", payload))
            return True
        source = self._topics.get(topic)
        if source is None:
            return False
        self._events.put(("desired", source, payload))
        return True

    # --- the agent's thread ---

    def _run(self) -> None:
        if self._ha is not None:
            self._announce_ha()
        self._publish_report()
        while True:
            try:
                event = self._events.get(timeout=TICK_S)
            except queue.Empty:
                event = None
            if event is _STOP:
                return
            try:
                if event is not None:
                    self._handle(event)
                for name in self.stores:
                    self._reconcile(name)
                self._watch_canaries()
            except Exception:  # the agent must outlive any one document or release
                logger.exception("fleet: the agent's step failed; it carries on")
            self._publish_report()

    def _handle(self, event: tuple) -> None:
        if event[0] == "cmd":
            self.last_cmd = commands_node.run(self, event[1])
            return
        _, source, payload = event
        try:
            doc = desired.parse_desired(payload, source)
        except ValueError as exc:
            logger.warning("fleet: the desired document on %s is refused: %s", source, exc)
            return
        changed = self._docs.take(source, doc)
        if changed:
            for name in changed:
                if name in self.records:
                    self.records[name].forget(self._target_serial(name), TRANSIENT)

    def _target_serial(self, name: str) -> Optional[int]:
        target = self.targets().get(name)
        return None if target is None else target.serial

    def targets(self) -> dict:
        return desired.merge(self._docs.docs, self._fleet.groups)

    def _reconcile(self, name: str) -> None:
        record, store = self.records[name], self.stores[name]
        if record.state == CANARY:
            return
        target = self.targets().get(name)
        if target is None:
            if record.state not in (FAILED, ROLLED_BACK, STAGED):
                record.state = ACTIVE if store.current() is not None else IDLE
            return
        serial = target.serial if target.serial is not None else (record.target or {}).get("serial")
        if serial is not None and serial == store.current():  # what is desired runs (a rollback's target too)
            self._settle(name, target, serial)
            return
        refused = record.rejection(serial) if serial is not None else None
        if refused is not None:
            if record.state not in (FAILED, ROLLED_BACK):
                self._set(name, FAILED if refused["code"] not in (CANARY_CODE, "operator") else ROLLED_BACK)
            return
        if record.staged is not None and record.staged == serial and self._fleet.activation == MANUAL:
            return
        self._install(name, target)

    def _settle(self, name: str, target: desired.Target, serial: int) -> None:
        """The desired release is the current one: active, with its own gate's figures (not a refused
        one's); written and published only when that changes something."""
        record = self.records[name]
        gate = record.gate if record.gate and record.gate.get("serial") == serial else None
        release = self._release(name, serial)
        shown = {**target.as_dict(), "serial": serial, "version": release.version if release else None}
        if (record.state, record.target, record.error, record.progress, record.gate) != (ACTIVE, shown, None, None,
                                                                                          gate):
            self._set(name, ACTIVE, target=shown, error=None, progress=None, gate=gate)

    def _install(self, name: str, target: desired.Target) -> None:
        record, store = self.records[name], self.stores[name]
        self._cancel[name].clear()
        record.target, record.error, record.gate = target.as_dict(), None, None
        installer = self._make_installer(self._host.config(), self._trusted, store,
                                         lambda state, **fields: self._set(name, state, **fields), self._cancel[name])
        serial, version = target.serial, UNKNOWN_VERSION
        try:
            self._set(name, VERIFYING, progress=None)  # the manifest first: no byte of the model before it
            data, signatures = installer.signed(target)
            said = claimed(data)  # what a refusal before the signatures are checked names (shown, not trusted)
            serial, version = target.serial if target.serial is not None else said[0], said[1]
            manifest = installer.manifest(target, data, signatures)
            serial, version = manifest.serial, manifest.version
            record.target.update(serial=serial, version=version)
            record.summary = manifest.summary
            if manifest.serial == store.current():
                self._set(name, ACTIVE, progress=None)
                return
            kept = manifest.serial in store.kept()
            installer.fetch(target, manifest, data, signatures)
            gate = {"passed": True, "note": "a kept release: no gate"} if kept else installer.gate(manifest)
            record.gate = {**gate, "serial": manifest.serial}
            if self._fleet.activation == MANUAL:
                record.staged = manifest.serial
                self._set(name, STAGED, progress=None)
                return
            self._activate(name, manifest.serial)
        except Refused as refusal:
            self._refuse(name, serial, version, refusal)

    def _refuse(self, name: str, serial: Optional[int], version: str, refusal: Refused) -> None:
        logger.warning("fleet: %s serial %s refused: %s: %s", name, serial, refusal.code, refusal.message)
        self.records[name].reject(serial, version, refusal.code, refusal.message)
        if refusal.code in (GATE, CLAIM):
            self.records[name].gate = {"passed": False, "code": refusal.code, "message": refusal.message,
                                       "serial": serial}
        self._set(name, FAILED, progress=None)

    def activate_staged(self, name: str) -> str:
        """`install`: swap in the staged release (activation: manual)."""
        record = self.records[name]
        if record.state != STAGED or record.staged is None:
            raise Refused("operator", f"model {name!r} has no staged release (it is {record.state})")
        serial = record.staged
        self._activate(name, serial)
        return f"installing serial {serial}"

    def _activate(self, name: str, serial: int) -> None:
        """The journaled swap, the service's hot swap, then the canary."""
        store, record = self.stores[name], self.records[name]
        watch = self._host.watch
        previous = watch.window(self._host.model_sha256(name)[:SHA_PREFIX])  # before the swap: the same sha may come back
        previous_copy = canary_probe.copy_of(lambda: self._host.open_model(name))  # the bytes serving now
        record.staged, record.canary_serial, record.restarts = None, serial, 0
        store.write_state({**record.as_state(), "state": CANARY})  # a kill from here on resumes the canary at start
        before = store.current()
        store.activate(serial, record.refused())
        problem = self._host.apply(f"fleet: model {name} serial {serial}")
        if problem is not None:  # undone: back to what ran before, even from a kept release below it
            if before is None:
                store.deactivate()
            else:
                store.activate(before, record.refused())
            record.canary_serial = None
            raise Refused(LOAD, f"the swap failed and the previous release serves on: {problem}")
        new_sha = self._host.model_sha256(name)
        watch.forget(new_sha[:SHA_PREFIX])
        probe = canary_probe.against(previous_copy, lambda: self._host.open_model(name))
        self._canaries[name] = _Canary(self._clock(), new_sha, previous, self._host.internal_errors(self._routes(name)),
                                       probe)
        logger.info("fleet: %s serial %d swapped in (sha256 %s); canary for %g s and %d answers", name, serial,
                    new_sha[:12], self._fleet.canary.duration_s, self._fleet.canary.min_answers)
        self._set(name, CANARY, progress=None, error=None)

    def _routes(self, name: str) -> list[str]:
        return [r.name for r in self._host.config().routes if r.model == name]

    def _resume_canaries(self) -> None:
        """A canary that a restart interrupted goes on (boot() counted the restart), without the
        previous release's window: only the internal rate is judged until the end."""
        for name, record in self.records.items():
            if record.state == CANARY and record.canary_serial == self.stores[name].current():
                sha = self._host.model_sha256(name)
                self._canaries[name] = _Canary(self._clock(), sha, ReleaseWindow((), (), 0),
                                               self._host.internal_errors(self._routes(name)))
            elif record.state == CANARY:  # the swap never happened (or boot undid it): reconcile decides
                record.state, record.canary_serial = IDLE, None

    def _watch_canaries(self) -> None:
        for name, run in list(self._canaries.items()):
            watch = self._host.watch
            verdict = canary.judge(self._fleet.canary, watch.window(run.new_sha[:SHA_PREFIX]), run.previous,
                                   self._host.internal_errors(self._routes(name)) - run.internal_before,
                                   self._clock() - run.started, self._routes(name), run.probe)
            self.records[name].canary = {**verdict.figures, "restarts": self.records[name].restarts}
            if verdict.outcome == canary.PASS:
                del self._canaries[name]
                self.records[name].canary_serial = None
                removed = self.stores[name].prune(self._fleet.keep)
                logger.info("fleet: %s serial %s is active (%s)%s", name, self.stores[name].current(), verdict.reason,
                            f"; releases {removed} removed" if removed else "")
                self._set(name, ACTIVE)
            elif verdict.outcome == canary.FAIL:
                self.rollback(name, CANARY_CODE, f"the canary failed: {verdict.reason}")

    def rollback(self, name: str, code: str, message: str) -> str:
        """Back to the newest kept release below the current one that this node has not refused (no
        download, no gate; never up to a later serial), or to the configured files when none is kept.
        Refused when no release is current."""
        store, record = self.stores[name], self.records[name]
        serial = store.current()
        if serial is None:
            raise Refused("operator", f"model {name!r} runs its configured files: there is no release to go back from")
        left = self._release(name, serial)  # the release left, not the target: they differ after a refusal
        store.back(record.refused())
        problem = self._host.apply(f"fleet: model {name} back to {_shown(store.current())}")
        self._canaries.pop(name, None)
        record.canary_serial = None
        record.reject(serial, left.version if left else UNKNOWN_VERSION, code, message)
        logger.warning("fleet: %s serial %s rolled back to %s: %s", name, serial, _shown(store.current()), message)
        if problem is not None:
            logger.error("fleet: %s: the previous release failed to load again: %s", name, problem)
        self._set(name, ROLLED_BACK)
        return f"rolled back from serial {serial} to {_shown(store.current())}"

    def _set(self, name: str, state: str, **fields) -> None:
        record = self.records[name]
        moved = state != record.state
        record.state = state
        for key, value in fields.items():
            setattr(record, key, value)
        if moved or state != DOWNLOADING:
            self.stores[name].write_state(record.as_state())
        now = self._clock()
        if moved or state != DOWNLOADING or now - self._progress_at >= PROGRESS_INTERVAL_S:
            self._progress_at = now  # a download's progress is shown, not published per chunk
            self._publish_report()

    def _release(self, name: str, serial: Optional[int]) -> Optional[Release]:
        directory = None if serial is None else self.stores[name].release_dir(serial)
        files = None if directory is None else release_files(directory)
        return None if files is None else Release(files.serial, files.version, files.model_sha256)

    def report(self) -> dict:
        models = {}
        for name, record in self.records.items():
            store = self.stores[name]
            current = self._release(name, store.current())
            entry = record.as_report(current, self._release(name, store.previous()))
            if current is None:  # the configured files, before the first release
                entry["sha256"] = self._host.model_sha256(name)[:12]
            models[name] = entry
        return {"node": self._node, "groups": list(self._fleet.groups), "rev": self._docs.revs(),
                "uptime_s": round(self._host.uptime_s(), 1), "time": round(time.time(), 1), "models": models,
                "last_cmd": self.last_cmd}

    def _publish_report(self) -> None:
        report = self.report()
        body = codecs.encode({k: v for k, v in report.items() if k not in ("uptime_s", "time")})
        if body == self._last_report:
            return
        self._last_report = body
        self._host.publish(self._reported_topic, codecs.encode(report), True)
        if self._ha is not None:
            self._publish_ha(report)

    def _announce_ha(self) -> None:
        """Home Assistant's update entity per managed model (retained, once: the broker keeps it)."""
        config = self._host.config()
        node = ha_discovery.node_id(config.mqtt)
        for name in self.stores:
            topic, payload = ha_update.discovery(node, name, config.homeassistant.prefix, config.mqtt)
            self._host.publish(topic, codecs.encode(payload), True)

    def _publish_ha(self, report: dict) -> None:
        mqtt = self._host.config().mqtt
        for name, entry in report["models"].items():
            record = self.records[name]
            version = (record.target or {}).get("version")
            latest = {"version": version, "summary": record.summary} if version else None
            self._host.publish(ha_update.state_topic(mqtt, name), codecs.encode(ha_update.state(entry, latest)), True)


def _shown(serial: Optional[int]) -> str:
    return "the configured files" if serial is None else f"serial {serial}"
