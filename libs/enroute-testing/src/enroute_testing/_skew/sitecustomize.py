"""Offsets the wall clock of a test process by ``CLUSTER_CLOCK_SKEW_S`` seconds.

The services take their wall clock from ``time.time``/``time.time_ns`` in
their ``main.py`` and offer no setting to move it, so a cluster test that
needs a skewed compute starts it with this directory first on PYTHONPATH.
Monotonic clocks are left alone (skew moves wall time only).

gRPC's asyncio layer turns a timeout into a deadline with ``time.time()`` and
hands it to its C core, which compares it with the real clock; on a skewed
host both move together, so gRPC's own callers keep the real time here (a
skew of -120 s would otherwise expire every deadline before it is sent).
"""

import os
import sys
import time

_skew = float(os.environ.get("CLUSTER_CLOCK_SKEW_S", "0") or 0)
if _skew:
    _time, _time_ns = time.time, time.time_ns
    _skew_ns = int(_skew * 1e9)

    def _from_grpc() -> bool:
        return str(sys._getframe(2).f_globals.get("__name__", "")).startswith("grpc")

    def _skewed_time() -> float:
        return _time() if _from_grpc() else _time() + _skew

    def _skewed_time_ns() -> int:
        return _time_ns() if _from_grpc() else _time_ns() + _skew_ns

    time.time = _skewed_time
    time.time_ns = _skewed_time_ns
