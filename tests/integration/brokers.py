"""The brokers the delivery tests run on, and what each does not do.

mosquitto is every test's broker. A test marked `@pytest.mark.brokers(*features)` runs on each
broker below instead: where the broker is not installed, or lacks one of `features`, its run is
skipped with the reason (what the broker does instead, measured here or in its docs;
docs/brokers.md has the table). The other brokers run over the default transport (paho): the
native transport's runs stay on mosquitto, which keeps the suite inside its time budget.

Features:
- `persistence`: sessions and queued messages survive a broker restart;
- `share`: `$share/<group>/<filter>` subscriptions;
- `v311`: MQTT 3.1.1 clients;
- `tls`: a TLS listener the tests can configure;
- `takeover_reason`: the older of two clients with one id gets DISCONNECT 0x8E (session taken over).
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from daemon.tools.broker import Broker, find_mosquitto

FEATURES = ("persistence", "share", "v311", "tls", "takeover_reason")
MOSQUITTO = "mosquitto"


@dataclass(frozen=True)
class BrokerKind:
    name: str
    make: Callable[[Path], object]  # workdir -> a broker (Broker's surface), not started
    missing: Callable[[], Optional[str]]  # why it cannot run here, or None
    lacks: dict[str, str] = field(default_factory=dict)  # feature -> what the broker does instead


def _mosquitto_missing() -> Optional[str]:
    try:
        find_mosquitto()
    except Exception as exc:  # DaemonError: not installed
        return str(exc)
    return None


def _module_missing(module: str, why: str) -> Callable[[], Optional[str]]:
    return lambda: None if importlib.util.find_spec(module) is not None else why


def _program_missing(program: str, why: str) -> Callable[[], Optional[str]]:
    return lambda: None if shutil.which(program) or Path(program).exists() else why


def _rumqttd(workdir: Path):
    from daemon.tools.rumqttd import Rumqttd
    return Rumqttd(workdir)


def _ejabberd(workdir: Path):
    from daemon.tools.ejabberd import Ejabberd
    return Ejabberd(workdir)


KINDS: dict[str, BrokerKind] = {
    MOSQUITTO: BrokerKind(MOSQUITTO, lambda workdir: Broker(workdir), _mosquitto_missing,
                          {"takeover_reason": "mosquitto 2.0 drops the older client without a reason code"}),
}


def register(kind: BrokerKind) -> None:
    KINDS[kind.name] = kind


def has(broker: object, feature: str) -> bool:
    """Whether the running `broker` (from the fixture: `.kind` names it) has `feature`."""
    return feature not in KINDS[getattr(broker, "kind", MOSQUITTO)].lacks


def skip_reason(name: str, needs: tuple[str, ...]) -> Optional[str]:
    """Why `name` cannot run a test that needs `needs`, or None."""
    kind = KINDS[name]
    missing = kind.missing()
    if missing is not None:
        return f"{name}: {missing}"
    for feature in needs:
        if feature not in FEATURES:
            raise ValueError(f"unknown broker feature {feature!r}; known: {', '.join(FEATURES)}")
        if feature in kind.lacks:
            return f"{name} lacks {feature}: {kind.lacks[feature]}"
    return None
