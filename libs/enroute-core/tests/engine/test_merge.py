"""Merging a run of layers (seed 004, "Stable object numbering": Assignment and Effects).

Histories are built in process from real Git objects: pushes ingested against
a snapshot that may lag the log (concurrent pushes), so later layers hold
duplicates of objects other pushes stored first, and REF_DELTA entries whose
bases are local, in older layers, or duplicates. The merged layer is checked
against the view of the sources: every oid keeps its id, every body and the
whole commit graph are unchanged, and ``replace_layers`` accepts the output
and releases the pins of the inline run.
"""

from __future__ import annotations

import os
import random
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enroute_core.base.errors import InvalidArgument
from enroute_core.base.ids import LogIndex, ObjectId
from enroute_core.engine.compaction import plan
from enroute_core.engine.maintenance import merge_stretch
from enroute_core.engine.merge import MergedLayer, ViewBefore, merge_layers
from enroute_core.engine.serve import plan_fetch, write_pack
from enroute_core.engine.view import View
from enroute_core.git.delta import create_delta
from enroute_core.git.object_type import ObjectType
from enroute_core.git.objects import object_id
from enroute_core.git.pack import encode_entry_header
from enroute_core.git.source import BytesSource
from enroute_core.state import LayersChanged, OutcomeCode, PinsChanged, RepoState, apply
from enroute_core.state.model import LayerEntry as ManifestEntry
from enroute_core.state.model import LayerKind as ManifestKind
from enroute_core.storage.layer import CommitInfo, Kind, LayerEntry, LayerReader, write_layer
from enroute_testing.gitcli import run_git
from enroute_testing.pushed import inline_entry, merge

Layer = tuple[ManifestEntry, LayerReader]
REF_DELTA = 7


@dataclass
class Push:
    """One push as ingest would store it: entries in storage order and commit records."""

    entries: list[LayerEntry] = field(default_factory=list)
    commits: list[CommitInfo] = field(default_factory=list)


@dataclass
class History:
    """Layers in log order and the bodies of every object, for checking reads."""

    layers: list[Layer] = field(default_factory=list)
    bodies: dict[bytes, bytes] = field(default_factory=dict)
    depths: dict[bytes, int] = field(default_factory=dict)
    next_id: int = 0
    pin: int = 0

    def add(self, push: Push) -> None:
        data, sealed = write_layer(push.entries, push.commits)
        reader = LayerReader.open(BytesSource(data), meta_size=sealed.meta_size)
        self.pin += 1
        entry = inline_entry(sealed, self.next_id, self.pin)
        self.layers.append((entry, reader))
        self.next_id = entry.end_id


def full(kind: Kind, otype: ObjectType, body: bytes) -> LayerEntry:
    oid = object_id(otype, body)
    entry = encode_entry_header(int(otype), len(body)) + zlib.compress(body)
    return LayerEntry(oid, kind, entry, len(body), None, 0)


def delta(oid: ObjectId, body: bytes, base: ObjectId, base_body: bytes, depth: int) -> LayerEntry:
    d = create_delta(base_body, body)
    entry = encode_entry_header(REF_DELTA, len(d)) + base + zlib.compress(d)
    return LayerEntry(oid, Kind.BLOB, entry, len(body), base, depth)


def tree_body(blobs: list[tuple[bytes, ObjectId]]) -> bytes:
    return b"".join(b"100644 " + name + b"\0" + oid for name, oid in sorted(blobs))


def commit_body(tree: ObjectId, parents: list[ObjectId], n: int) -> bytes:
    lines = [b"tree " + tree.hex().encode()]
    lines += [b"parent " + p.hex().encode() for p in parents]
    who = b"A U Thor <a@example.com> %d +0000" % (1_700_000_000 + n)
    lines += [b"author " + who, b"committer " + who, b"", b"push %d" % n, b""]
    return b"\n".join(lines)


def make_push(
    h: History,
    rng: random.Random,
    n: int,
    snapshot: int,
    pool: list[bytes],
) -> Push:
    """A push ingested against the first ``snapshot`` layers: it may store again objects
    that layers after the snapshot hold (concurrent pushes), as ingest cannot know."""
    visible: dict[bytes, bytes] = {}
    trees: set[bytes] = set()
    tips: list[ObjectId] = []
    for _, reader in h.layers[:snapshot]:
        for local in range(reader.object_count):
            oid = reader.record(local).oid
            if reader.kind_of(local) == Kind.BLOB:
                visible.setdefault(oid, h.bodies[oid])
            elif reader.kind_of(local) == Kind.TREE:
                trees.add(oid)
            elif reader.kind_of(local) == Kind.COMMIT:
                tips.append(oid)
    push = Push()
    blobs: list[LayerEntry] = []
    names: list[tuple[bytes, ObjectId]] = []
    local_depth: dict[bytes, int] = {}
    for j in range(rng.randint(1, 5)):
        body = (
            rng.choice(pool) if rng.random() < 0.5 else pool[rng.randrange(len(pool))] + b"%d" % n
        )
        oid = object_id(ObjectType.BLOB, body)
        names.append((b"f%d" % j, oid))
        if oid in visible or oid in local_depth:
            continue
        candidates = [(o, b, local_depth[o]) for o, b in ((e.oid, h.bodies[e.oid]) for e in blobs)]
        candidates += [(o, b, h.depths[o]) for o, b in visible.items()]
        if candidates and rng.random() < 0.7:
            base, base_body, base_depth = rng.choice(candidates)
            e = delta(oid, body, ObjectId(base), base_body, base_depth + 1)
        else:
            e = full(Kind.BLOB, ObjectType.BLOB, body)
        blobs.append(e)
        h.bodies[oid] = body
        local_depth[oid] = e.depth
        h.depths.setdefault(oid, e.depth)
    t = full(Kind.TREE, ObjectType.TREE, tree_body(names))
    parents = [rng.choice(tips)] if tips else []
    if len(tips) > 1 and rng.random() < 0.3:
        parents.append(rng.choice([p for p in tips if p != parents[0]]))
    c = full(Kind.COMMIT, ObjectType.COMMIT, commit_body(t.oid, parents, n))
    h.bodies[t.oid] = tree_body(names)
    h.bodies[c.oid] = commit_body(t.oid, parents, n)
    h.depths[t.oid] = h.depths[c.oid] = 0
    # Ingest drops what the snapshot has: a tree equal to a visible one is not stored again.
    new_tree = [] if t.oid in trees else [t]
    push.entries = [c, *new_tree, *blobs]
    segment = (c.oid, *(e.oid for e in new_tree), *(e.oid for e in blobs))
    push.commits = [CommitInfo(c.oid, t.oid, tuple(parents), 1_700_000_000 + n, segment)]
    return push


def make_history(seed: int, pushes: int) -> History:
    rng = random.Random(seed)
    pool = [rng.randbytes(rng.randint(40, 200)) for _ in range(6)]
    h = History()
    for n in range(pushes):
        lag = rng.choice([0, 0, 1, 2])  # snapshot behind the log: a concurrent push
        h.add(make_push(h, rng, n, max(0, len(h.layers) - lag), pool))
    return h


def assert_same_repository(before: View, after: View, bodies: dict[bytes, bytes]) -> None:
    """Seed 004, "Effects": the swap changes no id, body or commit of any view."""
    for oid, body in bodies.items():
        found = before.id_of_oid(ObjectId(oid))
        assert found is not None
        assert after.id_of_oid(ObjectId(oid)) == found, oid.hex()
        assert after.read_id(found) == body
        assert after.kind_of(found) == before.kind_of(found)
    assert after.commit_count == before.commit_count
    for oid in bodies:
        cid = before.id_of_oid(ObjectId(oid))
        assert cid is not None
        old, new = before.commit(cid), after.commit(cid)
        if old is None:
            assert new is None
            continue
        assert new is not None
        assert (new.tree_id, new.parents, new.time, new.generation) == (
            old.tree_id,
            old.parents,
            old.time,
            old.generation,
        )
        assert new.segment == old.segment


def check_merge(h: History, start: int, stop: int) -> MergedLayer:
    merged, out = merge(h.layers, start, stop)
    out[1].verify()
    assert out[1].is_merged
    sources = h.layers[start:stop]
    assert merged.object_count + merged.dropped == sum(r.object_count for _, r in sources)
    assert merged.id_count == sources[-1][0].end_id - sources[0][0].first_id
    after = (
        [*h.layers[:start], out, *h.layers[stop:]]
        if merged.object_count
        else [
            *h.layers[:start],
            *h.layers[stop:],
        ]
    )
    whole = View(h.layers)
    assert_same_repository(whole, View(after), h.bodies)
    # Seed 004, "Effects": the view swaps the stretch and rebuilds nothing else.
    swapped = whole.with_layers([e for e, _ in sources], [out] if merged.object_count else [])
    assert_same_repository(whole, swapped, h.bodies)
    # The graph stored in the file is the view's graph of those commits.
    graph = out[1].commit_graph()
    assert graph is not None
    for rank in range(len(graph)):
        g = graph.commit(rank)
        c = whole.commit(g.commit_id)
        assert c is not None
        assert (g.tree_id, g.parents, g.generation, g.time) == (
            c.tree_id,
            c.parents,
            c.generation,
            c.time,
        )
        assert list(g.segment) == list(c.segment)
    return merged


def seed_of() -> int:
    seed = int(os.environ.get("ENROUTE_SEED", random.randrange(1 << 32)))
    print(f"ENROUTE_SEED={seed}")
    return seed


# -- examples ---------------------------------------------------------------------------------


def test_seed004_merge_keeps_every_id_and_drops_concurrent_duplicates() -> None:
    seed = seed_of()
    h = make_history(seed, 12)
    merged = check_merge(h, 0, len(h.layers))
    assert merged.run_roots == tuple(e.root for e, _ in h.layers)


def test_seed004_duplicate_of_concurrent_push_leaves_a_hole_and_its_dependants_resolve() -> None:
    """Two pushes against the same snapshot store one blob each; the newer one also
    stores a delta against its own copy. The merge keeps the oldest copy, marks the
    hole with an id run, and the delta resolves through the kept copy."""
    base_body = b"shared blob body " * 8
    x = full(Kind.BLOB, ObjectType.BLOB, base_body)
    y_body = base_body + b" and more"
    y_oid = object_id(ObjectType.BLOB, y_body)
    h = History()
    h.bodies[x.oid] = base_body
    h.bodies[y_oid] = y_body
    for n, blobs in enumerate([[x], [x, delta(y_oid, y_body, x.oid, base_body, 1)]]):
        names = [(b"x", x.oid)] + ([(b"y", y_oid)] if len(blobs) == 2 else [])
        t = full(Kind.TREE, ObjectType.TREE, tree_body(names))
        c = full(Kind.COMMIT, ObjectType.COMMIT, commit_body(t.oid, [], n))
        h.bodies[t.oid] = tree_body(names)
        h.bodies[c.oid] = commit_body(t.oid, [], n)
        segment = (c.oid, t.oid, *(b.oid for b in blobs))
        h.add(Push([c, t, *blobs], [CommitInfo(c.oid, t.oid, (), 1_700_000_000 + n, segment)]))
    merged, (entry, reader) = merge(h.layers, 0, 2)
    assert merged.dropped == 1
    # Layer 0 holds ids 0..2 (commit, tree, x); layer 1 ids 3..6 with its x at 5: a hole.
    assert reader.id_runs == ((0, 0), (5, 6))
    assert entry.id_count == 7 and reader.object_count == 6
    y_local = reader.lookup(y_oid)
    assert y_local is not None
    rec = reader.record(y_local)
    assert rec.base_ref == reader.lookup(x.oid) and rec.depth == 1
    check_merge(h, 0, 2)


def test_seed004_merge_of_a_middle_run_resolves_externals_and_older_duplicates() -> None:
    seed = seed_of()
    h = make_history(seed, 10)
    for start, stop in [(2, 5), (3, 10), (1, 2), (9, 10)]:
        check_merge(h, start, stop)


def test_seed004_merged_layers_merge_again() -> None:
    """A compaction of flush outputs: graphs of merged sources are reused by ids."""
    seed = seed_of()
    h = make_history(seed, 9)
    _, a = merge(h.layers, 0, 3)
    _, b = merge(h.layers, 3, 6)
    second = History(layers=[a, b, *h.layers[6:]], bodies=h.bodies, depths=h.depths)
    check_merge(second, 0, 2)
    check_merge(second, 1, 5)
    merged, out = merge(second.layers, 0, len(second.layers))
    assert_same_repository(View(h.layers), View([out]), h.bodies)
    assert merged.id_count == h.next_id


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(2, 9), st.data())
def test_seed004_any_run_of_any_history_merges_without_changing_the_repository(
    seed: int, pushes: int, data: st.DataObject
) -> None:
    h = make_history(seed, pushes)
    start = data.draw(st.integers(0, pushes - 1))
    stop = data.draw(st.integers(start + 1, pushes))
    check_merge(h, start, stop)


# -- the state machine takes what the merge produces (task: replace_layers) ------------------


def state_of(h: History) -> RepoState:
    return RepoState(
        incarnation=1,
        version=len(h.layers) + 1,
        head=b"refs/heads/main",
        manifest=tuple(e for e, _ in h.layers),
        next_id=h.next_id,
        upload_gen=3,
        upload_window=64,
    )


def test_seed004_flush_output_is_accepted_and_releases_the_pins_of_the_inline_run() -> None:
    h = make_history(seed_of(), 8)
    state = state_of(h)
    merged, _ = merge(h.layers, 3, 8)
    cmd = merged.replace_command(incarnation=1, upload_gen=3)
    result = apply(state, cmd, log_index=100)
    assert result.outcome.code is OutcomeCode.OK, result.outcome
    run = state.manifest[3:8]
    pins = [e for e in result.effects if isinstance(e, PinsChanged)]
    assert pins == [PinsChanged(added=(), released=tuple(e.pin for e in run))]
    swapped = [e for e in result.effects if isinstance(e, LayersChanged)]
    assert swapped[0].removed == run
    new = result.state.manifest
    assert new[:3] == state.manifest[:3] and len(new) == 4
    assert (new[3].first_id, new[3].end_id) == (run[0].first_id, run[-1].end_id)
    assert new[3].kind is ManifestKind.STORED and new[3].root == merged.sealed.root
    assert result.state.pins() == tuple(e.pin for e in state.manifest[:3])
    # A second replacement of the same run is stale: the roots are gone.
    again = apply(result.state, cmd, log_index=101)
    assert again.outcome.code is OutcomeCode.STALE_RUN


def test_seed004_inline_merge_output_takes_a_pin_of_its_own() -> None:
    h = make_history(seed_of(), 4)
    parts: list[bytes] = []
    merged = merge_layers(h.layers[1:], parts.append, older=ViewBefore(View(h.layers), 1))
    result = apply(state_of(h), merged.replace_command(1, 0, b"".join(parts)), log_index=77)
    assert result.outcome.code is OutcomeCode.OK, result.outcome
    assert result.state.pins() == (h.layers[0][0].pin, LogIndex(77))


def test_merge_refuses_an_empty_or_inconsistent_run() -> None:
    h = make_history(1, 3)
    with pytest.raises(InvalidArgument):
        merge_layers([], lambda b: None)
    swapped = [h.layers[1], h.layers[0]]
    with pytest.raises(InvalidArgument):
        merge_layers(swapped, lambda b: None)
    entry, reader = h.layers[0]
    wrong = ManifestEntry(
        entry.kind,
        entry.first_id,
        entry.id_count + 1,
        entry.object_count,
        0,
        entry.file_size,
        entry.meta_size,
        entry.root,
        entry.pin,
    )
    with pytest.raises(InvalidArgument):
        merge_layers([(wrong, reader)], lambda b: None)


def test_seed004_the_same_push_stored_twice_merges_into_one_copy_of_everything() -> None:
    """Two computes take the same push concurrently (the same commit to two refs): the
    second layer is all duplicates, its commit included; merged with the first it
    leaves only holes, merged alone (the first is older) it leaves no output."""
    seed = seed_of()
    rng = random.Random(seed)
    pool = [rng.randbytes(100) for _ in range(4)]
    h = History()
    h.add(make_push(h, rng, 0, 0, pool))
    first = make_push(h, rng, 1, 1, pool)
    h.add(first)
    h.add(Push(list(first.entries), list(first.commits)))  # the same bytes again
    h.add(make_push(h, rng, 2, 3, pool))
    merged = check_merge(h, 1, 4)
    assert merged.dropped == h.layers[2][1].object_count
    alone, _ = merge(h.layers, 2, 3)
    assert alone.object_count == 0 and alone.outputs(upload_gen=1) == ()
    result = apply(state_of(h), alone.replace_command(1, 3), log_index=9)
    assert result.outcome.code is OutcomeCode.OK
    assert len(result.state.manifest) == 3
    rest = [*h.layers[:2], h.layers[3]]
    assert_same_repository(View(h.layers), View(rest), h.bodies)


def test_seed004_pushes_with_maintenance_keep_few_layers_and_the_same_repository() -> None:
    """Issue "Layer maintenance", acceptance in small: pushes (some concurrent) with the
    plan applied after each; every merge is swapped into the view (no rebuild), the
    repository never changes, and the layer count stays logarithmic."""
    seed = seed_of()
    rng = random.Random(seed)
    pool = [rng.randbytes(rng.randint(40, 120)) for _ in range(5)]
    h = History()  # every push, never merged: the reference
    layers: list[Layer] = []
    view = View([])
    counts = []
    for n in range(60):
        lag = rng.choice([0, 0, 0, 1])
        h.add(make_push(h, rng, n, max(0, len(h.layers) - lag), pool))
        layers.append(h.layers[-1])
        view = view.with_layers([], [h.layers[-1]])
        while (stretch := plan([e for e, _ in layers])) is not None:
            parts: list[bytes] = []
            merged = merge_stretch(view, stretch, parts.append)
            data = b"".join(parts)
            reader = LayerReader.open(BytesSource(data), meta_size=merged.sealed.meta_size)
            entry = ManifestEntry(
                ManifestKind.STORED, merged.first_id, merged.id_count, merged.object_count,
                n + 1, merged.sealed.file_size, merged.sealed.meta_size, merged.sealed.root,
                LogIndex(0),
            )  # fmt: skip
            removed = [e for e, _ in layers[stretch.start : stretch.stop]]
            added = [(entry, reader)] if merged.object_count else []
            layers[stretch.start : stretch.stop] = added
            view = view.with_layers(removed, added)
        counts.append(len(layers))
    total = sum(e.object_count for e, _ in layers)
    assert max(counts) <= total.bit_length() + 1
    assert_same_repository(View(h.layers), view, h.bodies)
    assert_same_repository(View(h.layers), View(layers), h.bodies)


@pytest.mark.interop
@pytest.mark.parametrize("ofs_delta", [True, False])
def test_clone_from_merged_layers_passes_gits_strict_checks(
    tmp_path: Path, ofs_delta: bool
) -> None:
    """Clones after a compaction are correct: a pack served from the merged layers
    (holes, deltas re-pointed at kept copies) passes ``index-pack --strict`` and
    ``fsck --strict`` with every commit as a ref."""
    h = make_history(seed_of(), 10)
    _, a = merge(h.layers, 0, 6)
    second = [a, *h.layers[6:]]
    _, b = merge(second, 1, len(second))
    view = View([a, b])
    ids = {oid: view.id_of_oid(ObjectId(oid)) for oid in h.bodies}
    commits = [oid for oid, i in ids.items() if i is not None and view.commit(i) is not None]
    assert len(commits) == 10
    plan = plan_fetch(view, [ObjectId(c) for c in commits], ofs_delta=ofs_delta)
    parts: list[bytes] = []
    write_pack(view, plan, parts.append)
    repo = tmp_path / "fresh.git"
    repo.mkdir()
    run_git(["init", "--quiet", "--bare", "."], cwd=repo)
    run_git(["index-pack", "--strict", "--stdin"], cwd=repo, input=b"".join(parts))
    for n, c in enumerate(commits):
        run_git(["update-ref", f"refs/heads/c{n}", c.hex()], cwd=repo)
    run_git(["fsck", "--strict", "--no-dangling"], cwd=repo)
    listed = run_git(["rev-list", "--objects", "--all"], cwd=repo).split(b"\n")
    assert {bytes.fromhex(line[:40].decode()) for line in listed if line} == set(h.bodies)
