"""The ledger's /metrics names: every numeric Runtime counter is exported, old names kept."""

from __future__ import annotations

from types import SimpleNamespace

from enroute_ledger.http import exported_name, runtime_counters


def test_runtime_counters_takes_public_numbers_only() -> None:
    rt = SimpleNamespace(
        applied_entries=3, handle_s=0.5, leader_changes=2, new_counter=7, _private=1,
        flag=True, name="x", groups={}, nan=float("nan"),
    )  # fmt: skip
    assert runtime_counters(rt) == {  # type: ignore[arg-type]
        "applied_entries": 3,
        "handle_s": 0.5,
        "leader_changes": 2,
        "new_counter": 7,
    }


def test_exported_names_keep_the_existing_ones() -> None:
    assert exported_name("proposals_total") == "enroute_ledger_proposals"
    assert exported_name("compactions") == "enroute_ledger_log_compactions"
    assert exported_name("persist_wait_s") == "enroute_ledger_persist_wait_seconds"
    assert exported_name("leader_changes") == "enroute_raft_leader_changes"
    # attributes added later get a derived name
    assert exported_name("reproposals") == "enroute_ledger_reproposals"
    assert exported_name("snapshot_send_s") == "enroute_ledger_snapshot_send_seconds"
    assert exported_name("blank_joined_total") == "enroute_ledger_blank_joined"
