"""`edge-inferd fleet status|rollout|abort|rollback` (daemon/fleet/controller/controller.py) over a real
mosquitto, against scripted nodes (tests/fleet/fake_node.py) that speak docs/fleet.md.

Waits are on events (a node's state, the retained record, a process's exit) with generous limits;
a limit only decides how long a failing test takes.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Optional

import pytest

from daemon.fleet.controller import controller, fleet_status
from daemon.fleet.controller.controller import AbortOptions, RollbackOptions, RolloutOptions, StatusOptions
from daemon.fleet.controller.record import RolloutRecord
from daemon.tools.broker import Broker, end_process, free_port
from tests.fleet.fake_node import WAIT_S, FakeNode
from tests.fleet.watching import Screen, Watcher

ROOT = Path(__file__).resolve().parents[3]
MODEL = "activity"
GOOD = "http://releases.local/activity/2/"
BAD = "http://releases.local/activity/bad/"
RECORD = f"edge-inferd/fleet/rollout/{MODEL}"


@pytest.fixture
def broker(tmp_path):
    with Broker(tmp_path / "broker") as b:
        yield b


@pytest.fixture
def watcher(broker):
    w = Watcher(broker, RECORD, "edge-inferd/fleet/desired/node/+")
    yield w
    w.close()


@pytest.fixture
def nodes(broker):
    started: list[FakeNode] = []

    def start(*names: str, **settings) -> list[FakeNode]:
        made = [FakeNode(broker.port, name, MODEL, **settings) for name in names]
        started.extend(made)
        return made

    yield start
    for node in started:
        node.close()


def _options(broker: Broker, release: str = GOOD, **changes) -> RolloutOptions:
    settings = {"waves": "1,50%,100%", "wave_timeout_s": WAIT_S, **changes}
    return RolloutOptions(broker.address, MODEL, release, 2, **settings)


def _desired(watcher: Watcher, node: str) -> Optional[dict]:
    with watcher.cond:
        return watcher.latest.get(f"edge-inferd/fleet/desired/node/{node}")


def _in_thread(options: RolloutOptions) -> tuple[threading.Thread, dict]:
    """rollout() on a thread; the result holds its exit status and output once it ends."""
    result: dict = {}

    def run() -> None:
        out = io.StringIO()
        result["code"] = controller.rollout(options, out)
        result["out"] = out.getvalue()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def _subprocess(call: str, log: Path) -> subprocess.Popen:
    """A controller verb in a process of its own (`call` uses `c`, the controller module)."""
    code = f"import sys\nfrom daemon.fleet.controller import controller as c\nsys.exit({call})"
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})


def test_a_three_node_rollout_completes_wave_by_wave(broker, nodes, watcher):
    fleet = nodes("gw1", "gw2", "gw3")
    out = io.StringIO()
    assert controller.rollout(_options(broker, version="1.2.0"), out) == 0, out.getvalue()
    record = watcher.wait(RECORD, lambda r: r["state"] == "completed")
    assert record["assigned"] == {"gw1": 0, "gw2": 1, "gw3": 2}
    assert record["result"] == {"gw1": "active", "gw2": "active", "gw3": "active"}
    assert record["revs"] == {"gw1": 1, "gw2": 1, "gw3": 1} and record["previous"] == {"gw1": None, "gw2": None,
                                                                                       "gw3": None}
    for node in fleet:
        assert [d["models"][MODEL] for d in node.taken] == [{"url": GOOD, "serial": 2}]
    text = out.getvalue()
    for line in ("wave 1/3: gw1", "gw1: downloading 50%", "gw1: canary", "gw1: active serial 2", "wave 3/3 passed",
                 "rollout of activity serial 2 completed: 3 of 3 nodes assigned; 3 active"):
        assert line in text, text


def test_a_bad_release_aborts_on_the_first_wave_and_restores_the_desired_entry(broker, nodes, watcher):
    nodes("gw1", "gw2", "gw3")
    earlier = {"url": "http://releases.local/activity/1/", "serial": 1}
    watcher.publish("edge-inferd/fleet/desired/node/gw1", {"rev": 5, "models": {MODEL: earlier, "other": None}})
    out = io.StringIO()
    assert controller.rollout(_options(broker, BAD, on_abort="rollback"), out) == 1, out.getvalue()
    record = watcher.wait(RECORD, lambda r: r["state"] == "aborted")
    assert record["assigned"] == {"gw1": 0} and record["result"] == {"gw1": "failed"}
    restored = watcher.wait("edge-inferd/fleet/desired/node/gw1", lambda d: d["rev"] == 7)
    assert restored["models"] == {MODEL: earlier, "other": None}
    assert _desired(watcher, "gw2") is None and _desired(watcher, "gw3") is None
    assert "gw1: failed bad_signature" in out.getvalue()
    assert "gw1: desired entry restored to serial 1 (rev 7)" in out.getvalue()


def test_an_explicit_null_entry_is_restored_as_null_not_removed(broker, nodes, watcher):
    nodes("gw1", groups=("hall-a",))
    watcher.publish("edge-inferd/fleet/desired/node/gw1", {"rev": 3, "models": {MODEL: None}})
    assert controller.rollout(_options(broker, BAD, waves="100%"), io.StringIO()) == 1
    watcher.wait(RECORD, lambda r: r["state"] == "aborted")
    assert watcher.wait("edge-inferd/fleet/desired/node/gw1", lambda d: d["rev"] == 5)["models"] == {MODEL: None}


def test_halt_leaves_the_desired_entry_as_it_is(broker, nodes, watcher):
    nodes("gw1", "gw2")
    assert controller.rollout(_options(broker, BAD, on_abort="halt"), io.StringIO()) == 1
    watcher.wait(RECORD, lambda r: r["state"] == "aborted")
    assert _desired(watcher, "gw1") == {"rev": 1, "models": {MODEL: {"url": BAD, "serial": 2}}}


def test_an_abort_leaves_a_node_already_active_on_the_release_where_it_is(broker, nodes, watcher):
    """gw1 passed its gate and canary on serial 2; gw2's gate fails in wave 2 and aborts the rollout:
    gw1 keeps serial 2 (no new desired document, no `rollback`, so nothing refused as `operator`
    there), and only gw2's entry goes back."""
    first = nodes("gw1")[0]
    nodes("gw2", fails_gate=True)
    out = io.StringIO()
    # gw1 passes wave 1; gw2's gate fails in wave 2, which reaches --abort-at 0.5.
    assert controller.rollout(_options(broker, waves="1,100%"), out) == 1, out.getvalue()
    watcher.wait(RECORD, lambda r: r["state"] == "aborted" and r["result"] == {"gw1": "active", "gw2": "failed"})
    assert watcher.wait("edge-inferd/fleet/desired/node/gw2", lambda d: d["rev"] == 2)["models"] == {}
    assert _desired(watcher, "gw1") == {"rev": 1, "models": {MODEL: {"url": GOOD, "serial": 2}}}
    assert [d["rev"] for d in first.taken] == [1] and first.states[-1] == "active"
    assert "rolled_back" not in first.states
    text = out.getvalue()
    assert "gw1: active on serial 2: keeps it (its desired entry is left as it is)" in text, text
    assert "gw2: desired entry removed (rev 2)" in text and "sent rollback" not in text, text


def test_fleet_rollback_is_not_sent_to_a_node_it_would_move_forward(broker, nodes, watcher):
    """A scripted node keeps `previous` by time, as daemons did before rollbacks went by serial: sent
    down from serial 2 to 1 after an aborted rollout, its previous is 2, the aborted release.
    `fleet rollback` does not send it the command (it would go up onto 2) and says why."""
    first = nodes("gw1")[0]
    nodes("gw2", fails_gate=True)
    assert controller.rollout(_options(broker, waves="1,100%"), io.StringIO()) == 1
    watcher.wait(RECORD, lambda r: r["state"] == "aborted")
    watcher.publish(first.desired_topic, {"rev": 2, "models": {MODEL: {"url": "http://releases.local/activity/1/",
                                                                       "serial": 1}}})
    reported = Watcher(broker, "edge-inferd/gw1/fleet/reported")
    try:  # at the broker before `fleet rollback` reads it
        reported.wait("edge-inferd/gw1/fleet/reported", lambda d: d["models"][MODEL]["serial"] == 1
                      and d["models"][MODEL]["previous"]["serial"] == 2)
    finally:
        reported.close()
    out = io.StringIO()
    assert controller.rollback(RollbackOptions(broker.address, MODEL, timeout_s=WAIT_S), out) == 1, out.getvalue()
    lines = out.getvalue().splitlines()
    assert lines[0] == ("gw1: not sent: it runs serial 1 and its previous release is serial 2, a later one "
                        "(fleet rollback never moves a node forward)"), lines
    assert lines[1].startswith("gw2: refused"), lines
    assert "rolled_back" not in first.states


def test_a_node_that_never_answers_times_out_and_counts_as_failed(broker, nodes, watcher):
    nodes("gw1", silent=True)
    nodes("gw2")
    out = io.StringIO()
    # The timeout is what is tested: gw1 never answers, whatever the machine's speed.
    assert controller.rollout(_options(broker, wave_timeout_s=1.0), out) == 1
    record = watcher.wait(RECORD, lambda r: r["state"] == "aborted")
    assert record["result"] == {"gw1": "timeout"} and "gw1: no answer within 1 s" in out.getvalue()
    assert _desired(watcher, "gw1")["models"] == {} and _desired(watcher, "gw2") is None


def test_timeouts_count_towards_abort_at_even_when_the_wave_would_pass(broker, nodes, watcher):
    nodes("gw1", serial=2)  # runs the release already: judged active at once, however slow the machine
    nodes("gw2", "gw3", silent=True)
    out = io.StringIO()
    # --success 0.3: gw1 alone would pass the wave; the first timeout judged (1 of 2 >= 0.5) aborts it.
    assert controller.rollout(_options(broker, waves="100%", success=0.3, wave_timeout_s=1.0), out) == 1
    assert "aborting: 1 of 2 nodes failed (abort at 0.5)" in out.getvalue(), out.getvalue()


def test_a_killed_controller_resumes_without_assigning_twice(broker, nodes, watcher, tmp_path):
    gw1, gw2, gw3 = nodes("gw1"), nodes("gw2", hold_at="canary"), nodes("gw3")
    gw1, gw2, gw3 = gw1[0], gw2[0], gw3[0]
    options = _options(broker)
    call = (f"c.rollout(c.RolloutOptions({broker.address!r}, {MODEL!r}, {GOOD!r}, 2, waves='1,50%,100%', "
            f"wave_timeout_s={WAIT_S}), sys.stdout)")
    first = _subprocess(call, tmp_path / "first.log")
    gw2.wait_state("canary")
    watcher.wait(RECORD, lambda r: r["assigned"] == {"gw1": 0, "gw2": 1} and r["revs"].get("gw2") == 1)
    first.kill()
    first.wait(WAIT_S)
    gw2.go.set()
    out = io.StringIO()
    assert controller.rollout(options, out) == 0, (tmp_path / "first.log").read_text() + out.getvalue()
    assert "resuming the rollout" in out.getvalue()
    record = watcher.wait(RECORD, lambda r: r["state"] == "completed")
    assert record["revs"] == {"gw1": 1, "gw2": 1, "gw3": 1}
    assert [len(node.taken) for node in (gw1, gw2, gw3)] == [1, 1, 1]  # no node assigned twice


def test_the_rollout_survives_a_broker_restart(broker, nodes, watcher):
    held = nodes("gw1", hold_at="canary")[0]
    nodes("gw2")
    thread, result = _in_thread(_options(broker))
    held.wait_state("canary")
    watcher.wait(RECORD, lambda r: r["revs"] == {"gw1": 1})
    broker.stop()  # SIGTERM: mosquitto saves its retained messages (persistence is on)
    broker.start()
    held.go.set()
    thread.join(WAIT_S * 2)
    assert result.get("code") == 0, result
    record = watcher.wait(RECORD, lambda r: r["state"] == "completed")
    assert record["revs"] == {"gw1": 1, "gw2": 1} and record["result"] == {"gw1": "active", "gw2": "active"}


def test_abort_from_a_second_process_is_applied_by_the_running_controller(broker, nodes, watcher, tmp_path):
    held = nodes("gw1", hold_at="canary")[0]
    nodes("gw2")
    thread, result = _in_thread(_options(broker))
    held.wait_state("canary")
    watcher.wait(RECORD, lambda r: r["revs"] == {"gw1": 1})
    second = _subprocess(f"c.abort(c.AbortOptions({broker.address!r}, {MODEL!r}, handoff_s={WAIT_S}), sys.stdout)",
                         tmp_path / "abort.log")  # the controller answers at once: a long limit only bounds a failure
    assert second.wait(WAIT_S) == 0, (tmp_path / "abort.log").read_text()
    thread.join(WAIT_S)
    assert result.get("code") == 1, result
    assert "aborting: aborted by the operator" in result["out"]
    assert "the controller took the abort" in (tmp_path / "abort.log").read_text()
    watcher.wait(RECORD, lambda r: r["state"] == "aborted")
    assert watcher.wait("edge-inferd/fleet/desired/node/gw1", lambda d: d["rev"] == 2)["models"] == {}


def test_abort_with_no_controller_running_applies_on_abort_itself(broker, nodes, watcher, tmp_path):
    held = nodes("gw1", hold_at="canary")[0]
    nodes("gw2")
    call = f"c.rollout(c.RolloutOptions({broker.address!r}, {MODEL!r}, {GOOD!r}, 2, waves='1,100%'), sys.stdout)"
    first = _subprocess(call, tmp_path / "first.log")
    held.wait_state("canary")
    watcher.wait(RECORD, lambda r: r["revs"] == {"gw1": 1})
    end_process(first, signal.SIGKILL)
    out = io.StringIO()
    assert controller.abort(AbortOptions(broker.address, MODEL, handoff_s=1.0), out) == 0, out.getvalue()
    assert "no controller answered" in out.getvalue()
    watcher.wait(RECORD, lambda r: r["state"] == "aborted")
    assert watcher.wait("edge-inferd/fleet/desired/node/gw1", lambda d: d["rev"] == 2)["models"] == {}


def test_another_release_still_running_makes_a_new_rollout_refuse_unless_forced(broker, nodes, watcher):
    nodes("gw1")
    other = RolloutRecord(MODEL, "http://releases.local/activity/9/", 9, None, ("100%",), ("gw1",), "running",
                          1.0, 0.5, 1, 600.0, "rollback")
    watcher.publish(RECORD, json.loads(other.to_json()))
    out = io.StringIO()
    assert controller.rollout(_options(broker), out) == 2 and "serial 9" in out.getvalue()
    assert controller.rollout(_options(broker, force=True), io.StringIO()) == 0


def test_fleet_status_json_shows_the_nodes(broker, nodes):
    nodes("gw1", "gw2")
    out = io.StringIO()
    assert controller.status(StatusOptions(broker.address, json=True), out) == 0
    rows = json.loads(out.getvalue())
    assert [(r["node"], r["model"], r["state"], r["serial"]) for r in rows] == [("gw1", MODEL, "active", 1),
                                                                                ("gw2", MODEL, "active", 1)]
    assert all(r["age_s"] is not None and r["age_s"] < WAIT_S for r in rows)
    table = io.StringIO()
    assert controller.status(StatusOptions(broker.address, model=MODEL), table) == 0
    assert table.getvalue().splitlines()[0].split() == list(fleet_status.COLUMNS)


def test_fleet_status_watch_redraws_when_a_document_changes(broker, nodes):
    nodes("gw1")
    screen, stop = Screen(), threading.Event()
    thread = threading.Thread(target=controller.status, args=(StatusOptions(broker.address, watch_s=WAIT_S), screen,
                                                               stop), daemon=True)
    thread.start()
    screen.wait_for("gw1")
    nodes("gw2")  # its first reported document redraws the table long before WAIT_S
    screen.wait_for("gw2")
    assert screen.getvalue().count("fleet status --watch") >= 2 and screen.getvalue().startswith("-" * 80)
    stop.set()
    nodes("gw3")  # a change wakes the loop, which sees `stop`
    thread.join(WAIT_S)
    assert not thread.is_alive()


def test_fleet_status_with_no_node_says_so(broker):
    out = io.StringIO()
    assert controller.status(StatusOptions(broker.address), out) == 1
    assert "no edge-inferd node has reported" in out.getvalue()


def test_fleet_rollback_sends_the_command_and_reports_each_node(broker, nodes):
    fleet = nodes("gw1", "gw2")
    assert controller.rollout(_options(broker, waves="100%"), io.StringIO()) == 0
    out = io.StringIO()
    assert controller.rollback(RollbackOptions(broker.address, MODEL), out) == 0, out.getvalue()
    assert out.getvalue().splitlines() == ["gw1: rolled_back to serial 1", "gw2: rolled_back to serial 1"]
    assert all("rolled_back" in node.states for node in fleet)


def test_usage_problems_exit_2_before_connecting(broker):
    out = io.StringIO()
    assert controller.rollout(RolloutOptions(broker.address, MODEL, GOOD, 2, waves="1,50%", success=2.0,
                                             nodes=("a",), group="g"), out) == 2
    assert "--success" in out.getvalue() and "--nodes and --group" in out.getvalue()
    assert controller.rollout(RolloutOptions(broker.address, MODEL, GOOD, 2), io.StringIO()) == 2  # no node


def test_group_picks_the_nodes_that_report_it(broker, nodes, watcher):
    nodes("gw1", "gw3", groups=("hall-a",))
    nodes("gw2", groups=("hall-b",))
    assert controller.rollout(_options(broker, waves="100%", group="hall-a"), io.StringIO()) == 0
    record = watcher.wait(RECORD, lambda r: r["state"] == "completed")
    assert record["nodes"] == ["gw1", "gw3"] and _desired(watcher, "gw2") is None


def test_the_table_reads_download_gate_canary_error_and_age():
    now = 1_700_000_000.0
    reported = {
        "gw1": {"time": now - 12, "models": {MODEL: {"state": "downloading", "version": "1.1.0", "serial": 1,
                                                     "progress": {"bytes": 450, "total": 1000}}}},
        "gw2": {"models": {MODEL: {
            "state": "canary", "version": "1.2.0", "serial": 2,
            "gate": {"passed": True, "routes": {"a": {"metric": "accuracy", "value": 0.975}}},
            "canary": {"answers": 812, "min_answers": 200, "elapsed_s": 41.2, "duration_s": 60, "psi": 0.012,
                       "latency_ratio": 1.04}}}},
        "gw3": {"models": {MODEL: {"state": "failed", "serial": 1, "error": {"code": "gate", "message": "worse"}},
                           "other": {"state": "active", "serial": 7}}},
    }
    table_rows = fleet_status.rows(reported, MODEL, now)
    assert [r["node"] for r in table_rows] == ["gw1", "gw2", "gw3"]  # --model: other's row left out
    lines = fleet_status.render(table_rows).splitlines()
    assert lines[1].split() == ["gw1", MODEL, "1.1.0", "1", "downloading", "45%", "-", "-", "-", "12s"]
    assert "pass accuracy 0.975" in lines[2] and "812/200 41/60s psi 0.012 lat x1.04" in lines[2] and lines[2].endswith("-")
    assert lines[3].split()[-2:] == ["gate", "-"]
    assert len(fleet_status.rows(reported, None, now)) == 4


def test_the_error_cell_shows_an_old_refusal_only_while_it_is_the_word_on_the_target():
    untrusted = {"serial": 2, "version": "1.1.0", "code": "untrusted_key", "message": "signed by another key"}
    reported = {"gw1": {"models": {MODEL: {"state": "active", "serial": 3, "target": {"serial": 3},
                                           "rejected": [untrusted]}}},
                "gw2": {"models": {MODEL: {"state": "downloading", "serial": 1, "target": {"serial": 2},
                                           "rejected": [untrusted]}}}}
    assert [r["error"] for r in fleet_status.rows(reported, MODEL, 0.0)] == [None, "last: untrusted_key"]


def test_the_argparse_helper_registers_the_verbs_and_runs_the_one_parsed(broker, nodes):
    import argparse

    nodes("gw1")
    parser = argparse.ArgumentParser(prog="edge-inferd")
    fleet = parser.add_subparsers(dest="command").add_parser("fleet").add_subparsers(dest="fleet_command")
    controller.add_fleet_controller_args(fleet)
    out = io.StringIO()
    args = parser.parse_args(["fleet", "status", "--broker", broker.address, "--json", "--model", MODEL])
    assert controller.run_from_args(args, out) == 0 and json.loads(out.getvalue())[0]["node"] == "gw1"
    args = parser.parse_args(["fleet", "rollout", "--broker", broker.address, "--model", MODEL, "--release", GOOD,
                              "--serial", "2", "--waves", "100%", "--nodes", "gw1", "--on-abort", "halt"])
    assert controller.run_from_args(args, io.StringIO()) == 0
    for verb in ("abort", "rollback"):
        assert parser.parse_args(["fleet", verb, "--model", MODEL]).fleet_verb is not None


def test_rollout_help_gives_every_default():
    import argparse

    fleet = argparse.ArgumentParser(prog="edge-inferd").add_subparsers().add_parser("fleet").add_subparsers()
    controller.add_fleet_controller_args(fleet)
    text = " ".join(fleet.choices["rollout"].format_help().split())
    for option, default in (("--success F", "(default 1.0: all)"), ("--abort-at F", "(default 0.5)"),
                            ("--abort-min-nodes N", "(default 1)"), ("--wave-timeout S", "(default 600.0)"),
                            ("--on-abort {rollback,halt}", "(default rollback)")):
        help_of = text.split(f" {option} ", 1)[1].split(" --", 1)[0]  # up to the next option
        assert default in help_of, (option, help_of)


def test_an_unreachable_broker_exits_1_and_a_bad_address_2():
    out = io.StringIO()
    closed = free_port()  # nothing listens there
    assert controller.status(StatusOptions(f"127.0.0.1:{closed}"), out) == 1 and "cannot reach" in out.getvalue()
    assert controller.abort(AbortOptions("mqtt://a/b", MODEL), io.StringIO()) == 2
    assert controller.status(StatusOptions(f"127.0.0.1:{closed}", watch_s=0), io.StringIO()) == 2
