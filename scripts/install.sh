#!/usr/bin/env bash
# Installs edge-inferd as a systemd service (as root):
#   /opt/edge-inferd              the code, the bundled models and a venv
#   /etc/edge-inferd/config.yaml  the example config, model paths made absolute, mode 0644
#   /etc/systemd/system/edge-inferd.service
# then runs check-config as an unprivileged user, as the service will (DynamicUser=yes).
#
#   sudo ./scripts/install.sh [--root DIR] [--no-venv] [--no-systemctl]
#
# --root DIR installs under DIR (a staging tree, or a test); --no-venv reuses a venv already
# at DIR/opt/edge-inferd/.venv or leaves it out (check-config then runs with this checkout's
# .venv); --no-systemctl skips daemon-reload and enable.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="" VENV=1 SYSTEMCTL=1
while [ $# -gt 0 ]; do
    case "$1" in
        --root) ROOT="$2"; shift 2 ;;
        --no-venv) VENV=0; shift ;;
        --no-systemctl) SYSTEMCTL=0; shift ;;
        *) echo "install: unknown option $1" >&2; exit 2 ;;
    esac
done
APP="$ROOT/opt/edge-inferd" ETC="$ROOT/etc/edge-inferd" UNITS="$ROOT/etc/systemd/system"

echo "install: code and models -> $APP" >&2
install -d -m 0755 "$APP" "$ETC" "$UNITS"
git ls-files -z | grep -zv '^tests/' | tar --null -T - -cf - | tar -C "$APP" -xf -
chmod -R a+rX "$APP"
if [ "$VENV" -eq 1 ]; then
    echo "install: venv -> $APP/.venv (a minute or two)" >&2
    python3 -m venv "$APP/.venv"
    "$APP/.venv/bin/pip" install -q "$APP"
fi

echo "install: config -> $ETC/config.yaml (0644: keep secrets in a password_file or LoadCredential=)" >&2
if [ ! -e "$ETC/config.yaml" ]; then
    sed "s#path: models/#path: /opt/edge-inferd/models/#; s#labels: models/#labels: /opt/edge-inferd/models/#; s#data: models/#data: /opt/edge-inferd/models/#" \
        config.yaml > "$ETC/config.yaml"
    if [ -n "$ROOT" ]; then  # a staging tree: point at the staged models
        sed -i "s#/opt/edge-inferd/#$APP/#" "$ETC/config.yaml"
    fi
fi
chmod 0644 "$ETC/config.yaml"
install -m 0644 systemd/edge-inferd.service "$UNITS/edge-inferd.service"

PY="$APP/.venv/bin/python"
[ -x "$PY" ] || PY="$PWD/.venv/bin/python"
# The service runs as a dynamic user: everything it reads must be readable by anyone.
for f in "$ETC/config.yaml" "$APP"/models/*/model.tflite "$APP"/models/*/labels.txt; do
    runuser -u nobody -- test -r "$f" || { echo "install: $f is not readable by the service user" >&2; exit 1; }
done
if runuser -u nobody -- test -x "$(readlink -f "$PY")"; then
    echo "install: check-config as user nobody (the service runs as a dynamic user)" >&2
    runuser -u nobody -- env PYTHONPATH="$APP" "$PY" -m daemon check-config --config "$ETC/config.yaml"
else  # e.g. a venv on a pyenv interpreter under /root, as on some build machines
    echo "install: $PY is not executable by nobody here; check-config as $(id -un)" >&2
    env PYTHONPATH="$APP" "$PY" -m daemon check-config --config "$ETC/config.yaml"
fi

if [ "$SYSTEMCTL" -eq 1 ] && [ -z "$ROOT" ] && command -v systemctl >/dev/null; then
    systemctl daemon-reload
    systemctl enable --now edge-inferd
    echo "install: started; follow it with journalctl -u edge-inferd -f" >&2
fi
