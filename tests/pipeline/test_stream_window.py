"""The pure stream window (daemon/pipeline/stream_window.py): windows of consecutive samples every
hop, gaps and duplicates, on samples that carry their own seq as their value."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from daemon.pipeline.stream_window import NEW, SEQ, SILENCE, StreamWindow


def samples(first: int, n: int) -> np.ndarray:
    """n samples of 2 values each, the value being the sample's seq (so a window shows what it holds)."""
    return np.repeat(np.arange(first, first + n, dtype=np.float32)[:, None], 2, axis=1)


def held(window) -> list[int]:
    return [int(v) for v in window.data[:, 0]]


def test_a_window_every_hop_from_one_sample_a_message():
    stream = StreamWindow(4, 2, (2,), None, numbered=True)
    windows = [w for seq in range(10) for w in stream.push(samples(seq, 1), seq, float(seq)).windows]
    assert [held(w) for w in windows] == [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [6, 7, 8, 9]]
    assert [(w.first_seq, w.last_seq) for w in windows] == [(0, 3), (2, 5), (4, 7), (6, 9)]
    assert [w.gap for w in windows] == [NEW, None, None, None]  # a stream's first window: nothing known before it
    assert (windows[1].first_at, windows[1].last_at) == (2.0, 5.0)


def test_a_chunk_may_complete_several_windows_and_a_hop_past_the_window_skips_samples():
    stream = StreamWindow(3, 5, (2,), None, numbered=True)
    pushed = stream.push(samples(0, 13), 0, 0.0)
    assert [held(w) for w in pushed.windows] == [[0, 1, 2], [5, 6, 7], [10, 11, 12]]


def test_a_missing_seq_starts_the_window_again_and_the_next_window_says_how_many_were_missed():
    stream = StreamWindow(4, 4, (2,), None, numbered=True)
    assert len(stream.push(samples(0, 4), 0, 0.0).windows) == 1
    assert stream.push(samples(4, 2), 4, 1.0).windows == []
    pushed = stream.push(samples(9, 4), 9, 2.0)  # 6, 7 and 8 never came: 4 and 5 cannot share a window with 9
    assert [held(w) for w in pushed.windows] == [[9, 10, 11, 12]]
    assert (pushed.windows[0].gap, pushed.windows[0].missed) == (SEQ, 3)


def test_a_redelivered_or_late_seq_is_dropped_and_counted():
    stream = StreamWindow(4, 4, (2,), None, numbered=True)
    stream.push(samples(0, 3), 0, 0.0)
    assert stream.push(samples(1, 1), 1, 0.1).duplicates == 1  # a QoS 1 redelivery
    pushed = stream.push(samples(2, 3), 2, 0.2)  # overlaps: 2 is taken already, 3 and 4 are new
    assert pushed.duplicates == 1 and [held(w) for w in pushed.windows] == [[0, 1, 2, 3]]
    assert stream.push(samples(5, 3), 5, 0.3).windows[0].gap is None


def test_silence_longer_than_max_gap_starts_the_window_again():
    stream = StreamWindow(3, 3, (2,), 1.0, numbered=False)
    stream.push(samples(0, 3), None, 0.0)
    stream.push(samples(3, 2), None, 0.5)
    pushed = stream.push(samples(5, 3), None, 2.0)  # 1.5 s of silence: 3 and 4 are dropped
    assert [held(w) for w in pushed.windows] == [[5, 6, 7]]
    assert pushed.windows[0].gap == SILENCE and pushed.windows[0].first_seq is None


def test_the_window_holds_only_what_its_ring_needs():
    assert StreamWindow(100, 50, (6,), None, numbered=True).nbytes == 100 * 6 * 4 + 100 * 8 + 100 * 8


@settings(max_examples=60, deadline=None)
@given(window=st.integers(1, 9), hop=st.integers(1, 12), chunks=st.lists(st.integers(1, 7), min_size=1, max_size=20))
def test_any_chunking_makes_the_windows_of_the_whole_signal(window, hop, chunks):
    """However the samples are cut into messages, the windows are those of the whole signal: each
    `window` consecutive samples, starting every `hop`."""
    stream = StreamWindow(window, hop, (2,), None, numbered=True)
    got, seq = [], 0
    for n in chunks:
        got += [held(w) for w in stream.push(samples(seq, n), seq, 0.0).windows]
        seq += n
    expected = [list(range(s, s + window)) for s in range(0, seq - window + 1, hop)]
    assert got == expected
