#!/usr/bin/env python3
"""An unpaced burst of distinct requests through the daemon on each broker, results counted by id.

    EDGE_INFERD_TEST_MODELS=.cache/test-models .venv/bin/python tools/dev/burst_brokers.py \\
        [--requests 20000] [--broker mosquitto rumqttd ejabberd] [--ejabberd-max-queue 5000]

The bundled config as written (native on MQTT v5), gunpoint's route; the requests are published
by paho at QoS 1 as fast as it queues them (no pacing), then the replies are counted by id for up to
--wait seconds. A broker's own queue limit shows here: ejabberd ends a session whose queue passes
mod_mqtt's `max_queue` (5,000 by default) with DISCONNECT 0x97 and drops what it held.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.integration.conftest import Client, Daemon, with_login, write_config  # noqa: E402


def _broker(kind: str, workdir: Path, max_queue: int):
    if kind == "rumqttd":
        from tests.integration.rumqttd import Rumqttd
        return Rumqttd(workdir)
    if kind == "ejabberd":
        from tests.integration.ejabberd import Ejabberd
        return Ejabberd(workdir, settings={"modules": {"mod_mqtt": {"max_queue": max_queue}}})
    from daemon.tools.broker import Broker
    return Broker(workdir)


def burst(kind: str, n: int, wait_s: float, max_queue: int, workdir: Path) -> str:
    with _broker(kind, workdir / "broker", max_queue) as broker:
        client = Client(broker)
        daemon = Daemon(with_login(write_config(workdir, cache={"enabled": False}), broker), broker.address,
                        workdir / "daemon.log")
        try:
            client.subscribe("edge-inferd/edge-inferd/status")  # retained: `online` once the daemon serves
            client.wait_payload("edge-inferd/edge-inferd/status", b"online")
            client.subscribe("results/b/gesture")
            with np.load(ROOT / "models/gunpoint/test.npz") as data:
                x = data["x"]
            start = time.monotonic()
            for i in range(n):  # distinct requests: each window moved a little
                row = np.round(x[i % len(x)].ravel() + 1e-4 * i, 4).tolist()
                client.c.publish("sensors/b/gesture", json.dumps({"id": i, "data": row}), qos=1)
            deadline = time.monotonic() + wait_s
            while client.count("results/b/gesture") < n and time.monotonic() < deadline:
                time.sleep(0.5)
            got = {json.loads(m.payload)["id"] for m in client.on("results/b/gesture")}
            return f"{kind}: {len(got)} of {n} answered in {time.monotonic() - start:.1f} s"
        finally:
            daemon.stop()
            client.close()


def main() -> None:
    import tempfile
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--broker", nargs="+", default=["mosquitto", "rumqttd", "ejabberd"])
    parser.add_argument("--ejabberd-max-queue", type=int, default=5000)
    parser.add_argument("--wait", type=float, default=120.0)
    args = parser.parse_args()
    for kind in args.broker:
        print(burst(kind, args.requests, args.wait, args.ejabberd_max_queue, Path(tempfile.mkdtemp())), flush=True)


if __name__ == "__main__":
    main()
