"""The TFLite runtime's INFO banner, kept out of our output.

ai-edge-litert's C++ code writes `INFO: Created TensorFlow Lite XNNPACK delegate for CPU.`
straight to file descriptor 2 the first time a process applies the XNNPACK delegate
(inside `allocate_tensors`). No environment variable turns it off (TF_CPP_MIN_LOG_LEVEL
0..3 all leave it; the minimum severity is a C++ static in an anonymous namespace), so
`quiet_native_info()` points fd 2 at a temporary file around the calls that can print it,
then writes back every captured line that is not a native `INFO: ` line. Native errors
stay visible, and so does whatever another thread wrote meanwhile, a little later.
Dropped lines go to this module's logger at DEBUG (`edge-inferd -v` shows them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import threading
from typing import Iterator, Optional

logger = logging.getLogger(__name__)

STDERR_FD = 2
# TFLite's minimal logger prefixes INFO lines this way; our own log lines never do
# (their level name is followed by the logger name, not a colon).
NATIVE_INFO_PREFIX = b"INFO: "
# The banner is logged once per process (TFLITE_LOG_PROD_ONCE): once seen, stop redirecting.
_BANNER = b"XNNPACK delegate"

_lock = threading.Lock()  # fd 2 is process-wide: one redirection at a time
_banner_seen = False


@contextlib.contextmanager
def quiet_native_info(fd: int = STDERR_FD) -> Iterator[None]:
    """Within the block, native `INFO: ` lines on `fd` are dropped; everything else passes, after it."""
    if _banner_seen:
        yield
        return
    with _lock:
        capture = _open_capture()
        saved = _redirect(fd, capture)
        try:
            yield
        finally:
            if saved is not None:
                _flush_python_stderr()
                os.dup2(saved, fd)
                os.close(saved)
            if capture is not None:
                _replay(capture, fd)
                capture.close()


def _open_capture():
    try:
        return tempfile.TemporaryFile()
    except OSError:  # nowhere to write: better an INFO line than no model
        return None


def _redirect(fd: int, capture) -> Optional[int]:
    """Point `fd` at the capture file; the saved original fd, or None when nothing was redirected."""
    if capture is None:
        return None
    try:
        saved = os.dup(fd)
    except OSError:  # fd 2 is closed: nothing to keep quiet
        return None
    _flush_python_stderr()
    os.dup2(capture.fileno(), fd)
    return saved


def _flush_python_stderr() -> None:
    with contextlib.suppress(Exception):  # a replaced or closed sys.stderr must not break model loading
        sys.stderr.flush()


def _replay(capture, fd: int) -> None:
    global _banner_seen
    capture.seek(0)
    for line in capture.read().splitlines(keepends=True):
        if line.startswith(NATIVE_INFO_PREFIX):
            _banner_seen = _banner_seen or _BANNER in line
            logger.debug("runtime: %s", line.decode(errors="replace").rstrip())
        else:
            os.write(fd, line)
