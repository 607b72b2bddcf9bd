"""Fuzz target: push ingest (``enroute_core.engine.ingest.ingest_pack``), pack to layer.

Seed 004, "Layers", "Stable object numbering"; DESIGN "Layers" (segments).
Inputs: the pack mutations of the pack target (``packmodel``: real packs from
``git pack-objects`` and from our writer, changed entry by entry, re-framed),
byte mutations and raw bytes. Tips: objects the seed packs hold (commits and
tags mostly, trees and blobs too) and unknown ids. Snapshots keep the
snapshot contract (every object's closure is in it): empty, one commit's
closure, or a whole seed history. Property: only the typed errors of the
pack and object parsers and ``MissingObject`` escape; a layer that comes out
opens and verifies.
"""

from __future__ import annotations

import pytest
from fuzzkit import fuzz_settings, typed_errors
from hypothesis import event as tally
from hypothesis import given
from hypothesis import strategies as st
from packmodel import KNOWN, packs

from enroute_core.base.errors import (
    InvalidDelta,
    InvalidObject,
    InvalidPack,
    LimitExceeded,
    MissingObject,
)
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import Limits
from enroute_core.engine.ingest import ingest_pack
from enroute_core.git.commit import Commit
from enroute_core.git.object_type import ObjectType
from enroute_core.git.source import BytesSource
from enroute_core.git.tag import Tag
from enroute_core.git.tree import Tree
from enroute_core.storage.layer import LayerReader

pytestmark = pytest.mark.fuzz

ALLOWED = (InvalidPack, InvalidDelta, InvalidObject, LimitExceeded, MissingObject)


class MapSnapshot:
    def __init__(self, objects: dict[ObjectId, tuple[int, bytes]]) -> None:
        self.objects = objects

    def contains(self, oid: ObjectId) -> bool:
        return oid in self.objects

    def type_of(self, oid: ObjectId) -> ObjectType | None:
        found = self.objects.get(oid)
        return None if found is None else ObjectType(found[0])

    def size_of(self, oid: ObjectId) -> int | None:
        found = self.objects.get(oid)
        return None if found is None else len(found[1])

    def read(self, oid: ObjectId) -> tuple[ObjectType, bytes] | None:
        found = self.objects.get(oid)
        return None if found is None else (ObjectType(found[0]), found[1])


def _closure(oid: ObjectId) -> dict[ObjectId, tuple[int, bytes]]:
    out: dict[ObjectId, tuple[int, bytes]] = {}
    stack = [oid]
    while stack:
        current = stack.pop()
        if current in out or current not in KNOWN:
            continue
        type_num, body = KNOWN[current]
        out[current] = (type_num, body)
        if type_num == ObjectType.COMMIT:
            commit = Commit.parse(body)
            stack += [commit.tree, *commit.parents]
        elif type_num == ObjectType.TREE:
            stack += [e.oid for e in Tree.parse(body).entries if e.mode != 0o160000]
        elif type_num == ObjectType.TAG:
            stack.append(Tag.parse(body).object)
    return out


HISTORY_TIPS = sorted(o for o, (t, _) in KNOWN.items() if t in (ObjectType.COMMIT, ObjectType.TAG))
SNAPSHOTS = [MapSnapshot({})] + [MapSnapshot(_closure(t)) for t in HISTORY_TIPS]
# A ref may name any object (git lets a push set one to a tree or a blob).
TIPS = HISTORY_TIPS + sorted(o for o in KNOWN if o not in HISTORY_TIPS)
SMALL = Limits(delta_chain_depth_max=2, object_bytes_max=4096, tree_entries_max=2)


@fuzz_settings(400)
@given(
    pack=packs(),
    tips=st.lists(st.sampled_from(TIPS) | st.binary(min_size=20, max_size=20), max_size=3),
    snapshot=st.sampled_from(SNAPSHOTS),
    limits=st.sampled_from([Limits(), Limits(), SMALL]),
)
def test_ingest_pack(pack: bytes, tips: list[bytes], snapshot: MapSnapshot, limits: Limits) -> None:
    with typed_errors(*ALLOWED) as caught:
        result = ingest_pack(
            BytesSource(pack), [ObjectId(t) for t in tips], snapshot, limits=limits
        )
    tally(f"ingest: {type(caught[0]).__name__ if caught else 'layer'}")
    if caught or result.data is None:
        return
    LayerReader.open(BytesSource(result.data)).verify()
