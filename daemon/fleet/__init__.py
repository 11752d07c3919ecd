"""Fleet delivery: signed releases, desired/reported state over MQTT, gate, canary, rollback, waves (docs/fleet.md)."""
