"""The `drift` section: watching each route's answers against a reference (daemon/obs/drift.py).

The frozen section and its reader, like reuse.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from daemon.config.reader import Reader

DEFAULT_WINDOW = 1000
DEFAULT_WARN_ABOVE = 0.25  # the conventional "significant shift" reading of the PSI
DEFAULT_REFERENCE_ANSWERS = 500
DEFAULT_MIN_ANSWERS = 200


@dataclass(frozen=True)
class DriftConfig:
    enabled: bool = True
    """Watch every `classify` and `anomaly` route's answers (docs/drift.md): the shares of the
    top-1 label and a histogram of the top score (classify), the anomaly score's bins and
    quantiles (anomaly), each against a reference, as a population stability index (PSI) in the
    stats (`drift`) and Prometheus (`edge_inferd_drift_psi`). `detect` and `values` routes have
    no drift measure. Costs a few µs per answer; the PSI is computed when the stats are read."""
    window: int = DEFAULT_WINDOW
    """The last this many answers of a route are compared with its reference (a sliding window)."""
    warn_above: float = DEFAULT_WARN_ABOVE
    """A route whose PSI (labels or score) passes this gets one warning line, and one line when
    it is back below 80 % of it. Conventional readings: below 0.1 stable, 0.1-0.25 a moderate
    shift, above 0.25 a significant one."""
    reference_answers: int = DEFAULT_REFERENCE_ANSWERS
    """A route without `validate.data` takes its first this many answers after start (or after a
    reload that changed it) as its reference; a route with it takes the validate data's answers,
    computed at start-up and reload."""
    min_answers: int = DEFAULT_MIN_ANSWERS
    """No PSI is reported (null) while the window holds fewer answers: two samples of the same
    distribution read about (bins - 1) x (1/answers + 1/reference) by chance alone (0.1 at 100
    answers over 10 bins). At most `window` (left out: 200, or `window` when that is smaller)."""


def read_drift(r: Reader, root: Mapping) -> DriftConfig:
    p, d = "drift", DriftConfig()
    m = r.section(root, "drift", DriftConfig)
    window = r.get(m, "window", p, int, d.window, minimum=1)
    least = r.get(m, "min_answers", p, int, min(d.min_answers, window), minimum=1)
    if least > window and r.ok(f"{p}.window"):
        r.error(m, "min_answers", p, f"must be at most drift.window ({window}), got {least}")
        least = window
    return DriftConfig(
        enabled=r.get(m, "enabled", p, bool, d.enabled),
        window=window,
        warn_above=float(r.get(m, "warn_above", p, (int, float), d.warn_above, check=_positive)),
        reference_answers=r.get(m, "reference_answers", p, int, d.reference_answers, minimum=1),
        min_answers=least,
    )


def _positive(value: float) -> Optional[str]:
    return None if value > 0 else f"must be > 0, got {value!r}"
