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
# Fleet delivery's tests (tests/fleet/): Debian's minisign, to check that releases signed by
# `edge-inferd fleet sign` verify with `minisign -V` and the other way round, and nginx-light, an
# on-site release server with Range and ETag (the tests start their own instance on a free port;
# the package's own service would hold port 80, so it is stopped). Optional: without them those
# tests skip.
command -v minisign >/dev/null || apt_install minisign || echo "setup: minisign is not installable here; its tests will be skipped" >&2
# The audio tests' speech (tests/speech.py): espeak-ng speaks a phrase, resampled to 16 kHz in numpy,
# for the pcm16 routes and the wake-word chain. Optional: without it those tests skip.
command -v espeak-ng >/dev/null || apt_install espeak-ng || echo "setup: espeak-ng is not installable here; the audio tests will be skipped" >&2
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
    if apt_install nginx-light; then
        if [ -d /run/systemd/system ]; then
            $SUDO systemctl disable --now nginx.service >/dev/null 2>&1 || true
        elif command -v service >/dev/null; then
            $SUDO service nginx stop >/dev/null 2>&1 || true
        fi
    else
        echo "setup: nginx-light is not installable here; the release-server tests will be skipped" >&2
    fi
fi
# ejabberd's mod_mqtt, a second broker for tests/integration/test_ejabberd_broker.py (which skip
# without it). Optional: a failed install only warns. The tests start their own instance
# (tests/integration/ejabberd.py); the package's system service would hold ports 1883, 5222, 5269,
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

# The runtime: ai-edge-litert on x86-64 and aarch64. On armv7 there is none of its wheels, so
# the `tflite` extra (tflite-runtime 2.14, which needs numpy<2); and PyPI has no armv7 wheel of
# numpy, PyYAML or Pillow either (piwheels has, but is another index): numpy 1.24 and PyYAML 6.0
# come from Debian (python3-numpy, python3-yaml; the venv sees them through
# --system-site-packages), and Pillow (Debian's is 9.4, below the >= 10 required) is built from
# its sdist, with a compiler and the JPEG and zlib headers.
extras=test
runtime_module=ai_edge_litert
venv_flags=""
case "$(uname -m)" in
    armv7l|armv8l|armhf)
        extras=test,tflite
        runtime_module=tflite_runtime.interpreter
        venv_flags=--system-site-packages
        python3 -c 'import numpy, yaml' 2>/dev/null || apt_install python3-numpy python3-yaml
        if ! command -v cc >/dev/null || [ ! -e /usr/include/jpeglib.h ] || ! python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))'; then
            apt_install build-essential python3-dev libjpeg62-turbo-dev zlib1g-dev
        fi
        ;;
esac

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv" >&2
    # shellcheck disable=SC2086
    python3 -m venv $venv_flags .venv
fi
test_modules="daemon, $runtime_module, paho.mqtt, diskcache, yaml, pytest, xdist, PIL, orjson, hypothesis, prometheus_client, mqtt5, cryptography, mkdocs, material"
case "$(uname -m)" in x86_64|aarch64) test_modules="$test_modules, tritonclient.http" ;; esac
if ! .venv/bin/python -c "import $test_modules" 2>/dev/null; then
    echo "setup: installing edge-inferd[$extras] into .venv (a minute or two; on armv7 Pillow is compiled)" >&2
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -e ".[$extras]"
fi
