"""`input.format: pcm16`: int16 little-endian mono -> float32 int16 / 32768, whole clips and chunks."""

from __future__ import annotations

import numpy as np
import pytest

from daemon.config.schema import InputConfig
from daemon.errors import PayloadError
from daemon.pipeline import codecs, pcm16

CHUNK = 1280  # 80 ms at 16 kHz, as a microphone publishes it
SPEC = InputConfig(format="pcm16", shape=(CHUNK,), dtype="int16", sample_rate=16_000)


def test_every_int16_value_decodes_exactly_to_value_over_32768():
    values = np.arange(-32768, 32768, dtype=np.int64)
    decoded = pcm16.samples(values.astype("<i2").tobytes())
    assert decoded.dtype == np.float32
    assert np.array_equal(decoded.astype(np.float64), values / 32768.0)  # each one exact in float32
    assert decoded.min() == -1.0 and decoded.max() < 1.0


def test_the_bytes_are_little_endian():
    assert pcm16.samples(b"\x01\x00\x00\x80\xff\x7f").tolist() == [1 / 32768, -1.0, 32767 / 32768]


def test_chunks_decode_to_the_whole_clip_in_pieces():
    clip = np.random.default_rng(7).integers(-32768, 32768, 4 * CHUNK).astype("<i2").tobytes()
    pieces = [pcm16.samples(clip[i:i + 2 * CHUNK]) for i in range(0, len(clip), 2 * CHUNK)]
    assert np.array_equal(np.concatenate(pieces), pcm16.samples(clip))


def test_an_odd_byte_count_is_bad_payload():
    with pytest.raises(PayloadError, match="3 bytes: not whole 2-byte samples") as err:
        pcm16.samples(b"\0\0\0")
    assert err.value.code == "bad_payload"


def test_a_whole_clip_decodes_to_the_route_shape_without_an_id():
    clip = np.arange(CHUNK, dtype="<i2")
    decoded = codecs.decode(clip.tobytes(), SPEC)
    assert decoded.request_id is None and decoded.data.shape == (CHUNK,)
    assert np.array_equal(decoded.data, clip / np.float32(32768))
    batch = codecs.decode_many([clip.tobytes(), b"\0" * 10, clip[::-1].tobytes()], SPEC)
    assert [i for i, _ in batch.decoded] == [0, 2] and batch.x.shape == (2, CHUNK)
    assert [(i, e.code) for i, e in batch.errors] == [(1, "bad_shape")]


@pytest.mark.parametrize("size", [2 * CHUNK - 2, 2 * CHUNK + 2, 2 * CHUNK - 1])
def test_a_shorter_or_longer_clip_is_bad_shape_naming_the_bytes_expected(size):
    with pytest.raises(PayloadError, match=f"pcm16 payload is {size} bytes; {CHUNK} samples need {2 * CHUNK}") as err:
        codecs.decode(b"\0" * size, SPEC)
    assert err.value.code == "bad_shape" and err.value.request_id is None
    assert codecs.scan_id(b'{"id": 5}', SPEC) is None  # raw audio has no id to find
