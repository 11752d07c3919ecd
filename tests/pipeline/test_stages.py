"""The pure chain of `stages` (daemon/pipeline/stages.py) with fake models: frames, windows, each
stage's batching, the answer per window, `publish_stages` and the chain's cache key. The real
openWakeWord chain is in tests/model/test_stages_chain.py."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from daemon.config.schema import VALUES, InputConfig, RouteConfig
from daemon.config.stages import StageConfig, WindowConfig
from daemon.model.preprocess import Normalize
from daemon.pipeline import stages
from daemon.pipeline.postprocess import ModelOutputs
from daemon.pipeline.request_path import handle_batch
from daemon.pipeline.route_pipeline import Request, RoutePipeline
from tests.fakes import DictCache, FakeClock

FRAMES, FEATURES = 10, 3  # stage 0 turns a request of FRAMES * FEATURES values into FRAMES frames


class Fake:
    """A model that records each invoke's batch; its output is `fn` of each input row."""

    cost_per_sample_s = 0.0

    def __init__(self, fn, num_outputs: int):
        self.fn, self.num_outputs, self.batches = fn, num_outputs, []

    def quantize(self, batch, as_is=False):
        return np.asarray(batch, dtype=np.float32)

    def infer_quantized(self, q):
        self.batches.append(q.shape)
        return np.stack([np.ravel(self.fn(row)) for row in q]).astype(np.float32)

    def take_invokes(self):
        return []


def _route(kind="classify", **keys) -> RouteConfig:
    chain = (StageConfig("sum", preprocess=(Normalize(mean=0.0, std=2.0),), window=WindowConfig(size=4, hop=2)),
             StageConfig("last", window=WindowConfig(size=2, hop=1)))
    return RouteConfig(name="r", subscribe="s/+", model="first", input=InputConfig(format="raw", shape=(FRAMES * FEATURES,)),
                       preprocess=(), top_k=1, publish="o/{1}", kind=kind, stages=chain, **keys)


def _pipe(route: RouteConfig, last_sha: str = "cc" * 32) -> RoutePipeline:
    # first: (1, FRAMES, FEATURES) -> frames (10, 3); sum: windows (4, 3) -> one value each: frames (4,);
    # last: windows of 2 frames -> one score each: 3 windows
    plan = stages.plan(route, "aa" * 32, (1, FRAMES, FEATURES), [("bb" * 32, (1, 1)), (last_sha, (1, 1))])
    outputs = ModelOutputs(("score",), ((1,),), (0, 1), (1, 1))
    return RoutePipeline(route, "aa" * 32, ("wake",), outputs, chain=plan)


def _models():
    first = Fake(lambda row: row, FRAMES * FEATURES)
    summed = Fake(lambda window: window.sum(), 1)
    last = Fake(lambda window: window[1] - window[0], 1)
    return first, summed, last


def _request(seed: int) -> Request:
    x = np.random.default_rng(seed).standard_normal(FRAMES * FEATURES).astype("<f4")
    return Request(x.tobytes(), 0.0)


def _direct(payload: bytes) -> np.ndarray:
    """The chain computed here, window by window: what the daemon must answer."""
    frames = np.frombuffer(payload, "<f4").reshape(FRAMES, FEATURES)
    sums = np.array([(frames[s:s + 4] / 2.0).sum() for s in range(0, FRAMES - 4 + 1, 2)])
    return np.array([sums[s + 1] - sums[s] for s in range(len(sums) - 1)])


def test_windows_are_every_whole_window_in_order_and_drop_the_rest():
    frames = np.arange(2 * 7 * 2).reshape(2, 7, 2)
    got = stages.windows(frames, WindowConfig(size=3, hop=2))  # starts 0, 2, 4; frame 6 is left over
    assert got.shape == (2 * 3, 3, 2)
    np.testing.assert_array_equal(got[4], frames[1, 2:5])


def test_each_stage_runs_every_window_of_every_request_in_one_batch_and_answers_as_computed_directly():
    first, summed, last = _models()
    requests = [_request(1), _request(2)]
    outcome = handle_batch(_pipe(_route()), requests, first, None, FakeClock(), stage_models=[summed, last])
    assert first.batches == [(2, FRAMES * FEATURES)]
    assert summed.batches == [(2 * 4, 4, FEATURES)]  # 4 windows per request, all in one batch
    assert last.batches == [(2 * 3, 2)]
    for request, reply in zip(requests, outcome.replies):
        want = _direct(request.payload)
        assert [w["score"] for w in reply["windows"]] == [round(float(v), 6) for v in want]
        assert reply["window"] == int(np.argmax(want)) and reply["score"] == round(float(want.max()), 6)
        assert reply["label"] == "wake" and reply["top_k"] == [{"label": "wake", "score": reply["score"]}]
    assert outcome.counts == {"stage_windows.sum": 8, "stage_windows.last": 6}
    assert {"stage0:first", "stage1:sum", "stage2:last", "infer"} <= set(outcome.stages)


def test_values_answer_with_the_last_window_on_top_and_every_window_listed():
    first, summed, last = _models()
    request = _request(3)
    reply = handle_batch(_pipe(_route(kind=VALUES)), [request], first, None, FakeClock(),
                         stage_models=[summed, last]).replies[0]
    want = _direct(request.payload)
    assert reply["window"] == 2 and reply["values"]["score"] == pytest.approx([want[-1]], abs=1e-5)
    assert [w["values"]["score"][0] for w in reply["windows"]] == pytest.approx(want, abs=1e-5)


def test_publish_stages_adds_each_earlier_output_and_leaves_a_large_one_out():
    first, summed, last = _models()
    request = _request(4)
    route = _route(publish_stages=True)
    reply = handle_batch(_pipe(route), [request], first, None, FakeClock(), stage_models=[summed, last]).replies[0]
    published = reply["stages"]
    assert [(s["model"], s["frames"], s["shape"]) for s in published] == [("first", FRAMES, [FRAMES, FEATURES]),
                                                                         ("sum", 4, [4])]
    np.testing.assert_allclose(published[0]["values"], np.frombuffer(request.payload, "<f4").reshape(FRAMES, FEATURES),
                               atol=1e-6)
    json.dumps(reply)  # a reply is JSON
    big = stages.published(_pipe(route).chain, "first", [np.zeros((1, 4097))], 0)
    assert big == [{"model": "first", "frames": 4097, "shape": [4097], "left_out": {"values": [4097]}}]


def test_a_stage_model_or_setting_changed_gives_new_cache_keys():
    route = _route()
    keys = {_pipe(route).key_sha256, _pipe(route, last_sha="dd" * 32).key_sha256,
            _pipe(dataclasses.replace(route, stages=route.stages[:1] + (
                dataclasses.replace(route.stages[1], window=WindowConfig(size=2, hop=2)),))).key_sha256}
    assert len(keys) == 3 and "aa" * 32 not in keys


def test_a_cached_chain_answer_is_the_same_answer_without_running_a_stage():
    first, summed, last = _models()
    cache, pipe = DictCache(), _pipe(_route())
    request = _request(5)
    fresh = handle_batch(pipe, [request], first, cache, FakeClock(), stage_models=[summed, last])
    for keys, rows, cost in fresh.fresh:
        cache.put_many(list(zip(keys, rows)), cost)
    again = handle_batch(pipe, [request], first, cache, FakeClock(), stage_models=[summed, last]).replies[0]
    assert again["cached"] and again["windows"] == fresh.replies[0]["windows"]
    assert len(summed.batches) == 1


def test_each_earlier_stage_gives_the_drift_monitor_one_level_a_request_under_its_own_name():
    """Stage 0's and stage 1's outputs (the last stage's is the route's own answer) are watched as
    anomaly scores are: each request's mean output, named route/stage<k>:<model>."""
    first, summed, last = _models()
    requests = [_request(1), _request(2)]
    outcome = handle_batch(_pipe(_route()), requests, first, None, FakeClock(), stage_models=[summed, last])
    names = ["r/stage0:first", "r/stage1:sum"]
    assert [a[0] for a in outcome.drift] == [names[0]] * 2 + [names[1]] * 2
    for k, request in enumerate(requests):
        frames = np.frombuffer(request.payload, "<f4").reshape(FRAMES, FEATURES)
        sums = [(frames[s:s + 4] / 2.0).sum() for s in range(0, FRAMES - 4 + 1, 2)]
        assert outcome.drift[k][1:] == (None, pytest.approx(float(frames.mean()), rel=1e-6))
        assert outcome.drift[2 + k][2] == pytest.approx(float(np.mean(sums)), rel=1e-5)
    assert stages.drift_names("r", "first", _pipe(_route()).chain) == names
