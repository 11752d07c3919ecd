"""Fleet delivery in a real Home Assistant 2024.3.3, end to end: a real node with
`homeassistant.discovery` and `fleet.activation: manual` stages a release; HA's update entity
shows it; HA's Install button (`update.install`, through HA's REST API) makes the node swap it in.
Skipped, saying why, without HA's venv (./scripts/setup_ha.sh)."""

from __future__ import annotations

import pytest

from tests.homeassistant import ha
from tests.integration.fleet_site import ACTIVITY_FLOAT_IO, Site, desire, reported

pytestmark = [pytest.mark.integration, pytest.mark.skipif(ha.available() is not None, reason=ha.available() or "")]
NODE = "gw1"
ENTITY = f"update.edge_inferd_{NODE}_fleet_activity"


def _attribute(key: str, value):
    return lambda states: states.get(ENTITY, {}).get("attributes", {}).get(key) == value


def test_home_assistants_install_button_swaps_the_staged_release_in(tmp_path, broker, client, start_daemon,
                                                                    home_assistant):
    site = Site(tmp_path)
    try:
        config = site.config(tmp_path / NODE, activation="manual", canary={"duration_s": 0, "min_answers": 0},
                             sections={"homeassistant": {"discovery": True}})
        start_daemon(config, wait_online=client, client_id=NODE)
        desire(client, NODE, 1, site.release(2, "1.1.0", ACTIVITY_FLOAT_IO, summary="another build"), 2)
        reported(client, NODE, lambda m: m["state"] == "staged")
        entity = home_assistant.wait_for("the staged release", _attribute("latest_version", "1.1.0"))[ENTITY]
        assert entity["state"] == "on" and entity["attributes"]["installed_version"].startswith("sha256:")
        assert entity["attributes"]["release_summary"].endswith("another build")
        home_assistant.call_service("update", "install", {"entity_id": ENTITY})
        doc = reported(client, NODE, lambda m: m["state"] == "active" and m["serial"] == 2)
        assert doc["last_cmd"] == {"cmd": "install", "model": "activity", "ok": True, "message": "installing serial 2"}
        entity = home_assistant.wait_for("the installed release", _attribute("installed_version", "1.1.0"))[ENTITY]
        assert entity["state"] == "off"
    finally:
        site.close()
