"""What the broker refuses or grants short is named in the daemon's start-up log (issue 19, point 2).

Each test starts a real broker configured to grant less, and reads the daemon's log; the
daemon must still come online and answer.
"""

from __future__ import annotations

import pytest

from daemon.tools.broker import Broker
from tests.integration import brokers
from tests.integration.conftest import Client, Daemon, activity_payloads, with_login, write_config


@pytest.fixture
def small_broker(tmp_path):
    """mosquitto taking packets of at most 20,000 bytes and 10 publishes in flight per client."""
    with Broker(tmp_path / "broker", settings={"max_packet_size": "20000", "max_inflight_messages": "10"}) as b:
        yield b


def test_a_small_packet_limit_and_reply_window_are_named_at_start_up(tmp_path, small_broker):
    config = write_config(tmp_path)  # MQTT v5 only: a 3.1.1 CONNACK carries neither limit
    client = Client(small_broker)
    daemon = Daemon(config, small_broker.address, tmp_path / "daemon.log")
    try:
        client.subscribe("edge-inferd/edge-inferd/status")
        client.wait_payload("edge-inferd/edge-inferd/status", b"online")
        client.subscribe("results/g1/activity")
        client.publish("sensors/g1/imu", activity_payloads(1)[0])
        [reply] = client.wait_json("results/g1/activity")
        assert "label" in reply  # still serving
        log = daemon.log()
        assert f"broker mqtt://{small_broker.address} takes packets of at most 20000 bytes" in log, log[-3000:]
        assert "input.max_bytes" in log
        assert "takes 10 replies in flight" in log, log[-3000:]
    finally:
        daemon.stop()
        client.close()



@pytest.fixture
def ejabberd(tmp_path):
    reason = brokers.skip_reason("ejabberd", ())
    if reason:
        pytest.skip(reason)
    with brokers.KINDS["ejabberd"].make(tmp_path / "ejabberd") as b:
        b.kind = "ejabberd"
        yield b
        b.kill()  # the test is over (its daemon stopped first): a clean stop took the VM ~1 s


def test_a_session_kept_shorter_and_a_refused_share_group_are_named_at_start_up(tmp_path, ejabberd):
    """ejabberd 23.01 grants a 300 s session (mod_mqtt's default) for the 86,400 asked, and answers
    a `$share` SUBSCRIBE with DISCONNECT 0x9E: both named, the second with what to do."""
    config = with_login(write_config(tmp_path, mqtt={"share_group": "inference"}), ejabberd)
    daemon = Daemon(config, ejabberd.address, tmp_path / "daemon.log")
    try:
        assert daemon.wait_for_log("(reason 0x9E)"), daemon.log()[-3000:]
        log = daemon.log()
        assert f"broker mqtt://{ejabberd.address} keeps this daemon's session 300 s after a disconnect, " \
               "not the 86400 s asked (mqtt.session_expiry_s)" in log, log[-3000:]
        assert "remove mqtt.share_group" in log and "another client is probably using" not in log
        assert daemon.proc.poll() is None
    finally:
        assert daemon.stop() == 0, daemon.log()[-3000:]
