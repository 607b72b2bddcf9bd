"""Commit section and commit graph codecs (seed 004, "Layers"; DESIGN "Layers").

Commit section (every layer), at ``commit_off``::

    records   commit_count x <I I q I I I I>: local index, tree ref, commit time,
              parents start, parents count, members start, members count
    parents   commit_parent_count x u32 refs
    members   commit_member_count x u32 refs (each commit's run sorted, no repeats)

Records are in topological order (parents first). Refs are layer refs
(local index, ``0x80000000 | external index`` or none), so a commit's data is
found without scanning.

Commit graph (merged layers only), at ``graph_off``: fixed-width columns by
commit rank, ranks in ascending commit id (id order is topological, seed 004,
"Stable object numbering"). Ids here are repository ids, not refs: a merged
layer is written after its range is known, and parents, trees and segment
members may live in older layers::

    commit ids       n x u32 (strictly ascending)
    tree ids         n x u32
    generations      n x u32
    times            n x i64
    parent starts    n x u32    parent counts   n x u32
    segment starts   n x u32    segment counts  n x u32
    parent ids       graph_parent_count x u32
    segment ids      graph_member_count x u32 (each commit's run sorted, no repeats)
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from enroute_core.base.errors import CorruptData, InvalidArgument
from enroute_core.base.ids import ObjectId
from enroute_core.storage.layer.format import COMMIT_RECORD, S_GRAPH, U32_MAX

I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """A commit as the engine hands it to the writer, by oid.

    ``time`` is the committer time in seconds; ``segment`` is the commit's
    segment (DESIGN "Layers": the objects it introduces), in any order.
    """

    oid: ObjectId
    tree: ObjectId
    parents: tuple[ObjectId, ...]
    time: int
    segment: tuple[ObjectId, ...]


@dataclass(frozen=True, slots=True)
class CommitRecord:
    """A commit as the commit section stores it: by layer refs."""

    local_index: int
    tree_ref: int
    time: int
    parent_refs: tuple[int, ...]
    segment_refs: tuple[int, ...]


def encode_commit_section(records: Sequence[CommitRecord]) -> bytes:
    """Records, then the shared parents array, then the shared members array."""
    heads = bytearray(len(records) * COMMIT_RECORD.size)
    parents: list[int] = []
    members: list[int] = []
    for i, r in enumerate(records):
        COMMIT_RECORD.pack_into(
            heads,
            i * COMMIT_RECORD.size,
            r.local_index,
            r.tree_ref,
            r.time,
            len(parents),
            len(r.parent_refs),
            len(members),
            len(r.segment_refs),
        )
        parents.extend(r.parent_refs)
        members.extend(r.segment_refs)
    return bytes(heads) + _u32_bytes(parents) + _u32_bytes(members)


@dataclass(frozen=True, slots=True)
class GraphCommit:
    """One commit of a merged layer's graph, by repository ids."""

    commit_id: int
    tree_id: int
    generation: int
    time: int
    parents: tuple[int, ...]
    segment: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CommitGraph:
    """The decoded commit graph: flat arrays by rank (seed 004, "Design": about 4 bytes per
    segment member plus about 32 bytes per commit)."""

    commit_ids: array[int]
    tree_ids: array[int]
    generations: array[int]
    times: array[int]
    parent_starts: array[int]
    parent_counts: array[int]
    segment_starts: array[int]
    segment_counts: array[int]
    parent_ids: array[int]
    segment_ids: array[int]

    @classmethod
    def empty(cls) -> CommitGraph:
        """A graph of no commit, to :meth:`append` to in ascending commit id."""
        return cls(**{f: array("q" if f == "times" else "I") for f in cls.__dataclass_fields__})

    def append(
        self,
        commit_id: int,
        *,
        tree_id: int,
        generation: int,
        time: int,
        parents: Iterable[int],
        segment: Iterable[int],
    ) -> None:
        """One more commit, above every commit id the graph holds; ``segment`` ascending."""
        self.commit_ids.append(commit_id)
        self.tree_ids.append(tree_id)
        self.generations.append(generation)
        self.times.append(time)
        self.parent_starts.append(len(self.parent_ids))
        self.parent_ids.extend(parents)
        self.parent_counts.append(len(self.parent_ids) - self.parent_starts[-1])
        self.segment_starts.append(len(self.segment_ids))
        self.segment_ids.extend(segment)
        self.segment_counts.append(len(self.segment_ids) - self.segment_starts[-1])

    def __len__(self) -> int:
        return len(self.commit_ids)

    def rank_of(self, commit_id: int) -> int | None:
        rank = bisect_left(self.commit_ids, commit_id)
        if rank < len(self.commit_ids) and self.commit_ids[rank] == commit_id:
            return rank
        return None

    def parents(self, rank: int) -> array[int]:
        s = self.parent_starts[rank]
        return self.parent_ids[s : s + self.parent_counts[rank]]

    def segment(self, rank: int) -> array[int]:
        s = self.segment_starts[rank]
        return self.segment_ids[s : s + self.segment_counts[rank]]

    def commit(self, rank: int) -> GraphCommit:
        return GraphCommit(
            commit_id=self.commit_ids[rank],
            tree_id=self.tree_ids[rank],
            generation=self.generations[rank],
            time=self.times[rank],
            parents=tuple(self.parents(rank)),
            segment=tuple(self.segment(rank)),
        )

    def check(self) -> None:
        """The full structural check (``LayerReader.verify``): what decoding leaves out."""
        n = len(self)
        p = s = 0
        for rank in range(n):
            cid = self.commit_ids[rank]
            if rank and cid <= self.commit_ids[rank - 1]:
                _corrupt("commit ids are not ascending", rank)
            if self.parent_starts[rank] != p or self.segment_starts[rank] != s:
                _corrupt("ranges are not contiguous", rank)
            p += self.parent_counts[rank]
            s += self.segment_counts[rank]
            if self.generations[rank] < 1:
                _corrupt("generation is 0", rank)
            for parent in self.parents(rank):
                if parent >= cid:
                    _corrupt("a parent id is not below its commit id", rank)
                prank = self.rank_of(parent)
                if prank is not None and self.generations[prank] >= self.generations[rank]:
                    _corrupt("generation is not above a parent's", rank)
            seg = self.segment(rank)
            if any(seg[i] >= seg[i + 1] for i in range(len(seg) - 1)):
                _corrupt("segment is not sorted and unique", rank)
        if p != len(self.parent_ids) or s != len(self.segment_ids):
            _corrupt("ranges do not cover the shared arrays", n)


def _corrupt(what: str, rank: int) -> None:
    raise CorruptData(f"commit graph: {what}", section=S_GRAPH, rank=rank)


def check_graph_input(commits: Sequence[GraphCommit]) -> None:
    """Refuse a graph the reader would call corrupt (writer side of ``CommitGraph.check``)."""
    gens: dict[int, int] = {}
    prev = -1
    for c in commits:
        for v in (c.commit_id, c.tree_id, c.generation, *c.parents, *c.segment):
            if not 0 <= v <= U32_MAX:
                raise InvalidArgument(f"graph commit {c.commit_id}: {v} is not a u32")
        if c.commit_id <= prev:
            raise InvalidArgument(f"graph commit ids must ascend: {c.commit_id} after {prev}")
        prev = c.commit_id
        if not I64_MIN <= c.time <= I64_MAX:
            raise InvalidArgument(f"graph commit {c.commit_id}: time {c.time} is not an i64")
        if c.generation < 1:
            raise InvalidArgument(f"graph commit {c.commit_id}: generation must be at least 1")
        for parent in c.parents:
            if parent >= c.commit_id:
                raise InvalidArgument(f"graph commit {c.commit_id}: parent {parent} is not older")
            if parent in gens and gens[parent] >= c.generation:
                raise InvalidArgument(f"graph commit {c.commit_id}: generation not above parent's")
        if any(c.segment[i] >= c.segment[i + 1] for i in range(len(c.segment) - 1)):
            raise InvalidArgument(f"graph commit {c.commit_id}: segment must be sorted and unique")
        gens[c.commit_id] = c.generation


def encode_commit_graph(commits: Sequence[GraphCommit]) -> bytes:
    """Columns by rank, then the shared parent and segment id arrays."""
    starts_p: list[int] = []
    starts_s: list[int] = []
    parents: list[int] = []
    segment: list[int] = []
    for c in commits:
        starts_p.append(len(parents))
        starts_s.append(len(segment))
        parents.extend(c.parents)
        segment.extend(c.segment)
    times = array("q", [c.time for c in commits])
    if sys.byteorder == "big":  # pragma: no cover - the file is little-endian
        times.byteswap()
    return b"".join(
        (
            _u32_bytes([c.commit_id for c in commits]),
            _u32_bytes([c.tree_id for c in commits]),
            _u32_bytes([c.generation for c in commits]),
            times.tobytes(),
            _u32_bytes(starts_p),
            _u32_bytes([len(c.parents) for c in commits]),
            _u32_bytes(starts_s),
            _u32_bytes([len(c.segment) for c in commits]),
            _u32_bytes(parents),
            _u32_bytes(segment),
        )
    )


def decode_commit_graph(
    raw: bytes, commit_count: int, parent_count: int, member_count: int
) -> CommitGraph:
    """Columns from ``raw``; every range is checked to lie inside its shared array."""
    n = commit_count
    if len(raw) != n * 36 + (parent_count + member_count) * 4:
        raise CorruptData("commit graph has the wrong length", section=S_GRAPH)
    pos = 0

    def take(code: str, count: int) -> array[int]:
        nonlocal pos
        width = 8 if code == "q" else 4
        out = _array(code, raw[pos : pos + count * width])
        pos += count * width
        return out

    g = CommitGraph(
        commit_ids=take("I", n),
        tree_ids=take("I", n),
        generations=take("I", n),
        times=take("q", n),
        parent_starts=take("I", n),
        parent_counts=take("I", n),
        segment_starts=take("I", n),
        segment_counts=take("I", n),
        parent_ids=take("I", parent_count),
        segment_ids=take("I", member_count),
    )
    for rank in range(n):
        if g.parent_starts[rank] + g.parent_counts[rank] > parent_count:
            _corrupt("a parent range is outside the parent ids", rank)
        if g.segment_starts[rank] + g.segment_counts[rank] > member_count:
            _corrupt("a segment range is outside the segment ids", rank)
    return g


def u32_array(raw: bytes) -> array[int]:
    return _array("I", raw)


def _array(code: str, raw: bytes) -> array[int]:
    out = array(code)
    assert out.itemsize == (8 if code == "q" else 4), out.itemsize
    out.frombytes(raw)
    if sys.byteorder == "big":  # pragma: no cover - the file is little-endian
        out.byteswap()
    return out


def _u32_bytes(values: Sequence[int]) -> bytes:
    out = array("I", values)
    assert out.itemsize == 4, out.itemsize
    if sys.byteorder == "big":  # pragma: no cover - the file is little-endian
        out.byteswap()
    return out.tobytes()
