"""The `mqtt:` section: every broker address form, mqtts implying TLS, the default client id."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.config import mqtt as config_mqtt
from daemon.config.loader import load_config
from daemon.errors import ConfigError
from daemon.config.mqtt import TlsConfig, parse_broker
from daemon.config.mqtt import BrokerAddress, default_client_id

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value,host,port,tls", [
    ("gw.local", "gw.local", 1883, False),
    ("gw.local:1884", "gw.local", 1884, False),
    ("10.0.0.7:1", "10.0.0.7", 1, False),
    ("[::1]:1884", "::1", 1884, False),
    ("[fe80::1%eth0]", "fe80::1%eth0", 1883, False),
    ("mqtt://gw.local", "gw.local", 1883, False),
    ("mqtt://gw.local:2000", "gw.local", 2000, False),
    ("mqtt://[::1]:2000", "::1", 2000, False),
    ("mqtts://gw.local", "gw.local", 8883, True),
    ("MQTTS://gw.local:8884", "gw.local", 8884, True),
    ("mqtts://[2001:db8::1]", "2001:db8::1", 8883, True),
])
def test_broker_address_forms(value, host, port, tls):
    assert parse_broker(value) == BrokerAddress(host, port, tls)


def test_a_tls_section_makes_the_default_port_8883_and_contradicts_mqtt_scheme():
    assert parse_broker("gw.local", tls=True) == BrokerAddress("gw.local", 8883, True)
    assert parse_broker("gw.local:1883", tls=True) == BrokerAddress("gw.local", 1883, True)
    with pytest.raises(ValueError, match="plain TCP, but mqtt.tls is set"):
        parse_broker("mqtt://gw.local", tls=True)


@pytest.mark.parametrize("value,message", [
    ("", "must be a broker address"),
    ("tcp://gw.local", "unknown scheme 'tcp://'"),
    ("ws://gw.local:80", "unknown scheme 'ws://'"),
    ("mqtt://mqtt://gw.local", "a second scheme"),
    ("mqtt://gw.local/topic", "a path"),
    ("mqtt://user:pass@gw.local", "a user name"),
    ("gw.local:0", "port must be a number in 1..65535"),
    ("gw.local:65536", "port must be a number in 1..65535"),
    ("gw.local:", "port must be a number"),
    ("gw.local:x", "port must be a number"),
    ("::1", "an IPv6 address goes in brackets"),
    ("[nope]:1883", "brackets hold an IPv6 address"),
    ("[::1]x", "brackets hold an IPv6 address"),
    ("gw local", "spaces"),
    ("-gw", "not a host name"),
    ("mqtts://", "not a host name"),
])
def test_malformed_broker_addresses_are_refused(value, message):
    with pytest.raises(ValueError, match=message):
        parse_broker(value)


def _config(tmp_path: Path, mqtt: str) -> Path:
    text = (ROOT / "config.yaml").read_text().replace("models/", str(ROOT / "models") + "/")
    text = text.replace("  broker: localhost:1883", mqtt, 1)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_mqtts_in_the_file_turns_tls_on_with_the_system_trust_store(tmp_path):
    mqtt = load_config(_config(tmp_path, "  broker: mqtts://broker.example.com"), check_models=False).mqtt
    assert (mqtt.host, mqtt.port, mqtt.tls, mqtt.url) == ("broker.example.com", 8883, TlsConfig(),
                                                           "mqtts://broker.example.com:8883")


def test_a_bad_broker_in_the_file_names_the_key_and_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(_config(tmp_path, "  broker: mqtt://user:pw@gw.local"), check_models=False)
    [line] = err.value.errors
    assert line.startswith("mqtt.broker: ") and "a user name" in line and line.endswith("(line 6)")


def test_the_broker_override_is_validated_and_mqtts_turns_tls_on():
    config = load_config(ROOT / "config.yaml", check_models=False)
    assert config.mqtt.tls is None and config.mqtt.url == "mqtt://localhost:1883"
    secure = config.with_broker("mqtts://gw.example.com")
    assert (secure.mqtt.host, secure.mqtt.port, secure.mqtt.tls) == ("gw.example.com", 8883, TlsConfig())
    assert secure.with_broker("127.0.0.1:2000").mqtt.tls is None  # TLS implied by mqtts:// does not carry over
    ipv6 = config.with_broker("[::1]:1884")
    assert (ipv6.mqtt.host, ipv6.mqtt.port, ipv6.mqtt.url) == ("::1", 1884, "mqtt://[::1]:1884")
    for bad in ("host:notaport", "mqtt://mqtt://h", "http://h", ""):
        with pytest.raises(ConfigError, match="^--broker: "):
            config.with_broker(bad)


def test_an_explicit_tls_section_survives_a_plain_override(tmp_path):
    (tmp_path / "ca.crt").write_text("")
    config = load_config(_config(tmp_path, "  broker: gw.local\n  tls: {ca_file: ca.crt}"), check_models=False)
    assert config.mqtt.port == 8883 and config.mqtt.tls == TlsConfig(ca_file=tmp_path / "ca.crt")
    assert config.with_broker("127.0.0.1:2000").mqtt.tls == config.mqtt.tls


@pytest.mark.parametrize("hostname,expected", [
    ("gw1", "edge-inferd-gw1"),
    ("gw1.site-a.example.com", "edge-inferd-gw1.site-a.example.com"),
    ("bad+name/with#wildcards", "edge-inferd-bad-name-with-wildcards"),
    ("x" * 200, "edge-inferd-" + "x" * config_mqtt.MAX_HOSTNAME_IN_ID),
    ("", "edge-inferd"),
    ("///", "edge-inferd"),
])
def test_the_default_client_id_is_unique_per_host_and_mqtt_safe(monkeypatch, hostname, expected):
    monkeypatch.setattr(config_mqtt.socket, "gethostname", lambda: hostname)
    assert default_client_id() == expected


def test_the_example_config_leaves_the_client_id_to_the_default(monkeypatch):
    monkeypatch.setattr(config_mqtt.socket, "gethostname", lambda: "gw7")
    mqtt = load_config(ROOT / "config.yaml", check_models=False).mqtt
    assert mqtt.client_id == "edge-inferd-gw7" and mqtt.status_topic == "edge-inferd/edge-inferd-gw7/status"
