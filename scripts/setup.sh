#!/usr/bin/env bash
# Sets up what the demo and the tests need, from nothing, on Debian/Ubuntu:
#   .venv with edge-inferd and its test extra, and mosquitto and its C clients (through apt when missing).
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
apt_updated=0
apt_install() {
    echo "setup: installing $* with apt-get" >&2
    if [ "$apt_updated" -eq 0 ]; then $SUDO apt-get update -qq; apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

command -v python3 >/dev/null || apt_install python3
python3 -c 'import ensurepip, venv' 2>/dev/null || apt_install python3-venv
if ! command -v mosquitto >/dev/null && [ ! -x /usr/sbin/mosquitto ]; then
    apt_install mosquitto
fi
# The C clients: the burst tests and `edge-inferd bench e2e` publish with mosquitto_pub -l.
command -v mosquitto_pub >/dev/null || apt_install mosquitto-clients
# ejabberd's mod_mqtt, a second broker for tests/integration/test_ejabberd_broker.py (which skip
# without it). Optional: a failed install only warns. The tests start their own instance
# (daemon/tools/ejabberd.py); the package's system service would hold ports 1883, 5222, 5269,
# 5280 and the node ejabberd@localhost, so it is stopped and disabled.
if ! compgen -G '/usr/lib/*/ejabberd-[0-9]*/ebin/mod_mqtt.beam' >/dev/null \
        && ! compgen -G '/usr/lib/erlang/lib/ejabberd-[0-9]*/ebin/mod_mqtt.beam' >/dev/null; then
    if apt_install ejabberd; then
        if [ -d /run/systemd/system ]; then
            $SUDO systemctl disable --now ejabberd.service >/dev/null 2>&1 || true
        elif command -v service >/dev/null; then
            $SUDO service ejabberd stop >/dev/null 2>&1 || true
        fi
    else
        echo "setup: ejabberd is not installable here; the ejabberd broker tests will be skipped" >&2
    fi
fi

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv" >&2
    python3 -m venv .venv
fi
if ! .venv/bin/python -c 'import daemon, ai_edge_litert, paho.mqtt, diskcache, yaml, pytest, PIL, orjson, hypothesis, prometheus_client, mqtt5' 2>/dev/null; then
    echo "setup: installing edge-inferd into .venv (a minute or two)" >&2
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -e '.[test]'
fi
