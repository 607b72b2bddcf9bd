"""The ledger's /metrics names come from an explicit list (issue 21, item 3).

``http.RUNTIME_COUNTERS`` names each Runtime counter and the metric it is exported
as; nothing is read off the Runtime's attributes, so renaming an attribute cannot
rename a metric. These tests hold a real Runtime against the list: a public number
added to the Runtime must be listed (or named a setting in ``NOT_COUNTERS``), and
every listed attribute must exist (a rename fails here, not at a scrape).
"""

from __future__ import annotations

import asyncio
import math
import operator
from collections.abc import Callable
from pathlib import Path

from enroute_core.base.ids import NodeId
from enroute_ledger.http import NOT_COUNTERS, RUNTIME_COUNTERS, metrics
from enroute_ledger.logstore import open_log_store
from enroute_ledger.runtime import Runtime, RuntimeConfig


def with_runtime(tmp_path: Path, check: Callable[[Runtime], None]) -> None:
    async def main() -> None:
        store = open_log_store(tmp_path / "log")
        try:
            rt = Runtime(
                RuntimeConfig(node_id=NodeId(1), peers=()),
                store,
                clock=asyncio.get_running_loop().time,
                nonce=b"12345678",
                seed=1,
            )
            check(rt)
        finally:
            store.close()

    asyncio.run(main())


def _numbers(obj: object, prefix: str = "") -> set[str]:
    """Public numbers of ``obj``: its own, the class-level zeros it has not counted yet, and
    its properties that read a number (``snapshots_sent`` reads the transport's count)."""
    found = {**vars(type(obj)), **vars(obj)}
    values = {k: getattr(obj, k) if isinstance(v, property) else v for k, v in found.items()}
    return {
        prefix + k
        for k, v in values.items()
        if not k.startswith("_")
        and isinstance(v, int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
    }


def public_numbers(rt: Runtime) -> set[str]:
    """Numbers on the Runtime and on the parts whose counters it exports (``trace.``,
    ``client.``)."""
    return _numbers(rt) | _numbers(rt.trace, "trace.") | _numbers(rt.client, "client.")


def _has(rt: Runtime, attribute: str) -> bool:
    try:
        operator.attrgetter(attribute)(rt)
    except AttributeError:
        return False
    return True


def test_every_public_number_of_the_runtime_is_listed_as_a_counter_or_a_setting(
    tmp_path: Path,
) -> None:
    def check(rt: Runtime) -> None:
        listed = {attribute for attribute, _ in RUNTIME_COUNTERS}
        assert public_numbers(rt) - listed - NOT_COUNTERS == set(), "add it to RUNTIME_COUNTERS"
        assert {a for a in listed if not _has(rt, a)} == set(), (
            "a listed counter is not on the Runtime"
        )
        assert not listed & NOT_COUNTERS

    with_runtime(tmp_path, check)


def test_each_listed_counter_is_exported_once_under_its_name(tmp_path: Path) -> None:
    def check(rt: Runtime) -> None:
        names = [name for _, name in RUNTIME_COUNTERS]
        assert len(names) == len(set(names))
        text = metrics(rt).decode()
        for name in names:
            assert f"\n{name}_total 0.0\n" in text, name
        assert "blank_id" not in text  # a setting, never a metric

    with_runtime(tmp_path, check)


def test_the_names_kept_from_before_the_list() -> None:
    named = dict(RUNTIME_COUNTERS)
    assert named["client.proposals_total"] == "enroute_ledger_proposals"
    assert named["compactions"] == "enroute_ledger_log_compactions"
    assert named["persist_wait_s"] == "enroute_ledger_persist_wait_seconds"
    assert named["leader_changes"] == "enroute_raft_leader_changes"
    assert named["wakes"] == "enroute_ledger_group_wakes"
    assert named["client.reproposals"] == "enroute_ledger_reproposals"
