#!/usr/bin/env bash
# The README's first command: set up, then run the daemon on the bundled models with a
# private mosquitto, replay the bundled held-out samples over MQTT and print the results.
# The camera route's SSD detector and photos are fetched first (scripts/fetch_test_models.sh:
# once, into .cache/test-models or $EDGE_INFERD_TEST_MODELS; it installs what it needs itself).
# When the fetch fails, the demo runs the bundled kinds and says why detect was skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if ! ./scripts/fetch_test_models.sh "${EDGE_INFERD_TEST_MODELS:-.cache/test-models}"; then
    echo "demo: scripts/fetch_test_models.sh failed (above): the camera route's detector is left out" >&2
fi
exec .venv/bin/edge-inferd demo --config config.yaml "$@"
