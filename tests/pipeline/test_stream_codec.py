"""A stream message's bytes -> its samples, seq and stream (daemon/pipeline/stream_codec.py)."""

from __future__ import annotations

import numpy as np
import pytest

from daemon.config.schema import InputConfig
from daemon.config.stream import StreamConfig
from daemon.errors import BAD_PAYLOAD, BAD_SHAPE, PayloadError
from daemon.pipeline.stream_codec import decode_samples

IMU = InputConfig(format="json", shape=(100, 6), stream=StreamConfig(key="device", window=100, hop=50, seq="seq"))


def test_a_json_chunk_is_its_samples_with_the_first_ones_seq_and_the_stream_its_field_names():
    got = decode_samples(b'{"id": "m7", "device": 12, "seq": 40, "data": [[1,2,3,4,5,6],[6,5,4,3,2,1]]}', IMU)
    assert got.samples.shape == (2, 6) and got.samples.dtype == np.float32 and got.samples[1, 0] == 6
    assert (got.seq, got.request_id, got.field_key) == (40, "m7", "12")


def test_one_sample_may_come_flat():
    assert decode_samples(b'{"device": "a", "seq": 0, "data": [1,2,3,4,5,6]}', IMU).samples.shape == (1, 6)


@pytest.mark.parametrize("payload, code, words", [
    (b'{"id": 1, "device": "a", "seq": 0, "data": [1,2,3,4]}', BAD_SHAPE, "whole samples of [6]"),
    (b'{"id": 1, "device": "a", "data": [1,2,3,4,5,6]}', BAD_PAYLOAD, "'seq' must number"),
    (b'{"id": 1, "device": "a", "seq": -1, "data": [1,2,3,4,5,6]}', BAD_PAYLOAD, "'seq' must number"),
    (b'{"id": 1, "seq": 3, "data": [1,2,3,4,5,6]}', BAD_PAYLOAD, "'device' must name the message's stream"),
    (b'{"id": 1, "device": "a", "seq": 3, "data": [1,2,3,4,5,1e39]}', BAD_PAYLOAD, "NaN or infinity"),
    (b'{"id": 1, "device": "a", "seq": 3, "data": []}', BAD_SHAPE, "data has 0 values"),
])
def test_a_bad_message_is_refused_with_its_id_and_why(payload, code, words):
    with pytest.raises(PayloadError) as err:
        decode_samples(payload, IMU)
    assert err.value.code == code and words in err.value.message and err.value.request_id == 1


def test_raw_and_pcm16_messages_carry_whole_samples():
    raw = InputConfig(format="raw", shape=(100, 2), dtype="int16", stream=StreamConfig(window=100, hop=100))
    assert decode_samples(np.arange(6, dtype="<i2").tobytes(), raw).samples.tolist() == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(PayloadError, match="whole samples of \\[2\\]"):
        decode_samples(np.arange(3, dtype="<i2").tobytes(), raw)
    pcm = InputConfig(format="pcm16", shape=(32000,), dtype="int16", stream=StreamConfig(window=32000, hop=4000))
    got = decode_samples(np.array([-32768, 0, 16384], "<i2").tobytes(), pcm)
    assert got.samples.tolist() == [-1.0, 0.0, 0.5] and got.seq is None and got.field_key is None
