"""The parts of serving, built and connected once: intake -> worker pool -> worker side -> replies.

`build` makes each part and hands each only what it needs; `Serving` is the record of
them that the service starts, stops, swaps on a reload and reads for its stats. It holds
no behaviour of its own beyond starting and stopping the parts in order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from daemon.config.schema import BatchingConfig, WorkersConfig
from daemon.obs.drift import DriftMonitor
from daemon.obs.model_watch import ModelWatch
from daemon.obs.stats import Stats
from daemon.pipeline.reuse import DeviceReuse
from daemon.pipeline.route_pipeline import RoutePipeline, ScoreCache
from daemon.serve.admission import Admission
from daemon.serve.autoscale import Autoscaler
from daemon.serve.batches import BatchProcessor
from daemon.serve.cascade import RemoteCascade
from daemon.serve.far_v2 import V2Cascade
from daemon.serve.ha_devices import DiscoveredDevices
from daemon.serve.intake import Intake, RouteTable
from daemon.serve.jobs import Job, WorkerContext, WorkerModels
from daemon.serve.rate import DeviceRate
from daemon.serve.stream_intake import StreamIntake
from daemon.serve.streams import Streams
from daemon.serve.replies import Replier, Transport
from daemon.serve.workers import WorkerPool

MakeModels = Callable[[int], WorkerModels]  # worker index -> that worker's own interpreters


@dataclass(frozen=True)
class Serving:
    intake: Intake
    pool: WorkerPool[Job, WorkerContext]
    admission: Admission
    replier: Replier
    routes: RouteTable
    rate: DeviceRate
    reuse: dict  # DeviceReuse by route name; kept across reloads (entries name their model digest)
    remote: Optional[RemoteCascade] = None
    far_v2: Optional[V2Cascade] = None
    streams: Optional[Streams] = None  # the stream routes' windows; kept across reloads (streams.py)

    @property
    def filters(self) -> list[str]:
        """The topic filters to subscribe: the routes', and the far tiers' answers."""
        return self.routes.filters + ([self.remote.response_topic] if self.remote else [])

    def attach(self, transport: Transport) -> None:
        self.replier.attach(transport)

    def start(self) -> None:
        self.pool.start()
        for far in (self.remote, self.far_v2):
            if far is not None:
                far.start()

    def stop(self, timeout_s: float) -> bool:
        stopped = self.pool.stop(timeout_s)
        for far in (self.remote, self.far_v2):
            if far is not None:
                far.stop()  # parked escalations get their local answer: none left unanswered
        return stopped

    def swap(self, pipes: Sequence[RoutePipeline], make_models: MakeModels) -> None:
        """New models and pipelines for the same routes (a reload): built here, then each worker
        takes its own before its next batch; a batch in flight finishes on the old ones."""
        by_name = {p.route.name: p for p in pipes}
        self.pool.replace_contexts(lambda i: WorkerContext(make_models(i), by_name))
        self.routes.replace(pipes)

    def reuse_snapshot(self) -> dict:
        """{route: {devices, hits, misses, skipped}} for the routes with `reuse` configured."""
        return {name: state.snapshot() for name, state in self.reuse.items()}

    def streams_snapshot(self) -> dict:
        """{route: {streams, max_streams, bytes}} for the stream routes that have heard a stream."""
        return self.streams.snapshot() if self.streams is not None else {}

    def queue_state(self) -> dict:
        return {"depth": self.pool.depth, "busy": self.pool.busy, "bytes": self.admission.queued_bytes,
                "peak_bytes": self.admission.peak_bytes,
                "predicted_wait_ms": round(self.admission.predicted_wait_s() * 1000.0, 1),
                "holds": self.admission.holds, "holding": not self.admission.has_room()}


def build(pipes: Sequence[RoutePipeline], cache: Optional[ScoreCache], stats: Stats, workers: WorkersConfig,
          make_models: MakeModels, batching: BatchingConfig = BatchingConfig(),
          clock: Callable[[], float] = time.monotonic, escalation_topic: Optional[str] = None,
          drift: Optional[DriftMonitor] = None,
          devices: Optional[DiscoveredDevices] = None, watch: Optional[ModelWatch] = None,
          control: Optional[Callable[[str, bytes], bool]] = None) -> Serving:
    """`escalation_topic`: where far tiers answer this node's `escalate.to_topic` requests. Both
    transports stop reading while the byte budget is full (admission.py), so QoS 1 requests wait
    at the broker instead of being shed.
    `drift`: the answers' distribution per route (daemon/obs/drift.py), fed as replies are tallied.
    `devices`: Home Assistant discovery's device tracker (ha_devices.py), fed by intake.
    `watch`: each model release's answers and invoke times, for the fleet canary.
    `control`: takes the daemon's own control messages (the fleet's), topic and payload: True when it did."""
    replier = Replier(stats, drift, watch)
    far = any(p.route.escalate and p.route.escalate.to_topic for p in pipes) and escalation_topic
    remote = RemoteCascade(escalation_topic, replier.send_one, clock) if far else None
    far_v2 = V2Cascade(pipes, replier.send_one, clock) if any(p.route.escalate and p.route.escalate.to_v2
                                                              for p in pipes) else None
    rate = DeviceRate(stats)  # per-device min_interval_ms and coalesce state
    reuse = {p.route.name: DeviceReuse(p.route.reuse) for p in pipes if p.route.reuse is not None}
    max_wait_s = None if workers.max_wait_ms is None else workers.max_wait_ms / 1000.0
    admission = Admission(workers.queue_bytes, max_wait_s, workers.min, batching.max_batch, clock)
    batches = BatchProcessor(admission, rate, replier, stats, cache, reuse, remote, clock, watch, far_v2)
    by_name = {p.route.name: p for p in pipes}
    pool: WorkerPool[Job, WorkerContext] = WorkerPool(
        workers.max, lambda i: WorkerContext(make_models(i), by_name), batches.process, batching.max_batch,
        batching.max_delay_ms / 1000.0,
        deadline_of=lambda job: job.inbound.deadline, arrival_of=lambda job: job.inbound.received_at, clock=clock,
        batch_seconds=lambda job, n: admission.batch_seconds(job.pipe.route.name, n),
        scaler=Autoscaler(workers.min, workers.max, workers.scale_up_wait_ms / 1000.0, workers.scale_down_after_s,
                          clock),
        on_resize=admission.set_workers)
    routes = RouteTable(pipes)
    streams = Streams(stats)
    intake = Intake(routes, rate, admission, pool.submit_many, replier, stats, remote, clock, devices, control,
                    StreamIntake(admission, replier, streams))
    return Serving(intake, pool, admission, replier, routes, rate, reuse, remote, far_v2, streams)
