"""A model loaded first in a child process, where the runtime may crash without taking the daemon.

tflite-runtime 2.14 does not verify a model's flatbuffer: a truncated or corrupt file kills the
process that loads it with SIGSEGV (x86-64 and armv7 alike; ai-edge-litert rejects the same file
with an error). On that backend, armv7's only one, the config check (config/check.py) loads each
model in a child first, so a bad file is a config error that names its key (exit 78 at start-up)
instead of a crash that systemd restarts into again. The cost is one interpreter start per model
per check (about 0.3 s on x86-64; docs/platforms.md).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

# What the child runs: the load, any Python error ignored (the parent's own load reports it).
_CHILD = ("import sys\nfrom daemon.model.runtime import Model\n"
          "try:\n    Model(sys.argv[1], backend=sys.argv[2], max_batch=1)\nexcept Exception:\n    pass\n")
PROBE_TIMEOUT_S = 120.0
UNVERIFYING_BACKEND = "tflite"  # the backend whose loads this probes (ai-edge-litert verifies a file itself)
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding `daemon`


def crash_loading(path: Path, backend: str, timeout_s: float = PROBE_TIMEOUT_S) -> Optional[str]:
    """How a child process died loading `path` on `backend`, or None when it did not (and, without a
    child, on a backend that verifies the file itself)."""
    if backend != UNVERIFYING_BACKEND:
        return None
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, str(path), backend], capture_output=True,
                              timeout=timeout_s, cwd=_PACKAGE_ROOT, check=False)
    except subprocess.TimeoutExpired:
        return f"loading it did not finish in {timeout_s:.0f} s"
    if done.returncode >= 0:
        return None
    try:
        name = signal.Signals(-done.returncode).name
    except ValueError:
        name = "an unknown signal"
    return f"the {backend} runtime crashed loading it (killed by {name}): not a usable .tflite file " \
           f"(truncated or corrupt?)"
