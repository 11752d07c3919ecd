"""Load generation and measurement for `bench e2e`: C clients, consumer processes, CPU.

- `Collector`: one `mosquitto_sub -q 1` on the reply filter for the whole run; a thread
  reads its stdout (mosquitto_sub flushes each message) and timestamps each reply line.
- `LinePublisher`: one `mosquitto_pub -l -q 1`; lines written to its stdin are published
  by the C client, so the bench's Python only formats and paces.
- `ConsumerProcess`: a consumer as its own process, its process CPU read from /proc.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterable, Optional

import numpy as np

from daemon.tools.broker import end_process
from daemon.errors import DaemonError

logger = logging.getLogger(__name__)

QOS = "1"
POLL_S = 0.05
READY_TIMEOUT_S = 60.0
# Replies counted as answered: a result, or one of these error codes.
SHED_CODES = ("overloaded", "expired")
PERCENTILES = (50, 90, 99)
_CLK_TCK = os.sysconf("SC_CLK_TCK")
# The collector is MQTT v5 with the largest receive maximum, so the broker never queues
# replies for it: past max_queued_messages (1000 by default) mosquitto drops them silently.
_WIDE_WINDOW = ("-V", "5", "-D", "CONNECT", "receive-maximum", "65535")
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_PIPE_BYTES = 1 << 20
_STAT_UTIME = 13  # /proc/<pid>/stat fields after the command name: utime, stime (all threads)
_END_SESSION_TIMEOUT_S = 10.0


def expiry_args(seconds: int) -> tuple[str, ...]:
    """mosquitto_pub options that give every request a v5 Message Expiry of `seconds`."""
    return ("-V", "5", "-D", "publish", "message-expiry-interval", str(seconds))


def require_clients() -> None:
    missing = [c for c in ("mosquitto_pub", "mosquitto_sub") if shutil.which(c) is None]
    if missing:
        raise DaemonError(f"{' and '.join(missing)} not found: apt-get install mosquitto-clients")


# Extra options of every mosquitto_pub/_sub: ("-V", "5") for a broker that serves MQTT v5 only
# on its port (benchmarks/bench_rumqttd.py); the options later on a command line win.
_CLIENT_PROTOCOL: list[str] = []


def use_mqtt5_clients() -> None:
    """Every later mosquitto_pub/_sub speaks MQTT v5 (rumqttd answers a 3.1.1 CONNECT on its v5 port with nothing)."""
    _CLIENT_PROTOCOL[:] = ["-V", "5"]


def host_port(address: str) -> list[str]:
    host, port = address.rsplit(":", 1)
    return ["-h", host, "-p", port, *_CLIENT_PROTOCOL]


@dataclass(frozen=True)
class Reply:
    at: float  # time.perf_counter() when the bench read it
    kind: str  # result | hit | overloaded | expired | <other error code>


def classify(obj: dict) -> str:
    if "error" in obj:
        return obj["error"].get("code", "error")
    return "hit" if obj.get("cached") else "result"


def subscriber(address: str, topic_filter: str, *extra: str) -> subprocess.Popen:
    """`mosquitto_sub` on `topic_filter` at QoS 1 with a wide v5 receive window, its stdout a wide
    pipe (it absorbs bursts, so mosquitto_sub never waits on the reader thread); `extra`: more
    options, e.g. an output format."""
    cmd = ["mosquitto_sub", *host_port(address), "-q", QOS, "-t", topic_filter, *_WIDE_WINDOW, *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        fcntl.fcntl(proc.stdout.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)
    except OSError:
        pass
    return proc


class Collector:
    """Every reply on `topic_filter` (and `more`), by request id (replies without an id are listed apart)."""

    def __init__(self, address: str, topic_filter: str, *more: str):
        self._proc = subscriber(address, topic_filter, *(arg for f in more for arg in ("-t", f)))
        self.by_id: dict[int, Reply] = {}
        self.anonymous: list[Reply] = []
        self.probes = 0
        self._thread = threading.Thread(target=self._read, name="collector", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            at = time.perf_counter()
            try:
                obj = json.loads(line)
            except ValueError:
                self.probes += 1  # e.g. the readiness probe
                continue
            self._arrived(at, obj)

    def _arrived(self, at: float, obj) -> None:
        """One parsed reply, read at `at` (perf_counter); a subclass may keep replies otherwise."""
        request_id = obj.get("id") if isinstance(obj, dict) else None
        if request_id is None:
            self.anonymous.append(Reply(at, classify(obj)))
        elif request_id < 0:
            self.probes += 1
        else:
            self.by_id.setdefault(request_id, Reply(at, classify(obj)))

    def wait(self, predicate, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        return True

    def settle(self, done, idle_s: float, busy: Callable[[], bool] = lambda: False) -> float:
        """Wait until `done()` or no new reply for `idle_s` once `busy()` is False (the publisher still
        sending: a broker busy reading a burst may hold a consumer's replies back for seconds, as
        mosquitto does with a 3.1.1 client's window of 20); the time of the last reply seen."""
        seen, last_change = -1, time.monotonic()
        while not done():
            count = len(self.by_id) + len(self.anonymous)
            if count != seen or busy():
                seen, last_change = count, time.monotonic()
            elif time.monotonic() - last_change > idle_s:
                break
            time.sleep(POLL_S)
        return self.last_at()

    def last_at(self) -> float:
        times = [r.at for r in list(self.by_id.values())[-1:]] + [r.at for r in self.anonymous[-1:]]
        return max(times, default=0.0)

    def exit_code(self) -> Optional[int]:
        """mosquitto_sub's exit status, None while it runs."""
        return self._proc.poll()

    def close(self) -> None:
        end_process(self._proc)


class LinePublisher:
    """`mosquitto_pub -l`: each line written to `stdin` is one QoS 1 publish on `topic`; `extra`:
    more options, e.g. EXPIRY_ARGS."""

    def __init__(self, address: str, topic: str, extra: tuple[str, ...] = ()):
        self._proc = subprocess.Popen(["mosquitto_pub", *host_port(address), "-q", QOS, "-t", topic, "-l", *extra],
                                      stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.stdin: IO[bytes] = self._proc.stdin

    def send(self, line: bytes) -> None:
        self.stdin.write(line)
        self.stdin.flush()

    def send_file(self, path: Path) -> None:
        with open(path, "rb") as src:
            shutil.copyfileobj(src, self.stdin)
        self.stdin.flush()

    def close(self) -> None:
        try:
            self.stdin.close()
        except BrokenPipeError:
            pass
        end_process(self._proc, timeout_s=READY_TIMEOUT_S)


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process, all its threads, in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[_STAT_UTIME - 2]) + int(fields[_STAT_UTIME - 1])) / _CLK_TCK


def wait_online(address: str, status_topic: str, proc: subprocess.Popen, log: Path) -> None:
    """Wait for the retained `online` on `status_topic`, or fail if the process exits first."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DaemonError(f"consumer exited with {proc.returncode}: {log.read_text(errors='replace')[-1500:]}")
        out = subprocess.run(["mosquitto_sub", *host_port(address), "-t", status_topic, "-C", "1", "-W", "1"],
                             capture_output=True, check=False).stdout
        if out.strip() == b"online":
            return
    raise DaemonError(f"no retained online on {status_topic} within {READY_TIMEOUT_S:.0f}s; see {log}")


def end_session(address: str, client_id: str) -> None:
    """Connect once as `client_id` with a clean session, so the broker drops the session a stopped
    consumer left (docs/performance.md, bench e2e): it would queue every later request for it."""
    cmd = ["mosquitto_sub", *host_port(address), "-i", client_id, "-t", f"edge-inferd/{client_id}/end", "-E"]
    done = subprocess.run(cmd, capture_output=True, timeout=_END_SESSION_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise DaemonError(f"could not end {client_id}'s session: {done.stderr.decode(errors='replace')[-300:]}")


class ConsumerProcess:
    """A consumer command as a child process; stdout and stderr go to `log`; `env` adds to the environment;
    `after_stop` runs once the process has ended (e.g. end_session); `preexec` in the child before it
    execs (its CPUs, cpus.Placement)."""

    def __init__(self, cmd: list[str], address: str, status_topic: str, log: Path, env: Optional[dict] = None,
                 after_stop: Optional[Callable[[], None]] = None, preexec: Optional[Callable[[], None]] = None):
        self.log = log
        self._after_stop = after_stop
        with open(log, "wb") as out:
            env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=preexec)
        try:
            wait_online(address, status_topic, self.proc, log)
        except BaseException:
            self.stop()
            raise

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)

    def stop(self) -> int:
        code = end_process(self.proc, timeout_s=READY_TIMEOUT_S)
        after, self._after_stop = self._after_stop, None
        if after is not None:
            after()
        return code


@dataclass
class Outcome:
    """What came back for one set of requests."""

    sent: int
    counts: dict[str, int] = field(default_factory=dict)
    rtt_ms: dict[str, list[float]] = field(default_factory=dict)

    def summary(self) -> dict:
        answered = sum(self.counts.values())
        out = {"sent": self.sent, "answered": answered, "results": self.counts.get("result", 0) +
               self.counts.get("hit", 0), "cache_hits": self.counts.get("hit", 0)}
        out.update({code: self.counts.get(code, 0) for code in SHED_CODES})
        out["other_errors"] = answered - out["results"] - sum(out[c] for c in SHED_CODES)
        out["lost"] = self.sent - answered
        out["error_codes"] = {code: n for code, n in sorted(self.counts.items()) if code not in ("result", "hit")}
        for kind, values in sorted(self.rtt_ms.items()):
            out[f"{kind}_rtt_ms"] = percentiles(values)
        return out


def outcome(collector: Collector, ids: Iterable[int], sent_at: Optional[dict[int, float]] = None) -> Outcome:
    ids = list(ids)
    result = Outcome(len(ids), rtt_ms={"result": [], "hit": []} if sent_at is not None else {})
    for i in ids:
        reply = collector.by_id.get(i)
        if reply is None:
            continue
        result.counts[reply.kind] = result.counts.get(reply.kind, 0) + 1
        if sent_at is not None and i in sent_at:
            result.rtt_ms.setdefault(reply.kind, []).append((reply.at - sent_at[i]) * 1000.0)
    return result


def percentiles(values: list[float]) -> dict:
    if not values:
        return {f"p{p}": None for p in PERCENTILES}
    points = np.percentile(np.asarray(values), PERCENTILES)
    return {f"p{p}": round(float(v), 3) for p, v in zip(PERCENTILES, points)}


def last_reply(collector: Collector, ids: range) -> float:
    return max((r.at for i in ids if (r := collector.by_id.get(i)) is not None), default=0.0)


def drain_summary(summary: dict, start: float, end: float, cpu_s: float) -> dict:
    seconds = max(end - start, 1e-9)
    answered = max(summary["answered"], 1)
    summary.update(seconds=round(seconds, 3), rps=round(summary["answered"] / seconds, 1),
                   cpu_s=round(cpu_s, 3), cpu_us_per_request=round(cpu_s / answered * 1e6, 1))
    return summary


def json_line(request_id: int, data: bytes) -> bytes:
    return b'{"id": %d, "data": %s}\n' % (request_id, data)
