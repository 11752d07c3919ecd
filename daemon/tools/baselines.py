"""Reference consumers and a raw-payload load generator for `edge-inferd bench e2e`.

    python -m daemon.tools.baselines echo   --broker HOST:PORT [--config config.yaml] [--route activity]
    python -m daemon.tools.baselines naive  --broker HOST:PORT [--config config.yaml] [--route activity]   # any route
    python -m daemon.tools.baselines naive-detect --broker HOST:PORT --config C --route R
    python -m daemon.tools.baselines naive-stream --broker HOST:PORT --config C --route R   # a stream route
    python -m daemon.tools.baselines naive-audio --broker HOST:PORT --config C --route R    # pcm16 stream + stages
    python -m daemon.tools.baselines rawpub --broker HOST:PORT --topic T --file F --size BYTES [--warmup N]

- `echo`: the transport floor. Bare paho 2.x as people write it (paho's defaults: MQTT 3.1.1,
  Nagle on, a clean session), subscribed to the route's filter at QoS 1; `on_message` publishes a 16-byte reply carrying the request's
  id at QoS 1 to the route's reply topic. No decoding, no model.
- `naive`: the script most people write: decode + preprocessing + INT8 invoke + publish
  inside `on_message`, with the daemon's model, preprocessing code and reply topic, for any
  route whose input is json, raw or npy and whose output kind is classify (label, score),
  anomaly (the mean squared reconstruction error) or values (the outputs as a list).
- `naive-detect`: the camera script most people write, for a `detect` route on an SSD
  (TFLite_Detection_PostProcess: boxes, classes, scores, count): inside `on_message`, Pillow
  decodes the JPEG or PNG, stretches it to the model's input (BILINEAR, the daemon's filter, so
  both see the same pixels), the runtime's own Interpreter (ai_edge_litert's; tflite_runtime's
  where litert is not installed, as on armv7; the model's `threads`) invokes it, and the
  detections scoring at least `output.min_score` (at most `output.max_results`, best first,
  boxes in the sent picture's pixels) are published as JSON. No daemon code on
  the message's way.
- `naive-stream`: the buffering script people put in front of a model for a device's samples: a
  dict of deques in `on_message` (JSON messages of one sample, the device named by the field
  `input.stream.key`), the window inferred inline every `hop` samples (benchmarks/bench_streams.py).
- `naive-audio`: the microphone script people write in front of a wake-word chain, for a pcm16
  stream route with `stages` (the device named by the topic level of the filter's `+`): a
  per-device array of samples in `on_message`, and every `hop` samples, once a window is there,
  the route's model and each stage's model invoked inline on that one window with the runtime's
  own Interpreter (the stage's windows in one invoke, as openWakeWord's loop does), the route's
  and stages' preprocess steps as the daemon's code applies them; the best last-stage score is
  published with the stream and the window's number (benchmarks/bench_stream_audio.py).
- `rawpub`: publishes fixed-size binary payloads from a file at QoS 1 with a large
  in-flight window (`mosquitto_pub -l` is line-based and cannot carry binary payloads).

The JSON replies use the standard library's `json`, as people's scripts do. `--protocol 5`
runs a consumer on MQTT v5 with TCP_NODELAY instead (the daemon's own settings: the bench's
`echo-v5` and `naive-v5`); on v5 a consumer replies with the request's CorrelationData when it
has one, as the daemon does (naive-detect needs it: an image carries no JSON id).

The consumers publish a retained `online` on `edge-inferd/<client-id>/status`, like the
daemon, so the bench waits for them the same way.
"""

from __future__ import annotations

import argparse
import importlib
import io
from collections import defaultdict, deque
import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from daemon import topics
from daemon.model import preprocess
from daemon.config.schema import ANOMALY, CLASSIFY, VALUES, RouteConfig
from daemon.config.loader import load_config
from daemon.config.model_files import read_labels
from daemon.errors import DaemonError
from daemon.transport.link_common import STATUS_OFFLINE, STATUS_ONLINE
from daemon.transport.mqtt import disable_nagle, stop_loop
from daemon.model.runtime import BACKENDS, Model, _resolver_options, resolve_backend

QOS = 1
ECHO_REPLY_BYTES = 16
# The id is the first key of every bench request: `{"id": 123, "data": ...}`.
_ID_PREFIX = re.compile(rb'^\{"id":\s*(-?\d+)')
# Messages rawpub keeps unacknowledged: enough that the publisher is never the bottleneck.
RAW_INFLIGHT = 1000
_PUBLISH_TIMEOUT_S = 120.0
# --protocol: paho's default (what people's scripts run), or v5 with TCP_NODELAY (the daemon's).
PROTOCOLS = {"3.1.1": paho.MQTTv311, "5": paho.MQTTv5}
DEFAULT_PROTOCOL = "3.1.1"
# naive-audio: int16 -> [-1, 1), the convention the daemon's pcm16 decode and the route's steps assume.
PCM16_FULL_SCALE = np.float32(32768.0)


def _route(config_path: Path | str, route_name: str):
    config = load_config(config_path)
    route = next((r for r in config.routes if r.name == route_name), None)
    if route is None:
        raise DaemonError(f"no route named {route_name!r} in {config_path}")
    return config, route


def _decoder(route: RouteConfig) -> Callable[[bytes], tuple[object, np.ndarray]]:
    """The naive decode of the route's `input.format`: (the request's id, its float32 array)."""
    shape = (1,) + tuple(route.input.shape)
    fmt = route.input.format
    if fmt == "json":
        def decode(payload: bytes) -> tuple[object, np.ndarray]:
            req = json.loads(payload)
            return req["id"], np.asarray(req["data"], dtype=np.float32).reshape(shape)
    elif fmt == "raw":
        def decode(payload: bytes) -> tuple[object, np.ndarray]:
            return None, np.frombuffer(payload, dtype=np.dtype(route.input.dtype).newbyteorder("<")) \
                .astype(np.float32).reshape(shape)
    elif fmt == "npy":
        def decode(payload: bytes) -> tuple[object, np.ndarray]:
            return None, np.load(io.BytesIO(payload), allow_pickle=False).astype(np.float32).reshape(shape)
    else:
        raise DaemonError(f"route {route.name!r}: the naive script decodes json, raw and npy, not {fmt!r} "
                          "(a detect route on an SSD: naive-detect)")
    return decode


def _replier(route: RouteConfig, labels: tuple) -> Callable[[object, np.ndarray, np.ndarray], dict]:
    """The naive reply of the route's output kind, from (id, model input, the model's outputs for it)."""
    if route.kind == CLASSIFY:
        return lambda request_id, x, scores: {"id": request_id, "label": labels[int(scores.argmax())],
                                              "score": float(scores.max())}
    if route.kind == ANOMALY:
        return lambda request_id, x, out: {"id": request_id,
                                           "anomaly_score": float(np.mean((x.reshape(-1) - out) ** 2))}
    if route.kind == VALUES:
        return lambda request_id, x, out: {"id": request_id, "values": out.tolist()}
    raise DaemonError(f"route {route.name!r}: no naive script for output kind {route.kind!r}")


def make_answer(config_path: Path | str, route_name: str = "activity") -> tuple[RouteConfig, Callable[[bytes], str]]:
    """The route and the naive per-message body: decode, preprocess, INT8 invoke, reply JSON, for the
    route's input format (json, raw, npy) and output kind (classify, anomaly, values).

    tools/dev/profile_worker.py times this same function against the daemon's worker path."""
    config, route = _route(config_path, route_name)
    decode, model = _decoder(route), Model(config.models[route.model].path)
    found = read_labels(config.models[route.model].labels)
    reply = _replier(route, found.names if found else ())

    def answer(payload: bytes) -> str:
        request_id, x = decode(payload)
        x = preprocess.apply_steps(route.preprocess, x)
        return json.dumps(reply(request_id, x, model.infer(x)[0]))

    return route, answer


def make_stream_answer(config_path: Path | str, route_name: str) -> tuple[RouteConfig, Callable[[bytes], str | None]]:
    """The route and the naive buffering script's per-message body, for a stream route whose JSON
    messages carry one sample and name their device in a field (`input.stream.key`): a dict of
    deques in `on_message`, and every `hop` samples, once a window is there, the window inferred
    inline and its answer published. No gaps, seq or bounds: as people write it."""
    config, route = _route(config_path, route_name)
    stream = route.input.stream
    model = Model(config.models[route.model].path)
    found = read_labels(config.models[route.model].labels)
    reply = _replier(route, found.names if found else ())
    buffers: dict = defaultdict(lambda: deque(maxlen=stream.window))
    counts: dict = defaultdict(int)

    def answer(payload: bytes) -> str | None:
        msg = json.loads(payload)
        device = msg[stream.key]
        buffers[device].append(msg["data"])
        counts[device] += 1
        if counts[device] < stream.window or (counts[device] - stream.window) % stream.hop:
            return None
        x = preprocess.apply_steps(route.preprocess, np.asarray(buffers[device], dtype=np.float32)[None])
        return json.dumps({**reply(msg["id"], x, model.infer(x)[0]), "stream": device})

    return route, answer


class _AudioChain:
    """The route's model and its stages on one window, each model a plain Interpreter of one
    thread (the daemon's `threads: 1`), resized when a stage's batch of windows changes size."""

    def __init__(self, config, route: RouteConfig):
        backend_name = resolve_backend(config.runtime)
        backend = importlib.import_module(BACKENDS[backend_name])
        models = [route.model] + [stage.model for stage in route.stages]
        options = _resolver_options(backend_name, config.xnnpack)  # XNNPACK on or off, as the daemon
        self._interps = [backend.Interpreter(model_path=str(config.models[m].path), num_threads=1, **options)
                         for m in models]
        self._shapes: list = [None] * len(models)
        self.route = route

    def _invoke(self, i: int, x: np.ndarray) -> np.ndarray:
        interp = self._interps[i]
        tensor = interp.get_input_details()[0]["index"]
        if self._shapes[i] != x.shape:
            interp.resize_tensor_input(tensor, list(x.shape))
            interp.allocate_tensors()
            self._shapes[i] = x.shape
        interp.set_tensor(tensor, x)
        interp.invoke()
        return interp.get_tensor(interp.get_output_details()[0]["index"])

    def scores(self, window: np.ndarray) -> np.ndarray:
        """One window of samples -> the last stage's scores, one per its windows (docs/stages.md's frames)."""
        x = preprocess.apply_steps(self.route.preprocess, window[None])
        frames = np.squeeze(self._invoke(0, x)[0])
        for i, stage in enumerate(self.route.stages, start=1):
            size, hop = stage.window.size, stage.window.hop
            starts = range(0, len(frames) - size + 1, hop)
            batch = preprocess.apply_steps(stage.preprocess, np.stack([frames[s:s + size] for s in starts]))
            frames = self._invoke(i, batch).reshape(len(starts), -1)
        return frames.reshape(-1)


def make_audio_answer(config_path: Path | str, route_name: str) -> tuple[RouteConfig, Callable[[bytes, str], list]]:
    """The route and the naive microphone script's per-message body, for a pcm16 stream route with
    windowed `stages`: each device's samples appended to its array, and every `hop` samples, once a
    window is there, the chain run on that window and its best score published. No gaps or bounds:
    as people write it."""
    config, route = _route(config_path, route_name)
    if route.input.format != "pcm16" or route.input.stream is None or not route.stages:
        raise DaemonError(f"route {route_name!r}: naive-audio takes a pcm16 stream route with stages")
    window, hop = route.input.stream.window, route.input.stream.hop
    chain = _AudioChain(config, route)
    level = route.subscribe.split("/").index("+")
    held: dict = defaultdict(lambda: np.zeros(0, np.float32))
    counts: dict = defaultdict(int)  # samples heard per device: where its next window ends

    def answer(payload: bytes, topic: str) -> list:
        device = topic.split("/")[level]
        samples = np.frombuffer(payload, "<i2").astype(np.float32) / PCM16_FULL_SCALE
        buffer = np.concatenate([held[device], samples])
        heard, total = counts[device], counts[device] + len(samples)
        replies = []
        for end in range(heard + 1, total + 1):  # each sample count reached: does a window end there?
            if end >= window and (end - window) % hop == 0:
                start = len(buffer) - (total - end) - window
                best = float(chain.scores(buffer[start:start + window]).max())
                replies.append(json.dumps({"stream": device, "window": (end - window) // hop, "score": best}))
        counts[device] = total
        held[device] = buffer[-(window - 1):]  # what a later window can still need
        return replies

    return route, answer


def make_detect_answer(config_path: Path | str, route_name: str) -> tuple[RouteConfig, Callable[[bytes], str]]:
    """The route and the naive camera script's per-message body: image bytes in, detections JSON out."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:  # armv7: tflite-runtime is the only runtime there (no litert wheel)
        from tflite_runtime.interpreter import Interpreter
    from PIL import Image

    config, route = _route(config_path, route_name)
    spec = config.models[route.model]
    interp = Interpreter(model_path=str(spec.path), num_threads=spec.threads)
    interp.allocate_tensors()
    tensor = interp.get_input_details()[0]
    _, height, width, _ = (int(d) for d in tensor["shape"])
    boxes_out, classes_out, scores_out, count_out = (d["index"] for d in interp.get_output_details())
    found = read_labels(spec.labels)
    labels = found.names if found else ()

    def answer(payload: bytes) -> str:
        img = Image.open(io.BytesIO(payload)).convert("RGB")
        sent_w, sent_h = img.size
        pixels = np.asarray(img.resize((width, height), Image.Resampling.BILINEAR), dtype=np.uint8)
        interp.set_tensor(tensor["index"], pixels[None])
        interp.invoke()
        boxes, classes = interp.get_tensor(boxes_out)[0], interp.get_tensor(classes_out)[0]
        scores, count = interp.get_tensor(scores_out)[0], int(interp.get_tensor(count_out).reshape(-1)[0])
        detections = []
        for i in np.argsort(-scores[:count], kind="stable")[: route.max_results]:
            if scores[i] < route.min_score:
                break
            ymin, xmin, ymax, xmax = np.clip(boxes[i], 0.0, 1.0)
            index = int(classes[i])
            detections.append({"label": labels[index] if index < len(labels) else str(index), "index": index,
                               "score": round(float(scores[i]), 6),
                               "box": {"x_min": round(float(xmin) * sent_w, 1), "y_min": round(float(ymin) * sent_h, 1),
                                       "x_max": round(float(xmax) * sent_w, 1), "y_max": round(float(ymax) * sent_h, 1)}})
        return json.dumps({"route": route.name, "detections": detections})

    return route, answer


def echo_reply(payload: bytes) -> bytes:
    """`{"id":N}` padded to 16 bytes, without decoding the request."""
    found = _ID_PREFIX.match(payload[:32])
    body = b'{"id":%s}' % (found.group(1) if found else b"null")
    return body.ljust(ECHO_REPLY_BYTES)


def _one(reply: Callable[[bytes], bytes | str | None]) -> Callable[[bytes, str], list]:
    """A per-payload body as `_serve` takes it: (payload, topic) -> the replies (none for None)."""
    def replies(payload: bytes, topic: str) -> list:
        body = reply(payload)
        return [] if body is None else [body]  # naive-stream: a sample that completes no window gets no reply
    return replies


def _serve(broker: str, client_id: str, route: RouteConfig, replies: Callable[[bytes, str], list],
           protocol: str = DEFAULT_PROTOCOL) -> None:
    """Reply to every request of `route` inside `on_message`, until SIGTERM."""
    status = f"edge-inferd/{client_id}/status"
    v5 = PROTOCOLS[protocol] == paho.MQTTv5

    def on_message(client, userdata, msg):
        captures = topics.match(route.subscribe, msg.topic)
        properties = _correlated(msg) if v5 else None
        for body in replies(msg.payload, msg.topic):
            client.publish(topics.render(route.publish, msg.topic, captures), body, qos=QOS, properties=properties)

    def on_connect(client, userdata, flags, reason_code, properties):
        if v5:
            disable_nagle(client.socket())
        client.subscribe(route.subscribe, qos=QOS)
        client.publish(status, STATUS_ONLINE, qos=QOS, retain=True)

    host, port = broker.rsplit(":", 1)
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=PROTOCOLS[protocol])
    client.will_set(status, STATUS_OFFLINE, qos=QOS, retain=True)
    client.on_message = on_message
    client.on_connect = on_connect
    client.connect(host, int(port))

    def stop(*_) -> None:
        # Offline first, as the daemon says it: a retained `online` left behind would make this
        # consumer's next run look ready before it has subscribed (its first requests then lost).
        client.publish(status, STATUS_OFFLINE, qos=QOS, retain=True)
        client.disconnect()

    signal.signal(signal.SIGTERM, stop)
    client.loop_forever()


def _correlated(msg) -> Properties | None:
    """A reply's v5 properties carrying the request's CorrelationData, or None where it has none."""
    correlation = getattr(msg.properties, "CorrelationData", None)
    if correlation is None:
        return None
    properties = Properties(PacketTypes.PUBLISH)
    properties.CorrelationData = correlation
    return properties


def _rawpub(args: argparse.Namespace) -> None:
    """Publish --warmup messages, wait for a line on stdin, publish the rest; print the rate."""
    blob = Path(args.file).read_bytes()
    payloads = [blob[i : i + args.size] for i in range(0, len(blob), args.size)]
    host, port = args.broker.rsplit(":", 1)
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id="", protocol=paho.MQTTv5)
    client.max_inflight_messages_set(RAW_INFLIGHT)
    client.max_queued_messages_set(0)
    client.connect(host, int(port))
    disable_nagle(client.socket())
    client.loop_start()
    for payload in payloads[: args.warmup]:
        client.publish(args.topic, payload, qos=QOS)
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.perf_counter()
    infos = [client.publish(args.topic, payload, qos=QOS) for payload in payloads[args.warmup :]]
    for info in infos:
        info.wait_for_publish(_PUBLISH_TIMEOUT_S)
    elapsed = time.perf_counter() - start
    print(json.dumps({"published": len(infos), "seconds": round(elapsed, 4)}), flush=True)
    client.disconnect()
    stop_loop(client)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m daemon.baselines", description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=("echo", "naive", "naive-detect", "naive-stream", "naive-audio", "rawpub"))
    parser.add_argument("--broker", required=True, help="HOST:PORT")
    parser.add_argument("--config", default="config.yaml", type=Path)
    parser.add_argument("--route", default="activity")
    parser.add_argument("--client-id", help="default: the kind")
    parser.add_argument("--protocol", choices=tuple(PROTOCOLS), default=DEFAULT_PROTOCOL,
                        help="echo, naive: MQTT 3.1.1 as paho's default (default), or 5 with TCP_NODELAY")
    parser.add_argument("--topic", help="rawpub: request topic")
    parser.add_argument("--file", help="rawpub: concatenated payloads")
    parser.add_argument("--size", type=int, help="rawpub: bytes per payload")
    parser.add_argument("--warmup", type=int, default=0, help="rawpub: payloads sent before the go line")
    args = parser.parse_args(argv)
    if args.kind == "rawpub":
        _rawpub(args)
        return
    client_id = args.client_id or args.kind
    if args.kind == "echo":
        _, route = _route(args.config, args.route)
        _serve(args.broker, client_id, route, _one(echo_reply), args.protocol)
    elif args.kind == "naive-audio":
        route, answer = make_audio_answer(args.config, args.route)
        _serve(args.broker, client_id, route, answer, args.protocol)
    elif args.kind in ("naive-detect", "naive-stream"):
        make = make_detect_answer if args.kind == "naive-detect" else make_stream_answer
        route, answer = make(args.config, args.route)
        _serve(args.broker, client_id, route, _one(answer), args.protocol)
    else:
        route, answer = make_answer(args.config, args.route)
        _serve(args.broker, client_id, route, _one(answer), args.protocol)


if __name__ == "__main__":
    main()
