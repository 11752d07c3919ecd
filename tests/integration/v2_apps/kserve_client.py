"""KServe 0.21's own REST client (`kserve.InferenceRESTClient`, protocol v2) as a client of a v2
server, run by the kserve venv's python (scripts/setup_v2.sh):
    python kserve_client.py URL MODEL ROWS.npy
Asks server live and ready, model ready and metadata, then infers the rows of ROWS.npy (one
request, all rows), in JSON and over the binary tensor extension; prints one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx
import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

TIMEOUT_S = 30.0
INPUT = "input"


def _plain(array: np.ndarray) -> list:
    """A decoded output as JSON: BYTES tensors come back as bytes or str, depending on the way."""
    return [v.decode() if isinstance(v, bytes) else v for v in array.ravel().tolist()]


async def _infer(client: InferenceRESTClient, url: str, model: str, x: np.ndarray, binary: bool) -> dict:
    tensor = InferInput(INPUT, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    request = InferRequest(model_name=model, infer_inputs=[tensor], request_id=f"kserve-{binary}")
    response = await client.infer(url, request, model_name=model)
    outputs = {o.name: {"shape": list(o.shape), "data": _plain(o.as_numpy())} for o in response.outputs}
    return {"id": response.id, "outputs": outputs}


async def main(url: str, model: str, rows: str) -> dict:
    x = np.load(rows).astype(np.float32)
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=TIMEOUT_S))
    try:
        found = {"server_live": await client.is_server_live(url),
                 "server_ready": await client.is_server_ready(url),
                 "model_ready": await client.is_model_ready(url, model)}
        # kserve 0.21's REST client has no model-metadata call: the same GET through httpx, its transport.
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as plain:
            found["metadata"] = (await plain.get(f"{url}/v2/models/{model}")).json()
        found["json"] = await _infer(client, url, model, x, binary=False)
        found["binary"] = await _infer(client, url, model, x, binary=True)
    finally:
        await client.close()
    return found


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*sys.argv[1:4]))))
