"""Enroute."""
