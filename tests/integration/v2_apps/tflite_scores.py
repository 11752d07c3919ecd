"""The far tier's contract, written the way a user of a v2 server would write it: float32 rows
of a TFLite model's input in, the model's float32 scores out, exactly as edge-inferd's own
runtime (daemon/model/runtime.py) gives them for the same rows.

Runs under a v2 server's own venv (scripts/setup_v2.sh), never the daemon's: it imports numpy and
a TFLite interpreter only. tests/integration/v2_servers.py copies it beside the server's runtime.
"""

from __future__ import annotations

import numpy as np

try:
    from ai_edge_litert.interpreter import Interpreter
except ImportError:  # where a server's numpy pin keeps litert out (scripts/setup_v2.sh)
    from tflite_runtime.interpreter import Interpreter

FP32 = "FP32"
INPUT, OUTPUT = "input", "scores"  # a request's input may have any name: there is one


class BadInput(ValueError):
    """A request this model cannot take as sent: the server answers it 400."""


def quantize(x: np.ndarray, scale: float, zero_point: int, dtype: np.dtype) -> np.ndarray:
    """As the daemon does it (runtime.quantize): rounded in float64, saturated to the dtype."""
    info = np.iinfo(dtype)
    q = np.round(np.asarray(x, dtype=np.float64) / scale) + zero_point
    return np.clip(q, info.min, info.max).astype(dtype)


class Scorer:
    """One interpreter, resized to each request's batch. Not thread-safe: both servers call
    predict on their event loop, one request at a time."""

    def __init__(self, path: str):
        # One thread and litert's default XNNPACK delegate, as the daemon runs a model by default
        # (models.<name>.threads: 1): the INT8 scores are then the daemon's bit for bit.
        self._interp = Interpreter(model_path=path, num_threads=1)
        self._interp.allocate_tensors()
        self._input = self._interp.get_input_details()[0]
        self._output = self._interp.get_output_details()[0]
        self._batch = int(self._input["shape"][0])
        self.sample_shape = tuple(int(d) for d in self._input["shape"][1:])
        self.num_classes = int(np.prod(self._output["shape"][1:]))
        # For model metadata (GET /v2/models/<name>): the batch dimension is free.
        self.inputs = [{"name": INPUT, "datatype": FP32, "shape": [-1, *self.sample_shape]}]
        self.outputs = [{"name": OUTPUT, "datatype": FP32, "shape": [-1, self.num_classes]}]

    def rows(self, shape: list, datatype: str) -> tuple[int, ...]:
        """The request's shape as (N, *sample_shape); [N, 1460] stands for [N, 1460, 1]."""
        if datatype != FP32:
            raise BadInput(f"the input must be {FP32}, got {datatype}")
        squeezed = tuple(d for d in self.sample_shape if d != 1)
        if len(shape) < 2 or shape[0] < 1 or tuple(shape[1:]) not in (self.sample_shape, squeezed):
            raise BadInput(f"the input's shape must be [N, {', '.join(map(str, self.sample_shape))}] "
                           f"or [N, {', '.join(map(str, squeezed))}], got {list(shape)}")
        return (int(shape[0]), *self.sample_shape)

    def scores(self, x: np.ndarray) -> np.ndarray:
        """(N, *sample_shape) float32 -> (N, num_classes) float32."""
        n = x.shape[0]
        if n != self._batch:  # resize and allocate cost more than an invoke: only when N changes
            self._interp.resize_tensor_input(self._input["index"], [n, *self.sample_shape])
            self._interp.allocate_tensors()
            self._batch = n
        scale, zero_point = self._input["quantization"]
        dtype = np.dtype(self._input["dtype"])
        tensor = quantize(x, scale, zero_point, dtype) if dtype.kind in "iu" and scale else x.astype(dtype)
        self._interp.set_tensor(self._input["index"], tensor)
        self._interp.invoke()
        out = self._interp.get_tensor(self._output["index"])
        scale, zero_point = self._output["quantization"]
        if out.dtype.kind in "iu" and scale:
            out = (out.astype(np.int32) - zero_point) * scale
        return np.asarray(out, dtype=np.float32).reshape(n, self.num_classes)
