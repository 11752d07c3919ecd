"""The config's schema: one frozen dataclass per YAML section, a docstring per field.

Under both the readers (loader.py and a module per section) and the checks (check.py):
this module reads nothing and checks nothing. `tools/gen_config_doc.py` writes
docs/config.md from these dataclasses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Optional

from daemon.config.drift import DriftConfig
from daemon.config.anchors import AnchorDecode
from daemon.config.escalate import EscalateConfig
from daemon.config.fleet import FleetConfig
from daemon.config.homeassistant import HomeAssistantConfig
from daemon.config.http import HttpConfig
from daemon.config.mqtt import MqttConfig
from daemon.config.reuse import ReuseConfig
from daemon.config.stream import StreamConfig
from daemon.config.then import ThenConfig
from daemon.config.stages import StageConfig
from daemon.errors import ConfigError

_MIB = 1 << 20
DEFAULT_MAX_BYTES = _MIB  # 1 MiB: payloads above it are answered `too_large` undecoded
PCM16, PCM16_DTYPE = "pcm16", "int16"
INPUT_FORMATS = ("json", "raw", "npy", "image", PCM16)
# input.sample_rate's bounds: below 1 kHz is no audio a model hears, above 384 kHz no ADC records.
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 1_000, 384_000
INPUT_DTYPES = ("float32", "float64", "int8", "uint8", "int16", "uint16", "int32")
MIN_QUEUE_MB = 0.01  # ~10 KB: room for a single small request (tests shed with it)
MIN_STATS_INTERVAL_S = 0.1
DEFAULT_THREADS = 1
# Bound on width * height of a sent image. A 12 MP phone photo (4000x3000), a 24 MP camera
# (6000x4000) and an 8K frame (33 MP) fit; a bomb's claim does not (PNG's IHDR and JPEG's SOF
# allow 2^31 and 65535 squared). At the limit a JPEG is cheap (decoded at 1/8 scale: +8 MB,
# 40 ms), a PNG is not: it cannot be decoded at reduced scale, and a 170 KB one of solid
# RGBA costs +317 MB peak and 0.6 s here (Pillow keeps RGB in 4 bytes a pixel, and the
# conversion is a second copy). A small gateway's route may want the limit lower.
DEFAULT_MAX_PIXELS = 40_000_000
STRETCH, LETTERBOX = "stretch", "letterbox"
DECODE_MODES = ("fast", "exact")
RESIZE_MODES = (STRETCH, LETTERBOX)
CLASSIFY, DETECT, ANOMALY, VALUES = "classify", "detect", "anomaly", "values"
OUTPUT_KINDS = (CLASSIFY, DETECT, ANOMALY, VALUES)
DEFAULT_MIN_SCORE = 0.5
DEFAULT_MAX_RESULTS = 10
COALESCE_LATEST = "latest"
COALESCE_CHOICES = (COALESCE_LATEST,)  # routes[].coalesce
DEFAULT_TOP_K = 3
# Field metadata read by tools/gen_config_doc.py (docs/config.md): "yaml" is the key when it
# differs from the field's name, "doc_default" a default that is not a literal, "doc": False
# hides a field that is not a YAML key.
_HIDDEN = {"doc": False}


@dataclass(frozen=True)
class ModelConfig:
    name: str = field(metadata=_HIDDEN)  # the key under `models`
    path: Path
    """The .tflite file: INT8 (the fast path; int8, uint8 or float32 in and out) or float (float32 or float16
    weights, served as they are; check-config says so once). `edge-inferd inspect` tells what it takes."""
    labels: Optional[Path] = None
    """One label per line in output order, or `id label` lines (gaps allowed, as detectors ship
    them). Required by `classify` and `detect` routes; optional for `anomaly` and `values`."""
    sha256: Optional[str] = None
    """When set, a file with another digest is refused before loading."""
    threads: int = DEFAULT_THREADS
    """Interpreter threads per worker: more cuts one large model's latency (a detector), at the
    cost of the other workers' cores (`edge-inferd bench model` measures it)."""
    managed: bool = False
    """Delivered by the fleet (`fleet` below, docs/fleet.md): the store's current release of this
    model is served, its files and sha256 from the signed manifest; `path` and `labels` are what
    runs until the first release arrives."""
    max_batch: Optional[int] = None
    """Samples one invoke of this model takes at most (null: `batching.max_batch`). 1 for a model whose
    answer for one sample depends on the others in its invoke: openWakeWord's melspectrogram clamps its
    output to 80 dB below the loudest value of the whole invoke (docs/stages.md)."""
    release: Optional[int] = field(default=None, metadata=_HIDDEN)
    """The serial of the store's release being served (managed models only)."""


@dataclass(frozen=True)
class InputConfig:
    format: str = "json"
    """json, raw, npy, image or pcm16 (see Input formats)."""
    shape: tuple[int, ...] = field(default=(), metadata={"doc_default": "required"})
    """Shape of one request, in sensor units, before preprocessing."""
    dtype: str = "float32"
    """Element type of raw payloads (json values are parsed as floats; pcm16 is always int16)."""
    sample_rate: Optional[int] = field(default=None, metadata={"doc_default": "required for pcm16"})
    """pcm16: the audio's sample rate in Hz (16000 for most speech models). Nothing is resampled:
    a `log_mel` step without its own `sample_rate` takes this one, and one that names another
    rate is refused."""
    max_bytes: int = DEFAULT_MAX_BYTES
    """Larger payloads are answered `too_large` before any decoding."""
    resize: str = STRETCH
    """image: how a picture of any size becomes `shape`'s height x width: `stretch` (each axis
    scaled on its own) or `letterbox` (one scale, centred, padded). Boxes come back in the
    sent picture's pixels either way. A JPEG at least twice that size is first decoded at a
    reduced scale unless `decode: exact` (below)."""
    max_pixels: int = DEFAULT_MAX_PIXELS
    """image: a picture whose header claims more pixels (width x height) is answered `too_large`
    before it is decoded (a decompression bomb never reaches memory)."""
    decode: str = "fast"
    """image: `fast` decodes a JPEG at least twice the target size at 1/2, 1/4 or 1/8 scale in
    libjpeg (Pillow's draft mode) before the resize; `exact` decodes it at full size. The scaled
    DCT moves scores a little (docs/performance.md has the time saved and the score differences on
    real photos); PNGs and small JPEGs decode the same either way."""
    stream: Optional[StreamConfig] = None
    """Messages that each carry one or more samples of a device's stream, made into windows of
    `input.shape` (`routes[].input.stream` below; docs/streams.md). Absent: each message is one
    whole input."""


@dataclass(frozen=True)
class RouteConfig:
    name: str
    """Unique route name, echoed in every reply."""
    subscribe: str
    """Topic filter; each '+' level is a capture for {1}, {2}, ... in `publish`."""
    model: str
    """A key of `models`."""
    input: InputConfig
    """How request payloads are decoded (`routes[].input` below)."""
    preprocess: tuple = field(metadata={"doc_default": "`[]`", "doc_type": "list of steps"})
    """Steps from `daemon.model.preprocess`, applied in order (see Preprocess steps below)."""
    top_k: int = field(metadata={"yaml": "output.top_k", "doc_default": DEFAULT_TOP_K})
    """classify: how many (label, score) pairs a result lists."""
    publish: str
    """Reply topic template: {1}, {2}, ... are the filter's '+' captures, {topic} the request topic."""
    kind: str = field(default=CLASSIFY, metadata={"yaml": "output.kind"})
    """What the model's outputs become in a reply: `classify` (label, score, top_k), `detect`
    (boxes of an SSD or YOLO detector), `anomaly` (an autoencoder's reconstruction error) or
    `values` (the dequantized outputs by name, for regressors and anything else)."""
    min_score: float = field(default=DEFAULT_MIN_SCORE, metadata={"yaml": "output.min_score"})
    """detect: detections scoring below this are left out."""
    max_results: int = field(default=DEFAULT_MAX_RESULTS, metadata={"yaml": "output.max_results"})
    """detect: at most this many detections, best first."""
    threshold: Optional[float] = field(default=None, metadata={"yaml": "output.threshold"})
    """anomaly: a reconstruction error above this is `"anomaly": true` (null: the score only)."""
    outputs: tuple = field(default=(), metadata={"yaml": "output.outputs", "doc_default": "`[]`",
                                                 "doc_type": "list of output names"})
    """values: the model's outputs the reply carries, by name, each in full (`values` is keyed by
    name). Empty: every output of at most 4,096 values; a larger one (a 256x256 mask, a heatmap) is
    left out unless named, and the reply's `left_out` names it with its shape."""
    validate_data: Optional[Path] = field(default=None, metadata={"yaml": "validate.data"})
    """Labelled .npz (x, y) for the gate a changed model must pass on reload (`check-config --deep`)."""
    min_accuracy: float = field(default=0.0, metadata={"yaml": "validate.min_accuracy"})
    """The gate of a `classify` route: top-1 accuracy on `validate.data` at least this."""
    min_roc_auc: float = field(default=0.0, metadata={"yaml": "validate.min_roc_auc"})
    """The gate of an `anomaly` route: ROC-AUC on `validate.data` (y: 0 normal, 1 anomalous) at least this."""
    max_mae: Optional[float] = field(default=None, metadata={"yaml": "validate.max_mae"})
    """The gate of a `values` route: mean absolute error on `validate.data` (y: the targets) at most this."""
    min_interval_ms: float = 0.0
    """Per device (= request topic): a request sooner than this after the device's last admitted
    one is answered `rate_limited` at once, without inference. 0: no limit."""
    coalesce: Optional[str] = None
    """`latest`: of a device's queued requests only the newest is served; each older one is
    answered `superseded`. null: every request is served."""
    reuse: Optional[ReuseConfig] = None
    """Per-device fast path (`routes[].reuse` below): off when absent."""
    cache: Optional[bool] = field(default=None, metadata={"doc_default": "on, except for image routes"})
    """Whether this route's results go through the result cache (when `cache.enabled`). Camera
    frames never repeat exactly, so an image route skips it unless this says true."""
    anchor_decode: Optional[AnchorDecode] = field(default=None, metadata={"yaml": "output.decode"})
    """detect: a detector's raw SSD heads decoded as MediaPipe does (`output.decode: anchors`
    and its keys, `routes[].output` with decode: anchors below); None: the model's own post-process
    (SSD) or a YOLO tensor."""
    escalate: Optional[EscalateConfig] = None
    """Confidence cascade: low-confidence results go to a heavier tier (`routes[].escalate` below)."""
    then: Optional[ThenConfig] = None
    """detect: each box cropped from the sent image and classified by another route's model, its
    top-1 in the box's `sub_label` and `sub_score` (`routes[].then` below); off when absent."""
    stages: tuple[StageConfig, ...] = field(default=(), metadata={"doc_default": "`[]`",
                                                                  "doc_type": "list of stages"})
    """Further models run in order after `model`, in process (`routes[].stages[]` below, docs/stages.md): each
    takes the previous one's output as frames, whole or in windows; the last one's output is the answer,
    decoded by `output.kind` (classify or values) with its model's labels."""
    publish_stages: bool = False
    """With `stages`: the reply's `stages` lists each earlier stage's output (a model's, frames and shape;
    its values when at most 4,096, else `left_out`). Such a route skips the result cache."""

    @property
    def uses_cache(self) -> bool:
        if self.publish_stages:  # a cache entry keeps the last stage's output only
            return False
        return self.cache if self.cache is not None else self.input.format != "image"


@dataclass(frozen=True)
class CacheConfig:
    enabled: bool = True
    """false serves every request from the model. When on, a result is stored only for an input
    seen before (the second sighting; the third is a hit), so a stream that never repeats costs
    the cache almost nothing (docs/performance.md, "The result cache")."""
    dir: Path = Path(".cache/edge-inferd")
    """Created with mode 0700; survives restarts. Relative: under $CACHE_DIRECTORY when systemd
    sets it (CacheDirectory=), else next to the config file."""
    max_mb: int = 256
    """Size cap in MiB of the disk tier, which holds the results of models whose invoke costs
    more than a disk read (a cheaper model's results stay in memory)."""
    ttl_s: float = 3600.0
    """Entries expire after this many seconds (both tiers); 0 keeps them until evicted."""
    memory_mb: int = 32
    """In-memory LRU in front of the disk, in MiB; 0 turns the memory tier off."""


@dataclass(frozen=True)
class WorkersConfig:
    max: int = field(default=os.cpu_count() or 1, metadata={"doc_default": "the number of CPUs"})
    """Worker threads at most; each owns one interpreter per model and batch bucket."""
    min: int = 1
    """Worker threads at least. Between `min` and `max` the pool grows and shrinks with the
    load (docs/scaling.md); `min` equal to `max` is a fixed pool."""
    scale_up_wait_ms: float = 50.0
    """A thread is added as soon as a request waits longer than this in the queue (arrival
    to a worker taking it), one per such wait, up to `max`."""
    scale_down_after_s: float = 30.0
    """A thread is retired (after its current batch) once the queue wait stayed below half of
    `scale_up_wait_ms` with a worker idle for this long; at most one per this many seconds."""
    queue_mb: float = 64.0
    """Memory budget of queued requests (payload bytes plus a fixed overhead each). A burst
    that fits is served however many messages it holds. Past it the daemon stops reading until
    the workers have taken the queue below 75 % of it: QoS 1 requests wait at the broker, none is
    shed (stats `queue.holds`); QoS 0 requests, which no broker holds, are answered `overloaded`."""
    max_wait_ms: Optional[float] = None
    """Off (null) by default: deadlines decide shedding. A request without one (no v5 message
    expiry, no `timeout_ms` in its JSON) is queued while the bytes fit `queue_mb`, however long
    the wait, as the broker holds the backlog safely at QoS 1; one with a deadline is answered
    `expired` as soon as its predicted wait passes it. Set this to cap every request's wait: a
    request whose predicted wait (work queued ahead x measured cost / workers) exceeds it is
    answered `overloaded` at once. Use it when clients never send deadlines but do give up
    (a dashboard that stops listening after a few seconds), so they hear `overloaded` and can
    retry instead of getting an answer nobody waits for."""
    drain_timeout_s: float = 10.0
    """On shutdown, how long queued and in-flight work may take."""
    processes: int = 1
    """Worker processes, each a full daemon with its own MQTT connection (client id
    `<client_id>-w<i>`) in the share group `mqtt.share_group` (default: the client id), so
    they split the node's requests and use more than one core. A supervisor keeps the node's
    status and summed stats and restarts a crashed or stuck process (docs/scaling.md).
    1: one process, no supervisor."""
    idle_unload_s: float = 0.0
    """A model that has run no inference for this long is unloaded from every worker (its
    interpreters freed, the memory given back); the next request for it loads it again on
    its worker. 0: never unload."""

    @property
    def queue_bytes(self) -> int:
        return int(self.queue_mb * _MIB)


@dataclass(frozen=True)
class BatchingConfig:
    max_batch: int = 32
    """A worker takes up to this many queued requests at once and runs one invoke per model."""
    max_delay_ms: float = 0.0
    """How long a worker may wait for more requests to fill a batch (0: take what is queued,
    never wait). The wait never passes the earliest deadline in the batch."""


@dataclass(frozen=True)
class MetricsConfig:
    port: Optional[int] = None
    """Serve Prometheus metrics on this port (null: no endpoint)."""
    address: str = "127.0.0.1"
    """Address to bind; 0.0.0.0 exposes the endpoint to the network."""


@dataclass(frozen=True)
class Config:
    mqtt: MqttConfig
    runtime: str = field(metadata={"doc_default": "`auto`"})
    """TFLite backend: auto (ai-edge-litert, else tflite-runtime), litert or tflite."""
    models: Mapping[str, ModelConfig]
    routes: tuple[RouteConfig, ...]
    cache: CacheConfig
    workers: WorkersConfig
    batching: BatchingConfig = BatchingConfig()
    xnnpack: bool = True
    """litert only: false runs TFLite's built-in kernels, bit-identical to tflite-runtime."""
    stats_interval_s: float = 10.0
    """How often the retained stats go to `edge-inferd/<client_id>/stats` (also at start)."""
    metrics: MetricsConfig = MetricsConfig()
    drift: DriftConfig = DriftConfig()
    """Watching each route's answers against a reference (`drift` below, docs/drift.md)."""
    homeassistant: HomeAssistantConfig = HomeAssistantConfig()
    """Home Assistant MQTT discovery (`homeassistant` below); off by default."""
    http: HttpConfig = HttpConfig()
    """The Open Inference Protocol (KServe v2) over HTTP beside MQTT (`http` below, docs/http.md);
    off by default."""
    fleet: FleetConfig = FleetConfig()
    """Model delivery to this node: signed releases, desired and reported state (`fleet` below,
    docs/fleet.md); off by default."""
    source: Optional[Path] = field(default=None, metadata=_HIDDEN)
    """The file this config came from, for messages."""

    def with_broker(self, broker: str) -> "Config":
        """A copy with `mqtt.broker` replaced (the `--broker` flag); validated like the file."""
        try:
            return replace(self, mqtt=self.mqtt.with_broker(broker))
        except ValueError as exc:
            raise ConfigError([f"--broker: {exc}"]) from None

