"""Whether this node's data directory is its first life, or a life after a wiped disk.

docs/raft.md, "A voter that lost its disk". A voter whose disk was wiped must not
vote or count in a quorum with a blank memory under its old id: it may vote twice
in a term, or help elect a leader that lacks an entry it had acknowledged. The
object store remembers every node that ever started:

1. ``ledger/nodes/<id>`` (JSON: node id, life id) is written before a fresh data
   directory is marked as this node's, so any node that ever sent a Raft message
   left a record.
2. A fresh data directory with no record is a first life (a founding member).
3. A fresh data directory with a record is a life after a wipe. The node lists the
   repositories the store knows *now*: only their groups can remember an earlier
   life of this node (a group of a repository created later never had it as a
   voter). It writes that list and a new random blank id to ``blank-repos`` in the
   data directory (fsynced, then renamed), then the record, then marks the
   directory. The runtime joins those groups blank until a READMIT names the id.

A crash anywhere in between starts over at the next start (the directory is not
marked yet); the worst case is a first life taken for a later one, which costs
READMITs, never safety. A single voter skips all of this: it has no quorum to be
readmitted by, and restores from the state objects instead (DESIGN, "Freezing the
ledger").
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from enroute_core.base.errors import (
    CorruptData,
    EnrouteError,
    InvalidArgument,
    InvalidName,
    NotFound,
    PreconditionFailed,
)
from enroute_core.base.ids import NodeId
from enroute_core.state.names import repo_name_from_storage
from enroute_core.storage.objectstore import ObjectStore

from .storage import LogStore

log = logging.getLogger("enroute.ledger.identity")

NODES_PREFIX = "ledger/nodes/"
BLANK_FILE = "blank-repos"
_REPOS_PREFIX = "repos/"
_LIST_PAGE = 1000
_LIST_PAGES_MAX = 1 << 20
"""Bound on list pages read at a wiped start (a billion keys)."""


@dataclass(frozen=True, slots=True)
class NodeLife:
    """``blank_id`` 0: a first life (or a single voter); else the repositories to join blank."""

    blank_id: int
    blank_repos: frozenset[str]


def node_key(node: NodeId) -> str:
    return f"{NODES_PREFIX}{int(node)}"


async def establish(
    data_dir: Path,
    logstore: LogStore,
    objstore: ObjectStore,
    node: NodeId,
    *,
    voters: int,
    new_id: int,
) -> NodeLife:
    """Mark ``data_dir`` as ``node``'s and tell which life it is (module docstring).

    ``new_id`` is a random non-zero u64 from the caller (main owns randomness).
    Raises InvalidArgument when the directory belongs to another node id.
    """
    assert 0 < new_id < 1 << 64, new_id
    known = logstore.node_identity()
    if known is not None and known != node:
        raise InvalidArgument("data dir belongs to another node id", stored=known, node=node)
    path = data_dir / BLANK_FILE
    if known is not None:
        life = read_blank_file(path) if path.exists() else NodeLife(0, frozenset())
        try:
            if not await _has_record(objstore, node):  # a directory older than the records
                await _put_record(objstore, node, new_id, None)
        except EnrouteError as e:  # needed only after a future wipe: do not stop a restart
            log.warning("node record %s not checked: %s", node_key(node), e)
        return life
    etag = await _record_etag(objstore, node)
    if etag is None or voters <= 1:
        if etag is None:
            try:
                await _put_record(objstore, node, new_id, None)
            except PreconditionFailed:
                etag = await _record_etag(objstore, node)
        if etag is None or voters <= 1:
            logstore.set_node_identity(node)
            return NodeLife(0, frozenset())
    repos = await list_repositories(objstore)
    life = NodeLife(new_id, repos)
    write_blank_file(path, life)
    log.warning(
        "node %s starts with a wiped data directory: %d repositories join blank (id %016x)",
        node,
        len(repos),
        new_id,
    )
    await _put_record(objstore, node, new_id, etag)
    logstore.set_node_identity(node)
    return life


async def _record_etag(objstore: ObjectStore, node: NodeId) -> str | None:
    try:
        _, etag = await objstore.get_with_etag(node_key(node))
    except NotFound:
        return None
    return etag


async def _has_record(objstore: ObjectStore, node: NodeId) -> bool:
    return await _record_etag(objstore, node) is not None


async def _put_record(objstore: ObjectStore, node: NodeId, life: int, etag: str | None) -> None:
    body = json.dumps({"node": int(node), "life": f"{life:016x}"}, sort_keys=True).encode()
    if etag is None:
        await objstore.put(node_key(node), body, if_none_match=True)
    else:
        await objstore.put(node_key(node), body, if_match=etag)


async def list_repositories(objstore: ObjectStore) -> frozenset[str]:
    """Every repository with a key under ``repos/``, one list page per 1,000 keys.

    After each page the listing skips the rest of the last repository's keys (its
    layers): ``<segment>0`` sorts right after ``<segment>/`` and everything in it.
    """
    names: set[str] = set()
    after: str | None = None
    for _ in range(_LIST_PAGES_MAX):
        page = await objstore.list(_REPOS_PREFIX, start_after=after, limit=_LIST_PAGE)
        last: str | None = None
        for item in page.items:
            segment = item.key[len(_REPOS_PREFIX) :].split("/", 1)[0]
            if segment:
                last = segment
                try:
                    names.add(repo_name_from_storage(segment))
                except InvalidName:
                    log.warning("key %r names no repository", item.key)
        if page.next_start_after is None or last is None:
            return frozenset(names)
        after = f"{_REPOS_PREFIX}{last}0"
    raise CorruptData("repository listing did not end", section="ledger-identity")


def write_blank_file(path: Path, life: NodeLife) -> None:
    """Durably: a temporary file, fsync, rename, fsync of the directory."""
    body = json.dumps(
        {"format": 1, "blank_id": f"{life.blank_id:016x}", "repos": sorted(life.blank_repos)}
    ).encode()
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_blank_file(path: Path) -> NodeLife:
    try:
        doc = json.loads(path.read_bytes())
        blank_id = int(doc["blank_id"], 16)
        repos = doc["repos"]
        if doc["format"] != 1 or not 0 < blank_id < 1 << 64 or not isinstance(repos, list):
            raise ValueError("bad fields")
        return NodeLife(blank_id, frozenset(str(r) for r in repos))
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptData(f"{path.name}: {e}", section="ledger-identity") from None
