"""Offsets the wall clock of a test process by ``CLUSTER_CLOCK_SKEW_S`` seconds.

The services take their wall clock from ``time.time``/``time.time_ns`` in
their ``main.py`` and offer no setting to move it, so a cluster test that
needs a skewed compute starts it with this directory first on PYTHONPATH.
Monotonic clocks are left alone (skew moves wall time only).
"""

import os
import time

_skew = float(os.environ.get("CLUSTER_CLOCK_SKEW_S", "0") or 0)
if _skew:
    _time, _time_ns = time.time, time.time_ns
    _skew_ns = int(_skew * 1e9)
    time.time = lambda: _time() + _skew
    time.time_ns = lambda: _time_ns() + _skew_ns
