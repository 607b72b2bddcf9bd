"""Ledger membership drills on the local cluster: add a voter, remove one, wipe one.

``enroute cluster ledger-add|ledger-remove ID|ledger-wipe ID`` and the drill in
``tests/cluster/test_ledger_membership.py`` use these (docs/raft.md, "Membership
changes"). A voter added here is a new process ``ledger-N`` (N the next free
number) with its own directory and ports, started blank at the address given to
``enroute ledger add``, with no id configured (``node.id`` is its name): it takes
the id the change gave that address, as a chart's pod does, and keeps it on its
disk. Founders keep ``node.id`` 1..3. The running voters' config files are
rewritten to the new member count, so a later restart of any of them passes the
start check. Voters added here reach the others directly (no fault proxy). The
changes themselves go through the operator's command, ``enroute ledger ...
--data DIR``, run as a child process, so the drill exercises it as an operator
runs it; the drill reads the membership from a voter's ``/membership`` (what
``enroute ledger members --json`` prints), sparing a process start per look.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from enroute_testing.cluster import Cluster, Member, get_json
from enroute_testing.env import service_env
from enroute_testing.ports import free_port

CHANGE_TIMEOUT_S = 600.0
MEMBERS_TIMEOUT_S = 30.0
_OPENED = re.compile(r"^voter (\d+) at ")

Say = Callable[[str], None]


def voter_names(cluster: Cluster) -> list[str]:
    return sorted((n for n in cluster.members if n.startswith("ledger-")), key=_number)


def _number(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def _config(member: Member) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(member.config_path.read_text())
    return doc


def _founder_id(member: Member) -> int | None:
    configured = str(_config(member)["node"]["id"])
    return int(configured) if configured.isdigit() else None


def id_of(cluster: Cluster, name: str) -> int:
    """The Raft id of voter ``name``: a founder's ``node.id``, else the id the record
    gives its address (an open change's or a voter's)."""
    member = cluster.members[name]
    founder = _founder_id(member)
    if founder is not None:
        return founder
    record = members(cluster)["record"]
    for i, address in {**record["voters"], **(record["target"] or {})}.items():
        if address == member.grpc:
            return int(i)
    raise KeyError(f"{name} ({member.grpc}) is no voter of the ledger")


def name_of(cluster: Cluster, node: int) -> str:
    names = voter_names(cluster)
    for name in names:
        if _founder_id(cluster.members[name]) == node:
            return name
    record = members(cluster)["record"]
    address = {**record["voters"], **(record["target"] or {})}.get(str(node))
    for name in names:
        if address is not None and cluster.members[name].grpc == address:
            return name
    raise KeyError(f"no voter with id {node}")


def _cli(cluster: Cluster, *args: str) -> list[str]:
    return [sys.executable, "-m", "enroute_gitproto.cli", "ledger", *args, "--data",
            str(cluster.root)]  # fmt: skip


def members(cluster: Cluster) -> dict[str, Any]:
    """What ``enroute ledger members --json`` prints: the record and every voter's
    report, from the ``/membership`` of the first live voter that answers."""
    failed: list[str] = []
    for name in voter_names(cluster):
        member = cluster.members[name]
        if name in cluster.keep_down or not member.alive():
            continue
        try:
            doc: dict[str, Any] = get_json(
                f"http://{member.http}/membership", MEMBERS_TIMEOUT_S, cluster.admin_headers
            )
        except (OSError, ValueError) as e:
            failed.append(f"{name}: {e}")
            continue
        return doc
    raise RuntimeError(f"no voter answers /membership: {failed}")


def members_cli(cluster: Cluster) -> dict[str, Any]:
    """``enroute ledger members --json``, run as the operator runs it."""
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
    gone = name_of(cluster, old)
    name = _grow(cluster, say, "replace", str(old), after=after, timeout_s=timeout_s)
    _stop_retired(cluster, gone, say)
    return name


def _stop_retired(cluster: Cluster, name: str, say: Say) -> None:
    """Stop a removed voter for good (SIGTERM: it leads nothing any more, so its drain
    is short; a drain that runs to the grace period shows in the line)."""
    cluster.keep_down.add(name)
    started = time.monotonic()
    code = cluster.terminate(name)
    say(f"{name} stopped in {time.monotonic() - started:.1f} s (exit {code})")


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
        # no id configured: a blank voter takes the one the change gave its address
        config["node"] = {"id": name, "data_dir": str(member.data_dir)}
        config["listen"] = {"grpc": member.grpc, "http": member.http}
        size = len(record["target"] or record["voters"])
        config["ledger"]["members"] = _member_list(cluster, record, member.grpc, size)
        member.directory.mkdir(parents=True, exist_ok=True)
        member.config_path.write_text(yaml.safe_dump(config, sort_keys=True))
        cluster.members[name] = member
        cluster._spawn(member)
        cluster.wait_ready(name)
        cluster.save()
        took = int(cluster.ledger_status(name)["node_id"])
        if took != nid:
            raise RuntimeError(f"{name} at {member.grpc} took id {took}, not {nid}")
        say(f"{name} started as voter {nid}")

    _change(cluster, say, command, *before, member.grpc, *after, started=start, timeout_s=timeout_s)
    assert name in cluster.members, "the change opened no voter"
    _rewrite_configs(cluster, members(cluster)["record"])
    return name


def ledger_remove(cluster: Cluster, node: int, say: Say = print) -> str:
    """Move every group off voter ``node``, then stop it for good; its name."""
    name = name_of(cluster, node)
    _change(cluster, say, "remove", str(node))
    _stop_retired(cluster, name, say)
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
