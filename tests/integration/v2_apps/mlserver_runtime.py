"""An MLServer (1.7.1) custom runtime over tflite_scores.Scorer: model-settings.json names it
`mlserver_runtime.TFLiteScores` and its `parameters.uri` the .tflite file.

MLServer answers an uncaught exception with a plain-text 500 and closes the keep-alive connection,
so every bad request is raised as its InferenceError: a JSON `{"error": ...}` 400.
"""

from __future__ import annotations

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse, MetadataTensor
from mlserver.utils import get_model_uri

from tflite_scores import OUTPUT, BadInput, Scorer


class TFLiteScores(MLModel):
    async def load(self) -> bool:
        self._scorer = Scorer(await get_model_uri(self.settings))
        self.inputs = [MetadataTensor(**tensor) for tensor in self._scorer.inputs]
        self.outputs = [MetadataTensor(**tensor) for tensor in self._scorer.outputs]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        if len(payload.inputs) != 1:
            raise InferenceError(f"one input tensor, got {len(payload.inputs)}")
        tensor = payload.inputs[0]
        try:
            shape = self._scorer.rows(list(tensor.shape), tensor.datatype)
            x = np.asarray(NumpyCodec.decode_input(tensor), dtype=np.float32).reshape(shape)
        except (BadInput, ValueError, TypeError) as exc:  # ValueError: data that do not fill the shape
            raise InferenceError(str(exc)) from None
        scores = self._scorer.scores(x)
        return InferenceResponse(model_name=self.name, model_version=self.version, id=payload.id,
                                 outputs=[NumpyCodec.encode_output(OUTPUT, scores)])
