#!/usr/bin/env bash
# Removes what scripts/install.sh installed (as root). The cache and state directories
# (/var/cache/edge-inferd, /var/lib/edge-inferd) go with --purge, /etc/edge-inferd too.
#   sudo ./scripts/uninstall.sh [--root DIR] [--purge]
set -euo pipefail
ROOT="" PURGE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --root) ROOT="$2"; shift 2 ;;
        --purge) PURGE=1; shift ;;
        *) echo "uninstall: unknown option $1" >&2; exit 2 ;;
    esac
done
if [ -z "$ROOT" ] && command -v systemctl >/dev/null; then
    systemctl disable --now edge-inferd 2>/dev/null || true
fi
rm -f "$ROOT/etc/systemd/system/edge-inferd.service"
rm -rf "$ROOT/opt/edge-inferd"
if [ "$PURGE" -eq 1 ]; then
    rm -rf "$ROOT/etc/edge-inferd" "$ROOT/var/cache/edge-inferd" "$ROOT/var/lib/edge-inferd"
fi
if [ -z "$ROOT" ] && command -v systemctl >/dev/null; then
    systemctl daemon-reload 2>/dev/null || true
fi
echo "uninstall: done${PURGE:+ (purge: $PURGE)}" >&2
