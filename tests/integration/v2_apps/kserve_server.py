"""A KServe (0.21) model server over tflite_scores.Scorer, started as
    python kserve_server.py --model_name NAME --model_path MODEL.tflite --http_port PORT --enable_grpc false

Answers the binary tensor extension both ways, as KServe's own runtimes do: the request's
`binary_data_output` and per-output `binary_data` pass through to the response.
"""

from __future__ import annotations

import argparse
import uuid

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer, model_server
from kserve.errors import InvalidInput
from kserve.protocol.rest import server as rest_server

from tflite_scores import OUTPUT, BadInput, Scorer

LOOPBACK = "127.0.0.1"


def _bind_loopback() -> None:
    """kserve 0.21's RESTServer binds 0.0.0.0 with no option to change it; a test server must
    not be reachable from the network."""
    init = rest_server.RESTServer.__init__

    def loopback_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.config.host = LOOPBACK

    rest_server.RESTServer.__init__ = loopback_init


class TFLiteScores(Model):
    def __init__(self, name: str, path: str):
        super().__init__(name)
        self._path = path

    def load(self) -> bool:
        self._scorer = Scorer(self._path)
        self.ready = True
        return self.ready

    def get_input_types(self) -> list[dict]:
        return self._scorer.inputs

    def get_output_types(self) -> list[dict]:
        return self._scorer.outputs

    async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
        if len(payload.inputs) != 1:
            raise InvalidInput(f"one input tensor, got {len(payload.inputs)}")
        tensor = payload.inputs[0]
        try:
            shape = self._scorer.rows(list(tensor.shape), tensor.datatype)
            x = np.asarray(tensor.as_numpy(), dtype=np.float32).reshape(shape)
        except (BadInput, ValueError, TypeError) as exc:  # ValueError: data that do not fill the shape
            raise InvalidInput(str(exc)) from None
        scores = self._scorer.scores(x)
        output = InferOutput(OUTPUT, list(scores.shape), "FP32", data=scores)
        # A JSON response needs an id (kserve validates it as a string: None is a 500), as KServe's
        # own runtimes give one to a request without.
        return InferResponse(payload.id or str(uuid.uuid4()), self.name, [output],
                             use_binary_outputs=payload.use_binary_outputs, requested_outputs=payload.request_outputs)


def main() -> None:
    parser = argparse.ArgumentParser(parents=[model_server.parser])
    parser.add_argument("--model_path", required=True)
    args, _ = parser.parse_known_args()
    _bind_loopback()
    model = TFLiteScores(args.model_name, args.model_path)
    model.load()
    ModelServer().start([model])


if __name__ == "__main__":
    main()
