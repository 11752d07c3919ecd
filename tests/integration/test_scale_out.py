"""Scale-out through an MQTT v5 shared subscription, over a real mosquitto.

Two daemons in one `mqtt.share_group`, each with its own client id and status: the broker
gives each request to one of them. Routing matches the bare filter, so replies are the
same as from one daemon.
"""

from __future__ import annotations

import signal

import pytest

from tests.integration.conftest import Client, activity_payloads, burst, wait_unique_ids, write_config


def _split(tmp_path, broker, start_daemon, transport, n: int) -> None:
    collector = Client(broker)
    daemons = []
    for name in ("a", "b"):  # started together, then each waited for online
        (tmp_path / name).mkdir()
        config = write_config(tmp_path / name, transport=transport, cache={"enabled": False},
                              mqtt={"share_group": "inference", "client_id": f"edge-inferd-{name}"})
        collector.subscribe(f"edge-inferd/edge-inferd-{name}/status")
        daemons.append(start_daemon(config))
    for name in ("a", "b"):
        collector.wait_payload(f"edge-inferd/edge-inferd-{name}/status", b"online")
    collector.subscribe("results/s1/activity")
    burst(collector, "sensors/s1/imu", activity_payloads(n))
    replies = wait_unique_ids(collector, "results/s1/activity", n)
    assert sorted(r["id"] for r in replies) == list(range(n))  # every request once: none lost, none doubled
    shares = []
    for daemon in daemons:
        assert daemon.stop(signal.SIGTERM) == 0, daemon.log()
        shares.append(daemon.final_stats()["counts"].get("received", 0))
    assert sum(shares) == n and min(shares) >= 0.2 * n, shares  # each does at least a fifth of the work
    collector.close()


@pytest.mark.brokers("share", "backlog")
def test_two_daemons_in_a_share_group_split_a_stream_with_nothing_lost_or_doubled(tmp_path, broker, start_daemon,
                                                                                   transport):
    _split(tmp_path, broker, start_daemon, transport, 2000)


@pytest.mark.brokers("share")
def test_two_daemons_in_a_share_group_split_a_burst_smaller_than_any_brokers_window(tmp_path, broker, start_daemon,
                                                                                     transport):
    """150 requests: under 100 waiting at each member, so it holds on rumqttd too (brokers.py, backlog)."""
    _split(tmp_path, broker, start_daemon, transport, 150)


@pytest.mark.brokers("share", "dead_member_kept")
def test_a_share_member_killed_mid_stream_loses_nothing_once_it_returns(tmp_path, broker, start_daemon, transport):
    """A member is SIGKILLed while it holds requests of its share, more requests come, and it is
    restarted under its id. mosquitto keeps what was in flight to it (and its later share) in its
    persistent session and delivers them on its return (eclipse-mosquitto#2662: not to the others),
    so every request is answered, duplicates allowed."""
    collector = Client(broker)
    configs = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        configs[name] = write_config(tmp_path / name, transport=transport, cache={"enabled": False},
                                     mqtt={"share_group": "inference", "client_id": f"edge-inferd-{name}"})
    for name in configs:
        collector.subscribe(f"edge-inferd/edge-inferd-{name}/status")
    members = {name: start_daemon(config) for name, config in configs.items()}  # together, then each online
    for name in configs:
        collector.wait_payload(f"edge-inferd/edge-inferd-{name}/status", b"online")
    collector.subscribe("results/s2/activity")
    payloads = activity_payloads(800)
    burst(collector, "sensors/s2/imu", payloads[:600])
    collector.wait_count("results/s2/activity", 50)  # both serving, most of the burst still at the broker
    members["a"].stop(signal.SIGKILL)
    burst(collector, "sensors/s2/imu", payloads[600:])
    start_daemon(configs["a"], client_id="edge-inferd-a")
    replies = wait_unique_ids(collector, "results/s2/activity", len(payloads))
    assert {r["id"] for r in replies} == set(range(len(payloads)))
    collector.close()
