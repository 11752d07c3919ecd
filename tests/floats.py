"""Whether this process represents subnormal floats, for hypothesis's float strategies.

tflite-runtime 2.14's armv7 wheel is linked with -ffast-math: loading it runs GCC's
crtfastmath constructor (vmrs/orr #0x1000000/vmsr: FPSCR.FZ, flush to zero) in the loading
thread, and from then on hypothesis refuses `st.floats()` that may draw subnormals
("FloatingPointError: Got allow_subnormal=True, but we can't represent subnormal floats").
The installed runtimes are imported here first, so the answer is the one every test sees
after the daemon has loaded its runtime. Elsewhere (x86-64, aarch64) SUBNORMALS is True.
"""

from __future__ import annotations

import sys

from daemon.model.runtime import available_backends

available_backends()  # imports each installed runtime: the FPU state is the daemon's from here on
SUBNORMALS = sys.float_info.min / 2 > 0
