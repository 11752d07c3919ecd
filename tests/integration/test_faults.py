"""Faults over a real mosquitto: nothing the daemon received is left unanswered.

Each test injects one fault (a signal at a chosen moment, a retained message) and checks
the outcome by counting replies per request id; waits are event-driven.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import numpy as np
import pytest

from tests.integration.conftest import (ROOT, WAIT_S, Client, Daemon, activity_payloads, burst, wait_unique_ids,
                                        with_login, write_config)
from tests.integration.mqtt_proxy import CuttingProxy


def _appliance_payloads(n: int) -> list[bytes]:
    """Requests for the heavier model (one worker at batch 1 keeps most of a burst queued)."""
    with np.load(ROOT / "models/appliance/test.npz") as data:
        x = data["x"]
    return [json.dumps({"id": i, "data": x[i % len(x)].tolist()}).encode() for i in range(n)]


@pytest.mark.brokers()
def test_sigterm_right_after_a_burst_answers_every_request_the_daemon_received(tmp_path, broker, client,
                                                                                start_daemon, transport):
    # One worker, batch 1, the heavier model: most of the burst is still queued at SIGTERM.
    config = write_config(tmp_path, transport=transport, cache={"enabled": False}, workers={"max": 1},
                          batching={"max_batch": 1})
    daemon = start_daemon(config, wait_online=client)
    client.subscribe("results/t1/appliance")
    burst(client, "plugs/t1/power", _appliance_payloads(1000))
    daemon.proc.send_signal(signal.SIGTERM)  # as soon as the broker has them all
    assert daemon.stop() == 0, daemon.log()
    stats = daemon.final_stats()
    received = stats["counts"]["received"]
    answered = stats["results"] + sum(stats["errors"].values())  # the payload moves errors.<code> to "errors"
    assert received > 0 and answered == received  # every request the daemon took was processed...
    replies = wait_unique_ids(client, "results/t1/appliance", received)  # ...and its reply left before `offline`
    assert len({r["id"] for r in replies}) == received


@pytest.mark.brokers("backlog")
def test_a_daemon_killed_mid_stream_answers_everything_after_a_restart(tmp_path, broker, client, start_daemon,
                                                                         transport):
    config = write_config(tmp_path, transport=transport, cache={"enabled": False})
    first = start_daemon(config, wait_online=client)
    client.subscribe("results/k1/activity")
    n = 600
    payloads = activity_payloads(n)
    burst(client, "sensors/k1/imu", payloads[:300])
    client.wait_count("results/k1/activity", 20)  # it is serving
    first.stop(signal.SIGKILL)  # unacked requests stay in its persistent session at the broker
    burst(client, "sensors/k1/imu", payloads[300:])  # sent while no daemon runs: held for its session
    start_daemon(config)
    replies = wait_unique_ids(client, "results/k1/activity", n)
    assert {r["id"] for r in replies} == set(range(n))  # every request answered at least once; duplicates allowed
    assert all("label" in r for r in replies)


@pytest.mark.brokers("backlog")
def test_a_backlog_of_1000_queued_while_the_daemon_is_stopped_drains_with_a_result_each(tmp_path, broker, client,
                                                                                        start_daemon, transport):
    """Ten times rumqttd's window of 100: there the native link acks once the replies are in the
    outbox, not once their PUBACKs (held while the window is full) come (safe_ack.py)."""
    config = write_config(tmp_path, transport=transport, cache={"enabled": False})
    first = start_daemon(config, wait_online=client)  # its persistent session holds the subscription
    assert first.stop() == 0, first.log()
    client.subscribe("results/b1/activity")
    n = 1000
    burst(client, "sensors/b1/imu", activity_payloads(n))  # queued at the broker for the stopped daemon
    second = start_daemon(config)
    replies = wait_unique_ids(client, "results/b1/activity", n)
    assert {r["id"] for r in replies} == set(range(n))  # none lost; duplicates allowed
    assert all("label" in r for r in replies)
    assert second.stop() == 0, second.log()
    outbox = second.final_stats()["outbox"]
    print(f"{broker.kind} over {transport}: {outbox} ({n} requests), "
          f"{len(replies)} replies")
    if broker.kind == "rumqttd":
        assert outbox["acks_after_outbox"] > 0, outbox


@pytest.mark.brokers("retain_as_published")
def test_retained_messages_and_retained_clears_are_not_answered(tmp_path, broker, client, start_daemon):
    # MQTT v5 only (Retain As Published): over 3.1.1 a live retained clear reaches a subscriber as a plain message.
    payload = activity_payloads(1)[0]
    client.c.publish("sensors/r1/imu", payload, qos=1, retain=True).wait_for_publish(60)  # before the daemon
    start_daemon(write_config(tmp_path, workers={"max": 1}), wait_online=client)
    client.subscribe("results/r1/activity")
    client.c.publish("sensors/r1/imu", b"", qos=1, retain=True).wait_for_publish(60)  # clears the retained one
    client.publish("sensors/r1/imu", payload.replace(b'"id": 0', b'"id": "live"'))
    [reply] = client.wait_json("results/r1/activity")  # one worker, in order: an answer to either would be first
    assert reply["id"] == "live" and "label" in reply


def test_a_daemon_started_before_the_broker_serves_once_it_appears(tmp_path, transport):
    from daemon.tools.broker import Broker

    broker = Broker(tmp_path / "late-broker")
    config = write_config(tmp_path, transport=transport, mqtt={"reconnect_min_s": 1, "reconnect_max_s": 1})
    daemon = Daemon(config, broker.address, tmp_path / "daemon.log")
    try:
        # wait until it has tried, and failed, to connect
        assert daemon.wait_for_log("cannot connect to"), daemon.log()
        seen = daemon.log()
        refused = f"refused: nothing accepts connections on port {broker.port}"
        assert f"cannot connect to mqtt://{broker.address}: {refused}" in seen, seen  # the cause...
        assert "next try in 1 s" in seen, seen  # ...and when it tries again
        broker.start()
        client = Client(broker)
        client.subscribe("edge-inferd/edge-inferd/status")
        client.wait_payload("edge-inferd/edge-inferd/status", b"online")
        client.subscribe("results/l2/activity")
        client.publish("sensors/l2/imu", activity_payloads(1)[0])
        [reply] = client.wait_json("results/l2/activity")
        client.close()
        assert reply["id"] == 0 and "label" in reply
    finally:
        assert daemon.stop() == 0, daemon.log()
        broker.close()


def test_under_systemd_ready_comes_once_serving_and_the_watchdog_is_fed(tmp_path, broker, client, transport):
    import socket as sockets

    path = tmp_path / "notify.sock"
    sock = sockets.socket(sockets.AF_UNIX, sockets.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(WAIT_S)
    daemon = Daemon(write_config(tmp_path, transport=transport), broker.address, tmp_path / "daemon.log",
                    env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000"})
    try:
        messages = [sock.recv(4096).decode()]
        while not any(m.startswith("READY=1") for m in messages):
            messages.append(sock.recv(4096).decode())
        client.subscribe("edge-inferd/edge-inferd/status")
        client.wait_payload("edge-inferd/edge-inferd/status", b"online")  # READY=1 came once it was online
        pings = [m for m in (sock.recv(4096).decode() for _ in range(6)) if m == "WATCHDOG=1"]
        assert len(pings) >= 2
    finally:
        assert daemon.stop() == 0, daemon.log()
        sock.close()


def test_a_sighup_during_start_up_is_queued_not_fatal(tmp_path, broker, client, transport):
    daemon = Daemon(write_config(tmp_path, transport=transport), broker.address, tmp_path / "daemon.log")
    try:
        assert daemon.wait_for_log("start-up: models"), daemon.log()  # the slow part: models load and warm up
        daemon.proc.send_signal(signal.SIGHUP)
        client.subscribe("edge-inferd/edge-inferd/status")
        client.wait_payload("edge-inferd/edge-inferd/status", b"online")
        client.subscribe("results/u1/activity")
        client.publish("sensors/u1/imu", activity_payloads(1)[0])
        [reply] = client.wait_json("results/u1/activity")
        assert "label" in reply and daemon.proc.poll() is None
        assert daemon.wait_for_log("reload: nothing to apply")  # the queued reload ran (its check: a child)
    finally:
        assert daemon.stop() == 0, daemon.log()
    assert "SIGHUP: reloading" in daemon.log()


def _persistent_clients(tmp_path, broker, start_daemon, reply_topic: str, suffix: str,
                        transport: str) -> tuple[Client, Client]:
    """The daemon (cache off) with a persistent collector on `reply_topic` and a persistent publisher,
    both reconnecting every second: their sessions ride out a broker restart."""
    collector = Client(broker, client_id=f"collector{suffix}", persistent=True)
    collector.c.reconnect_delay_set(1, 1)
    start_daemon(write_config(tmp_path, transport=transport, cache={"enabled": False}), wait_online=collector)
    collector.subscribe(reply_topic)
    publisher = Client(broker, client_id=f"publisher{suffix}", persistent=True)
    publisher.c.reconnect_delay_set(1, 1)
    return collector, publisher


@pytest.mark.brokers("persistence")
def test_a_broker_restarted_mid_stream_loses_nothing(tmp_path, broker, start_daemon, transport):
    """A persistent publisher and collector (their own sessions) and the daemon ride out a broker restart."""
    collector, publisher = _persistent_clients(tmp_path, broker, start_daemon, "results/b1/activity", "",
                                               transport)
    n = 400
    payloads = activity_payloads(n)
    burst(publisher, "sensors/b1/imu", payloads[:200])
    collector.wait_count("results/b1/activity", 10)
    broker.stop()  # SIGTERM: mosquitto saves its state (a SIGKILL loses its last autosave_interval: reliability.md)
    broker.start()
    for _ in range(int(WAIT_S / 0.1)):  # the publisher's own reconnect (1 s delay)
        if publisher.c.is_connected():
            break
        time.sleep(0.1)
    burst(publisher, "sensors/b1/imu", payloads[200:])
    replies = wait_unique_ids(collector, "results/b1/activity", n)
    assert {r["id"] for r in replies} == set(range(n))
    publisher.close()
    collector.close()


@pytest.mark.brokers("persistence")
def test_a_broker_killed_for_3_s_under_a_paced_stream_loses_nothing(tmp_path, broker, start_daemon, transport):
    """SIGKILL, 3 s down, restarted on the same port and persistence. Paced at 200/s the broker
    holds no backlog at the kill; a burst still queued in it loses its unsaved part (reliability.md)."""
    collector, publisher = _persistent_clients(tmp_path, broker, start_daemon, "results/k3/activity", "3",
                                               transport)
    n, rate = 1800, 200.0  # 3 s before the kill, 3 s down, 3 s after
    killer = threading.Timer(3.0, lambda: (broker.kill(), time.sleep(3.0), broker.start()))
    killer.start()
    start = time.monotonic()
    for k, payload in enumerate(activity_payloads(n)):  # paho holds QoS 1 publishes while the broker is away
        time.sleep(max(0.0, start + k / rate - time.monotonic()))
        publisher.c.publish("sensors/k3/imu", payload, qos=1)
    killer.join()
    replies = wait_unique_ids(collector, "results/k3/activity", n)
    assert {r["id"] for r in replies} == set(range(n))  # duplicates allowed (redeliveries)
    publisher.close()
    collector.close()


@pytest.mark.brokers()
def test_after_a_broker_restart_a_clean_session_daemon_resubscribes(tmp_path, broker, start_daemon, transport):
    config = write_config(tmp_path, transport=transport, mqtt={"session_expiry_s": 0}, stats_interval_s=0.2)
    collector = Client(broker, client_id="collector2", persistent=True)
    start_daemon(config, wait_online=collector)
    collector.subscribe("results/c2/activity")
    collector.subscribe("edge-inferd/edge-inferd/stats")
    broker.stop()
    broker.start()

    # the daemon re-announced `online`, which it does only after SUBACK
    collector.wait_json_until("edge-inferd/edge-inferd/stats", lambda s: s.get("reconnects", 0) >= 1)
    collector.publish("sensors/c2/imu", activity_payloads(1)[0])
    [reply] = collector.wait_json("results/c2/activity")
    assert "label" in reply
    collector.close()


@pytest.mark.brokers("persistence")
def test_replies_made_while_the_broker_is_away_survive_a_daemon_restart_in_the_outbox(tmp_path, broker, start_daemon,
                                                                                      transport):
    """The broker stops while the daemon drains a queue, and the daemon is stopped before it
    returns: the replies wait in the on-disk outbox and reach the collector from the next run.
    The daemon's session is clean (`session_expiry_s: 0`), so the broker does not redeliver
    its requests: every reply the next run delivers comes from the outbox. The collector's
    session is persistent, so replies the broker took before it stopped are not lost either."""
    config = write_config(tmp_path, transport=transport, cache={"enabled": False}, workers={"max": 1},
                          batching={"max_batch": 1}, mqtt={"session_expiry_s": 0})
    collector = Client(broker, client_id="collector-o", persistent=True)
    collector.c.reconnect_delay_set(1, 1)
    first = start_daemon(config, wait_online=collector)
    collector.subscribe("results/o1/appliance")
    burst(collector, "plugs/o1/power", _appliance_payloads(300))
    collector.wait_count("results/o1/appliance", 5)  # serving; most of the burst is still queued
    broker.stop()
    assert first.stop() == 0, first.log()  # drains with no broker: the replies go to the outbox
    stats = first.final_stats()
    received = stats["counts"]["received"]
    assert stats["outbox"]["stored"] > 0 and stats["outbox"]["dropped"] == 0, stats["outbox"]
    broker.start()
    second = start_daemon(config)
    replies = wait_unique_ids(collector, "results/o1/appliance", received)
    missing = set(range(received)) - {r["id"] for r in replies}
    assert not missing, (sorted(missing)[:10], second.log()[-3000:])
    assert second.stop() == 0, second.log()
    assert second.final_stats()["outbox"]["flushed"] == stats["outbox"]["stored"]
    collector.close()

def _cut_off_run(config, broker, log, cut_prefix: str = "results/") -> Daemon:
    """A run through a relay that swallows its first publish under `cut_prefix`, drops the
    connection both ways before any PUBACK, and stays unreachable; stopped once cut off."""
    with CuttingProxy(broker.port, cut_prefix=cut_prefix) as proxy:
        daemon = Daemon(config, proxy.address, log)
        try:
            assert proxy.cut.wait(WAIT_S), daemon.log()[-3000:]
        finally:
            assert daemon.stop() == 0, daemon.log()
    return daemon


@pytest.mark.brokers()
def test_a_flushed_reply_leaves_the_outbox_only_with_its_puback(tmp_path, broker, client, start_daemon, transport):
    """A run is cut off from the broker while it serves (a relay drops the connection at its first
    reply), so its replies go to the outbox; it is stopped. The next run hands the stored replies
    on, and the broker drops that connection too before any PUBACK; it is stopped while cut off.
    The rows must still be on disk (a run that deleted a row when it handed it on, before its
    PUBACK, loses every reply it handed), and the run after that delivers every reply. The
    daemon's session is clean, so no request is redelivered: each reply comes from the outbox."""
    config = with_login(write_config(tmp_path, transport=transport, cache={"enabled": False},
                                     mqtt={"session_expiry_s": 0}), broker)
    client.subscribe("results/p1/activity")
    with CuttingProxy(broker.port, cut_prefix="results/") as proxy:
        first = Daemon(config, proxy.address, tmp_path / "daemon-first.log")
        client.subscribe("edge-inferd/edge-inferd/status")
        client.wait_payload("edge-inferd/edge-inferd/status", b"online")
        n = 40
        burst(client, "sensors/p1/imu", activity_payloads(n))
        assert proxy.cut.wait(WAIT_S), first.log()[-3000:]  # what it read before the cut, it answers
        assert first.stop() == 0, first.log()
    stats = first.final_stats()
    received = stats["counts"]["received"]  # the first `received` of the burst (QoS 1 keeps the order)
    assert received > 0 and stats["outbox"]["stored"] == received, (stats, first.log()[-3000:])
    cut_off = _cut_off_run(config, broker, tmp_path / "daemon-cut-off.log")
    assert cut_off.final_stats()["outbox"]["stored"] == received, cut_off.log()[-3000:]
    last = start_daemon(config)
    replies = wait_unique_ids(client, "results/p1/activity", received)
    assert {r["id"] for r in replies} == set(range(received)), last.log()[-3000:]
    assert last.stop() == 0, last.log()
    assert last.final_stats()["outbox"]["flushed"] == received
