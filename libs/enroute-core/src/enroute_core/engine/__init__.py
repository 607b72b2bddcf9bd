"""Ingest, serving, views and layer maintenance."""
