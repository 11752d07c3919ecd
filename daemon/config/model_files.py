"""The model files a config names: a model loaded as the config says, and its labels.

The one factory for models: start-up, the workers' copies, pass 2 of the checks,
`validate` and the benchmarks all load through `open_model`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from daemon.config.schema import Config
from daemon.model.runtime import Model


def open_model(config: Config, name: str, max_batch: Optional[int] = None,
               sha256: Optional[str] = None) -> Model:
    """Load model `name` as the config says: its backend, pinned digest, XNNPACK and batch buckets.

    `max_batch=1` for a copy that only checks or describes the model (no batch interpreters
    to build); `sha256` pins a digest already read (the workers' copies of a loaded model)."""
    mc = config.models[name]
    return Model(mc.path, backend=config.runtime, expected_sha256=sha256 or mc.sha256, xnnpack=config.xnnpack,
                 max_batch=max_batch or config.batching.max_batch)


def read_labels(path: Path) -> Optional[list[str]]:
    """Labels, one per non-empty line; None when the file is missing."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return [line.strip() for line in text.splitlines() if line.strip()]
