"""A scripted stand-in for an edge-inferd node's fleet side (docs/fleet.md, the Protocol), over a
real broker, for the controller's tests until the real daemon takes its place.

It follows what a node must: it takes its retained desired document
`edge-inferd/fleet/desired/node/<name>` when its `rev` is above the highest it took (lower or
equal: ignored, as after a reconnect or a broker restart), and publishes its retained reported
document `edge-inferd/<name>/fleet/reported` at every step. What it does with a desired entry
for its model, by the release URL and its own settings:
- an entry that is what it runs, or no entry: nothing ("a model absent from every document stays
  where it is");
- a release it keeps (its previous one): straight back to it, `active`, no download or gate;
- a URL with `bad` in it: `verifying`, then `failed` with error `bad_signature` (and `rejected`);
- `silent=True`: never answers (a node the wave timeout must catch);
- `fails_gate=True`: `verifying` ... `gating`, then `failed` with error `gate` (worse on its data);
- else `verifying` (the manifest) → `downloading` (50%, 100%) → `verifying` (the files) → `gating` →
  `canary` → `active`.
`hold_at=STATE` stops after publishing that state until `go` is set, so a test can act (kill the
controller, restart the broker) at a known point. Commands on `edge-inferd/<name>/fleet/cmd`:
`rollback` sends the model back to `previous` (`rolled_back`, the serial rejected by `operator`).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from typing import Optional

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from daemon.transport.mqtt import stop_loop

WAIT_S = 60.0  # bounds a failing test only
QOS = 1
_STOP = object()
_HALF = 2


def version_of(serial: int) -> str:
    return f"1.{serial}.0"


class FakeNode:
    def __init__(self, port: int, name: str, model: str = "activity", serial: int = 1,
                 groups: tuple[str, ...] = (), silent: bool = False, hold_at: Optional[str] = None,
                 fails_gate: bool = False):
        self.name, self.model, self.silent, self.hold_at, self.fails_gate = name, model, silent, hold_at, fails_gate
        self.groups = list(groups)
        self.go = threading.Event()
        self.cond = threading.Condition()
        self.taken: list[dict] = []  # every desired document taken (rev above the last)
        self.states: list[str] = []  # every state published, in order
        self._rev = 0
        self._started = time.monotonic()
        self._entry = {"state": "active", "version": version_of(serial), "serial": serial, "sha256": f"{serial:012x}",
                       "previous": None, "target": None, "progress": None, "gate": None, "canary": None,
                       "error": None, "rejected": []}
        self._last_cmd: Optional[dict] = None
        self._inbox: queue.Queue = queue.Queue()
        self._worker = threading.Thread(target=self._work, name=f"fake-{name}", daemon=True)
        self._client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"fake-{name}", protocol=paho.MQTTv5)
        self._client.reconnect_delay_set(0.2, 2.0)
        self._client.on_connect = self._on_connect
        self._client.on_message = lambda c, u, msg: self._inbox.put_nowait((msg.topic, msg.payload))
        self._connected = threading.Event()
        self._client.connect("127.0.0.1", port)
        self._client.loop_start()
        assert self._connected.wait(WAIT_S), f"{name} did not connect"
        # The first report at the broker before the node counts as started: a controller started
        # right after must find it (a real node's retained report is there long before a rollout;
        # not waited for, a loaded machine let a rollout start without gw2 and its rollback fail).
        self._publish().wait_for_publish(WAIT_S)
        self._worker.start()

    @property
    def desired_topic(self) -> str:
        return f"edge-inferd/fleet/desired/node/{self.name}"

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        client.subscribe([(self.desired_topic, QOS), (f"edge-inferd/{self.name}/fleet/cmd", QOS)])
        self._connected.set()

    def wait_state(self, state: str) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: state in self.states, WAIT_S), f"{self.name} never {state}: {self.states}"

    def close(self) -> None:
        self.go.set()
        self._inbox.put_nowait(_STOP)
        self._worker.join(WAIT_S)
        self._client.disconnect()
        stop_loop(self._client)

    def _work(self) -> None:
        while True:
            item = self._inbox.get()
            if item is _STOP:
                return
            topic, payload = item
            try:
                doc = json.loads(payload) if payload else {}
            except ValueError:
                continue
            if topic == self.desired_topic:
                self._on_desired(doc)
            else:
                self._on_cmd(doc)

    def _on_desired(self, doc: dict) -> None:
        rev = doc.get("rev")
        if not isinstance(rev, int) or rev <= self._rev:
            return  # a replay (reconnect, broker restart) or an older document: changes nothing
        self._rev = rev
        with self.cond:
            self.taken.append(doc)
        entry = (doc.get("models") or {}).get(self.model)
        if self.silent:
            return
        if not isinstance(entry, dict) or entry.get("serial") == self._entry["serial"]:
            self._publish()  # nothing to do, but the reported `rev` says the document was taken
            return
        previous = self._entry["previous"]
        if previous and entry.get("serial") == previous["serial"]:
            self._switch(previous, "active")
        elif "bad" in str(entry.get("url")):
            self._fail(entry)
        else:
            self._install(entry)

    def _install(self, entry: dict) -> None:
        serial, total = entry["serial"], 21408
        self._step(state="verifying", target=_target(entry), error=None)
        self._step(state="downloading", progress={"bytes": total // _HALF, "total": total})
        self._step(progress={"bytes": total, "total": total})
        self._step(state="verifying")
        self._step(state="gating")
        if self.fails_gate:
            self._refuse(entry, {"code": "gate", "message": "accuracy 0.51 < current 0.97 - 0.02"},
                         gate={"passed": False, "routes": {self.model: {"metric": "accuracy", "value": 0.51,
                                                                        "current": 0.97}}, "cpu_s": 0.4})
            return
        gate = {"passed": True, "routes": {self.model: {"metric": "accuracy", "value": 0.975, "current": 0.97}},
                "cpu_s": 0.41}
        self._step(state="canary", gate=gate, canary={"answers": 300, "min_answers": 200, "elapsed_s": 30.0,
                                                      "duration_s": 60, "internal_rate": 0.0, "latency_ratio": 1.04,
                                                      "psi": 0.012, "restarts": 0})
        old = {k: self._entry[k] for k in ("version", "serial", "sha256")}
        self._step(state="active", version=version_of(serial), serial=serial, sha256=f"{serial:012x}", previous=old,
                   progress=None)

    def _fail(self, entry: dict) -> None:
        self._step(state="verifying", target=_target(entry))
        self._refuse(entry, {"code": "bad_signature", "message": "manifest.json.minisig does not verify manifest.json"})

    def _refuse(self, entry: dict, error: dict, **changes) -> None:
        rejected = [*self._entry["rejected"], {"serial": entry["serial"], "version": version_of(entry["serial"]),
                                               **error}]
        self._step(state="failed", error=error, rejected=rejected, progress=None, **changes)

    def _switch(self, to: dict, state: str, **changes) -> None:
        old = {k: self._entry[k] for k in ("version", "serial", "sha256")}
        self._step(state=state, previous=old, **{k: to[k] for k in ("version", "serial", "sha256")}, **changes)

    def _on_cmd(self, cmd: dict) -> None:
        if cmd.get("cmd") != "rollback" or cmd.get("model") != self.model:
            self._last_cmd = {**cmd, "ok": False, "message": "unknown command"}
            self._publish()
            return
        previous = self._entry["previous"]
        if not previous:
            self._last_cmd = {**cmd, "ok": False, "message": "no kept release before the current one"}
            self._publish()
            return
        self._last_cmd = {**cmd, "ok": True, "message": f"rolling back to serial {previous['serial']}"}
        rejected = [*self._entry["rejected"], {"serial": self._entry["serial"], "version": self._entry["version"],
                                               "code": "operator", "message": "fleet rollback"}]
        self._switch(previous, "rolled_back", rejected=rejected)

    def _step(self, **changes) -> None:
        self._entry.update(changes)
        state = self._entry["state"]
        # Recorded before it is published: a controller that has seen the document and returned
        # may be checked against `states` at once (appended after, a loaded machine showed a
        # rolled_back answer whose state was not in `states` yet).
        with self.cond:
            self.states.append(state)
            self.cond.notify_all()
        self._publish()
        if state == self.hold_at and "state" in changes:
            assert self.go.wait(WAIT_S), f"{self.name} held at {state} and never let go"

    def _publish(self) -> paho.MQTTMessageInfo:
        doc = {"node": self.name, "groups": self.groups, "rev": {"node": self._rev},
               "uptime_s": round(time.monotonic() - self._started, 1), "models": {self.model: dict(self._entry)},
               "last_cmd": self._last_cmd, "time": time.time()}
        # Not waited for: while the broker is away paho keeps it and sends it after reconnecting.
        return self._client.publish(f"edge-inferd/{self.name}/fleet/reported", json.dumps(doc), qos=QOS, retain=True)


def _target(entry: dict) -> dict:
    return {"version": version_of(entry["serial"]), "serial": entry["serial"], "url": entry["url"]}
