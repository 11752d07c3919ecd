"""The operator's side of fleet delivery: `edge-inferd fleet status|rollout|abort|rollback`
(docs/fleet.md, the Protocol). Each verb is a function of an options dataclass and an output
stream that returns an exit status (cli.py exits with it); `add_fleet_controller_args` registers
them under the `fleet` command, and `run_from_args` calls the one parsed.

Exit statuses: 0 done (rollout completed, status printed, abort applied, every node rolled back);
1 not done (rollout aborted, broker unreachable, a node that did not roll back); 2 a usage problem
(bad options, no node, another release's rollout still running without --force).
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass
from typing import Optional, TextIO

import orjson

from daemon.fleet.controller import fleet_status, reported_view
from daemon.fleet.controller.controller_link import ControllerLink, cmd_topic
from daemon.fleet.controller.record import ABORTED, ABORTING, COMPLETED, LIVE, ON_ABORT, ROLLBACK, RolloutRecord
from daemon.fleet.controller.rollout import Rollout, apply_on_abort, publish_record, rollback_answer, say
from daemon.fleet.controller.waves import WaveError, parse_waves, plan

EXIT_OK = 0
EXIT_NOT_DONE = 1
EXIT_USAGE = 2
DEFAULT_WAVES = "1,10%,50%,100%"
DEFAULT_WAVE_TIMEOUT_S = 600.0
WATCH_S = 2.0
# `fleet abort`: a running controller answers the `aborting` record at once (it waits on every
# message); no change within this long means there is none, and `fleet abort` applies on_abort itself.
ABORT_HANDOFF_S = 3.0
ABORT_DONE_S = 120.0  # for a running controller to restore every node and write `aborted`
ROLLBACK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class StatusOptions:
    broker: str
    model: Optional[str] = None
    """Only this model's rows."""
    watch_s: Optional[float] = None
    """Keep following and redraw on each change and every this many seconds (None: print once)."""
    json: bool = False
    """One JSON array of rows instead of the table (with watch_s: ignored)."""


@dataclass(frozen=True)
class RolloutOptions:
    broker: str
    model: str
    release: str
    """The release directory's URL, written into each node's desired entry."""
    serial: int
    waves: str = DEFAULT_WAVES
    version: Optional[str] = None
    nodes: tuple[str, ...] = ()
    """These nodes (in this order); empty: every node whose reported document lists the model."""
    group: Optional[str] = None
    """With no `nodes`: only the nodes that report this group."""
    success: float = 1.0
    abort_at: float = 0.5
    abort_min_nodes: int = 1
    wave_timeout_s: float = DEFAULT_WAVE_TIMEOUT_S
    on_abort: str = ROLLBACK
    force: bool = False
    """Start even though the record is another release's rollout that is still running."""

    def problems(self) -> list[str]:
        found = [] if self.serial >= 0 else ["--serial must be 0 or more"]
        found += [] if 0 < self.success <= 1 else ["--success must be above 0 and at most 1"]
        found += [] if 0 < self.abort_at <= 1 else ["--abort-at must be above 0 and at most 1"]
        found += [] if self.abort_min_nodes >= 1 else ["--abort-min-nodes must be at least 1"]
        found += [] if self.wave_timeout_s > 0 else ["--wave-timeout must be above 0"]
        found += [] if self.on_abort in ON_ABORT else [f"--on-abort must be one of {', '.join(ON_ABORT)}"]
        found += ["--nodes and --group: give one"] if self.nodes and self.group else []
        try:
            parse_waves(self.waves)
        except WaveError as exc:
            found.append(str(exc))
        return found


@dataclass(frozen=True)
class AbortOptions:
    broker: str
    model: str
    handoff_s: float = ABORT_HANDOFF_S


@dataclass(frozen=True)
class RollbackOptions:
    broker: str
    model: str
    nodes: tuple[str, ...] = ()
    """Empty: every node whose reported document lists the model."""
    timeout_s: float = ROLLBACK_TIMEOUT_S


def _connect(broker: str, model: Optional[str], out: TextIO) -> "ControllerLink | int":
    """A started link, or the exit status after saying why there is none."""
    try:
        link = ControllerLink(broker, model)
    except ValueError as exc:
        say(out, f"error: --broker: {exc}")
        return EXIT_USAGE
    try:
        link.start()
    except OSError as exc:
        say(out, f"error: cannot reach the broker at {broker}: {exc}")
        return EXIT_NOT_DONE
    return link


def status(options: StatusOptions, out: TextIO, stop: Optional[threading.Event] = None) -> int:
    """`fleet status`: print the table (or JSON) once, or redraw it until Ctrl-C or `stop`."""
    if options.watch_s is not None and options.watch_s <= 0:
        say(out, "error: --watch: SECONDS must be above 0")
        return EXIT_USAGE
    link = _connect(options.broker, None, out)
    if isinstance(link, int):
        return link
    try:
        if options.watch_s is not None:
            heading = f"edge-inferd fleet status --watch: {options.broker} (Ctrl-C stops)"
            try:
                fleet_status.watch(link, options.model, options.watch_s, out, stop or threading.Event(), heading)
            except KeyboardInterrupt:
                pass
            return EXIT_OK
        # time.time(): a reported document's `time` is an epoch, the node's clock (display only).
        table_rows = fleet_status.snapshot(link, options.model, time.time())
    finally:
        link.stop()
    out.write((orjson.dumps(table_rows).decode() if options.json else fleet_status.render(table_rows)) + "\n")
    out.flush()
    return EXIT_OK if table_rows else EXIT_NOT_DONE


def rollout(options: RolloutOptions, out: TextIO) -> int:
    """`fleet rollout`: new, or resumed from the retained record of the same release."""
    problems = options.problems()
    for problem in problems:
        say(out, f"error: {problem}")
    if problems:
        return EXIT_USAGE
    link = _connect(options.broker, options.model, out)
    if isinstance(link, int):
        return link
    try:
        record = _begin(link, options, out)
        if isinstance(record, int):
            return record
        return Rollout(link, record, out).run()
    except OSError as exc:  # the broker took no message for minutes (controller_link.PUBLISH_TRIES)
        say(out, f"error: {exc}; the record stays as it was: run the same command again to resume")
        return EXIT_NOT_DONE
    finally:
        link.stop()


def _begin(link: ControllerLink, options: RolloutOptions, out: TextIO) -> "RolloutRecord | int":
    """The record to run: the retained one when it is this release's and unfinished, else a new one."""
    old = link.record()
    if old is not None and old.same_release(options.release, options.serial):
        if old.state in LIVE:
            say(out, f"resuming the rollout of {old.release} (serial {old.serial}) at wave {old.wave + 1}: "
                     f"{len(old.assigned)} of {len(old.nodes)} nodes assigned")
            if old.state == ABORTING:
                apply_on_abort(link, old, out)
                return EXIT_NOT_DONE
            return old
        if old.state == COMPLETED and not options.force:
            say(out, f"the rollout of {old.release} (serial {old.serial}) has completed already")
            return EXIT_OK
    elif old is not None and old.state in LIVE and not options.force:
        say(out, f"error: a rollout of {old.release} (serial {old.serial}) is {old.state}: "
                 f"`fleet abort --model {old.model}` first, or --force")
        return EXIT_USAGE
    return _new_record(link, options, out)


def _new_record(link: ControllerLink, options: RolloutOptions, out: TextIO) -> "RolloutRecord | int":
    nodes = options.nodes or _discover(link, options.model, options.group)
    specs = parse_waves(options.waves)
    try:
        waves = plan(specs, nodes)
    except WaveError as exc:
        say(out, f"error: {exc}" + ("" if nodes else f" (no node reports model {options.model!r})"))
        return EXIT_USAGE
    record = RolloutRecord(
        model=options.model, release=options.release, serial=options.serial, version=options.version,
        waves=specs, nodes=tuple(node for wave in waves for node in wave), state="running",
        success=options.success, abort_at=options.abort_at, min_nodes=options.abort_min_nodes,
        wave_timeout_s=options.wave_timeout_s, on_abort=options.on_abort)
    publish_record(link, record)
    say(out, f"rollout of {options.model} {options.release} (serial {options.serial}) to {len(nodes)} nodes "
             f"in {len(waves)} waves: " + " | ".join(", ".join(wave) for wave in waves))
    return record


def _discover(link: ControllerLink, model: str, group: Optional[str]) -> tuple[str, ...]:
    """The nodes whose reported document lists the model (and the group), by name."""
    with link.cond:
        return tuple(sorted(node for node, doc in link.reported.items() if reported_view.lists_model(doc, model)
                            and (group is None or reported_view.in_group(doc, group))))


def abort(options: AbortOptions, out: TextIO) -> int:
    """`fleet abort`: ask the running controller (record `aborting`); with none, abort here."""
    link = _connect(options.broker, options.model, out)
    if isinstance(link, int):
        return link
    try:
        record = link.record()
        if record is None or record.state not in LIVE:
            say(out, f"no running rollout of {options.model}" + (f" (it is {record.state})" if record else ""))
            return EXIT_NOT_DONE
        return _hand_over_abort(link, record.change(state=ABORTING), options, out)
    finally:
        link.stop()


def _hand_over_abort(link: ControllerLink, asked: RolloutRecord, options: AbortOptions, out: TextIO) -> int:
    mine = asked.to_json()
    with link.cond:
        start = len(link.records)

    def after_mine() -> list[bytes]:
        later = link.records[start:]
        return later[later.index(mine) + 1:] if mine in later else []

    publish_record(link, asked)
    if not link.wait(lambda: after_mine(), options.handoff_s):
        say(out, f"no controller answered within {options.handoff_s:g} s: applying on_abort {asked.on_abort} here")
        apply_on_abort(link, asked, out)
        say(out, f"rollout of {asked.model} serial {asked.serial} aborted")
        return EXIT_OK
    say(out, "the controller took the abort; waiting for it to finish")
    done = link.wait(lambda: (link.record() or asked).state in (ABORTED, COMPLETED), ABORT_DONE_S)
    final = link.record()
    say(out, f"rollout of {asked.model} serial {asked.serial} is {final.state if final else 'gone'}")
    return EXIT_OK if done and final is not None and final.state == ABORTED else EXIT_NOT_DONE


def rollback(options: RollbackOptions, out: TextIO) -> int:
    """`fleet rollback`: the `rollback` command to each node, then each one's answer (bounded)."""
    link = _connect(options.broker, options.model, out)
    if isinstance(link, int):
        return link
    try:
        nodes = options.nodes or _discover(link, options.model, None)
        if not nodes:
            say(out, f"error: no node reports model {options.model!r}")
            return EXIT_USAGE
        with link.cond:
            before = {node: link.reports.get(node, 0) for node in nodes}
            held = {node: _upward(link.reported.get(node), options.model) for node in nodes}
        sent = [node for node in nodes if held[node] is None]
        for node in sent:
            link.publish(cmd_topic(node), orjson.dumps({"cmd": "rollback", "model": options.model}), retain=False)
        with link.cond:
            link.cond.wait_for(lambda: all(rollback_answer(link, node, before[node], options.model)
                                           for node in sent), options.timeout_s)
            answers = {node: held[node] or rollback_answer(link, node, before[node], options.model) for node in nodes}
    finally:
        link.stop()
    for node in nodes:
        say(out, f"{node}: {answers[node] or f'no answer within {options.timeout_s:g} s'}")
    return EXIT_OK if all(a and a.startswith(reported_view.ROLLED_BACK) for a in answers.values()) else EXIT_NOT_DONE


def _upward(doc: Optional[dict], model: str) -> Optional[str]:
    """Why `rollback` is not sent to a node whose `previous` is above the serial it runs (a daemon
    from before rollbacks went by serial, sent down by an abort's restored entry: it would go up
    onto the release the abort left); None to send it."""
    entry = reported_view.model_entry(doc, model) or {}
    previous = entry.get("previous") if isinstance(entry.get("previous"), dict) else {}
    serial, back_to = entry.get("serial"), previous.get("serial")
    if isinstance(serial, int) and isinstance(back_to, int) and back_to > serial:
        return (f"not sent: it runs serial {serial} and its previous release is serial {back_to}, a later one "
                "(fleet rollback never moves a node forward)")
    return None


_FORMATTER = argparse.RawDescriptionHelpFormatter


def add_fleet_controller_args(fleet_subparsers: argparse._SubParsersAction) -> None:
    """Register status, rollout, abort and rollback under `fleet`; each sets `fleet_verb`, which
    `run_from_args` calls."""
    _add_status(fleet_subparsers)
    _add_rollout(fleet_subparsers)
    _add_abort(fleet_subparsers)
    _add_rollback(fleet_subparsers)


def run_from_args(args: argparse.Namespace, out: TextIO) -> int:
    return args.fleet_verb(args, out)


def _parser(sub: argparse._SubParsersAction, name: str, summary: str, description: str,
            example: str) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=summary, formatter_class=_FORMATTER,
                            description=f"{description}\n\nexample:\n  {example}")
    parser.add_argument("--broker", default="localhost:1883", metavar="ADDRESS",
                        help="the broker: HOST[:PORT], mqtt://... or mqtts://... (default localhost:1883)")
    return parser


def _nodes(text: str) -> tuple[str, ...]:
    return tuple(node.strip() for node in text.split(",") if node.strip())


def _add_status(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "status", "every node's fleet state, as a table", (
        "Read the retained edge-inferd/+/fleet/reported documents and print a row per node and model:\n"
        "version, serial, state (download %), gate, canary, error code, and the document's age.\n"
        "Exits 1 when no node has reported."), "edge-inferd fleet status --broker gateway.local:1883 --watch")
    p.add_argument("--model", metavar="M", help="only this model's rows")
    p.add_argument("--watch", nargs="?", const=WATCH_S, type=float, metavar="SECONDS",
                   help=f"keep following: redraw on each change and every SECONDS (default {WATCH_S:g}; Ctrl-C stops)")
    p.add_argument("--json", action="store_true", help="one JSON array of rows, for machines")
    p.set_defaults(fleet_verb=lambda a, out: status(StatusOptions(a.broker, a.model, a.watch, a.json), out))


def _add_rollout(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "rollout", "roll a release out in waves, aborting on failures", (
        "Write each wave's nodes a desired entry for the release, wait for each to report it active\n"
        "(or failed, or no answer within --wave-timeout), and abort by --abort-at / --success. The\n"
        "record, retained on edge-inferd/fleet/rollout/<model>, lets the same command resume after a\n"
        "kill. Exits 0 completed, 1 aborted, 2 a usage problem."),
        "edge-inferd fleet rollout --model activity --release http://releases.local/activity/4/ --serial 4")
    p.add_argument("--model", required=True, metavar="M", help="the model's name in the nodes' configs (models.<name>)")
    p.add_argument("--release", required=True, metavar="URL", help="the release directory")
    p.add_argument("--serial", required=True, type=int, metavar="N", help="the release's serial (its manifest's)")
    p.add_argument("--version", metavar="V", help="the release's version, for the record and people")
    p.add_argument("--waves", default=DEFAULT_WAVES, metavar="SPECS",
                   help=f"cumulative targets: counts, shares (rounded up) or node names (default {DEFAULT_WAVES.replace('%', '%%')})")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--nodes", type=_nodes, default=(), metavar="A,B,C", help="these nodes, in this order")
    which.add_argument("--group", metavar="G", help="the nodes that report this group")
    p.add_argument("--success", type=float, default=RolloutOptions.success, metavar="F",
                   help="a wave passes at this share of its nodes active (default %(default)s: all)")
    p.add_argument("--abort-at", type=float, default=RolloutOptions.abort_at, metavar="F",
                   help="abort once this share of the nodes judged so far failed (default %(default)s)")
    p.add_argument("--abort-min-nodes", type=int, default=RolloutOptions.abort_min_nodes, metavar="N",
                   help="... and at least N nodes failed (default %(default)s)")
    p.add_argument("--wave-timeout", type=float, default=RolloutOptions.wave_timeout_s, metavar="S",
                   help="a node of the wave not active, failed or rolled back within S seconds "
                        "counts as failed (default %(default)s)")
    p.add_argument("--on-abort", choices=ON_ABORT, default=ROLLBACK,
                   help="rollback: every assigned node's earlier desired entry back, but for the nodes "
                        "already active on the release, which keep it; halt: leave them (default %(default)s)")
    p.add_argument("--force", action="store_true", help="start even while another release's rollout runs")
    p.set_defaults(fleet_verb=lambda a, out: rollout(RolloutOptions(
        a.broker, a.model, a.release, a.serial, a.waves, a.version, a.nodes, a.group, a.success, a.abort_at,
        a.abort_min_nodes, a.wave_timeout, a.on_abort, a.force), out))


def _add_abort(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "abort", "abort a model's running rollout", (
        "Set the rollout record to aborting: the running controller applies its on_abort and writes\n"
        f"aborted. When none answers within {ABORT_HANDOFF_S:g} s, this command applies on_abort itself."),
        "edge-inferd fleet abort --model activity")
    p.add_argument("--model", required=True, metavar="M", help="the model's name in the nodes' configs (models.<name>)")
    p.set_defaults(fleet_verb=lambda a, out: abort(AbortOptions(a.broker, a.model), out))


def _add_rollback(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "rollback", "send nodes back to their previous release of a model", (
        "Send {\"cmd\": \"rollback\", \"model\": M} to each node's edge-inferd/<node>/fleet/cmd and wait for\n"
        "each to report rolled_back. Exits 1 when a node refused or did not answer."),
        "edge-inferd fleet rollback --model activity --nodes gw1,gw2")
    p.add_argument("--model", required=True, metavar="M", help="the model's name in the nodes' configs (models.<name>)")
    p.add_argument("--nodes", type=_nodes, default=(), metavar="A,B,C",
                   help="these nodes (default: every node that reports the model)")
    p.add_argument("--timeout", type=float, default=ROLLBACK_TIMEOUT_S, metavar="S",
                   help=f"wait this long for the answers (default {ROLLBACK_TIMEOUT_S:g})")
    p.set_defaults(fleet_verb=lambda a, out: rollback(RollbackOptions(a.broker, a.model, a.nodes, a.timeout), out))
