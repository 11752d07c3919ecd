"""What one `edge-inferd bench e2e` run measures: its phases, request counts, offered rates and waits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from daemon.errors import DaemonError

PHASES = ("drain", "openloop", "cache", "batching")
# Run only when named (--only): the stress figures (stress.py), each on the default config.
EXTRA_PHASES = ("burst30k", "overload", "openloop1000", "cachepair")
ALL_PHASES = PHASES + EXTRA_PHASES
DEFAULT_ROUTE = "activity"
BURST_REQUESTS = 30000
DEFAULT_REQUESTS = 5000
DEFAULT_DURATION_S = 5.0
# Offered loads: plain numbers are req/s, "Nx" multiples of the batching-off daemon's drain rate.
DEFAULT_RATES = ("1000", "0.25x", "0.5x", "1x", "1.5x", "2x")
SETTLE_S = 5.0  # a measurement ends when all are answered or nothing came back for this long
QUICK = {"requests": 300, "duration": 0.5, "rates": ("300", "1x"), "warmup": 10, "burst": 1000}
WARMUP_REQUESTS = 50


def parse_rate(text: str, capacity: float) -> tuple[float, float]:
    """(req/s, multiple of capacity or 0 for a fixed rate) from "1000" or "0.5x"."""
    try:
        if text.endswith("x"):
            return float(text[:-1]) * capacity, float(text[:-1])
        return float(text), 0.0
    except ValueError:
        raise DaemonError(f"--rates: {text!r} is neither a rate (1000) nor a multiple of capacity (0.5x)") from None


@dataclass
class Plan:
    config: Path
    out: Path
    requests: int = DEFAULT_REQUESTS
    duration: float = DEFAULT_DURATION_S
    rates: tuple[str, ...] = DEFAULT_RATES
    phases: tuple[str, ...] = PHASES
    settle: float = SETTLE_S
    warmup: int = WARMUP_REQUESTS
    route: str = DEFAULT_ROUTE  # the route every phase but batching loads (batching: appliance-raw)
    rounds: int = 1  # every selected phase this many times, consumers alternating; medians reported
    burst: int = BURST_REQUESTS  # requests of the burst30k phase
    consumer_cpus: tuple[int, ...] = ()  # the consumers' CPUs; the bench and broker get the rest (cpus.py)
    consumer_cpu_share: Optional[float] = None  # the consumers capped at this share of one CPU
    also: tuple[str, ...] = ()  # more consumers (e2e.ALSO: echo-v5, naive-v5, daemon-paho, daemon-paho-v5, daemon-native)
    transport: Optional[str] = None  # every daemon's mqtt.transport, when set (else the config's)

    @classmethod
    def build(cls, config: Path, out: Path, requests: Optional[int] = None, duration: Optional[float] = None,
              rates: Optional[list[str]] = None, quick: bool = False, only: Optional[list[str]] = None,
              route: str = DEFAULT_ROUTE, rounds: int = 1, burst: Optional[int] = None,
              consumer_cpus: tuple[int, ...] = (), consumer_cpu_share: Optional[float] = None,
              also: tuple[str, ...] = ()) -> "Plan":
        base = dict(QUICK) if quick else {}
        for key, value in (("requests", requests), ("duration", duration), ("rates", rates), ("burst", burst)):
            if value is not None:
                base[key] = tuple(value) if key == "rates" else value
        phases = tuple(p for p in ALL_PHASES if p in (only or PHASES) or (p == "drain" and "openloop" in (only or ())))
        for rate in base.get("rates", ()):
            parse_rate(rate, 1.0)
        if rounds < 1:
            raise DaemonError(f"--rounds: {rounds} is not a positive number of rounds")
        return cls(config=config, out=out, phases=phases, route=route, rounds=rounds, consumer_cpus=consumer_cpus,
                   consumer_cpu_share=consumer_cpu_share, also=tuple(dict.fromkeys(also)), **base)
