"""Which layers to merge next: flush and geometric compaction, as pure functions.

Issue "Layer maintenance"; seed 004, "Stable object numbering" (a merge takes
a consecutive run, its output covers the run's range) and DESIGN "Freezing
the ledger" (a flush releases the pins of inline layers so that the log can
be truncated).

* **Flush** takes the newest run of consecutive inline layers (the tail, when
  the newest layer is inline) and turns it into one stored layer, which
  releases the run's pins. Applied repeatedly it leaves no inline layer.
* **Compaction** keeps the manifest a geometric progression, as Git's
  ``git repack --geometric=<factor>`` keeps packs: read from the newest layer
  back, each layer should hold at least ``factor`` times the objects of the
  next newer one. Git may roll up any packs, because it sorts them by size;
  layers are ordered by id and a merge takes a consecutive run, so the
  progression is read in id order and the rolled-up run is always a tail.
  The split is Git's: the longest progression from the oldest layer that
  holds, then the tail after it, grown while its sum is more than
  ``1/factor`` of the layer before it. After one merge the manifest is a
  progression, so ``n`` pushes leave at most ``log_factor(n) + 1`` layers;
  each object is rewritten ``O(log n)`` times.

Sizes are object counts (Git weighs packs by objects too), from the manifest
alone, so every compute plans the same merge from the same state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from enroute_core.base.errors import InvalidArgument
from enroute_core.state.model import LayerEntry, LayerKind


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """``factor``: Git's ``--geometric`` factor (2 = each layer at least twice the next
    newer). ``flush_layers_min``: inline layers a flush waits for (1: flush any).
    ``merge_objects_max``: a compaction stretch holds at most this many objects
    (0: no bound); a stretch over it is cut to its newest layers."""

    factor: int = 2
    flush_layers_min: int = 1
    merge_objects_max: int = 0

    def __post_init__(self) -> None:
        if self.factor < 2:
            raise InvalidArgument("the geometric factor is at least 2", factor=self.factor)
        if self.flush_layers_min < 1:
            raise InvalidArgument("a flush takes at least one layer")
        if self.merge_objects_max < 0:
            raise InvalidArgument("merge_objects_max is not negative")


DEFAULT_POLICY = CompactionPolicy()


@dataclass(frozen=True, slots=True)
class Stretch:
    """Manifest positions ``[start, stop)`` to replace with one merged layer."""

    start: int
    stop: int

    def __post_init__(self) -> None:
        assert 0 <= self.start < self.stop, (self.start, self.stop)

    def of(self, manifest: Sequence[LayerEntry]) -> tuple[LayerEntry, ...]:
        return tuple(manifest[self.start : self.stop])

    def __len__(self) -> int:
        return self.stop - self.start


def plan_flush(
    manifest: Sequence[LayerEntry], policy: CompactionPolicy = DEFAULT_POLICY
) -> Stretch | None:
    """The newest run of consecutive inline layers, if it has ``flush_layers_min`` layers."""
    stop = len(manifest)
    while stop and manifest[stop - 1].kind is not LayerKind.INLINE:
        stop -= 1
    start = stop
    while start and manifest[start - 1].kind is LayerKind.INLINE:
        start -= 1
    if stop == 0 or stop - start < policy.flush_layers_min:
        return None
    return Stretch(start, stop)


def plan_compaction(
    manifest: Sequence[LayerEntry], policy: CompactionPolicy = DEFAULT_POLICY
) -> Stretch | None:
    """The tail to roll up so that the manifest is a geometric progression, or None when
    it is one already (git's ``repack.c`` geometry split, read in id order)."""
    sizes = [e.object_count for e in manifest]
    n = len(sizes)
    if n < 2:
        return None
    f = policy.factor
    # The longest progression from the oldest layer: each at least f times the next.
    split = 1
    while split < n and sizes[split - 1] >= f * sizes[split]:
        split += 1
    if split == n:
        return None
    # Roll up [split, n); take older layers in while they are under f times the roll-up.
    total = sum(sizes[split:])
    while split > 0 and sizes[split - 1] < f * total:
        split -= 1
        total += sizes[split]
    start = split
    if policy.merge_objects_max:
        start = _bounded(sizes, start, n, policy.merge_objects_max)
    if n - start < 2:
        return None
    return Stretch(start, n)


def _bounded(sizes: Sequence[int], start: int, stop: int, objects_max: int) -> int:
    """Cut ``[start, stop)`` to its newest layers holding at most ``objects_max`` objects
    (always at least the newest two)."""
    total = sizes[stop - 1]
    cut = stop - 1
    while cut > start and (cut == stop - 1 or total + sizes[cut - 1] <= objects_max):
        cut -= 1
        total += sizes[cut]
    return cut


def plan(
    manifest: Sequence[LayerEntry], policy: CompactionPolicy = DEFAULT_POLICY
) -> Stretch | None:
    """The next merge. A compaction that covers the inline run flushes it too, in one
    rewrite; otherwise the flush goes first (it releases log pins), then compaction."""
    flush = plan_flush(manifest, policy)
    compaction = plan_compaction(manifest, policy)
    if flush is None:
        return compaction
    if compaction is not None and compaction.start <= flush.start and flush.stop <= compaction.stop:
        return compaction
    return flush
