"""Benchmarks against C git; each module writes its section of docs/benchmarks.md."""
