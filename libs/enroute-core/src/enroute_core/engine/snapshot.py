"""The seam between ingest and the repository snapshot a push is ingested against.

Seed 004, "Stable object numbering": a push refers only to its own objects
and to the snapshot it was ingested against. Ingest needs these questions
answered about that snapshot: does it hold an object, of what type and size
(git's ``oid_object_info``: every object a pushed tree, commit or tag names
must have the type it is named with, as ``index-pack --strict`` checks, and a
``.gitmodules`` or ``.gitattributes`` blob is bounded before it is read), and
what is its body (thin-pack bases, trees of parent commits for segment diffs,
``.gitmodules`` and ``.gitattributes`` blobs a pushed tree names). The view
answers them from its layers; tests answer them from a real git repository.

Contract an implementation keeps (ingest relies on it for connectivity):
every object the snapshot contains has its whole closure in the snapshot,
as every layer was connectivity-checked when it was ingested.
"""

from __future__ import annotations

from typing import Protocol

from enroute_core.base.ids import ObjectId
from enroute_core.git.object_type import ObjectType


class SnapshotObjects(Protocol):
    """Objects of the snapshot a push is ingested against (read-only)."""

    def contains(self, oid: ObjectId) -> bool:
        """Whether the snapshot holds ``oid`` (and so its whole closure)."""
        ...

    def type_of(self, oid: ObjectId) -> ObjectType | None:
        """The object's type, or None when the snapshot lacks it; no body is read.

        Asked for every object a pushed tree, commit or tag names that the
        snapshot holds, so it must cost no more than :meth:`contains` and a table
        look-up (a layer's kinds are id runs).
        """
        ...

    def size_of(self, oid: ObjectId) -> int | None:
        """The object's size in bytes, or None when the snapshot lacks it; no body is read."""
        ...

    def read(self, oid: ObjectId) -> tuple[ObjectType, bytes] | None:
        """The object's type and full body, or None when the snapshot lacks it.

        Which bodies ingest reads shows only as it indexes and diffs, so it
        cannot load them before it runs. A view whose bytes are not all local is
        wrapped by the compute's ``LoadingSnapshot``, which loads a missing body
        with its delta chain and reads again (docs/residency.md, "Deviations");
        a bare view raises ``NotLocal`` instead (seed 004, "Never waiting on the
        object store").
        """
        ...


class EmptySnapshot:
    """The snapshot of a repository with no objects yet (the first push)."""

    __slots__ = ()

    def contains(self, oid: ObjectId) -> bool:
        return False

    def type_of(self, oid: ObjectId) -> ObjectType | None:
        return None

    def size_of(self, oid: ObjectId) -> int | None:
        return None

    def read(self, oid: ObjectId) -> tuple[ObjectType, bytes] | None:
        return None


EMPTY_SNAPSHOT = EmptySnapshot()
