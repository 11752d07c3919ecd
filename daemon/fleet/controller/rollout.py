"""The rollout engine: assign each wave's nodes their desired release, judge them from their
reported documents, and abort by the record's rules (docs/fleet.md, "Rollout record").

The record is published before each desired document it announces: killed between the two, a
controller started again finds the node assigned, checks whether its desired document already
carries the release at the recorded `rev`, and writes it only when it does not. No node is
assigned twice and every `rev` it writes is above the one before.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional, TextIO

import orjson

from daemon.fleet.controller import reported_view
from daemon.fleet.controller.controller_link import ControllerLink, desired_topic
from daemon.fleet.controller.record import (ABORTED, ABORTING, COMPLETED, EXPLICIT_NULL, ROLLBACK, TIMEOUT, RolloutRecord,
                                 topic)
from daemon.fleet.controller.waves import plan

logger = logging.getLogger(__name__)

EXIT_COMPLETED = 0
EXIT_ABORTED = 1
FAILURES = (reported_view.FAILED, reported_view.ROLLED_BACK, TIMEOUT)


def say(out: TextIO, line: str) -> None:
    out.write(line + "\n")
    out.flush()


class Rollout:
    """One rollout (new or resumed) over `link`; `run()` returns EXIT_COMPLETED or EXIT_ABORTED."""

    def __init__(self, link: ControllerLink, record: RolloutRecord, out: TextIO,
                 clock: Callable[[], float] = time.monotonic):
        self.link = link
        self.record = record
        self.out = out
        self._clock = clock
        self._shown: dict[str, str] = {}  # node -> the state line last printed

    def run(self) -> int:
        waves = plan(self.record.waves, self.record.nodes)
        self.link.watch(self.record)
        for index in range(self.record.wave, len(waves)):
            if index != self.record.wave:
                self._save(wave=index)
            say(self.out, f"wave {index + 1}/{len(waves)}: {', '.join(waves[index])}")
            reason = self._run_wave(waves[index])
            if reason:
                return self.abort(reason)
            say(self.out, f"wave {index + 1}/{len(waves)} passed")
        self._save(state=COMPLETED)
        self._summary(COMPLETED)
        return EXIT_COMPLETED

    def _run_wave(self, wave: tuple[str, ...]) -> Optional[str]:
        """None when the wave passed, else why the rollout aborts."""
        with self.link.cond:  # before assigning: each state the nodes report after it is in the log
            seen = len(self.link.report_log)
            news = [(node, self.link.reported.get(node)) for node in wave]
        for node in wave:
            self._assign(node)
        deadline = self._clock() + self.record.wave_timeout_s
        while True:
            reason = self._interrupted() or self._judge(wave, news)
            if reason:
                return reason
            pending = [node for node in wave if node not in self.record.result]
            if not pending:
                return self._wave_verdict(wave)
            left = deadline - self._clock()
            if left <= 0:
                reasons = [self._settle(node, TIMEOUT, f"{node}: no answer within {self.record.wave_timeout_s:g} s")
                           for node in pending]
                return next((reason for reason in reasons if reason), None) or self._wave_verdict(wave)
            self.link.wait(lambda: len(self.link.report_log) != seen or self.link.abort_requested
                           or self.link.superseded is not None, left)
            with self.link.cond:
                news, seen = self.link.report_log[seen:], len(self.link.report_log)

    def _interrupted(self) -> Optional[str]:
        if self.link.superseded is not None:
            other = self.link.superseded
            return f"superseded by a rollout of {other.release} (serial {other.serial})"
        return "aborted by the operator (fleet abort)" if self.link.abort_requested else None

    def _assign(self, node: str) -> None:
        """Record, then write, the node's desired entry; on a resume only what is missing."""
        model, rec = self.record.model, self.record
        with self.link.cond:
            doc = dict(self.link.desired.get(node) or {})
        models = doc.get("models") if isinstance(doc.get("models"), dict) else {}
        if node in rec.assigned:
            if _rev(doc) >= rec.revs.get(node, 0) and models.get(model) == rec.entry():
                return  # written before the restart
            rev = max(_rev(doc) + 1, rec.revs.get(node, 0))
            self._save(revs={**rec.revs, node: rev})
        else:
            rev = _rev(doc) + 1
            previous = EXPLICIT_NULL if model in models and models[model] is None else models.get(model)
            self._save(assigned={**rec.assigned, node: rec.wave}, previous={**rec.previous, node: previous},
                       revs={**rec.revs, node: rev})
        wanted = {**doc, "rev": rev, "models": {**models, model: rec.entry()}}
        self.link.publish(desired_topic(node), orjson.dumps(wanted), retain=True)
        say(self.out, f"{node}: assigned {rec.release} (serial {rec.serial}, rev {rev})")

    def _judge(self, wave: tuple[str, ...], news: list[tuple[str, Optional[dict]]]) -> Optional[str]:
        """Each new reported document of a wave's node not judged yet, in order: a line per
        state change, and the node's result once it has one."""
        for node, doc in news:
            if node not in wave or node in self.record.result:
                continue
            entry = reported_view.model_entry(doc, self.record.model)
            line = reported_view.describe(entry)
            if self._shown.get(node) != line:
                self._shown[node] = line
                say(self.out, f"{node}: {line}")
            verdict = reported_view.verdict(entry, self.record.serial)
            if verdict:
                reason = self._settle(node, verdict)
                if reason:
                    return reason
        return None

    def _settle(self, node: str, result: str, line: str = "") -> Optional[str]:
        """Record a node's result; why the rollout aborts when the failures reach the threshold."""
        if line:
            say(self.out, line)
        self._save(result={**self.record.result, node: result})
        results = list(self.record.result.values())
        failed = sum(1 for r in results if r in FAILURES)
        if failed >= self.record.min_nodes and failed / len(results) >= self.record.abort_at:
            return f"{failed} of {len(results)} nodes failed (abort at {self.record.abort_at:g})"
        return None

    def _wave_verdict(self, wave: tuple[str, ...]) -> Optional[str]:
        active = sum(1 for node in wave if self.record.result[node] == reported_view.ACTIVE)
        if active / len(wave) >= self.record.success:
            return None
        return f"{active} of {len(wave)} nodes of the wave active, below --success {self.record.success:g}"

    def abort(self, reason: str) -> int:
        logger.info("rollout of %s serial %s aborting: %s", self.record.model, self.record.serial, reason)
        say(self.out, f"aborting: {reason}")
        if self.link.superseded is not None:
            self._summary("left to the newer rollout")  # its record is the retained one now: leave it
            return EXIT_ABORTED
        self.record = apply_on_abort(self.link, self.record, self.out)
        self._summary(ABORTED)
        return EXIT_ABORTED

    def _save(self, **changes) -> None:
        self.record = self.record.change(**changes)
        publish_record(self.link, self.record)

    def _summary(self, how: str) -> None:
        counts: dict[str, int] = {}
        for result in self.record.result.values():
            counts[result] = counts.get(result, 0) + 1
        by = ", ".join(f"{n} {result}" for result, n in sorted(counts.items())) or "no node judged"
        say(self.out, f"rollout of {self.record.model} serial {self.record.serial} {how}: "
                      f"{len(self.record.assigned)} of {len(self.record.nodes)} nodes assigned; {by}")


def publish_record(link: ControllerLink, record: RolloutRecord) -> None:
    link.publish(topic(record.model), record.to_json(), retain=True)


def apply_on_abort(link: ControllerLink, record: RolloutRecord, out: TextIO) -> RolloutRecord:
    """`aborting`, then on_abort (rollback: every assigned node's previous entry back, but for the
    nodes already active on the release), then `aborted`. Shared by the controller and by `fleet
    abort` when no controller is there to do it."""
    record = record.change(state=ABORTING)
    publish_record(link, record)
    if record.on_abort == ROLLBACK:
        for node in sorted(record.assigned, key=lambda n: (record.assigned[n], n)):
            if _healthy(link, record, node):
                say(out, f"{node}: active on serial {record.serial}: keeps it (its desired entry is left as it is)")
            else:
                record = _restore(link, record, node, out)
    else:
        say(out, "on_abort halt: every desired document is left as it is")
    record = record.change(state=ABORTED)
    publish_record(link, record)
    return record


def _healthy(link: ControllerLink, record: RolloutRecord, node: str) -> bool:
    """The node runs the release and its reported document says `active`: it passed its own gate and
    canary on it. Another node's failure is no reason to take it away: sent back, the node would
    also refuse the good release as `operator` from then on. `fleet rollback --nodes` still can."""
    with link.cond:
        entry = reported_view.model_entry(link.reported.get(node), record.model)
    return reported_view.verdict(entry, record.serial) == reported_view.ACTIVE


def _restore(link: ControllerLink, record: RolloutRecord, node: str, out: TextIO) -> RolloutRecord:
    """The node's previous desired entry for the model (or none) back, with the next rev."""
    with link.cond:
        doc = dict(link.desired.get(node) or {})
    models = dict(doc.get("models")) if isinstance(doc.get("models"), dict) else {}
    previous = record.previous.get(node)
    if previous is None:
        models.pop(record.model, None)
    else:
        models[record.model] = None if previous == EXPLICIT_NULL else previous
    rev = max(_rev(doc), record.revs.get(node, 0)) + 1
    record = record.change(revs={**record.revs, node: rev})
    publish_record(link, record)
    link.publish(desired_topic(node), orjson.dumps({**doc, "rev": rev, "models": models}), retain=True)
    said = ("removed" if previous is None else "restored to null" if previous == EXPLICIT_NULL
            else f"restored to serial {previous.get('serial')}")
    say(out, f"{node}: desired entry {said} (rev {rev})")
    return record


def rollback_answer(link: ControllerLink, node: str, before: int, model: str) -> Optional[str]:
    """What a reported document sent after the rollback command says (None: nothing yet); under
    `link.cond`."""
    if link.reports.get(node, 0) <= before:
        return None
    doc = link.reported.get(node) or {}
    entry = reported_view.model_entry(doc, model)
    if entry is not None and entry.get("state") == reported_view.ROLLED_BACK:
        serial = entry.get("serial")
        return f"{reported_view.ROLLED_BACK} to " + ("its configured files" if serial is None else f"serial {serial}")
    last = doc.get("last_cmd")
    if isinstance(last, dict) and last.get("cmd") == "rollback" and last.get("ok") is False:
        return f"refused: {last.get('message', '')}"
    return None


def _rev(doc: dict) -> int:
    rev = doc.get("rev")
    return rev if isinstance(rev, int) else 0
