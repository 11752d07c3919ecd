"""The real, pretrained third-party models (and photos) the tests run, from the cache that
scripts/fetch_test_models.sh fills (./scripts/test.sh runs it and sets EDGE_INFERD_TEST_MODELS).

Nothing is downloaded here. Without EDGE_INFERD_TEST_MODELS a test that needs a real model is
skipped, saying so; with it set, a missing or altered file fails the test: a CI run that
asks for the real models never passes without them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import pytest

ENV = "EDGE_INFERD_TEST_MODELS"


@functools.lru_cache(maxsize=None)
def _manifest(cache: str) -> dict:
    path = Path(cache) / "MANIFEST.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        pytest.fail(f"{ENV}={cache}, but its MANIFEST.json cannot be read ({e}); "
                    "run ./scripts/fetch_test_models.sh", pytrace=False)


@functools.lru_cache(maxsize=None)
def _sha256(path: str, mtime_ns: int, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def real_model(name: str) -> Path:
    """The cached file `name` (e.g. "ssd_mobilenet_v2_coco_quant.tflite", "chelsea.png"),
    checked against the sha256 in the cache's MANIFEST.json."""
    cache = os.environ.get(ENV)
    if not cache:
        pytest.skip(f"{ENV} is not set; ./scripts/test.sh fetches the real models")
    entry = _manifest(cache).get(name)
    if entry is None:
        pytest.fail(f"{name} is not in {cache}/MANIFEST.json; is scripts/fetch_test_models.sh "
                    "out of date?", pytrace=False)
    path = Path(cache) / name
    try:
        st = path.stat()
    except OSError:
        pytest.fail(f"{path} is missing; run ./scripts/fetch_test_models.sh", pytrace=False)
    got = _sha256(str(path), st.st_mtime_ns, st.st_size)
    if got != entry["sha256"]:
        pytest.fail(f"{path}: sha256 {got}, not the {entry['sha256']} of its manifest; "
                    "run ./scripts/fetch_test_models.sh", pytrace=False)
    return path
