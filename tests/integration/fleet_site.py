"""A site for fleet tests: a signing key, a release server (Python's http.server on a free port, which
ignores Range, as a plain on-site server might), releases made by `fleet sign`'s own code, and a
node config with the activity model managed. Real parts throughout: the daemon, mosquitto, HTTP.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Optional

import yaml

from daemon.fleet.release import minisign
from daemon.fleet.controller.publish import make_release
from daemon.fleet.release.release import Claim
from daemon.tools.demo_fleet import node_config
from daemon.tools.release_server import ReleaseServer
from tests.integration.conftest import ROOT, Client, activity_payloads

ACTIVITY = ROOT / "models/activity"
# A second build of the activity model (a float32 interface, the same task): a release with another sha256.
ACTIVITY_FLOAT_IO = ROOT / "tests/fixtures/activity_float_io"
# A build that does the activity graph five times, with the same answers (tools/slower_build.py).
SLOWER = ROOT / "tests/fixtures/activity_x3"
GUNPOINT = ROOT / "models/gunpoint"


class Site:
    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.key = minisign.generate()
        self.server = ReleaseServer(tmp_path / "site")

    def release(self, serial: int, version: str, model_dir: Path = ACTIVITY, labels: Optional[list[str]] = None,
                key: Optional[minisign.SecretKey] = None, claims=(), summary: str = "", name: str = "activity") -> str:
        """A signed release of `model_dir`'s model (and its labels, or `labels` instead) at
        site/<name>/<serial>/; returns its URL."""
        out = self.server.root / name / str(serial)
        labels_path = model_dir / "labels.txt"
        if labels is not None:
            labels_path = self.tmp / f"labels-{serial}" / "labels.txt"
            labels_path.parent.mkdir(parents=True, exist_ok=True)
            labels_path.write_text("\n".join(labels) + "\n")
        make_release(out, name, version, serial, model_dir / "model.tflite", labels_path, key or self.key,
                     tuple(claims), summary)
        return self.server.url(f"{name}/{serial}/")

    def release_dir(self, serial: int, name: str = "activity") -> Path:
        return self.server.root / name / str(serial)

    def config(self, directory: Path, client_id: str = "gw1", validate: bool = True,
               sections: Optional[dict] = None, **fleet) -> Path:
        """A node serving only the activity route (managed), trusting this site's key; quick fetch
        retries and a short canary unless `fleet` says otherwise; `sections` replace whole sections."""
        fleet = {"fetch": {"attempts": 2, "backoff_s": 0.05, "stall_s": 5},
                 "canary": {"duration_s": 1, "min_answers": 30}, **fleet}
        path = node_config(directory, client_id, self.key.public_key.line, validate, **fleet)
        if sections:
            raw = yaml.safe_load(path.read_text())
            path.write_text(yaml.safe_dump({**raw, **sections}, sort_keys=False))
        return path

    def close(self) -> None:
        self.server.close()


def desire(client: Client, node: str, rev: int, url: Optional[str], serial: Optional[int]) -> None:
    models = {"activity": None if url is None else {"url": url, "serial": serial}}
    client.c.publish(f"edge-inferd/fleet/desired/node/{node}", json.dumps({"rev": rev, "models": models}),
                     qos=1, retain=True).wait_for_publish(30)


def reported(client: Client, node: str, predicate) -> dict:
    """The first reported document of `node` whose activity entry satisfies `predicate`."""
    topic = f"edge-inferd/{node}/fleet/reported"
    if topic not in client.topics:
        client.subscribe(topic)
    try:
        return client.wait_json_until(topic, lambda doc: predicate(doc["models"]["activity"]))
    except AssertionError:
        last = client.on(topic)[-1:]
        raise AssertionError(f"no reported document as wanted; the last: {last[0].payload.decode() if last else None}")


def skewed_payloads(n: int, start: int = 0) -> list[bytes]:
    """n activity requests as a site's traffic is: mostly one activity (3 of 4 of class 0, the rest
    class 1), ids from `start`. A permutation of the labels moves these answers' distribution, where
    the balanced test split would not show it."""
    import numpy as np

    with np.load(ACTIVITY / "test.npz") as data:
        x, y = data["x"], data["y"]
    pool = [i for i in np.flatnonzero(y == 0)] * 3 + [i for i in np.flatnonzero(y == 1)]
    return [json.dumps({"id": start + k, "data": np.round(x[pool[k % len(pool)]], 3).tolist()}).encode()
            for k in range(n)]


def permuted(labels_file: Path) -> list[str]:
    labels = [line.strip() for line in labels_file.read_text().splitlines() if line.strip()]
    return labels[1:] + labels[:1]


def claim_on(data: Path, metric: str, value: float) -> Claim:
    from daemon.model.runtime import file_sha256

    return Claim(file_sha256(data), metric, value)


def requests_topic(node: str) -> str:
    """The activity route's request topic of `Site.config(..., client_id=node)` (one device)."""
    return f"sensors/{node}/dev1/imu"


def results_topic(node: str) -> str:
    return f"results/{node}/dev1/activity"


class Traffic:
    """Live traffic for several nodes' canaries, on a thread, until `stop()`: a round of `batch`
    requests to each node, then a wait for their answers before the next round. Paced by the
    nodes' own answers (never faster than they answer); a round that is not answered within
    `round_s` (a node mid-swap, a broker restart) is given up and the next one sent, so the feeder
    never stalls. And no round starts within `every_s` of the one before, as a site's sensors send
    at a rate of their own (20 requests per node per 0.25 s: 80/s, past a 1 s canary's 30 answers):
    unpaced, the three nodes answering as fast as they could took both CPUs of a small machine, and
    each node's swap (its check-config child runs at a lower priority) waited seconds for one."""

    def __init__(self, client: Client, nodes: list[str], batch: int = 20, round_s: float = 5.0,
                 every_s: float = 0.25):
        self.client, self.nodes, self.batch, self.round_s, self.every_s = client, nodes, batch, round_s, every_s
        self._stop = threading.Event()
        for node in nodes:
            client.subscribe(results_topic(node))
        self._payloads = activity_payloads(batch)
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            next_round = time.monotonic() + self.every_s
            with self.client.cond:
                before = {node: self.client.count(results_topic(node)) for node in self.nodes}
            for node in self.nodes:  # not waited for: while the broker is away paho keeps them (QoS 1)
                for payload in self._payloads:
                    self.client.c.publish(requests_topic(node), payload, qos=1)

            def answered() -> bool:
                return self._stop.is_set() or all(self.client.count(results_topic(n)) >= before[n] + self.batch
                                                  for n in self.nodes)
            with self.client.cond:
                self.client.cond.wait_for(answered, self.round_s)
            self._stop.wait(max(0.0, next_round - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        with self.client.cond:
            self.client.cond.notify_all()
        self._thread.join(30)
