"""Enroute's compiled routines: pure computations on bytes and callbacks, no I/O.

Each one is the hot loop of a Python reference that stays in ``enroute_core``
and that the tests compare it with (docs/native.md).
"""
