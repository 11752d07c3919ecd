"""daemon.paho_client against the real paho and a real mosquitto: read-ahead, batched wake-ups, reconnects."""

from __future__ import annotations

import socket
import ssl
import threading

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from daemon.transport import paho_client, paho_packets
from tests.integration import conftest
from tests.integration.conftest import WAIT_S


class Counting:
    """Wraps a socket-like object and counts send() calls."""

    def __init__(self, inner):
        self.inner = inner
        self.sends = 0

    def send(self, data):
        self.sends += 1
        return self.inner.send(data)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _receiver(broker, topic: str, n: int):
    got: list[bytes] = []
    done = threading.Event()

    def on_message(client, userdata, msg):
        got.append(msg.payload)
        if len(got) >= n:
            done.set()

    subscribed = threading.Event()
    c = paho_client.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    c.on_message = on_message
    c.on_connect = lambda client, *a: client.subscribe(topic, qos=1)
    c.on_subscribe = lambda *a: subscribed.set()
    c.reconnect_delay_set(1, 1)
    c.connect("127.0.0.1", broker.port)
    c.loop_start()
    assert subscribed.wait(WAIT_S)
    return c, got, done


def test_read_ahead_delivers_every_packet_in_order_with_fewer_recv_calls(broker, monkeypatch):
    calls = []
    real = paho.Client._sock_recv
    monkeypatch.setattr(paho.Client, "_sock_recv",
                        lambda self, n: (isinstance(self, paho_client.Client) and calls.append(n)) or real(self, n))
    n = 500
    c, got, done = _receiver(broker, "ra/t", n)
    sender = conftest.Client(broker)
    for i in range(n):
        sender.c.publish("ra/t", str(i).encode(), qos=1)
    assert done.wait(WAIT_S)
    sender.close()
    c.disconnect()
    c.loop_stop()
    assert got == [str(i).encode() for i in range(n)]
    assert len(calls) < n  # paho alone makes 3 recv() calls per message


def _batch_sender(broker) -> tuple[paho_client.Client, Counting, list[int]]:
    """A connected client whose wake-ups are counted and whose send() calls record their thread."""
    c = paho_client.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    c.max_inflight_messages_set(0)  # unlimited: paho's loop never queues deferred publishes itself
    c.connect("127.0.0.1", broker.port)
    c.loop_start()
    counting = Counting(c._real_sockpair_w)
    c._sockpairW = counting
    threads: list[int] = []
    real_send = c._sock_send
    c._sock_send = lambda buf: threads.append(threading.get_ident()) or real_send(buf)
    return c, counting, threads


def test_a_batch_is_written_on_the_caller_s_thread_in_one_send_without_waking_the_loop(broker):
    n = 100
    sink, got, done = _receiver(broker, "qw/t", n)
    c, counting, threads = _batch_sender(broker)
    threads.clear()
    with c.quiet_wakeups():
        for i in range(n):
            c.publish("qw/t", str(i).encode(), qos=1)
    assert counting.sends == 0 and threads == [threading.get_ident()]  # written here, at the block's end
    assert done.wait(WAIT_S) and got == [str(i).encode() for i in range(n)]
    c.publish("qw/t", b"outside", qos=1)  # outside the block paho wakes its loop per packet again
    assert counting.sends == 1
    for client in (c, sink):
        client.disconnect()
        client.loop_stop()


def test_a_batch_wakes_the_loop_once_while_another_thread_writes(broker):
    n = 100
    sink, got, done = _receiver(broker, "qw/t", n)
    c, counting, threads = _batch_sender(broker)
    held, release = threading.Event(), threading.Event()

    def writing():  # stands for the loop thread (or another worker) in the middle of a write
        with c._write_lock:
            held.set()
            release.wait(WAIT_S)

    other = threading.Thread(target=writing)
    other.start()
    assert held.wait(WAIT_S)
    threads.clear()
    with c.quiet_wakeups():
        for i in range(n):
            c.publish("qw/t", str(i).encode(), qos=1)
    assert counting.sends == 1 and threads == []  # left to the loop, woken once
    release.set()
    other.join()
    assert done.wait(WAIT_S) and got == [str(i).encode() for i in range(n)]
    assert threading.get_ident() not in threads
    for client in (c, sink):
        client.disconnect()
        client.loop_stop()


def test_only_a_plain_socket_is_written_from_the_caller_s_thread():
    with socket.socket() as plain:
        assert paho_client.writes_on_caller(plain)
        tls = ssl.create_default_context().wrap_socket(plain, server_hostname="broker", do_handshake_on_connect=False)
        assert not paho_client.writes_on_caller(tls)  # an SSL object is not read and written at once
        tls.close()
    assert not paho_client.writes_on_caller(None)


def test_a_reconnect_starts_with_an_empty_read_ahead(broker):
    c, got, done = _receiver(broker, "rc/t", 1)
    broker.stop()
    assert c._ahead_pos >= len(c._ahead)
    broker.start()
    sender = conftest.Client(broker)
    for _ in range(int(WAIT_S / 0.2)):  # publish until the reconnected client has resubscribed
        sender.c.publish("rc/t", b"after", qos=1)
        if done.wait(0.2):
            break
    sender.close()
    assert got and set(got) == {b"after"}
    c.disconnect()
    c.loop_stop()


def _publish_all(broker, window: int, n: int, before_connect: int = 0) -> paho_client.Client:
    """n QoS 1 publishes through a window of `window` (the first `before_connect` made offline): all
    arrive in order and all are acknowledged. (paho itself sends one made between connect() and
    CONNACK before the offline ones: so the tests make all or none offline.)"""
    sink, got, done = _receiver(broker, "uw/t", n)
    c = paho_client.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    c.max_inflight_messages_set(window)
    acked = threading.Event()
    c.on_publish = lambda client, *a: len(client._out_messages) <= 1 and acked.set()
    for i in range(before_connect):
        c.publish("uw/t", str(i).encode(), qos=1)
    c.connect("127.0.0.1", broker.port)
    c.loop_start()
    for i in range(before_connect, n):
        c.publish("uw/t", str(i).encode(), qos=1)
    assert done.wait(WAIT_S) and acked.wait(WAIT_S)
    assert got == [str(i).encode() for i in range(n)]
    for client in (c, sink):
        client.disconnect()
        client.loop_stop()
    return c


def test_publishes_held_back_by_a_full_window_are_all_sent_in_order(broker):
    c = _publish_all(broker, 5, 300)
    assert not c._held_back and c._inflight_messages == 0


def test_publishes_held_back_at_connect_are_all_sent_in_order(broker):
    c = _publish_all(broker, 5, 300, before_connect=300)  # the connect holds back all but the first 5
    assert not c._held_back and c._inflight_messages == 0


def test_held_back_publishes_wait_in_a_queue_not_a_walk(broker, monkeypatch):
    walks = []
    monkeypatch.setattr(paho.Client, "_update_inflight", lambda self: walks.append(1))
    _publish_all(broker, 5, 300)
    assert walks == []  # paho's walk over every unacknowledged publish is never taken


def test_a_read_burst_ends_with_one_call_after_all_its_messages(broker):
    n = 500
    c, got, done = _receiver(broker, "rb/t", n)
    events: list[str] = []
    receive = c.on_message
    c.on_message = lambda *a: events.append("message") or receive(*a)
    c.on_read_burst_end = lambda: events.append("end")
    sender = conftest.Client(broker)
    conftest.burst(sender, "rb/t", [str(i).encode() for i in range(n)])
    assert done.wait(WAIT_S)
    sender.close()
    c.disconnect()
    c.loop_stop()
    assert got == [str(i).encode() for i in range(n)]
    last_message = len(events) - 1 - events[::-1].index("message")
    assert "end" in events[last_message:]  # no message waits past the end of its burst
    assert events.count("end") < n / 2  # bursts, not one call per message (read-ahead serves many)


def _counting(monkeypatch, name: str) -> list:
    """Count the calls of paho's own `paho.Client.<name>` (the path the shortcuts skip)."""
    calls: list = []
    real = getattr(paho.Client, name)
    monkeypatch.setattr(paho.Client, name, lambda self, *a: calls.append(a) or real(self, *a))
    return calls


def test_a_publish_without_properties_skips_paho_s_decoder_and_one_with_them_keeps_them(broker, monkeypatch):
    decoded_by_paho = _counting(monkeypatch, "_handle_publish")
    c, got, done = _receiver(broker, "pp/t", 0)
    messages: list[paho.MQTTMessage] = []
    arrived = threading.Event()
    c.on_message = lambda client, userdata, msg: messages.append(msg) or (len(messages) == 3 and arrived.set())
    sender = conftest.Client(broker)
    sender.publish("pp/t", b"plain")
    sender.publish("pp/t", b"with", response_topic="me/replies", correlation=b"c-1")
    sender.publish("pp/t", b"", qos=0)
    assert arrived.wait(WAIT_S)
    plain, rich, empty = messages
    assert (plain.topic, plain.payload, plain.qos, plain.retain, plain.properties) == ("pp/t", b"plain", 1, False, None)
    assert (rich.payload, rich.properties.ResponseTopic, rich.properties.CorrelationData) == (b"with", "me/replies",
                                                                                             b"c-1")
    assert (empty.payload, empty.qos) == (b"", 0)
    assert len(decoded_by_paho) == 1  # only the one with properties
    sender.close()
    c.disconnect()
    c.loop_stop()


def test_with_paho_s_log_on_every_packet_takes_paho_s_path(broker, monkeypatch):
    decoded_by_paho = _counting(monkeypatch, "_handle_publish")
    c, got, done = _receiver(broker, "lg/t", 2)
    c.enable_logger()
    sender = conftest.Client(broker)
    for payload in (b"a", b"b"):
        sender.publish("lg/t", payload)
    assert done.wait(WAIT_S) and got == [b"a", b"b"]
    assert len(decoded_by_paho) == 2
    sender.close()
    c.disconnect()
    c.loop_stop()


def test_pubacks_skip_paho_s_decoder_and_keep_their_reason_code(broker, monkeypatch):
    decoded_by_paho = _counting(monkeypatch, "_handle_pubackcomp")
    sink, got, done = _receiver(broker, "pa/t", 1)
    c = paho_client.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    reasons: dict[int, int] = {}
    acked = threading.Event()
    c.on_publish = lambda client, userdata, mid, reason, props: reasons.update({mid: reason.value}) or (
        len(reasons) == 2 and acked.set())
    c.connect("127.0.0.1", broker.port)
    c.loop_start()
    heard = c.publish("pa/t", b"x", qos=1)
    unheard = c.publish("pa/nobody", b"x", qos=1)
    assert acked.wait(WAIT_S) and done.wait(WAIT_S)
    assert reasons == {heard.mid: 0x00, unheard.mid: 0x10}  # mosquitto: v5 "No matching subscribers"
    assert decoded_by_paho == []
    assert heard.is_published() and unheard.is_published()
    for client in (c, sink):
        client.disconnect()
        client.loop_stop()


def test_packets_whole_in_the_read_ahead_are_framed_from_it_and_others_read_by_paho(monkeypatch):
    """One write of many PUBLISH packets (one longer than the read-ahead) into a socketpair the
    client reads as its broker connection: all arrive, in order, most framed from the read-ahead."""
    served = []
    real = paho_client.Client._sock_recv
    monkeypatch.setattr(paho_client.Client, "_sock_recv", lambda self, n: served.append(n) or real(self, n))
    payloads = [b"%d" % i for i in range(150)] + [b"x" * 70_000] + [b"%d" % i for i in range(150)]
    c = paho_client.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    got: list[bytes] = []
    c.on_message = lambda client, userdata, msg: got.append(msg.payload)
    ours, broker_end = socket.socketpair()
    ours.setblocking(False)
    c._sock = ours
    bodies = [b"\x00\x01t" + payload for payload in payloads]  # QoS 0 PUBLISH on "t": no mid, no properties
    broker_end.sendall(b"".join(b"\x30" + paho_packets.varint(len(body)) + body for body in bodies))
    while len(got) < len(payloads):
        assert c.loop_read() == paho.MQTT_ERR_SUCCESS
    assert got == payloads
    assert len(served) < len(payloads) / 4  # paho's reader: 3 per packet
    c._sock = None
    ours.close()
    broker_end.close()


def test_framed_packets_keep_the_keepalive_s_clock_of_received_bytes(broker):
    c, got, done = _receiver(broker, "ka/t", 200)
    clock = "_last_bytes_received" if hasattr(c, "_last_bytes_received") else "_last_msg_in"  # paho 2.2 / 2.1
    sender = conftest.Client(broker)
    conftest.burst(sender, "ka/t", [b"x"] * 199)
    sent_at = paho.time_func()
    sender.publish("ka/t", b"last")
    assert done.wait(WAIT_S)
    assert getattr(c, clock) >= sent_at  # else the client would ping, and drop, a busy connection
    sender.close()
    c.disconnect()
    c.loop_stop()


def test_a_reply_never_waited_for_gets_no_condition(broker):
    sink, got, done = _receiver(broker, "lc/t", 2)
    c = paho_client.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    c.connect("127.0.0.1", broker.port)
    c.loop_start()
    quiet = c.publish("lc/t", b"1", qos=1)
    waited = c.publish("lc/t", b"2", qos=1)
    waited.wait_for_publish(WAIT_S)
    assert waited._published and done.wait(WAIT_S)
    for client in (c, sink):
        client.disconnect()
        client.loop_stop()
    assert quiet._published and quiet._condition is None  # paho makes a threading.Condition per publish


def test_reply_properties_reach_the_subscriber_also_when_held_back_by_the_window(broker):
    n = 50
    sink, got, done = _receiver(broker, "rp/t", n)
    seen: list[tuple] = []
    receive = sink.on_message
    sink.on_message = lambda client, userdata, msg: seen.append(
        (msg.payload, msg.properties.CorrelationData, msg.properties.ResponseTopic)) or receive(client, userdata, msg)
    c = paho_client.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    c.max_inflight_messages_set(5)  # 45 wait, held back, and are packed again when sent
    c.connect("127.0.0.1", broker.port)
    c.loop_start()
    for i in range(n):
        c.publish("rp/t", b"%d" % i, qos=1, properties=paho_packets.ReplyProperties(b"c-%d" % i, "me/answers"))
    assert done.wait(WAIT_S)
    assert seen == [(b"%d" % i, b"c-%d" % i, "me/answers") for i in range(n)]
    for client in (c, sink):
        client.disconnect()
        client.loop_stop()


def test_queued_packets_leave_in_one_send_and_qos_0_ones_still_get_on_publish(broker):
    n, qos0 = 100, 10
    sink, got, done = _receiver(broker, "js/t", n + qos0)
    c = paho_client.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    c.max_inflight_messages_set(0)
    published: list[int] = []
    c.on_publish = lambda client, userdata, mid, *a: published.append(mid)
    c.connect("127.0.0.1", broker.port)
    c.loop_start()
    sends = []
    real_send = c._sock_send
    c._sock_send = lambda buf: sends.append(len(buf)) or real_send(buf)
    with c.quiet_wakeups():  # the loop writes once, after the block: all n are queued by then
        infos = [c.publish("js/t", str(i).encode(), qos=1) for i in range(n)]
    infos[-1].wait_for_publish(WAIT_S)
    writes = len(sends)
    infos += [c.publish("js/t", str(i).encode(), qos=0) for i in range(n, n + qos0)]  # paho's own writes
    assert done.wait(WAIT_S)
    assert [g for g in got if int(g) < n] == [str(i).encode() for i in range(n)]  # in order per QoS (the
    assert sorted(got, key=int) == [str(i).encode() for i in range(n + qos0)]  # broker may pass QoS 0 first)
    assert writes < n / 4  # paho alone: one send() per packet
    assert sorted(published) == sorted(info.mid for info in infos)  # QoS 0 ones too
    for client in (c, sink):
        client.disconnect()
        client.loop_stop()
