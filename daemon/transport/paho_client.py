"""paho's Client with its per-packet system calls and a per-PUBACK walk taken off the request path.

Profiled on a 5,000-request burst (py-spy, docs/performance.md), paho itself was about
a third of the daemon's CPU; these of its habits are taken off the request path (the last
measured with benchmarks/bench_link.py, docs/performance.md, "The paho thread"):
- **Reads**: `_packet_read` takes each packet in two to four `recv()` calls (one byte
  for the command, one per remaining-length byte, then the body), each a system call:
  `_sock_recv` alone was 17% of the samples. Here one `recv()` reads ahead about
  READ_AHEAD_PACKETS requests' worth (128 KiB to 1 MiB) and serves the following packets
  from memory. `loop_read` keeps going while
  read-ahead bytes remain, because `select()` cannot see them. A PUBLISH or PUBACK that
  lies whole in the read-ahead is framed straight from it (`_frame`), not byte by byte
  through `_sock_recv` and paho's `_in_packet` bookkeeping. What one `loop_read` call
  reads is a read burst: `on_read_burst_end` is called at its end (MqttLink hands the
  burst's requests to intake in one call).
- **Wake-ups**: every publish or ack queued from another thread writes a byte to
  paho's socketpair to wake its loop (`_packet_queue`: 10% of the samples). A worker
  that publishes a batch of replies holds the wake-ups (`quiet_wakeups`) and, at the
  end, writes what is queued itself (`_write_here`) on a plain TCP socket when no other
  thread is writing: the reply leaves without a hop to the loop thread, which woke, then
  waited for the GIL until the worker was done with the batch (171 µs per reply at p50,
  632 at p99, at 1,000 requests/s: docs/performance.md, "Writing on the worker's
  thread"). It wakes the loop instead while another thread writes, when the socket is
  full, and on TLS and websocket connections (an SSL object is not to be written and read
  from two threads at once). Packets queued by the loop thread itself (the acks sent when
  a reply's PUBACK arrives) wake nothing. One lock (`_write_lock`) is held by whoever
  writes, closes or reconnects the socket, so packets never interleave, and a packet of
  the last connection is never written on the next.
- **Held-back replies**: past its in-flight window paho holds QoS>0 publishes back (state
  queued), and on every PUBACK `_update_inflight` walks all unacknowledged publishes from
  the oldest to find the first held-back one: ~1,024 steps per PUBACK once a burst fills
  the window (18% of the samples). Here the held-back mids wait in a deque, in paho's
  order, and each PUBACK sends the next one in O(1).
- **Holding**: while `may_read()` is False (the daemon's byte budget is full: serve/admission.py)
  no `recv()` is made (what the read-ahead holds is still handled: at most READ_AHEAD_MAX_BYTES
  past the budget), and `loop_read` sleeps HELD_POLL_S, so a backlog waits at the broker, which keeps
  it at QoS 1, instead of being answered `overloaded` (the native link does the same). The
  check is in `_sock_recv`, because paho's `loop_read` reads as many packets as there are
  publishes in flight, in one call.
  Replies still leave (a worker writes them itself); their PUBACKs are read once reading resumes.
  A PINGREQ waiting for its PINGRESP is always read, so keepalive never drops a held link.
- **Writes**: `_packet_write` gives each queued packet its own `send()`, so a batch of
  replies, and the PUBACKs of a read burst, each cost a system call. Here each run of queued
  packets that need nothing done once written (all but QoS 0 publishes and DISCONNECT,
  which paho's own loop still writes one by one) leaves in one `send()` of up to 64 KiB.

The packets themselves are decoded and made without paho's per-packet objects where they
carry no properties (paho_packets.py). All rely on paho 2.x internals (`_sock_recv`,
`_sock_close`, `_sockpairW`, `_update_inflight`, `_out_messages`, `_out_packet`, `_in_packet`,
`_packet_handle`, `_ping_t`, pinned by `paho-mqtt>=2.2,<3`); tests/integration/test_paho_client.py checks
them against the real paho.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode

from daemon.transport.paho_packets import PUBACK, PUBLISH, Packets

try:  # paho 2.2 turns decoding errors into MalformedPacket (and its _packet_read catches it); 2.1 has none
    from paho.mqtt.exception import MalformedPacket as _Malformed
except ImportError:  # pragma: no cover - paho 2.1
    _Malformed = ()

# One recv() reads about READ_AHEAD_PACKETS requests (PUBLISH packets) of the size seen lately,
# within READ_AHEAD_BYTES..READ_AHEAD_MAX_BYTES. Each recv() lets the GIL go and waits to get it
# back from the workers, so what it costs is paid per recv, and it is amortized over packets, not
# bytes: on `--only burst30k` gunpoint's 3.4 KB requests served best at 128 KiB (38 packets; 512 KiB,
# 150 packets, was 8 % slower: a longer read holds the GIL from the workers), activity's 12.5 KB
# ones at 370-512 KiB (30-42 packets; 128 KiB, 10 packets, was 20 % slower) (docs/performance.md,
# "The read-ahead, in packets"; 30 is what the end-to-end A/B there ran).
READ_AHEAD_PACKETS = 30
READ_AHEAD_BYTES = 1 << 17
READ_AHEAD_MAX_BYTES = 1 << 20
# Weight of each new packet in the running mean of packet sizes.
_PACKET_SIZE_WEIGHT = 1 / 64
# One send() writes up to about this much of the queued packets (at least one packet).
WRITE_JOIN_BYTES = 1 << 16
_DISCONNECT = 0xE0
_REMAINING_LENGTH_BYTES = 4  # MQTT's remaining length takes 1 to 4 bytes
# While reading is held (`may_read` False), how often the loop asks again.
HELD_POLL_S = 0.005
# What paho writes to its socketpair to wake the loop (any single byte does).
_WAKE_BYTE = b"0"


class _HeldWakeups:
    """Stands in for paho's socketpair writer while a thread holds its wake-ups."""

    def __init__(self) -> None:
        self.owed = False

    def send(self, data: bytes) -> int:
        self.owed = True
        return len(data)


_LOOP_THREAD = _HeldWakeups()  # owed wake-ups are never paid: the loop thread is the one they would wake


def _needs_nothing_once_sent(packet: dict) -> bool:
    """paho acts on a QoS 0 PUBLISH (`on_publish`) and a DISCONNECT once written; on nothing else."""
    command = packet["command"] & 0xF0
    return command != _DISCONNECT and not (command == PUBLISH and packet["qos"] == 0)


class Client(Packets):
    """paho.Client with read-ahead, joined writes and per-thread batched wake-ups; the API is paho's,
    plus `on_read_burst_end` (called on the loop thread after each read burst) and `quiet_wakeups`."""

    def __init__(self, *args: Any, **kwargs: Any):
        self._held = threading.local()
        self._real_sockpair_w = None
        self._ahead = b""
        self._ahead_pos = 0
        self._packet_size = 0.0  # running mean of PUBLISH bodies, for the read-ahead's size
        self._window: Optional[int] = None  # the daemon's own window (max_inflight_messages_set)
        self._framed: dict = {"command": 0, "have_remaining": 1, "remaining_count": [], "remaining_mult": 1,
                              "remaining_length": 0, "packet": b"", "to_process": 0, "pos": 0}
        self.last_connect_error: Optional[OSError] = None  # why the last (re)connect failed
        self._held_back: deque[int] = deque()  # mids paho holds back (state queued), oldest first; its lock
        # is paho's _out_message_mutex
        self._write_lock = threading.RLock()  # held to write, close or reconnect the socket (module doc)
        self.on_read_burst_end: Optional[Callable[[], None]] = None
        self.may_read: Callable[[], bool] = lambda: True  # False holds reading (the daemon's byte budget is full)
        super().__init__(*args, **kwargs)

    # paho assigns and reads `_sockpairW`; a thread holding its wake-ups sees the stand-in, and
    # so does paho's own loop thread, which is awake already: its packets (PUBACKs sent from
    # `on_publish`, say) go out in the loop's next pass without a wake-up byte each.
    @property
    def _sockpairW(self) -> Any:  # noqa: N802 - paho's name
        writer = self._real_sockpair_w
        if writer is None:
            return None
        loop = self.__dict__.get("_thread")  # read twice per queued packet: kept cheap
        if loop is not None and loop.ident == threading.get_ident():
            return _LOOP_THREAD
        held = getattr(self._held, "wakeups", None)
        return held if held is not None else writer

    @_sockpairW.setter
    def _sockpairW(self, value: Any) -> None:  # noqa: N802
        self._real_sockpair_w = value

    @contextmanager
    def quiet_wakeups(self) -> Iterator[None]:
        """Publishes and acks queued in this block wake paho's loop once, at the end."""
        held = _HeldWakeups()
        self._held.wakeups = held
        try:
            yield
        finally:
            self._held.wakeups = None
            writer = self._real_sockpair_w
            if held.owed and writer is not None and not self._write_here():
                try:
                    writer.send(_WAKE_BYTE)
                except (BlockingIOError, OSError):
                    pass  # the loop is awake already (buffer full) or the link is closing

    def _write_here(self) -> bool:
        """Writes the queued packets on this thread, if no other thread is writing and the socket is
        plain TCP; True when nothing is left for the loop to write (module doc). A packet paho acts
        on once written (a QoS 0 publish, DISCONNECT) is left to the loop, whose callbacks they are."""
        if not self._write_lock.acquire(blocking=False):
            return False
        try:
            if not writes_on_caller(self._sock):
                return False
            while True:
                packet = self._join_run()
                if packet is None:
                    return not self._out_packet
                if self._send_run(packet, log_failure=False) is not None:
                    return False  # full, or failing: the loop writes it, or finds the error
        finally:
            self._write_lock.release()

    def _read_ahead_bytes(self) -> int:
        return int(min(READ_AHEAD_MAX_BYTES, max(READ_AHEAD_BYTES, READ_AHEAD_PACKETS * self._packet_size)))

    def _saw_publish(self, length: int) -> None:
        """A whole PUBLISH body's length, framed here or asked for by paho's reader (PUBACKs, a few
        bytes each and as many as the replies, would say nothing of what a recv() brings)."""
        self._packet_size += (length - self._packet_size) * _PACKET_SIZE_WEIGHT

    def _sock_recv(self, bufsize: int) -> bytes:
        packet = self._in_packet
        if packet["command"] & 0xF0 == PUBLISH and bufsize == packet["remaining_length"]:
            self._saw_publish(bufsize)  # paho asks for the whole body first, then for what is left
        if self._ahead_pos >= len(self._ahead):
            if self._holding():  # paho reads one loop_read's packets in a loop of its own: stop it here
                raise BlockingIOError("holding: the byte budget is full")
            data = super()._sock_recv(max(bufsize, self._read_ahead_bytes()))
            if len(data) <= bufsize:
                return data
            self._ahead, self._ahead_pos = data, 0
        start = self._ahead_pos
        self._ahead_pos = min(start + bufsize, len(self._ahead))
        return self._ahead[start : self._ahead_pos]

    def publish(self, *args: Any, **kwargs: Any) -> paho.MQTTMessageInfo:
        """paho's publish, remembering (under paho's lock) a publish held back by a full window."""
        with self._out_message_mutex:
            info = super().publish(*args, **kwargs)
            message = self._out_messages.get(info.mid)
            if message is not None and message.state == paho.mqtt_ms_queued:
                self._held_back.append(info.mid)
            return info

    def _messages_reconnect_reset_out(self) -> None:
        with self._out_message_mutex:
            super()._messages_reconnect_reset_out()  # past the window, publishes are held back again
            self._held_back = deque(m.mid for m in self._out_messages.values() if m.state == paho.mqtt_ms_queued)

    def max_inflight_messages_set(self, inflight: int) -> None:
        super().max_inflight_messages_set(inflight)
        self._window = inflight  # the daemon's own window; a broker's ReceiveMaximum may lower it

    def fit_window(self, receive_maximum: int) -> None:
        """Keep at most the broker's ReceiveMaximum (from its CONNACK) of publishes in flight, as
        MQTT 5 requires of a client (4.9.0): paho 2.x reads the property and ignores it. Called in
        on_connect, before paho resends what it holds, so that the resend keeps to it too."""
        with self._out_message_mutex:
            limit = max(1, min(self._window or self._max_inflight_messages, receive_maximum))
            if limit != self._max_inflight_messages:
                self._max_inflight_messages = limit
                self._messages_reconnect_reset_out()  # in flight and held back again, by the new window

    def drop_out_messages(self) -> list[paho.MQTTMessage]:
        with self._out_message_mutex:
            self._held_back.clear()
            return super().drop_out_messages()

    def _update_inflight(self) -> MQTTErrorCode:
        """paho's, sending held-back publishes oldest first while the window has room, without
        walking the ones in flight (callers hold `_out_message_mutex`, as paho's do)."""
        held = self._held_back
        while held and self._inflight_messages < self._max_inflight_messages:
            m = self._out_messages.get(held.popleft())
            if m is None or m.qos == 0 or m.state != paho.mqtt_ms_queued:
                continue  # acknowledged, dropped or sent meanwhile
            self._inflight_messages += 1
            m.state = paho.mqtt_ms_wait_for_puback if m.qos == 1 else paho.mqtt_ms_wait_for_pubrec
            rc = self._send_publish(m.mid, m.topic.encode("utf-8"), m.payload, m.qos, m.retain, m.dup,
                                    properties=m.properties)
            if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                return rc
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def reconnect(self) -> MQTTErrorCode:
        """paho's reconnect, remembering the OSError its loop swallows (for `on_connect_fail`)."""
        try:
            with self._write_lock:  # no worker writes the old connection's packets on the new one
                return super().reconnect()
        except OSError as exc:
            self.last_connect_error = exc
            raise

    def _sock_close(self) -> None:
        with self._write_lock:
            self._ahead, self._ahead_pos = b"", 0  # never feed a new connection the old one's bytes
            super()._sock_close()

    def loop_write(self) -> MQTTErrorCode:
        with self._write_lock:
            return super().loop_write()

    def _holding(self) -> bool:
        """Reading is held: the budget is full, and no PINGREQ waits for its PINGRESP."""
        return self._ping_t == 0 and not self.may_read()

    def loop_read(self, max_packets: int = 1) -> MQTTErrorCode:
        if self._ahead_pos >= len(self._ahead) and self._holding():
            time.sleep(HELD_POLL_S)  # the broker keeps what is unread (QoS 1) until there is room
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        try:
            rc = super().loop_read(max_packets)
            while rc == MQTTErrorCode.MQTT_ERR_SUCCESS and self._ahead_pos < len(self._ahead) and self._sock:
                before = self._ahead_pos
                rc = super().loop_read(max_packets)
                if self._ahead_pos == before:
                    break  # no progress: wait for the socket
            return rc
        finally:
            if self.on_read_burst_end is not None:
                self.on_read_burst_end()

    def _packet_read(self) -> MQTTErrorCode:
        if self._in_packet["command"] == 0:  # between packets
            rc = self._frame()
            if rc is not None:
                return rc
        return super()._packet_read()

    def _frame(self) -> Optional[MQTTErrorCode]:
        """Handle the next packet straight from the read-ahead if it is a PUBLISH or a PUBACK and
        lies there whole; None: paho reads it (through `_sock_recv`). The keepalive's clock of
        received bytes needs no update here: every recv() is made by paho's reader, which sets
        it once the packet that asked for the bytes is complete."""
        buf, start = self._ahead, self._ahead_pos
        end = len(buf)
        if end - start < 2 or (buf[start] & 0xF0) not in (PUBLISH, PUBACK):
            return None
        length, shift, pos = 0, 0, start + 1
        while True:
            if pos >= end or pos > start + _REMAINING_LENGTH_BYTES:
                return None  # cut off here, or malformed: paho's reader decides
            byte = buf[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if pos + length > end:
            return None
        if buf[start] & 0xF0 == PUBLISH:
            self._saw_publish(length)
        self._ahead_pos = pos + length
        packet = self._framed
        packet["command"], packet["remaining_length"], packet["packet"] = buf[start], length, buf[pos : pos + length]
        idle, self._in_packet = self._in_packet, packet
        try:
            return self._handle_publish() if buf[start] & 0xF0 == PUBLISH else self._handle_pubackcomp("PUBACK")
        except _Malformed as exc:  # as paho 2.2's _packet_read does
            self._easy_log(paho.MQTT_LOG_DEBUG, "Received malformed packet: %s", exc)
            return MQTTErrorCode.MQTT_ERR_PROTOCOL
        finally:
            self._in_packet = idle

    def _packet_write(self) -> MQTTErrorCode:
        """paho's, with each run of packets that need nothing once written joined into one send()."""
        while True:
            packet = self._join_run()
            if packet is None:  # nothing queued, or a packet paho acts on once written
                return super()._packet_write()
            rc = self._send_run(packet)
            if rc is not None:
                return rc

    def _send_run(self, packet: dict, log_failure: bool = True) -> Optional[MQTTErrorCode]:
        """One send() of a joined run, what is unsent put back first; None: go on writing. A worker's
        write does not log a failure: the loop's next write meets it and does (`log_failure`)."""
        try:
            sent = self._sock_send(packet["packet"][packet["pos"] :])
        except (AttributeError, ValueError):  # no socket (closed meanwhile)
            self._out_packet.appendleft(packet)
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        except BlockingIOError:
            self._out_packet.appendleft(packet)
            return MQTTErrorCode.MQTT_ERR_AGAIN
        except OSError as err:
            self._out_packet.appendleft(packet)
            if log_failure:
                self._easy_log(paho.MQTT_LOG_ERR, "failed to receive on socket: %s", err)
            return MQTTErrorCode.MQTT_ERR_CONN_LOST
        packet["pos"] += sent
        packet["to_process"] -= sent
        if packet["to_process"] > 0:
            self._out_packet.appendleft(packet)  # the rest goes next, first
            if sent <= 0:
                return MQTTErrorCode.MQTT_ERR_SUCCESS
        return None

    def _join_run(self) -> Optional[dict]:
        """The leading packets that need nothing once written, up to WRITE_JOIN_BYTES, as one
        packet (only the holder of `_write_lock` takes packets off `_out_packet`; others append to
        its right)."""
        out = self._out_packet
        if not out or not _needs_nothing_once_sent(out[0]):
            return None
        first = out.popleft()
        if not out or not _needs_nothing_once_sent(out[0]):
            return first
        parts = [first["packet"][first["pos"] :]]
        size = len(parts[0])
        while out and size < WRITE_JOIN_BYTES and _needs_nothing_once_sent(out[0]):
            packet = out.popleft()
            parts.append(packet["packet"][packet["pos"] :])
            size += len(parts[-1])
        joined = b"".join(parts)
        return {"command": PUBACK, "mid": 0, "qos": 1, "pos": 0, "to_process": len(joined), "packet": joined,
                "info": None}


def writes_on_caller(sock: object) -> bool:
    """Whether a worker may write on this socket while the loop thread reads it: a plain TCP or
    Unix socket, not TLS (an SSL object read and written from two threads at once is unsafe) nor
    paho's websocket wrapper."""
    return isinstance(sock, socket.socket) and not isinstance(sock, ssl.SSLSocket)
