"""The model files a config names: a model loaded as the config says, and its labels.

The one factory for models: start-up, the workers' copies, pass 2 of the checks,
`validate` and the benchmarks all load through `open_model`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from daemon.config.schema import Config
from daemon.model import preprocess
from daemon.model.runtime import Model


def open_model(config: Config, name: str, max_batch: Optional[int] = None,
               sha256: Optional[str] = None) -> Model:
    """Load model `name` as the config says: its backend, pinned digest, XNNPACK and batch buckets.

    `max_batch=1` for a copy that only checks or describes the model (no batch interpreters
    to build); `sha256` pins a digest already read (the workers' copies of a loaded model)."""
    mc = config.models[name]
    return Model(mc.path, backend=config.runtime, expected_sha256=sha256 or mc.sha256, xnnpack=config.xnnpack,
                 max_batch=max_batch or min(config.batching.max_batch, mc.max_batch or config.batching.max_batch), num_threads=mc.threads,
                 sample_shape=route_sample_shape(config, name))


def route_sample_shape(config: Config, name: str) -> Optional[tuple[int, ...]]:
    """What the first route on model `name` feeds it (its input.shape after preprocessing): the
    size of a dynamic input (daemon/model/dynamic.py). None without a route, or one whose steps
    do not fit its shape (check-config names that itself)."""
    for route in config.routes:
        if route.model == name and route.input.shape:
            try:
                return preprocess.output_shape(route.preprocess, route.input.shape)
            except ValueError:
                return None
    return None


# An `id label` line as detectors ship their label maps: "0 person", "16  cat", "3: car".
_ID_LINE = re.compile(r"^\s*(\d+)\s*[:,]?\s+(\S.*?)\s*$")


@dataclass(frozen=True)
class Labels:
    """A model's labels by output index (or class id). Ids left out of an `id label` file are
    named by their number."""

    names: tuple[str, ...]
    """Dense, by index: a gap's entry is its id as text."""
    count: int
    """Labels the file gives."""
    by_id: bool = False
    """Read from `id label` lines."""

    def name(self, index: int) -> str:
        return self.names[index] if 0 <= index < len(self.names) else str(index)


def parse_labels(text: str) -> Labels:
    """Plain lines (one label per line, in output order) or `id label` lines (gaps allowed).
    A file is read as ids only when every line is one and no id repeats."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    found = [_ID_LINE.match(line) for line in lines]
    ids = [int(m.group(1)) for m in found if m]
    if lines and len(ids) == len(lines) and len(set(ids)) == len(ids):
        by_id = {int(m.group(1)): m.group(2) for m in found}
        names = tuple(by_id.get(i, str(i)) for i in range(max(by_id) + 1))
        return Labels(names, len(by_id), by_id=True)
    return Labels(tuple(lines), len(lines))


def read_labels(path: Optional[Path]) -> Optional[Labels]:
    """The labels file's labels; None when the file is missing (or none is configured)."""
    if path is None:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return parse_labels(text)
