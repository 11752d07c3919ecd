"""Run by Home Assistant's own Python (.cache/ha-venv, scripts/setup_ha.sh), not the daemon's:
validates discovery payloads with HA's MQTT discovery schemas, the ones its discovery applies.

stdin: a JSON list of [component, payload]; stdout: a JSON list of the errors, "" where valid.
The payloads are first expanded as HA expands them (abbreviations.py, then the `~` base topic).
"""

import importlib
import json
import sys

from homeassistant.components.mqtt.abbreviations import ABBREVIATIONS, DEVICE_ABBREVIATIONS, ORIGIN_ABBREVIATIONS


def expand(payload: dict) -> dict:
    out = {ABBREVIATIONS.get(key, key): value for key, value in payload.items()}
    for section, names in (("device", DEVICE_ABBREVIATIONS), ("origin", ORIGIN_ABBREVIATIONS)):
        if isinstance(out.get(section), dict):
            out[section] = {names.get(key, key): value for key, value in out[section].items()}
    return out


def main() -> None:
    errors = []
    for component, payload in json.load(sys.stdin):
        schema = importlib.import_module(f"homeassistant.components.mqtt.{component}").DISCOVERY_SCHEMA
        expanded = expand(payload)
        try:
            validated = schema(expanded)
        except Exception as exc:  # voluptuous.Invalid, with the key path
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        dropped = sorted(set(expanded) - set(validated))  # REMOVE_EXTRA drops keys HA does not know
        errors.append(f"keys HA does not know: {dropped}" if dropped else "")
    json.dump(errors, sys.stdout)


if __name__ == "__main__":
    main()
