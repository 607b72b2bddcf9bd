"""Reading a role's ``/metrics`` text (Prometheus exposition format) in tests and benchmarks.

Issue 19, "Bounded observability": a role's series count must not grow with the number
of repositories; the fleet test and ``bench/fleet.py`` count them the same way here.
"""

from __future__ import annotations


def series_count(text: str) -> int:
    """The samples of one scrape: every line that is neither blank nor a comment."""
    return sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))


def sample_value(text: str, family: str) -> float:
    """The value of the unlabelled sample ``family`` (AssertionError when not exported)."""
    for ln in text.splitlines():
        if ln.startswith(family + " "):
            return float(ln.split()[1])
    raise AssertionError(f"{family} not exported")
