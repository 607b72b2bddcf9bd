"""Layers over immutable files, tiered reads, the buffer pool, the object store."""
