"""What `bench e2e` sends a route: distinct JSON requests, from its validate data or its input spec.

A sensor stream never repeats exactly, so neither do the bench's requests. They come from a
pool of POOL_SIZE rows: the route's `validate.data` x (sensor units) plus noise of
NOISE_FRACTION of the data's standard deviation, or, for a route without validate data,
standard normal values of `input.shape`. Request i is pool row i mod POOL_SIZE, with its first
value shifted by (i // POOL_SIZE) standard deviations, so a run of any length repeats no
request, and its text costs a bytes join, not a JSON encode, while the bench paces the load.
`distinct_share` checks with the daemon's own preprocessing and quantization that the INT8
inputs (what the cache keys on) differ, for the pool and for its first shifted pass.

Requests go through `mosquitto_pub -l`, one line each, so the route's input must be JSON.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from daemon import topics
from daemon.config.loader import load_config
from daemon.config.schema import Config, RouteConfig
from daemon.errors import DaemonError
from daemon.model import preprocess
from daemon.model.runtime import Model
from daemon.pipeline.evaluate import find_route, load_split
from daemon.tools.bench.load import json_line

logger = logging.getLogger(__name__)

POOL_SIZE = 5000
NOISE_FRACTION = 0.1  # of the data's std: a fresh sample, not a copy (the INT8 input moves)
SEED = 7
DEVICE = "bench"  # fills each '+' (and a '#') of the route's filter
_FIRST_NUMBER = re.compile(rb"-?[0-9][0-9.eE+-]*")


@dataclass(frozen=True)
class Workload:
    route: RouteConfig
    request_topic: str
    reply_topic: str
    source: str  # where the values come from, for the results
    x: np.ndarray  # the base samples (N, *input.shape), sensor units
    noise_std: float
    step: float  # how far each pass over the pool shifts a row's first value: one std of the data
    pool: tuple  # (text before the first value, the first value, text after it) per pool row

    def data(self, i: int) -> bytes:
        """The `data` JSON of request i (negative ids, the warm-ups, get a pass of their own)."""
        head, first, tail = self.pool[i % len(self.pool)]
        return b"%s%r%s" % (head, first + (i // len(self.pool)) * self.step, tail)

    def line(self, i: int) -> bytes:
        return json_line(i, self.data(i))

    def fresh(self, n: int, rng: np.random.Generator) -> list[bytes]:
        """n more distinct `data` texts, new noise on the base samples (not from the pool)."""
        return [json.dumps(row.tolist()).encode() for row in _noisy(self.x, n, self.noise_std, rng)]

    def shifted_rows(self, rows: np.ndarray, passes: int) -> np.ndarray:
        out = rows.reshape(len(rows), -1).copy()
        out[:, 0] += passes * self.step
        return out.reshape(rows.shape)


def _noisy(x: np.ndarray, n: int, std: float, rng: np.random.Generator) -> np.ndarray:
    picks = x[np.arange(n) % len(x)]
    return picks + rng.normal(0.0, std, picks.shape).astype(np.float32) if std else picks.copy()


def _split(text: bytes) -> tuple[bytes, float, bytes]:
    found = _FIRST_NUMBER.search(text)
    return text[: found.start()], float(found.group()), text[found.end():]


def request_topic(route: RouteConfig) -> str:
    return "/".join(DEVICE if level in ("+", "#") else level for level in route.subscribe.split("/"))


def base_samples(route: RouteConfig, pool: int, rng: np.random.Generator) -> tuple[np.ndarray, float, str]:
    """(samples, noise std, source): the validate data with noise, or normal values of the input shape."""
    if route.validate_data is not None:
        x, _ = load_split(route.validate_data, route)
        return x, NOISE_FRACTION * float(np.std(x)), f"validate data {route.validate_data}"
    return rng.standard_normal((pool, *route.input.shape)).astype(np.float32), 0.0, "normal(0, 1) of input.shape"


def build_workload(config_path: Path, route_name: str, pool: int = POOL_SIZE, seed: int = SEED) -> Workload:
    config = load_config(config_path)
    route = find_route(config, route_name)
    if route.input.format != "json":
        raise DaemonError(f"--route {route_name}: bench e2e sends requests with mosquitto_pub -l, one line each, "
                          f"so it needs a json route, not {route.input.format!r}")
    rng = np.random.default_rng(seed)
    x, noise_std, source = base_samples(route, pool, rng)
    rows = _noisy(x, pool, noise_std, rng)
    texts = (json.dumps(row.tolist()).encode() for row in rows)
    topic = request_topic(route)
    reply = topics.render(route.publish, topic, topics.match(route.subscribe, topic))
    step = float(np.std(x)) or 1.0
    return Workload(route, topic, reply, source, x, noise_std, step, tuple(_split(t) for t in texts))


def distinct_share(config_path: Path, workload: Workload) -> float:
    """The share of distinct INT8 model inputs over the pool and its first shifted pass."""
    config: Config = load_config(config_path)
    rows = np.stack([np.asarray(json.loads(workload.data(i)), dtype=np.float32)
                     for i in range(len(workload.pool))])
    both = np.concatenate([rows, workload.shifted_rows(rows, 1)])
    model = Model(config.models[workload.route.model].path)
    q = model.quantize(preprocess.apply_steps(workload.route.preprocess, both))
    keys = {q[k].tobytes() for k in range(len(q))}
    return len(keys) / len(q)
