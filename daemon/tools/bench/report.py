"""`bench e2e` output: the JSON file, the latency-vs-load PNG and the summary table."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

JSON_NAME = "bench-e2e.json"
PLOT_NAME = "bench-e2e-latency.png"
FLOOR, NAIVE = "echo", "naive"
MATPLOTLIB_HINT = "pip install 'edge-inferd[bench]' (or pip install 'matplotlib>=3.7') for the latency plot"
_PLOT_SIZE_IN = (8, 5)
_PLOT_DPI = 120


def write_outputs(results: dict, out: Path) -> list[Path]:
    """The JSON, and the plot when matplotlib is there; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / JSON_NAME]
    written[0].write_text(json.dumps(results, indent=1))
    if results.get("openloop"):
        try:
            written.append(plot_latency(results["openloop"], out / PLOT_NAME))
        except ImportError:
            logger.warning("no plot: matplotlib is not installed; %s", MATPLOTLIB_HINT)
    return written


def plot_latency(openloop: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=_PLOT_SIZE_IN)
    for name, points in openloop.items():
        pts = sorted((p for p in points if p["result_rtt_ms"]["p50"] is not None), key=lambda p: p["offered_rps"])
        if not pts:
            continue
        rates = [p["offered_rps"] for p in pts]
        (line,) = ax.plot(rates, [p["result_rtt_ms"]["p50"] for p in pts], marker="o", label=f"{name} p50")
        ax.plot(rates, [p["result_rtt_ms"]["p99"] for p in pts], marker="x", linestyle="--",
                color=line.get_color(), label=f"{name} p99")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("round trip of results (ms)")
    ax.set_yscale("log")
    ax.set_title("edge-inferd bench e2e: round trip vs offered load")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=_PLOT_DPI)
    plt.close(fig)
    return path


def _ratio(value: Optional[float], ref: Optional[float]) -> str:
    return f"{value / ref:.2f}x" if value and ref else "-"


def _counts(row: dict) -> str:
    return (f"{row['results']:>7} {row['overloaded']:>5} {row['expired']:>5} {row['other_errors']:>5} "
            f"{row['lost']:>5}")


COUNTS_HEAD = f"{'results':>7} {'ovl':>5} {'exp':>5} {'err':>5} {'lost':>5}"


def drain_table(drain: dict) -> list[str]:
    floor, naive = drain.get(FLOOR, {}), drain.get(NAIVE, {})
    lines = [f"{'drain':<20} {'req/s':>8} {'/echo':>6} {'/naive':>6} {'CPU µs/req':>10} {'/echo':>6} "
             f"{'/naive':>6}  {COUNTS_HEAD}"]
    for name, row in drain.items():
        cpu = row["cpu_us_per_request"]
        lines.append(f"{name:<20} {row['rps']:>8.0f} {_ratio(row['rps'], floor.get('rps')):>6} "
                     f"{_ratio(row['rps'], naive.get('rps')):>6} {cpu:>10.1f} "
                     f"{_ratio(cpu, floor.get('cpu_us_per_request')):>6} "
                     f"{_ratio(cpu, naive.get('cpu_us_per_request')):>6}  {_counts(row)}")
    return lines


def _ms(value: Optional[float]) -> str:
    return f"{value:.1f}" if value is not None else "-"


def openloop_table(openloop: dict) -> list[str]:
    lines = [f"{'open loop':<20} {'rate':>6} {'offered':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}  {COUNTS_HEAD}"]
    for name, points in openloop.items():
        for p in points:
            rtt = p["result_rtt_ms"]
            lines.append(f"{name:<20} {p['rate_spec']:>6} {p['offered_rps']:>8.0f} {_ms(rtt['p50']):>8} "
                         f"{_ms(rtt['p90']):>8} {_ms(rtt['p99']):>8}  {_counts(p)}")
    return lines


def cache_lines(cache: dict, floor_cpu: Optional[float]) -> list[str]:
    mixed, unique, repeat = cache["mixed"], cache["all_unique"], cache["all_repeat"]
    hit, miss = mixed.get("hit_rtt_ms", {}), mixed.get("result_rtt_ms", {})
    net = (lambda v: f"{v - floor_cpu:.1f}") if floor_cpu else (lambda v: "-")
    return [f"cache: mixed stream at {cache['rate']:.0f} req/s, {mixed['cache_hits']} hits of "
            f"{mixed['repeats_sent']} repeats: hit p50 {_ms(hit.get('p50'))} ms, miss p50 {_ms(miss.get('p50'))} ms",
            f"cache: CPU µs/request all-unique {unique['cpu_us_per_request']:.1f} (minus echo floor "
            f"{net(unique['cpu_us_per_request'])}), all-repeat {repeat['cpu_us_per_request']:.1f} "
            f"({net(repeat['cpu_us_per_request'])}); hits in all-repeat {repeat['cache_hits']}/{repeat['sent']}"]


def batching_lines(batching: dict) -> list[str]:
    lines = [f"batching, appliance-raw: {name} {row['rps']:.0f} req/s (publisher {row['publisher_rps']:.0f} req/s), "
             f"CPU {row['cpu_us_per_request']:.1f} µs/req, lost {row['lost']}" for name, row in batching.items()]
    rows = list(batching.values())
    if len(rows) >= 2:  # the first two daemons: batching off, then on (e2e.CONSUMERS)
        names = list(batching)
        lines.append(f"batching ratio {names[1]}/{names[0]}: {_ratio(rows[1]['rps'], rows[0]['rps'])}")
    return lines


def _errors(row: dict) -> str:
    codes = row.get("error_codes") or {}
    return ", ".join(f"{code} {n}" for code, n in codes.items()) or "none"


def burst_lines(burst: dict) -> list[str]:
    return [f"burst30k: {burst['results']} results of {burst['sent']} ({burst['rps']:.0f} req/s, "
            f"CPU {burst['cpu_us_per_request']:.1f} µs/req); errors: {_errors(burst)}; lost {burst['lost']}"]


def overload_lines(overload: dict) -> list[str]:
    plain, expiry = overload["no_deadline"], next(v for k, v in overload.items() if k.startswith("expiry_"))
    late = expiry["lateness_ms"]
    return [f"overload: capacity {plain['capacity_rps']:.0f} req/s, offered {plain['offered_rps']:.0f} "
            f"({overload['multiple']:g}x) for {plain['duration_s']:g}s",
            f"  no deadline: results/s during {plain['results_per_s_during']:.0f}, after "
            f"{plain['results_per_s_after']:.0f}, overall {plain['results_per_s']:.0f} "
            f"({plain['of_capacity']:.2f}x capacity); lost {plain['lost']}; errors: {_errors(plain)}",
            f"  published {plain.get('published')}, the daemon received {plain.get('daemon_received')} "
            f"(its nudges {plain.get('daemon_nudges')}, acks after outbox {plain.get('daemon_acks_after_outbox')})",
            f"  expiry: {expiry['results']} results ({expiry['results_of_capacity_x_time']:.2f}x capacity x time), "
            f"lateness p99 {_ms(late['p99'])} ms, max {_ms(late['max'])} ms; expired {expiry['expired']}; "
            f"lost {expiry['lost']}"]


def openloop1000_lines(rows: dict) -> list[str]:
    lines = [f"openloop1000: {name} p50 {_ms(r['result_rtt_ms']['p50'])} ms, p99 {_ms(r['result_rtt_ms']['p99'])} ms, "
             f"errors {r['answered'] - r['results']}, lost {r['lost']}"
             for name, r in rows.items() if isinstance(r, dict)]
    ratio = rows.get("p99_ratio")
    return lines + [f"openloop1000: p99 daemon/echo {ratio:.2f}x" if ratio else "openloop1000: p99 ratio -"]


def cachepair_lines(rows: dict) -> list[str]:
    names = [n for n, r in rows.items() if isinstance(r, dict)]
    parts = ", ".join(f"{n} {rows[n]['cpu_us_per_request']:.1f} µs/req ({rows[n]['cache_hits']} hits)" for n in names)
    return [f"cachepair (distinct stream): {parts}; cache on minus off {rows['cpu_us_diff']:+.1f} µs/req"]


def rounds_lines(rounds: list[dict]) -> list[str]:
    """Each round's drain CPU per request and its ratios to echo and naive, beside the medians above."""
    lines = [f"rounds (medians above): drain CPU µs/req per round, and /echo /naive"]
    names = list(rounds[0].get("drain", {}))
    for name in names:
        cells = []
        for r in rounds:
            row, floor, naive = (r.get("drain", {}).get(k, {}) for k in (name, FLOOR, NAIVE))
            cpu = row.get("cpu_us_per_request")
            cells.append(f"{cpu:.0f} ({_ratio(cpu, floor.get('cpu_us_per_request'))} "
                         f"{_ratio(cpu, naive.get('cpu_us_per_request'))})" if cpu else "-")
        lines.append(f"  {name:<20} " + "  ".join(cells))
    return lines


_STRESS_LINES = (("burst30k", burst_lines), ("overload", overload_lines), ("openloop1000", openloop1000_lines),
                 ("cachepair", cachepair_lines))


def summary(results: dict) -> str:
    lines = [f"route {results['meta']['workload']['route']}"] if "workload" in results.get("meta", {}) else []
    if results.get("drain"):
        lines += drain_table(results["drain"]) + [""]
    if results.get("openloop"):
        lines += openloop_table(results["openloop"]) + [""]
    if results.get("cache"):
        floor = results.get("drain", {}).get(FLOOR, {}).get("cpu_us_per_request")
        lines += cache_lines(results["cache"], floor)
    if results.get("batching"):
        lines += batching_lines(results["batching"])
    for phase, lines_of in _STRESS_LINES:
        if results.get(phase):
            lines += lines_of(results[phase])
    if len(results.get("rounds", ())) > 1 and results.get("drain"):
        lines += rounds_lines(results["rounds"])
    lines += [f"FAILED {name}: {error}" for name, error in results.get("errors", {}).items()]
    lines.append(f"wall time {results['meta']['wall_s']:.0f}s")
    return "\n".join(lines)
