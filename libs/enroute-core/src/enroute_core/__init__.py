"""Enroute core library.

Layers point down only (seed 004, "Layering"): protocol -> engine -> storage
-> git -> base, with ``state`` beside storage.
"""
