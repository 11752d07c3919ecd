"""A stream route's message at intake, on the network thread: its samples into its stream's
window (streams.py), and each window it completes admitted as a request (admission, deadline,
batching: as any request's), or shed with its one reply.

Acks, at least once end to end: a message that completes no window is acked at once (its
samples are in memory: a restart loses them, and says so in the stream's next result). One
that completes windows is acked once the reply of its last window is safe at the broker, as a
request is; a message whose samples are refused (bad JSON, a partial sample) gets an error reply.
"""

from __future__ import annotations

import time
from typing import Callable

from daemon.errors import PayloadError
from daemon.pipeline.route_pipeline import RoutePipeline
from daemon.pipeline.stream_codec import decode_samples
from daemon.pipeline.stream_window import StreamItem, Window
from daemon.serve.admission import Admission, Refusal
from daemon.serve.jobs import Job
from daemon.serve.replies import Replier, Tally
from daemon.serve.streams import Streams
from daemon.transport.inbound import Inbound


class StreamIntake:
    def __init__(self, admission: Admission, replier: Replier, streams: Streams,
                 wall_offset: Callable[[], float] = lambda: time.time() - time.monotonic()):
        """`wall_offset`: what turns the monotonic arrival times into Unix time for the replies."""
        self._admission = admission
        self._replier = replier
        self.streams = streams
        self._wall_offset = wall_offset

    def take(self, pipe: RoutePipeline, inbound: Inbound, reply_topic: str, now: float, tally: Tally,
             jobs: list[Job]) -> None:
        route = pipe.route
        try:
            samples = decode_samples(inbound.payload, route.input)
        except PayloadError as exc:
            self._replier.send(inbound, reply_topic, pipe.error(exc.request_id, exc.code, exc.message), tally)
            return
        key, pushed = self.streams.push(route, inbound.topic, samples, now)
        if not pushed.windows:
            self._replier.ack(inbound)
            return
        last = len(pushed.windows) - 1
        for i, window in enumerate(pushed.windows):
            owner = inbound if i == last else inbound._replace(qos=0)  # one ack: with the last window's reply
            item = StreamItem(key, window.data, self.fields(key, window), samples.request_id, samples.timeout_ms)
            verdict = self._admission.admit(route.name, window.data.nbytes, inbound.deadline, inbound.qos > 0)
            if isinstance(verdict, Refusal):
                reply = {**pipe.error(samples.request_id, verdict.code, verdict.message), **item.fields}
                self._replier.send(owner, reply_topic, reply, tally)
            else:
                jobs.append(Job(pipe, owner, reply_topic, verdict, 0, item))

    def fields(self, key: str, window: Window) -> dict:
        """What a window's reply says of it: its stream, its samples (seq numbers, else arrival
        times in Unix seconds), and whether its stream's window started again before it, and why."""
        fields: dict = {"stream": key}
        if window.first_seq is not None:
            fields.update(first_seq=window.first_seq, last_seq=window.last_seq)
        else:
            offset = self._wall_offset()
            fields.update(first_at=round(window.first_at + offset, 3), last_at=round(window.last_at + offset, 3))
        fields["gap"] = window.gap is not None
        if window.gap is not None:
            fields["gap_reason"] = window.gap
            if window.missed:
                fields["missed"] = window.missed
        return fields
