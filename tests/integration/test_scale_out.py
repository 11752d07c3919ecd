"""Scale-out through an MQTT v5 shared subscription, over a real mosquitto.

Two daemons in one `mqtt.share_group`, each with its own client id and status: the broker
gives each request to one of them. Routing matches the bare filter, so replies are the
same as from one daemon.
"""

from __future__ import annotations

import signal

import pytest

from tests.integration.conftest import Client, activity_payloads, burst, wait_unique_ids, write_config


@pytest.mark.brokers("share")
def test_two_daemons_in_a_share_group_split_a_stream_with_nothing_lost_or_doubled(tmp_path, broker, start_daemon,
                                                                                   transport):
    collector = Client(broker)
    daemons = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        config = write_config(tmp_path / name, transport=transport, cache={"enabled": False},
                              mqtt={"share_group": "inference", "client_id": f"edge-inferd-{name}"})
        daemons.append(start_daemon(config, wait_online=collector, client_id=f"edge-inferd-{name}"))
    collector.subscribe("results/s1/activity")
    n = 2000
    burst(collector, "sensors/s1/imu", activity_payloads(n))
    replies = wait_unique_ids(collector, "results/s1/activity", n)
    assert sorted(r["id"] for r in replies) == list(range(n))  # every request once: none lost, none doubled
    shares = []
    for daemon in daemons:
        assert daemon.stop(signal.SIGTERM) == 0, daemon.log()
        shares.append(daemon.final_stats()["counts"].get("received", 0))
    assert sum(shares) == n and min(shares) >= 0.2 * n, shares  # each does at least a fifth of the work
    collector.close()
