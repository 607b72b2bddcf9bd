"""Errors and their one mapping table, limits, typed ids, the Clock protocol."""
