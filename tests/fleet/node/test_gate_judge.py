"""The gate's verdict on the child's figures (the child itself runs in tests/fleet/test_node.py)."""

from __future__ import annotations

import pytest

from daemon.config.fleet import GateConfig
from daemon.fleet.node.gate import judge
from daemon.fleet.release.refusal import Refused

GATE = GateConfig(max_drop_vs_current=0.02, claim_tolerance=0.01)


def figures(metric, value, current, sha="d" * 64):
    return {"metric": metric, "value": value, "current": current, "data": "v.npz", "data_sha256": sha}


def test_no_worse_than_current_within_the_drop_passes():
    out = judge({"r": figures("accuracy", 0.95, 0.96)}, [], GATE)
    assert out["passed"] and out["routes"]["r"] == {"metric": "accuracy", "value": 0.95, "current": 0.96}


@pytest.mark.parametrize("metric, value, current", [("accuracy", 0.90, 0.96), ("roc_auc", 0.5, 0.97),
                                                    ("mae", 0.30, 0.20)])
def test_a_drop_past_the_limit_fails_with_both_figures(metric, value, current):
    with pytest.raises(Refused) as caught:
        judge({"r": figures(metric, value, current)}, [], GATE)
    assert caught.value.code == "gate"
    assert f"{value:.4f}" in caught.value.message and f"{current:.4f}" in caught.value.message


def test_a_lower_mae_is_better():
    assert judge({"r": figures("mae", 0.1, 0.2)}, [], GATE)["passed"]


def test_a_claim_on_this_nodes_file_must_match():
    claims = [{"validate_sha256": "d" * 64, "metric": "accuracy", "value": 0.99}]
    with pytest.raises(Refused) as caught:
        judge({"r": figures("accuracy", 0.95, 0.94)}, claims, GATE)
    assert caught.value.code == "claim" and "0.9900" in caught.value.message
    out = judge({"r": figures("accuracy", 0.985, 0.94)}, claims, GATE)
    assert out["routes"]["r"]["claimed"] == 0.99


def test_a_claim_on_another_file_is_not_judged():
    claims = [{"validate_sha256": "e" * 64, "metric": "accuracy", "value": 0.5}]
    assert judge({"r": figures("accuracy", 0.95, 0.94)}, claims, GATE)["passed"]
