"""Every stream route's streams, on the network thread: a message's samples go to its stream's
window (daemon/pipeline/stream_window.py), and each full window goes on as a request does.

Bounded and counted: at most `input.stream.max_streams` streams a route, the least recently
heard evicted (`stream_evicted`); each holds one window of float32 samples plus a seq and an
arrival time per sample (`Streams.snapshot` says the bytes). Kept across a reload, except a
route whose stream or input shape changed: its streams start again (their next result says
`gap: true`, `new`). Lost at a restart: the partial windows live in memory only (docs/streams.md).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

from daemon.config.schema import RouteConfig
from daemon.obs.stats import Stats
from daemon.pipeline.stream_codec import Samples
from daemon.pipeline.stream_window import NEW, Pushed, StreamWindow

SAMPLES, WINDOWS, DUPLICATES, EVICTED, GAPS = ("stream_samples", "stream_windows", "stream_duplicates",
                                               "stream_evicted", "stream_gaps")


class _RouteStreams:
    """One route's streams, and what its messages are read with (worked out once, not per message)."""

    def __init__(self, route: RouteConfig):
        self.route = route
        self.windows: OrderedDict[str, StreamWindow] = OrderedDict()
        self.level = key_level(route)
        stream = route.input.stream
        self.max_gap_s = None if stream.max_gap_ms is None else stream.max_gap_ms / 1000.0

    def key(self, topic: str) -> str:
        """The stream a topic names: its `level`, or the whole topic."""
        if self.level is None:
            return topic
        levels = topic.split("/")
        return levels[self.level] if self.level < len(levels) else topic


class Streams:
    """Not thread-safe: the network thread alone pushes; `snapshot` reads sizes only."""

    def __init__(self, stats: Stats):
        self._stats = stats
        self._routes: dict[str, _RouteStreams] = {}

    def push(self, route: RouteConfig, topic: str, samples: Samples, now: float) -> tuple[str, Pushed]:
        """The message's samples into its stream: its key, and the windows they completed."""
        held = self._held(route)
        key = samples.field_key if samples.field_key is not None else held.key(topic)
        window = self._window(held, key)
        pushed = window.push(samples.samples, samples.seq, now)
        self._stats.incr(SAMPLES, len(samples.samples))
        if pushed.duplicates:
            self._stats.incr(DUPLICATES, pushed.duplicates)
        if pushed.windows:
            self._stats.incr(WINDOWS, len(pushed.windows))
            gaps = sum(w.gap not in (None, NEW) for w in pushed.windows)
            if gaps:
                self._stats.incr(GAPS, gaps)
        return key, pushed

    def _held(self, route: RouteConfig) -> _RouteStreams:
        held = self._routes.get(route.name)
        if held is not None and held.route.input is route.input:  # per message: identity, not equality
            return held
        if held is None or held.route.input != route.input:  # new, or its stream changed on a reload
            held = self._routes[route.name] = _RouteStreams(route)
        held.route, held.level = route, key_level(route)  # a reload that kept its input: the streams go on
        return held

    def _window(self, held: _RouteStreams, key: str) -> StreamWindow:
        window = held.windows.get(key)
        if window is not None:
            held.windows.move_to_end(key)
            return window
        route, stream = held.route, held.route.input.stream
        window = held.windows[key] = StreamWindow(stream.window, stream.hop, route.input.shape[1:], held.max_gap_s,
                                                  stream.seq is not None)
        if len(held.windows) > stream.max_streams:
            held.windows.popitem(last=False)
            self._stats.incr(EVICTED)
        return window

    def snapshot(self) -> dict:
        """{route: {streams, bytes}}: the streams held and the memory their windows take."""
        out = {}
        for name, held in list(self._routes.items()):
            windows = list(held.windows.values())
            out[name] = {"streams": len(windows), "max_streams": held.route.input.stream.max_streams,
                         "bytes": sum(w.nbytes for w in windows)}
        return out


def key_level(route: RouteConfig) -> Optional[int]:
    """The topic level that names a stream: `stream.key`'s, else the level of the filter's first
    `+`; None (the whole topic) without either."""
    key = route.input.stream.key
    if isinstance(key, int):
        return key
    levels = route.subscribe.split("/")
    return levels.index("+") if "+" in levels else None
