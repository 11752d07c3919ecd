#!/usr/bin/env bash
# The README's first command: set up, then run the daemon on the bundled models with a
# private mosquitto, replay the bundled held-out samples over MQTT and print the results.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/edge-inferd demo --config config.yaml "$@"
