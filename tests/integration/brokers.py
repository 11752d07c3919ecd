"""The brokers the delivery tests run on, and what each does not do.

mosquitto is every test's broker. A test marked `@pytest.mark.brokers(*features)` runs on each
broker below instead: where the broker is not installed, or lacks one of `features`, its run is
skipped with the reason (what the broker does instead, measured here or in its docs;
docs/brokers.md has the table). Every broker runs the v5 transport (native); the 3.1.1
transport (paho) runs on mosquitto only (PAHO_ON_MOSQUITTO), which keeps the suite inside its
time budget.

Features:
- `persistence`: sessions and queued messages survive a broker restart;
- `share`: `$share/<group>/<filter>` subscriptions;
- `v311`: MQTT 3.1.1 clients;
- `tls`: a TLS listener the tests can configure;
- `takeover_reason`: the older of two clients with one id gets DISCONNECT 0x8E (session taken over);
- `backlog`: a backlog of 100 or more at the daemon drains: the broker confirms a client's
  publishes however many messages to it are unacked, or the transport does not need it to
  (native acks on the outbox's word where the window is held: daemon/transport/safe_ack.py);
- `dead_member_kept`: what was in flight to a share member when it died is delivered again
  (to it on its return, or to the group), not dropped;
- `retain_as_published`: a v5 subscription's Retain As Published is honoured (the daemon tells
  a retained message, or a retained clear, from a request by its retain flag).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from daemon.tools.broker import Broker, find_mosquitto

FEATURES = ("persistence", "share", "v311", "tls", "takeover_reason", "backlog", "retain_as_published",
            "dead_member_kept")
MOSQUITTO = "mosquitto"


@dataclass(frozen=True)
class BrokerKind:
    name: str
    make: Callable[[Path], object]  # workdir -> a broker (Broker's surface), not started
    missing: Callable[[], Optional[str]]  # why it cannot run here, or None
    lacks: dict[str, str] = field(default_factory=dict)  # feature -> what the broker does instead
    # workdir, CA, server certificate, its key -> a TLS-only broker, not started (None: no TLS here)
    make_tls: Optional[Callable[[Path, Path, Path, Path], object]] = None


def _rumqttd(workdir: Path):
    from tests.integration.rumqttd import Rumqttd
    return Rumqttd(workdir)


def _rumqttd_tls(workdir: Path, ca: Path, cert: Path, key: Path):
    from tests.integration.rumqttd import Rumqttd
    return Rumqttd(workdir, settings={"certfile": str(cert), "keyfile": str(key)})  # no client certificates


def _mosquitto_tls(workdir: Path, ca: Path, cert: Path, key: Path):
    return Broker(workdir, settings={"cafile": str(ca), "certfile": str(cert), "keyfile": str(key)})


def _ejabberd(workdir: Path):
    from tests.integration.ejabberd import Ejabberd
    return Ejabberd(workdir)


def _missing(find: Callable[[], object]) -> Callable[[], Optional[str]]:
    """None where `find` (a broker's finder) succeeds; its DaemonError's words where it does not."""
    def why() -> Optional[str]:
        try:
            find()
        except Exception as exc:  # DaemonError: not installed, and how to install it
            return str(exc)
        return None
    return why


def _find_rumqttd() -> object:
    from tests.integration.rumqttd import find_rumqttd
    return find_rumqttd()


def _find_ejabberd() -> object:
    from tests.integration.ejabberd import find_ejabberd
    return find_ejabberd()


NO_TAKEOVER_REASON = "drops the older client without a reason code"
KINDS: dict[str, BrokerKind] = {
    MOSQUITTO: BrokerKind(MOSQUITTO, lambda workdir: Broker(workdir), _missing(find_mosquitto),
                          {"takeover_reason": f"mosquitto 2.0 {NO_TAKEOVER_REASON}"}, _mosquitto_tls),
    "rumqttd": BrokerKind("rumqttd", _rumqttd, _missing(_find_rumqttd), {
        "persistence": "rumqttd 0.20 keeps sessions and queued messages in memory only: a restart loses them",
        "v311": "rumqttd serves 3.1.1 on a listener of its own; a 3.1.1 CONNECT on the v5 port gets no CONNACK",
        "takeover_reason": f"rumqttd 0.20 {NO_TAKEOVER_REASON} (a TCP close)",
        "dead_member_kept": "rumqttd 0.20 drops what was in flight to a share member that died "
                            "(tools/dev/probe_rumqttd.py share_group: 81 of 200 never answered)",
        "retain_as_published": "rumqttd 0.20 forwards a retained publish (and a retained clear) without the "
                               "retain flag, ignoring Retain As Published",
    }, _rumqttd_tls),
    "ejabberd": BrokerKind("ejabberd", _ejabberd, _missing(_find_ejabberd), {
        "persistence": "ejabberd 23.01's mod_mqtt keeps sessions in RAM tables: a restart loses every "
                       "queued message",
        "share": "ejabberd 23.01's mod_mqtt answers a $share SUBSCRIBE with DISCONNECT 0x9E (not supported)",
        "tls": "not configured by the test fixture (mod_mqtt has TLS listeners; not run here)",
    }),
}


# Why a delivery test's paho (MQTT 3.1.1) run is on mosquitto only.
PAHO_ON_MOSQUITTO = ("the other brokers run the v5 transport (native); paho, the 3.1.1 transport, runs the "
                     "delivery tests on mosquitto")


def register(kind: BrokerKind) -> None:
    KINDS[kind.name] = kind


def has(broker: object, feature: str) -> bool:
    """Whether the running `broker` (from the fixture: `.kind` names it) has `feature`."""
    return feature not in KINDS[getattr(broker, "kind", MOSQUITTO)].lacks


def params(*needs: str) -> list:
    """One pytest.param per broker for a test that needs `needs`, skipped with the reason where it cannot run."""
    import pytest

    out = []
    for name in KINDS:
        reason = skip_reason(name, needs)
        out.append(pytest.param(name, id=name, marks=[pytest.mark.skip(reason=reason)] if reason else []))
    return out


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
