"""Ledger membership drills on the local cluster: add a voter, remove one, wipe one.

``enroute cluster ledger-add|ledger-remove ID|ledger-wipe ID`` and the drill in
``tests/cluster/test_ledger_membership.py`` use these (docs/raft.md, "Membership
changes"). A voter added here is a new process ``ledger-N`` (N the next free
number) with its own directory and ports, started with the id ``enroute ledger
add`` gave it; the running voters' config files are rewritten to the new member
count, so a later restart of any of them passes the start check. Voters added
here reach the others directly (no fault proxy). The changes themselves go
through the operator's command, ``enroute ledger ... --data DIR``, run as a
child process, so the drill exercises it as an operator runs it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from enroute_testing.cluster import Cluster, Member
from enroute_testing.env import service_env
from enroute_testing.ports import free_port

CHANGE_TIMEOUT_S = 600.0
_OPENED = re.compile(r"^voter (\d+) at ")

Say = Callable[[str], None]


def voter_names(cluster: Cluster) -> list[str]:
    return sorted((n for n in cluster.members if n.startswith("ledger-")), key=_number)


def _number(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def _config(member: Member) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(member.config_path.read_text())
    return doc


def id_of(cluster: Cluster, name: str) -> int:
    """The Raft id of voter ``name`` (its ``node.id``)."""
    return int(_config(cluster.members[name])["node"]["id"])


def name_of(cluster: Cluster, node: int) -> str:
    for name in voter_names(cluster):
        if id_of(cluster, name) == node:
            return name
    raise KeyError(f"no voter with id {node}")


def _cli(cluster: Cluster, *args: str) -> list[str]:
    return [sys.executable, "-m", "enroute_gitproto.cli", "ledger", *args, "--data",
            str(cluster.root)]  # fmt: skip


def members(cluster: Cluster) -> dict[str, Any]:
    """``enroute ledger members --json``: the record and every voter's report."""
    out = subprocess.run(
        _cli(cluster, "members", "--json"),
        capture_output=True,
        text=True,
        timeout=120,
        env=service_env(PYTHONUNBUFFERED="1"),
        check=True,
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def _change(
    cluster: Cluster,
    say: Say,
    *args: str,
    started: Callable[[int], None] | None = None,
    timeout_s: float = CHANGE_TIMEOUT_S,
) -> None:
    """Run one ``enroute ledger`` change to its end, its lines passed to ``say``; killed
    after ``timeout_s`` (a change that never ends fails the drill, not its time bound)."""
    proc = subprocess.Popen(
        _cli(cluster, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=service_env(PYTHONUNBUFFERED="1"),
    )
    assert proc.stdout is not None
    watchdog = threading.Timer(timeout_s, proc.kill)
    watchdog.start()
    try:
        for line in proc.stdout:
            say(line.rstrip())
            m = _OPENED.match(line)
            if m and started is not None:
                started(int(m.group(1)))
        code = proc.wait(timeout_s)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if code != 0:
        raise RuntimeError(
            f"enroute ledger {' '.join(args)} exited {code} (limit {timeout_s:.0f} s)"
        )


def _member_list(cluster: Cluster, record: dict[str, Any], own: str, size: int) -> list[str]:
    """A member list of ``size`` entries: founders by position (their configured routes
    stay), then the record's addresses of the voters added later, then ``own``."""
    founders = int(record["founders"])
    out = [cluster.members[f"ledger-{i}"].grpc for i in range(1, min(founders, size) + 1)]
    later = record["target"] or record["voters"]
    out += [a for i, a in sorted(later.items(), key=lambda kv: int(kv[0])) if int(i) > founders]
    if own not in out:
        out.append(own)
    return (out + [own] * size)[:size]


def _rewrite_configs(cluster: Cluster, record: dict[str, Any]) -> None:
    """Every voter's ``ledger.members`` gets the size of the record's view (start check)."""
    size = len(record["target"] or record["voters"])
    for name in voter_names(cluster):
        member = cluster.members[name]
        config = _config(member)
        members = list(config["ledger"]["members"])
        if len(members) == size:
            continue
        mine = _member_list(cluster, record, member.grpc, size)
        # a founder keeps its own routes (proxies) to the other founders
        keep = min(int(record["founders"]), len(members), size)
        config["ledger"]["members"] = members[:keep] + mine[keep:]
        member.config_path.write_text(yaml.safe_dump(config, sort_keys=True))


def ledger_add(cluster: Cluster, say: Say = print) -> str:
    """Start a new voter under a new id and move every group to it; its name."""
    return _grow(cluster, say, "add")


def ledger_replace(
    cluster: Cluster,
    old: int,
    say: Say = print,
    *,
    recover_from: int | None = None,
    timeout_s: float = CHANGE_TIMEOUT_S,
) -> str:
    """``enroute ledger replace``: a new machine under a new id, then voter ``old``
    removed and stopped for good; the new voter's name. ``recover_from``: a two-voter
    ledger that lost ``old`` is recovered from that surviving voter (``--recover-from``:
    docs/raft.md, "Recovering a two-voter ledger")."""
    after = () if recover_from is None else ("--recover-from", str(recover_from))
    name = _grow(cluster, say, "replace", str(old), after=after, timeout_s=timeout_s)
    gone = name_of(cluster, old)
    cluster.keep_down.add(gone)
    cluster.terminate(gone)
    return name


def _grow(
    cluster: Cluster,
    say: Say,
    command: str,
    *before: str,
    after: tuple[str, ...] = (),
    timeout_s: float = CHANGE_TIMEOUT_S,
) -> str:
    names = voter_names(cluster)
    base = cluster.members[names[0]]
    name = f"ledger-{_number(names[-1]) + 1}"
    member = Member(name, cluster.root / name, free_port(), free_port())

    def start(nid: int) -> None:
        record = members(cluster)["record"]
        config = _config(base)
        config["node"] = {"id": str(nid), "data_dir": str(member.data_dir)}
        config["listen"] = {"grpc": member.grpc, "http": member.http}
        size = len(record["target"] or record["voters"])
        config["ledger"]["members"] = _member_list(cluster, record, member.grpc, size)
        member.directory.mkdir(parents=True, exist_ok=True)
        member.config_path.write_text(yaml.safe_dump(config, sort_keys=True))
        cluster.members[name] = member
        cluster._spawn(member)
        cluster.wait_ready(name)
        cluster.save()
        say(f"{name} started as voter {nid}")

    _change(cluster, say, command, *before, member.grpc, *after, started=start, timeout_s=timeout_s)
    assert name in cluster.members, "the change opened no voter"
    _rewrite_configs(cluster, members(cluster)["record"])
    return name


def ledger_remove(cluster: Cluster, node: int, say: Say = print) -> str:
    """Move every group off voter ``node``, then stop it for good; its name."""
    name = name_of(cluster, node)
    _change(cluster, say, "remove", str(node))
    cluster.keep_down.add(name)
    cluster.terminate(name)
    _rewrite_configs(cluster, members(cluster)["record"])
    return name


def ledger_wipe(cluster: Cluster, node: int, say: Say = print) -> str:
    """Stop voter ``node``, delete its data directory, start it again (it comes back
    blank and is readmitted: docs/raft.md, "A voter that lost its disk")."""
    name = name_of(cluster, node)
    cluster.kill(name)
    shutil.rmtree(cluster.members[name].data_dir, ignore_errors=True)
    Path(cluster.members[name].data_dir).mkdir(parents=True, exist_ok=True)
    say(f"{name} (voter {node}): data directory deleted; starting it again")
    cluster._spawn(cluster.members[name])
    cluster.wait_ready(name)
    return name
