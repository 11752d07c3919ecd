"""What bench e2e sends and how it reports rounds: distinct requests from any JSON route, medians."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from daemon import cli_parser
from daemon.errors import DaemonError
from daemon.tools.bench import e2e as bench_e2e
from daemon.tools.bench import plan as bench_plan
from daemon.tools.bench.plan import Plan
from daemon.tools.bench.rounds import merge
from daemon.tools.bench.workload import build_workload, distinct_share

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config.yaml"
POOL = 64


def _int8_inputs(workload, ids) -> set[bytes]:
    from daemon.config.loader import load_config
    from daemon.model import preprocess
    from daemon.model.runtime import Model

    rows = np.stack([np.asarray(json.loads(workload.line(i))["data"], dtype=np.float32) for i in ids])
    model = Model(load_config(CONFIG).models[workload.route.model].path)
    q = model.quantize(preprocess.apply_steps(workload.route.preprocess, rows))
    return {row.tobytes() for row in q}


@pytest.mark.parametrize("route", ["activity", "gunpoint"])
def test_requests_never_repeat_as_the_cache_sees_them(route):
    workload = build_workload(CONFIG, route, pool=POOL)
    ids = list(range(-3, 3 * POOL))  # warm-ups, and three passes over the pool
    assert len(_int8_inputs(workload, ids)) == len(ids)
    assert distinct_share(CONFIG, workload) == 1.0


def test_requests_are_the_routes_shape_from_its_validate_data_and_topics():
    workload = build_workload(CONFIG, "gunpoint", pool=POOL)
    request = json.loads(workload.line(5))
    assert request["id"] == 5 and np.asarray(request["data"]).shape == (150, 1)
    assert workload.source.startswith("validate data") and workload.source.endswith("gunpoint/test.npz")
    with np.load(ROOT / "models/gunpoint/test.npz") as data:  # near a real sample, not noise
        assert np.abs(np.asarray(request["data"]) - data["x"][5]).mean() < 0.5
    assert (workload.request_topic, workload.reply_topic) == ("sensors/bench/gesture", "results/bench/gesture")


def test_a_route_without_validate_data_gets_values_of_its_input_shape():
    workload = build_workload(CONFIG, "load-profile", pool=POOL)
    assert workload.source == "normal(0, 1) of input.shape"
    assert np.asarray(json.loads(workload.line(0))["data"]).shape == (24,)
    assert len(_int8_inputs(workload, range(2 * POOL))) == 2 * POOL


def test_a_route_that_is_not_json_is_refused_with_the_reason():
    with pytest.raises(DaemonError, match="mosquitto_pub -l.*json route, not 'raw'"):
        build_workload(CONFIG, "activity-raw")
    with pytest.raises(DaemonError, match="no route named 'nope'"):
        build_workload(CONFIG, "nope")


def test_the_issue_phases_run_only_when_named_and_the_parser_knows_them_all():
    assert Plan.build(CONFIG, Path("out")).phases == bench_plan.PHASES
    assert Plan.build(CONFIG, Path("out"), only=["overload", "burst30k"]).phases == ("burst30k", "overload")
    assert cli_parser.ALL_BENCH_PHASES == bench_plan.ALL_PHASES
    assert cli_parser.BENCH_ALSO == tuple(bench_e2e.ALSO)
    assert cli_parser.build().parse_args(["bench", "e2e", "--also", "echo-v5"]).also == ["echo-v5"]
    args = cli_parser.build().parse_args(["bench", "e2e", "--route", "gunpoint", "--rounds", "3", "--only", "cachepair"])
    assert (args.route, args.rounds, args.only) == ("gunpoint", 3, ["cachepair"])
    with pytest.raises(DaemonError, match="--rounds"):
        Plan.build(CONFIG, Path("out"), rounds=0)


def test_rounds_merge_to_medians_and_keep_each_round():
    rounds = [{"drain": {"echo": {"rps": 100.0, "lost": 0, "p99": None, "name": "a"}}, "openloop": {"x": [{"p": 1}]}},
              {"drain": {"echo": {"rps": 300.0, "lost": 2, "p99": 5.0, "name": "b"}}, "openloop": {"x": [{"p": 3}]}},
              {"drain": {"echo": {"rps": 200.0, "lost": 1, "p99": 7.0, "name": "c"}}, "openloop": {"x": [{"p": 2}]}}]
    merged = merge(rounds)
    assert merged["drain"]["echo"] == {"rps": 200.0, "lost": 1, "p99": 6.0, "name": "a"}
    assert merged["openloop"]["x"] == [{"p": 2}]
    assert merged["rounds"] == rounds
    assert merge(rounds[:1]) is rounds[0]
