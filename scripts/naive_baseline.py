#!/usr/bin/env python3
"""The naive baseline most people write: JSON decode + INT8 invoke + publish inside on_message.

    python scripts/naive_baseline.py HOST:PORT   (serves the `activity` route of config.yaml)

Same model, same preprocessing code and same reply topic as the daemon, so
scripts/bench_e2e.py can compare the two side by side.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import paho.mqtt.client as paho  # noqa: E402
from paho.mqtt.enums import CallbackAPIVersion  # noqa: E402

from daemon import preprocess, topics  # noqa: E402
from daemon.config import RouteConfig, load_config  # noqa: E402
from daemon.mqtt import disable_nagle  # noqa: E402
from daemon.runtime import Model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def make_answer() -> tuple[RouteConfig, Callable[[bytes], str]]:
    """The activity route and the naive per-message body: JSON in, reply JSON out.

    scripts/profile_worker.py times this same function against the daemon's worker path."""
    config = load_config(ROOT / "config.yaml")
    route = next(r for r in config.routes if r.name == "activity")
    model = Model(config.models["activity"].path)
    labels = (ROOT / "models/activity/labels.txt").read_text().split()

    def answer(payload: bytes) -> str:
        req = json.loads(payload)
        x = np.asarray(req["data"], dtype=np.float32).reshape((1,) + route.input.shape)
        scores = model.infer(preprocess.apply_steps(route.preprocess, x))[0]
        return json.dumps({"id": req["id"], "label": labels[int(scores.argmax())], "score": float(scores.max())})

    return route, answer


def main(broker: str) -> None:
    route, answer = make_answer()

    def on_message(client, userdata, msg):
        captures = topics.match(route.subscribe, msg.topic)
        client.publish(topics.render(route.publish, msg.topic, captures), answer(msg.payload), qos=1)

    host, port = broker.rsplit(":", 1)
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="naive", protocol=paho.MQTTv5)
    client.on_message = on_message
    client.on_connect = lambda c, *_: (disable_nagle(c.socket()), c.subscribe(route.subscribe, qos=1),
                                      c.publish("edge-inferd/naive/status", "online", qos=1, retain=True))
    client.connect(host, int(port))
    signal.signal(signal.SIGTERM, lambda *_: client.disconnect())
    client.loop_forever()


if __name__ == "__main__":
    main(sys.argv[1])
