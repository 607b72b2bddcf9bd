"""The ref map of a repository state: a persistent sorted map from ref name to value.

A :class:`~enroute_core.state.model.RepoState` is a value, and the ledger and
every compute make the next one from it for each applied entry. A plain dict
would be copied whole for that, so a push of one ref into a repository of
300,000 refs would copy 300,000 entries (and a wake from hibernation replays
dozens of entries). :class:`RefMap` shares what did not change instead:

- the refs are kept in ascending byte order, cut into leaves of about
  ``LEAF_REFS`` refs each (a plain ``dict`` in ascending insertion order, never
  changed once built), with the first name of each leaf in a sorted tuple;
- :meth:`RefMap.updated` copies only the leaves the changes fall in (a leaf
  over ``2 * LEAF_REFS`` refs splits, an empty one goes) and the two tuples of
  leaf pointers (``len / LEAF_REFS`` pointers each; 1,200 at 300,000 refs);
- iteration is in ascending name order, so the checkpoint encoder and the
  advertisements need no sort.

Everything here depends only on the names and values given: no hashing that
varies between processes, so every replica builds the same leaves (STYLE
rule 8).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import ItemsView, Iterable, Iterator, Mapping, ValuesView
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    from enroute_core.state.model import RefValue

LEAF_REFS = 256
"""Refs a leaf holds after a rebuild; a leaf splits above twice this."""
_Leaf = dict[bytes, "RefValue"]


class _Items(ItemsView[bytes, "RefValue"]):
    _mapping: RefMap

    def __iter__(self) -> Iterator[tuple[bytes, RefValue]]:
        return itertools.chain.from_iterable(leaf.items() for leaf in self._mapping._leaves)


class _Values(ValuesView["RefValue"]):
    _mapping: RefMap

    def __iter__(self) -> Iterator[RefValue]:
        return itertools.chain.from_iterable(leaf.values() for leaf in self._mapping._leaves)


class RefMap(Mapping[bytes, "RefValue"]):
    """An immutable map of ref names to values, iterated in ascending name order; see the
    module docstring. Build one with :meth:`of` or :meth:`from_ascending`, change it with
    :meth:`updated`."""

    __slots__ = ("_firsts", "_leaves", "_len")

    _firsts: tuple[bytes, ...]
    _leaves: tuple[_Leaf, ...]
    _len: int

    def __init__(self) -> None:
        self._firsts = ()
        self._leaves = ()
        self._len = 0

    @classmethod
    def _made(cls, firsts: tuple[bytes, ...], leaves: tuple[_Leaf, ...], n: int) -> RefMap:
        out = cls.__new__(cls)
        out._firsts, out._leaves, out._len = firsts, leaves, n
        return out

    @classmethod
    def from_ascending(cls, items: Iterable[tuple[bytes, RefValue]]) -> RefMap:
        """The map of ``items``, whose names the caller has in strictly ascending order."""
        leaves = []
        it = iter(items)
        while chunk := dict(itertools.islice(it, LEAF_REFS)):
            leaves.append(chunk)
        return cls._made(
            tuple(next(iter(leaf)) for leaf in leaves), tuple(leaves), sum(map(len, leaves))
        )

    @classmethod
    def of(cls, refs: Mapping[bytes, RefValue]) -> RefMap:
        """``refs`` as a RefMap: itself when it is one, else sorted once."""
        if isinstance(refs, RefMap):
            return refs
        return cls.from_ascending(sorted(refs.items()))

    # -- reading ------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, name: bytes) -> RefValue:
        i = bisect.bisect_right(self._firsts, name) - 1
        if i < 0:
            raise KeyError(name)
        return self._leaves[i][name]

    @overload
    def get(self, name: bytes, /) -> RefValue | None: ...
    @overload
    def get(self, name: bytes, default: RefValue | Any, /) -> RefValue | Any: ...

    def get(self, name: bytes, default: Any = None, /) -> Any:
        i = bisect.bisect_right(self._firsts, name) - 1
        return default if i < 0 else self._leaves[i].get(name, default)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, bytes):
            return False
        i = bisect.bisect_right(self._firsts, name) - 1
        return i >= 0 and name in self._leaves[i]

    def __iter__(self) -> Iterator[bytes]:
        return itertools.chain.from_iterable(self._leaves)

    def items(self) -> ItemsView[bytes, RefValue]:
        return _Items(self)

    def values(self) -> ValuesView[RefValue]:
        return _Values(self)

    def leaves(self) -> tuple[Mapping[bytes, RefValue], ...]:
        """The leaves in order, each a mapping in ascending name order. A leaf of this map
        that is also one of another map (the same object) holds the same refs, so work
        done per leaf can be kept by leaf while the map that holds it is kept."""
        return self._leaves

    def first_from(self, low: bytes) -> bytes | None:
        """The smallest name at or above ``low`` (None when there is none)."""
        i = max(0, bisect.bisect_right(self._firsts, low) - 1)
        for leaf in self._leaves[i:]:
            for name in leaf:
                if name >= low:
                    return name
        return None

    def __repr__(self) -> str:
        return f"RefMap({len(self)} refs)"

    # -- changing -----------------------------------------------------------------------

    def updated(self, changes: Mapping[bytes, RefValue | None]) -> RefMap:
        """A new map with ``changes`` made (a value of None deletes its name); this one is
        left as it is. Costs the leaves the changes fall in, not the whole map."""
        if not changes:
            return self
        if not self._leaves:
            return RefMap.from_ascending(sorted((k, v) for k, v in changes.items() if v))
        firsts, leaves = self._firsts, self._leaves
        touched: dict[int, list[tuple[bytes, RefValue | None]]] = {}
        for name, value in changes.items():
            i = max(0, bisect.bisect_right(firsts, name) - 1)
            touched.setdefault(i, []).append((name, value))
        n = self._len
        parts: dict[int, list[_Leaf]] = {}
        for i, edits in touched.items():
            leaf = dict(leaves[i])
            before = len(leaf)
            added = False
            for name, value in edits:
                if value is None:
                    leaf.pop(name, None)
                else:
                    added = added or name not in leaf
                    leaf[name] = value
            n += len(leaf) - before
            if added:
                leaf = dict(sorted(leaf.items()))
            parts[i] = _split(leaf)
        new_leaves = list(leaves)
        new_firsts = list(firsts)
        for i in sorted(parts, reverse=True):  # from the end: indexes before stay valid
            new_leaves[i : i + 1] = parts[i]
            new_firsts[i : i + 1] = [next(iter(p)) for p in parts[i]]
        if len(new_leaves) > 4 * (n // LEAF_REFS) + 4:  # deletions left many small leaves
            return RefMap.from_ascending(
                itertools.chain.from_iterable(leaf.items() for leaf in new_leaves)
            )
        return RefMap._made(tuple(new_firsts), tuple(new_leaves), n)


def _split(leaf: _Leaf) -> list[_Leaf]:
    """``leaf`` as it goes into the map: none when empty, cut when over twice the size."""
    if len(leaf) <= 2 * LEAF_REFS:
        return [leaf] if leaf else []
    items = list(leaf.items())
    return [dict(items[k : k + LEAF_REFS]) for k in range(0, len(items), LEAF_REFS)]
