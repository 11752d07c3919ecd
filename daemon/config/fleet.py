"""The `fleet` section: model delivery to this node (daemon/fleet/, docs/fleet.md), read and checked.

Off by default: a daemon that does not ask for it subscribes to no fleet topic and fetches
nothing. A model takes part only with `models.<name>.managed: true`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from daemon.config.mqtt import MqttConfig, fleet_group_topic
from daemon.config.reader import Reader, systemd_base

AUTO, MANUAL = "auto", "manual"
ACTIVATIONS = (AUTO, MANUAL)
DEFAULT_STORE_DIR = Path("fleet")
_MIB = 1 << 20
# A group name is one topic level of edge-inferd/fleet/desired/group/<group>.
_BAD_LEVEL_CHARS = ("/", "+", "#", "\0")


@dataclass(frozen=True)
class FetchConfig:
    timeout_s: float = 10.0
    """Connecting to the release server, and waiting for its headers, at most this long."""
    stall_s: float = 30.0
    """A download that receives no byte for this long is cut and tried again (resumed)."""
    attempts: int = 5
    """Tries per file before the release is reported `failed` (code `download`); a 4xx answer
    (but 408 and 429) is final at once. A daemon restart resumes the partial file."""
    backoff_s: float = 2.0
    """The first wait between attempts; it doubles each time, with full jitter, so fifty
    gateways do not retry in step."""
    max_backoff_s: float = 60.0
    """The wait between attempts at most."""
    max_mb: float = 256.0
    """A release whose files add up to more than this is refused (`too_large`) before download."""
    min_free_mb: float = 64.0
    """Free disk left in the store after a download; a release that would leave less is refused
    (`no_space`)."""
    ca_file: Optional[Path] = None
    """A CA bundle for an on-site HTTPS server with a private CA (null: the system's)."""
    token_file: Optional[Path] = None
    """A file whose content is sent as `Authorization: Bearer <token>` (null: none)."""


@dataclass(frozen=True)
class GateConfig:
    max_drop_vs_current: float = 0.02
    """A new release must score no worse than the running one by more than this on each of its
    routes' `validate.data` (accuracy and ROC-AUC: this much lower; MAE: this much higher)."""
    claim_tolerance: float = 0.01
    """Where the release's claims name this node's validate file (by sha256), the node's own
    measurement must match the claimed value within this: a mismatch is a preprocessing or
    labels mismatch between where it was trained and here (`claim`)."""
    timeout_s: float = 300.0
    """The gate's child process (load, run each route's validate data) at most this long."""


@dataclass(frozen=True)
class CanaryConfig:
    duration_s: float = 60.0
    """After the swap, the new release is watched on live traffic for at least this long."""
    min_answers: int = 200
    """... and at least this many answers from it, before it is called active. Without traffic
    the canary waits (the reported doc says how far it is). 200 is what the PSI of a route and the
    latency check each need of both releases; a canary that passes short of them says what it
    did not judge (docs/fleet.md, "Canary")."""
    max_internal_rate: float = 0.01
    """Share of the new release's requests answered `internal`; above it, back to the previous."""
    max_latency_ratio: float = 2.0
    """The model's CPU time per sample of the new release against the previous release's, both
    loaded side by side on the node when the canary starts and invoked in turn (10th percentile
    of each); above it, back to the previous. CPU time, not the wall clock: on a busy machine the
    wall clock rolled back identical bytes."""
    max_psi: float = 0.25
    """PSI of the new answers (top-1 classes, or anomaly scores) against the previous release's
    answers on the same live traffic (docs/drift.md); above it, back to the previous. null: not
    judged."""
    max_restarts: int = 2
    """Daemon restarts during a canary (a crash counts); one more and the node goes back to the
    previous release at start."""


@dataclass(frozen=True)
class FleetConfig:
    enabled: bool = False
    """Take releases from the fleet topics (docs/fleet.md). Off: nothing is subscribed or fetched."""
    groups: tuple[str, ...] = field(default=(), metadata={"doc_default": "`[]`"})
    """Groups this node belongs to: it reads `edge-inferd/fleet/desired/group/<group>` for each.
    Per model the node's own desired document wins, then the first group listed."""
    store_dir: Path = field(default=DEFAULT_STORE_DIR, metadata={"doc_default": "`fleet`"})
    """Where releases are kept (mode 0700). Relative: under $STATE_DIRECTORY when systemd sets
    it (StateDirectory=), else next to the config file."""
    keep: int = 3
    """Releases kept per model (the current and the previous one always): `fleet rollback`
    needs no download while the release is kept."""
    trusted_keys: tuple[str, ...] = field(default=(), metadata={"doc_default": "`[]`"})
    """minisign public keys a release must be signed by: each the key's base64 line, or a path
    to a `.pub` file (`edge-inferd fleet keygen` writes one)."""
    threshold: int = 1
    """Distinct trusted keys that must have signed a release."""
    allow_downgrade: bool = False
    """Accept a release whose serial is below the committed one (a kept release is always
    accepted: that is a rollback)."""
    activation: str = AUTO
    """`auto`: a release that passed the gate is swapped in at once; `manual`: it waits as
    `staged` until an `install` command (Home Assistant's Install button sends one)."""
    fetch: FetchConfig = FetchConfig()
    """Downloading releases (`fleet.fetch` below)."""
    gate: GateConfig = GateConfig()
    """The check on this node's own data before the swap (`fleet.gate` below)."""
    canary: CanaryConfig = CanaryConfig()
    """Watching the new release on live traffic after the swap (`fleet.canary` below)."""

    @property
    def fetch_max_bytes(self) -> int:
        return int(self.fetch.max_mb * _MIB)

    @property
    def min_free_bytes(self) -> int:
        return int(self.fetch.min_free_mb * _MIB)


def node_topics(fleet: FleetConfig, mqtt: MqttConfig) -> list[str]:
    """The fleet topics a node subscribes (docs/fleet.md): its desired document, its groups', its
    commands; none when the fleet is off."""
    if not fleet.enabled:
        return []
    return [mqtt.fleet_desired_topic, *(fleet_group_topic(g) for g in fleet.groups), mqtt.fleet_cmd_topic]


def read_fleet(r: Reader, root: Mapping, base: Path) -> FleetConfig:
    p, d = "fleet", FleetConfig()
    s = r.section(root, "fleet", FleetConfig)
    groups = r.get(s, "groups", p, list, [], check=_groups_error) or []
    keys = r.get(s, "trusted_keys", p, list, [], check=_keys_error) or []
    enabled = r.get(s, "enabled", p, bool, d.enabled)
    threshold = r.get(s, "threshold", p, int, d.threshold, minimum=1)
    if enabled and r.ok(f"{p}.trusted_keys", f"{p}.threshold") and len(keys) < threshold:
        r.error(s, "trusted_keys" if "trusted_keys" in s else "enabled", p,
                f"lists {len(keys)} key(s) but fleet.threshold is {threshold}: no release could ever be trusted")
    return FleetConfig(
        enabled=enabled,
        groups=tuple(str(g) for g in groups),
        store_dir=systemd_base("STATE_DIRECTORY", base) / r.get(s, "store_dir", p, str, str(d.store_dir)),
        keep=r.get(s, "keep", p, int, d.keep, minimum=2),
        trusted_keys=tuple(_key_entry(k, base) for k in keys),
        threshold=threshold,
        allow_downgrade=r.get(s, "allow_downgrade", p, bool, d.allow_downgrade),
        activation=r.get(s, "activation", p, str, d.activation, choices=ACTIVATIONS),
        fetch=_read_fetch(r, r.section(s, "fetch", FetchConfig, path=f"{p}.fetch"), base),
        gate=_read_gate(r, r.section(s, "gate", GateConfig, path=f"{p}.gate")),
        canary=_read_canary(r, r.section(s, "canary", CanaryConfig, path=f"{p}.canary")),
    )


def _read_fetch(r: Reader, m: Mapping, base: Path) -> FetchConfig:
    p, d = "fleet.fetch", FetchConfig()
    ca = r.get(m, "ca_file", p, (str, type(None)), None)
    token = r.get(m, "token_file", p, (str, type(None)), None)
    return FetchConfig(
        timeout_s=r.get(m, "timeout_s", p, (int, float), d.timeout_s, minimum=0.1),
        stall_s=r.get(m, "stall_s", p, (int, float), d.stall_s, minimum=0.1),
        attempts=r.get(m, "attempts", p, int, d.attempts, minimum=1),
        backoff_s=r.get(m, "backoff_s", p, (int, float), d.backoff_s, minimum=0),
        max_backoff_s=r.get(m, "max_backoff_s", p, (int, float), d.max_backoff_s, minimum=0),
        max_mb=r.get(m, "max_mb", p, (int, float), d.max_mb, minimum=0.001),
        min_free_mb=r.get(m, "min_free_mb", p, (int, float), d.min_free_mb, minimum=0),
        ca_file=None if ca is None else base / ca,
        token_file=None if token is None else base / token,
    )


def _read_gate(r: Reader, m: Mapping) -> GateConfig:
    p, d = "fleet.gate", GateConfig()
    return GateConfig(
        max_drop_vs_current=r.get(m, "max_drop_vs_current", p, (int, float), d.max_drop_vs_current, minimum=0),
        claim_tolerance=r.get(m, "claim_tolerance", p, (int, float), d.claim_tolerance, minimum=0),
        timeout_s=r.get(m, "timeout_s", p, (int, float), d.timeout_s, minimum=1),
    )


def _read_canary(r: Reader, m: Mapping) -> CanaryConfig:
    p, d = "fleet.canary", CanaryConfig()
    psi = r.get(m, "max_psi", p, (int, float, type(None)), d.max_psi)
    if psi is not None and psi < 0:
        r.error(m, "max_psi", p, f"must be >= 0 or null, got {psi!r}")
        psi = d.max_psi
    return CanaryConfig(
        duration_s=r.get(m, "duration_s", p, (int, float), d.duration_s, minimum=0),
        min_answers=r.get(m, "min_answers", p, int, d.min_answers, minimum=0),
        max_internal_rate=r.get(m, "max_internal_rate", p, (int, float), d.max_internal_rate, minimum=0),
        max_latency_ratio=r.get(m, "max_latency_ratio", p, (int, float), d.max_latency_ratio, minimum=1),
        max_psi=None if psi is None else float(psi),
        max_restarts=r.get(m, "max_restarts", p, int, d.max_restarts, minimum=0),
    )


def _groups_error(groups: list) -> Optional[str]:
    for g in groups:
        if not isinstance(g, str) or not g or any(c in g for c in _BAD_LEVEL_CHARS):
            return f"each group must be a non-empty topic level (no '/', '+', '#'), got {g!r}"
    return None if len(set(groups)) == len(groups) else "lists a group twice"


def _keys_error(keys: list) -> Optional[str]:
    bad = [k for k in keys if not isinstance(k, str) or not k.strip()]
    return f"each key must be a minisign public key line or a .pub file's path, got {bad[0]!r}" if bad else None


def _key_entry(entry: str, base: Path) -> str:
    """A key's base64 line as given, or a .pub file's path made absolute (read when the daemon starts)."""
    entry = entry.strip()
    return entry if _looks_like_key(entry) else str(base / entry)


# A minisign public key is base64 of 42 bytes ("Ed", 8-byte id, 32-byte key): 56 characters,
# and "Ed" makes them all start with "RW".
_KEY_B64_CHARS = 56


def _looks_like_key(entry: str) -> bool:
    return len(entry) == _KEY_B64_CHARS and entry.startswith("RW") and not entry.endswith(".pub")


# --- Where a managed model's files are: the store's `current` release (daemon/fleet/node/store.py
# writes it; the config reads it, so that start-up, a reload and the child's check all load
# the same files) ---

CURRENT_LINK = "current"
MANIFEST_FILE = "manifest.json"


@dataclass(frozen=True)
class ReleaseFiles:
    """The files of one whole release in the store, as its (verified) manifest names them."""

    directory: Path
    serial: int
    version: str
    model_path: Path
    labels_path: Optional[Path]
    model_sha256: str


def release_files(directory: Path) -> Optional[ReleaseFiles]:
    """The release in `directory` (its real path), or None when it has no readable manifest.
    The manifest was verified before the release entered the store, whose directory is 0700."""
    import json  # only managed models come here

    directory = Path(directory).resolve()
    try:
        manifest = json.loads((directory / MANIFEST_FILE).read_text(encoding="utf-8"))
        digests = {f["name"]: f["sha256"] for f in manifest["files"]}
        model_file, labels_file = manifest["model_file"], manifest.get("labels_file")
        return ReleaseFiles(directory, int(manifest["serial"]), str(manifest["version"]), directory / model_file,
                            directory / labels_file if labels_file else None, digests[model_file])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def current_release(store_dir: Path, model: str) -> Optional[ReleaseFiles]:
    """The model's committed release (`<store_dir>/<model>/current`), or None before the first."""
    link = Path(store_dir) / model / CURRENT_LINK
    return release_files(link) if link.is_dir() else None
