"""What intake hands the worker pool, and what a worker runs a batch with: the one hand-off
between the network thread's side of serving (intake.py) and the workers' (batches.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from daemon.pipeline.route_pipeline import RoutePipeline, Runner
from daemon.pipeline.stream_window import StreamItem
from daemon.serve.admission import Ticket
from daemon.transport.inbound import Inbound

WorkerModels = Mapping[str, Runner]  # one worker's private interpreters, by model name


@dataclass(slots=True)
class Job:
    """An admitted request, queued for a worker. One per request on paho's thread: slotted, and not
    frozen (a frozen dataclass sets each field through object.__setattr__: 820 vs 200 ns to build);
    nothing assigns its fields after intake builds it."""

    pipe: RoutePipeline
    inbound: Inbound
    reply_topic: str
    ticket: Ticket
    seq: int = 0  # coalesce: its place among its device's jobs (rate.py); 0 is never superseded
    item: Optional[StreamItem] = None  # a stream's window (streams.py): its samples and reply fields


@dataclass(frozen=True)
class WorkerContext:
    """What one worker runs a batch with: its interpreters and the pipelines that match them
    (model digest, labels), swapped together on a reload so a batch never mixes them."""

    models: WorkerModels
    pipes: Mapping[str, RoutePipeline]  # by route name
