#!/usr/bin/env python3
"""Real time factor of openWakeWord's chain as one route's `stages` against the same chain inline.

    EDGE_INFERD_TEST_MODELS=.cache/test-models python benchmarks/bench_stages.py [--clips 8] [--rounds 5]

The chain: melspectrogram on a 3 s clip (16 kHz), the embedding model on every window of 76 mel
frames every 8 (x / 10 + 2 first), hey_jarvis on every 16 consecutive embeddings (docs/stages.md).
`daemon`: one batch of `--clips` requests through the request path (request_path.handle_batch, the
daemon's models, no result cache), each stage batching every window of every clip together.
`inline`: a plain script on the same backend, clip by clip as openWakeWord's own loop goes: one
melspectrogram invoke, one embedding invoke of the clip's windows, one hey_jarvis invoke per
window. The two take turns in each round; each figure is the median over rounds of CPU seconds
(time.process_time: both run on this thread) per second of audio. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from daemon.config.loader import load_config  # noqa: E402
from daemon.config.model_files import open_model  # noqa: E402
from daemon.model.runtime import BACKENDS, resolve_backend  # noqa: E402
from daemon.pipeline.request_path import handle_batch  # noqa: E402
from daemon.pipeline.route_pipeline import Request, route_pipelines  # noqa: E402
from tests.model.test_stages_chain import (CLIP, EMBED_HOP, EMBED_WINDOW, EMBEDDING, JARVIS, MEL, RATE,  # noqa: E402
                                           SCORE_WINDOW, chain_config)
from tests.real_models import real_model  # noqa: E402


class Inline:
    """The chain in a plain script: one interpreter per model, sized once."""

    def __init__(self, windows: int):
        backend = importlib.import_module(BACKENDS[resolve_backend()])
        self.mel = self._sized(backend, MEL, [1, CLIP])
        self.embedding = self._sized(backend, EMBEDDING, [windows, EMBED_WINDOW, 32, 1])
        self.jarvis = self._sized(backend, JARVIS, None)

    @staticmethod
    def _sized(backend, name: str, shape):
        interp = backend.Interpreter(model_path=str(real_model(name)))
        if shape is not None:
            interp.resize_tensor_input(interp.get_input_details()[0]["index"], shape)
        interp.allocate_tensors()
        return interp

    @staticmethod
    def _run(interp, x: np.ndarray) -> np.ndarray:
        interp.set_tensor(interp.get_input_details()[0]["index"], x.astype(np.float32))
        interp.invoke()
        return interp.get_tensor(interp.get_output_details()[0]["index"])

    def scores(self, clip: np.ndarray) -> np.ndarray:
        mel = self._run(self.mel, clip[None])[0, 0] / 10 + 2
        starts = range(0, len(mel) - EMBED_WINDOW + 1, EMBED_HOP)
        embeddings = self._run(self.embedding, np.stack([mel[s:s + EMBED_WINDOW] for s in starts])[..., None])
        embeddings = embeddings.reshape(len(starts), -1)
        return np.array([self._run(self.jarvis, embeddings[s:s + SCORE_WINDOW][None]).item()
                         for s in range(len(embeddings) - SCORE_WINDOW + 1)])


def _timed(fn) -> tuple[float, object]:
    started = time.process_time()
    out = fn()
    return time.process_time() - started, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp())
    config = load_config(chain_config(workdir))
    models = {name: open_model(config, name) for name in config.models}
    (pipe,) = route_pipelines(config, models)
    inline = Inline(pipe.chain.stages[0].inputs)
    rng = np.random.default_rng(0)
    clips = [(rng.standard_normal(CLIP) * 2000).astype(np.float32) for _ in range(args.clips)]
    requests = [Request(clip.astype("<f4").tobytes(), 0.0) for clip in clips]
    stage_models = [models["embedding"], models["jarvis"]]
    audio_s = args.clips * CLIP / RATE
    daemon_rtf, inline_rtf, differ = [], [], 0.0
    for _ in range(args.rounds + 1):  # the first round warms both up and is not counted
        d_s, outcome = _timed(lambda: handle_batch(pipe, requests, models["mel"], None, time.monotonic,
                                                   stage_models=stage_models))
        i_s, direct = _timed(lambda: [inline.scores(clip) for clip in clips])
        daemon_rtf.append(d_s / audio_s)
        inline_rtf.append(i_s / audio_s)
        got = np.array([[w["score"] for w in r["windows"]] for r in outcome.replies])
        differ = max(differ, float(np.abs(got - np.array(direct)).max()))
    print(json.dumps({"clips": args.clips, "audio_s_per_round": audio_s, "rounds": args.rounds,
                      "daemon_rtf": round(statistics.median(daemon_rtf[1:]), 4),
                      "inline_rtf": round(statistics.median(inline_rtf[1:]), 4),
                      "max_score_difference": differ}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
