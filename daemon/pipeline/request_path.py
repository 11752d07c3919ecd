"""The pure request path: a batch of payloads -> decode -> preprocess -> quantize -> cache -> infer -> replies.

No threads, no MQTT, no clocks of its own: the caller passes the model, the cache (or
None) and the clock. This is the unit-test seam, and what `validate` and the workers
both run, so the daemon and the accuracy gate cannot disagree.

A worker hands over every queued request of one route at once (`handle_batch`): the group
is decoded into one array (a bad request gets its error reply, the rest go on), then it is
preprocessed and quantized as one array, looked up in the cache by its INT8 input
tensor, and the misses run in as few invokes as the model's batch buckets allow.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from daemon.cache.cache_key import make_keys
from daemon.config.schema import CLASSIFY
from daemon.errors import BAD_PAYLOAD, EXPIRED, PayloadError
from daemon.pipeline import codecs
from daemon.pipeline import stages as stages_path
from daemon.pipeline.route_pipeline import CacheBatch, Clock, Outcome, Request, ReuseState, RoutePipeline, Runner, ScoreCache


def handle_batch(pipe: RoutePipeline, requests: Sequence[Request], model: Runner,
                 cache: Optional[ScoreCache], clock: Clock, reuse: Optional[ReuseState] = None,
                 finish_s: float = 0.0, stage_models: Sequence[Runner] = ()) -> Outcome:
    """Requests of one route -> one reply each. Errors other than PayloadError propagate.
    `finish_s`: how long the batch is expected to take; a request whose deadline would pass by
    then is answered `expired`, not served late. `stage_models`: a route with `stages` runs them
    after `model`, in order (daemon/pipeline/stages.py)."""
    if not pipe.route.uses_cache:
        cache = None  # an image route: camera frames never repeat, so a key would cost and save nothing
    chain = None
    if pipe.chain is not None:  # the whole chain runs where the one model's invoke would
        model = chain = stages_path.Chain(pipe.chain, pipe.route.model, model, stage_models, clock,
                                          pipe.route.publish_stages)
    stages: dict[str, float] = {}
    started = clock()
    replies: list[Any] = [None] * len(requests)
    decoded, x = _decode_all(pipe, requests, replies)
    now = clock()
    stages["decode"] = now - started
    decoded, x = _live_rows(pipe, requests, decoded, x, replies, now, finish_s)
    fresh: list[CacheBatch] = []
    if decoded:
        rows = [requests[i] for i, _ in decoded]
        scores, cached, reused, fresh, x = _rows(pipe, x, rows, model, cache, reuse, clock, stages)
        now = clock()
        classify = pipe.route.kind == CLASSIFY and chain is None  # a chain's row holds several windows
        orders = np.argsort(-scores, axis=1, kind="stable") if classify else None  # one sort per batch
        for row, (i, d) in enumerate(decoded):
            replies[i] = pipe.postprocess(scores[row], d.request_id, cached[row],
                                          (now - requests[i].received_at) * 1000.0,
                                          orders[row] if classify else None,
                                          None if reuse is None else reused[row], x[row], d.geometry)
        if chain is not None:
            _chain_fields(pipe, chain, decoded, replies, stages)
        stages["postprocess"] = clock() - now
    for i, request in enumerate(requests):
        if request.item is not None and replies[i] is not None:  # a stream's window: which samples it covers
            replies[i].update(request.item.fields)
    if chain is None:
        return Outcome(replies, fresh, stages)
    return Outcome(replies, fresh, stages, chain.counts,
                   stages_path.drift_answers(pipe.route.name, pipe.route.model, pipe.chain, chain.levels))


def _chain_fields(pipe: RoutePipeline, chain: stages_path.Chain, decoded: list, replies: list,
                  stages: dict) -> None:
    """A chain's per-stage timings into the batch's, and (`publish_stages`) each earlier stage's
    output into its reply: every row ran the chain then, as such a route skips the cache."""
    stages.update(chain.timings)
    if not pipe.route.publish_stages or not chain.earlier or len(chain.earlier[0]) != len(decoded):
        return
    for row, (i, _) in enumerate(decoded):
        replies[i]["stages"] = stages_path.published(pipe.chain, pipe.route.model, chain.earlier, row)


def _rows(pipe: RoutePipeline, x: np.ndarray, rows: Sequence[Request], model: Runner, cache: Optional[ScoreCache],
          reuse: Optional[ReuseState], clock: Clock,
          stages: dict) -> tuple[np.ndarray, list[bool], list[bool], list[CacheBatch], np.ndarray]:
    """Outputs for the rows (sensor units): reused per device, else from the cache or the model;
    and the rows as the model takes them, in real values (an autoencoder's score needs them)."""
    mark = clock()
    x = pipe.preprocess(x)
    if reuse is not None and x.dtype.kind in "iu":
        x = x.astype(np.float32)  # reuse measures change in real values (uint8 differences would wrap)
    scores, cached, reused, fresh = _outputs(pipe, x, rows, model, cache, reuse, clock, mark, stages)
    return scores, cached, reused, fresh, x


def _outputs(pipe: RoutePipeline, x: np.ndarray, rows: Sequence[Request], model: Runner,
             cache: Optional[ScoreCache], reuse: Optional[ReuseState], clock: Clock, mark: float,
             stages: dict) -> tuple[np.ndarray, list[bool], list[bool], list[CacheBatch]]:
    """Outputs, whether each came from the cache, whether each was reused, and what to cache."""
    if reuse is not None and len(rows) > 1 and not reuse.in_batch(model.cost_per_sample_s):
        reuse.forget([r.device for r in rows])  # a cheap model: in a batch, reuse costs more than it saves
        reuse = None
    if reuse is not None and len(rows) == 1:  # a request served alone (a lightly loaded daemon)
        return _one_row(pipe, x, rows[0], model, cache, reuse, clock, mark, stages)
    found = None if reuse is None else reuse.match([r.device for r in rows], x, pipe.model_sha256, mark)
    todo = None if found is None else [row for row, hit in enumerate(found) if hit is None]
    if todo is None or len(todo) == len(rows):  # no reuse, or no hit: no gather or scatter
        q = model.quantize(x, pipe.pixels_as_is)
        stages["preprocess"] = clock() - mark
        scores, cached, fresh = _scores(pipe, q, model, cache)
    else:
        scores, cached, fresh = _partial(pipe, x, todo, found, model, cache, clock, mark, stages)
    now = clock()
    stages["infer"] = now - mark - stages["preprocess"]
    if found is None:
        return scores, cached, [False] * len(rows), fresh
    if todo:  # the inferred rows become their devices' references; a hit row's device is left out
        reuse.remember([None if hit is not None else r.device for r, hit in zip(rows, found)], x, scores,
                       pipe.model_sha256, [r.received_at for r in rows], now)
    return scores, cached, [hit is not None for hit in found], fresh


def _one_row(pipe: RoutePipeline, x: np.ndarray, row: Request, model: Runner, cache: Optional[ScoreCache],
             reuse: ReuseState, clock: Clock, mark: float,
             stages: dict) -> tuple[np.ndarray, list[bool], list[bool], list[CacheBatch]]:
    """One request on a route with reuse: its device's last result when the input barely moved,
    else the cache or the model, and then the input and scores become the device's reference."""
    hit = reuse.match_one(row.device, x[0], pipe.model_sha256, mark)
    if hit is not None:
        stages["preprocess"] = clock() - mark
        stages["infer"] = 0.0
        return hit[None], [False], [True], []
    q = model.quantize(x, pipe.pixels_as_is)
    stages["preprocess"] = clock() - mark
    scores, cached, fresh = _scores(pipe, q, model, cache)
    now = clock()
    stages["infer"] = now - mark - stages["preprocess"]
    reuse.remember_one(row.device, x[0], scores[0], pipe.model_sha256, row.received_at, now)
    return scores, cached, [False], fresh


def _partial(pipe: RoutePipeline, x: np.ndarray, todo: list[int], found: list, model: Runner,
             cache: Optional[ScoreCache], clock: Clock, mark: float,
             stages: dict) -> tuple[np.ndarray, list[bool], list[CacheBatch]]:
    """Some rows reused: the others (`todo`) are gathered, quantized and scored, then all are scattered back."""
    q = model.quantize(x[todo], pipe.pixels_as_is) if todo else None
    stages["preprocess"] = clock() - mark
    scores, cached = np.empty((len(found), model.num_outputs), dtype=np.float32), [False] * len(found)
    fresh: list[CacheBatch] = []
    if q is not None:
        scores[todo], hits, fresh = _scores(pipe, q, model, cache)
        for row, hit in zip(todo, hits):
            cached[row] = hit
    for row, hit in enumerate(found):
        if hit is not None:
            scores[row] = hit
    return scores, cached, fresh


def _decode_all(pipe: RoutePipeline, requests: Sequence[Request],
                replies: list) -> tuple[list[tuple[int, codecs.Decoded]], np.ndarray]:
    """The group decoded at once (one array: codecs.decode_many); each bad request answered here.
    A stream's windows come decoded (stream_rows)."""
    batch = (stream_rows(pipe, requests) if any(r.item is not None for r in requests)
             else pipe.decode_many([request.payload for request in requests]))
    for i, exc in batch.errors:
        replies[i] = pipe.error(exc.request_id, exc.code, exc.message)
    return batch.decoded, batch.x


def stream_rows(pipe: RoutePipeline, requests: Sequence[Request]) -> codecs.DecodedBatch:
    """A stream route's group: its windows as they are, and any whole input sent as one request
    (over HTTP, say) decoded as usual."""
    decoded, errors = [], []
    for i, request in enumerate(requests):
        item = request.item
        if item is not None:
            decoded.append((i, codecs.Decoded(item.request_id, item.data, item.timeout_ms)))
            continue
        try:
            decoded.append((i, pipe.decode(request.payload, check_finite=False)))
        except PayloadError as exc:
            errors.append((i, exc))
    x = (np.stack([d.data for _, d in decoded]) if decoded
         else np.empty((0, *pipe.route.input.shape), np.float32))
    return codecs.DecodedBatch(decoded, x, errors)


def _live_rows(pipe: RoutePipeline, requests: Sequence[Request], decoded: list[tuple[int, codecs.Decoded]],
               x: np.ndarray, replies: list, now: float,
               finish_s: float) -> tuple[list[tuple[int, codecs.Decoded]], np.ndarray]:
    """The decoded requests still to serve and their rows of `x`: the expired (by the batch's
    expected end) and the non-finite are answered and left out."""
    keep = []
    for row, (i, d) in enumerate(decoded):
        if requests[i].deadline is not None or d.timeout_ms is not None:
            replies[i] = _expired(pipe, requests[i], d, now, finish_s)
            if replies[i] is not None:
                continue
        keep.append(row)
    if len(keep) < len(decoded):
        decoded, x = [decoded[row] for row in keep], x[keep]
    return _finite_rows(pipe, decoded, x, replies)


def _finite_rows(pipe: RoutePipeline, decoded: list[tuple[int, codecs.Decoded]], x: np.ndarray,
                 replies: list) -> tuple[list[tuple[int, codecs.Decoded]], np.ndarray]:
    """The rows without NaN or infinity, the others answered `bad_payload`: one pass for the batch."""
    if not decoded or x.dtype.kind in "iu":  # a picture's pixels: integers are always finite
        return decoded, x
    finite = np.isfinite(x.reshape(len(decoded), -1)).all(axis=1)
    if finite.all():
        return decoded, x
    for ok, (i, d) in zip(finite, decoded):
        if not ok:
            replies[i] = pipe.error(d.request_id, BAD_PAYLOAD, codecs.NOT_FINITE)
    return [entry for ok, entry in zip(finite, decoded) if ok], x[finite]


def _expired(pipe: RoutePipeline, request: Request, decoded: codecs.Decoded, now: float,
             finish_s: float = 0.0) -> Optional[dict]:
    """The `expired` reply when the request's deadline has passed before inference, or would
    pass before its batch is done (`finish_s` from now), else None."""
    deadline = request.deadline
    if decoded.timeout_ms is not None:
        own = request.received_at + decoded.timeout_ms / 1000.0
        deadline = own if deadline is None else min(deadline, own)
    if deadline is None or now + finish_s < deadline:
        return None
    if now < deadline:
        return pipe.error(decoded.request_id, EXPIRED, f"deadline {(deadline - now) * 1000.0:.1f} ms away, and "
                          f"its batch is expected to take {finish_s * 1000.0:.1f} ms")
    return pipe.error(decoded.request_id, EXPIRED,
                      f"deadline passed {(now - deadline) * 1000.0:.1f} ms before inference")


def _scores(pipe: RoutePipeline, q: np.ndarray, model: Runner,
            cache: Optional[ScoreCache]) -> tuple[np.ndarray, list[bool], list[CacheBatch]]:
    """Scores for INT8 input rows: cache hits are reused, misses run through the model."""
    n = q.shape[0]
    if cache is None:
        return model.infer_quantized(q), [False] * n, []
    keys = make_keys(pipe.key_sha256, q)  # the model's (or chain's) digest: a swapped model never gets the old answers
    hits = cache.get_many(keys, model.cost_per_sample_s)
    misses = [i for i, hit in enumerate(hits) if hit is None]
    if len(misses) == n:  # a stream that never repeats: no gather, no scatter
        computed = model.infer_quantized(q)
        return computed, [False] * n, [(keys, computed, model.cost_per_sample_s)]
    scores = np.empty((n, model.num_outputs), dtype=np.float32)
    for i, hit in enumerate(hits):
        if hit is not None:
            scores[i] = hit
    fresh: list[CacheBatch] = []
    if misses:
        computed = model.infer_quantized(q[misses])
        scores[misses] = computed
        # No copy here: the cache copies what it admits (one copy per entry), and `computed` is ours.
        fresh = [([keys[i] for i in misses], computed, model.cost_per_sample_s)]
    return scores, [hit is not None for hit in hits], fresh


def handle(pipe: RoutePipeline, payload: bytes, model: Runner, cache: Optional[ScoreCache],
           received_at: float, clock: Clock, deadline: Optional[float] = None) -> dict:
    """One request to one reply: `handle_batch` of one (cache writes are made at once)."""
    outcome = handle_batch(pipe, [Request(payload, received_at, deadline)], model, cache, clock)
    store(cache, outcome)
    return outcome.replies[0]


def store(cache: Optional[ScoreCache], outcome: Outcome) -> None:
    """The results `handle_batch` computed, offered to the cache (which admits those it has seen
    before): the caller does it after replying, so the write is never on the reply path; the
    cache is read and written here only."""
    if cache is not None:
        for keys, scores, invoke_cost_s in outcome.fresh:
            cache.put_many(list(zip(keys, scores)), invoke_cost_s)
