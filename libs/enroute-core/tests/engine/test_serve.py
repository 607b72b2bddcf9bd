"""Fetch planning and pack writing over a view (DESIGN "Layers": closures and kind runs;
seed 004, "Layers": a pack sent in id order names each base by offset; gitprotocol-v2
"fetch": thin-pack, ofs-delta, filter, deepen, include-tag).

Every pack written here is checked by real git: ``index-pack --strict`` and
``fsck --strict`` for self-contained packs, ``index-pack --fix-thin`` against a
repository holding the client's objects for thin ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from enroute_core.base.errors import InvalidArgument, MissingObject
from enroute_core.base.ids import ObjectId, oid_from_hex
from enroute_core.engine import serve
from enroute_core.engine.serve import (
    BlobLimit,
    BlobNone,
    FetchFilter,
    PackPlan,
    ProgressEvent,
    TreeDepth,
    WriteStats,
    plan_fetch,
    write_pack,
)
from enroute_core.engine.view import View
from enroute_core.git.object_type import ObjectType
from enroute_testing.gitcli import run_git
from enroute_testing.pushed import history_cuts, rev_list_objects, rev_parse, three_pushes
from enroute_testing.repogen import (
    GeneratedRepo,
    RepoSpec,
    generate_repo,
    pack_objects,
    verify_pack,
)

pytestmark = pytest.mark.interop

_SPEC = RepoSpec(seed=23, commits=30, branches=2, merge_every=5, files=16, file_bytes=900,
                 rename_rate=0.1, annotated_tags=2, lightweight_tags=1)  # fmt: skip


# -- the view: three pushes, ids as the state assigns them --------------------------------------


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> GeneratedRepo:
    return generate_repo(tmp_path_factory.mktemp("serve") / "full.git", _SPEC)


@pytest.fixture(scope="module")
def view(repo: GeneratedRepo) -> View:
    return View(three_pushes(repo))


@pytest.fixture(scope="module")
def old_repo(repo: GeneratedRepo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A client that has exactly what the second cut of main reaches."""
    path = tmp_path_factory.mktemp("client") / "old.git"
    path.mkdir()
    run_git(["init", "--quiet", "--bare", "."], cwd=path)
    old = rev_parse(repo.path, history_cuts(repo.path)[1]).hex()
    run_git(["index-pack", "--stdin"], cwd=path, input=pack_objects(repo.path, revs=[old]))
    return path


def _type_of(view: View, oid: ObjectId) -> ObjectType | None:
    found = view.read(oid)
    return None if found is None else found[0]


def _tips(repo: GeneratedRepo) -> list[ObjectId]:
    return [oid_from_hex(v) for v in repo.refs.values()]


def _write(view: View, plan: PackPlan) -> tuple[bytes, WriteStats, list[ProgressEvent]]:
    parts: list[bytes] = []
    events: list[ProgressEvent] = []
    stats = write_pack(view, plan, parts.append, progress=events.append, progress_every=50)
    return b"".join(parts), stats, events


def _oids(view: View, plan: PackPlan) -> set[ObjectId]:
    return {view.oid_of_id(i) for i in plan.ids}


def _strict_check(pack: bytes, tmp: Path, refs: dict[bytes, bytes]) -> None:
    """``index-pack --strict`` in a fresh repository, the refs set, then ``fsck --strict``."""
    fresh = tmp / "fresh.git"
    fresh.mkdir()
    run_git(["init", "--quiet", "--bare", "."], cwd=fresh)
    run_git(["index-pack", "--strict", "--stdin"], cwd=fresh, input=pack)
    for name, value in refs.items():
        run_git(["update-ref", name.decode(), value.decode()], cwd=fresh)
    run_git(["fsck", "--strict", "--no-dangling"], cwd=fresh)


# -- full clone -----------------------------------------------------------------------------------


@pytest.mark.parametrize("ofs_delta", [True, False])
def test_full_clone_passes_strict_checks(
    repo: GeneratedRepo, view: View, tmp_path: Path, ofs_delta: bool
) -> None:
    plan = plan_fetch(view, _tips(repo), ofs_delta=ofs_delta)
    assert _oids(view, plan) == rev_list_objects(repo.path, "--all")
    pack, stats, events = _write(view, plan)
    assert stats.object_count == plan.object_count and stats.pack_bytes == len(pack)
    assert stats.thin_kept == 0
    assert events[-1] == ProgressEvent("Writing objects", plan.object_count, plan.object_count)
    assert len(events) == plan.object_count // 50 + (plan.object_count % 50 != 0)
    _strict_check(pack, tmp_path, repo.refs)
    entries = verify_pack(pack, tmp_path)
    assert {oid_from_hex(e.oid) for e in entries} == rev_list_objects(repo.path, "--all")
    kinds = {e.pack_type for e in entries}
    if ofs_delta:
        assert stats.ofs_rewritten > 0 and b"ofs-delta" in kinds and b"ref-delta" not in kinds
    else:
        assert stats.ofs_rewritten == 0 and b"ofs-delta" not in kinds and b"ref-delta" in kinds
    # Layers 2 and 3 hold deltas against older layers: still bases in a full clone.
    assert stats.resolved == 0


def test_pack_is_in_id_order_and_copies_entries(repo: GeneratedRepo, view: View) -> None:
    plan = plan_fetch(view, _tips(repo), ofs_delta=False)
    pack, stats, _ = _write(view, plan)
    pos = 12
    for object_id in plan.ids:
        reader, local = view.locate(object_id)
        raw = reader.entry_bytes(local)
        assert pack[pos : pos + len(raw)] == raw, "stored entries are copied verbatim"
        pos += len(raw)
    assert pos == len(pack) - 20
    assert stats.copied == plan.object_count


@pytest.mark.parametrize("flush_bytes", [64, 4096])
def test_pieces_are_bounded_and_make_the_same_pack(
    repo: GeneratedRepo,
    view: View,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    flush_bytes: int,
) -> None:
    """Each piece the sink gets is at most the piece bound (twice the flush size: the
    flush size plus an entry or a run), larger ones split at the flush size, the trailer
    on the last; split anywhere, the pieces are the one pack."""
    plan = plan_fetch(view, _tips(repo))
    whole, _, _ = _write(view, plan)
    monkeypatch.setattr(serve, "_FLUSH_BYTES", flush_bytes)
    monkeypatch.setattr(serve, "_PIECE_BYTES_MAX", 2 * flush_bytes)
    parts: list[bytes] = []
    stats = write_pack(view, plan, parts.append)
    assert b"".join(parts) == whole and stats.pack_bytes == len(whole)
    largest = max(len(view.locate(i)[0].entry_bytes(view.locate(i)[1])) for i in plan.ids)
    assert largest > flush_bytes or flush_bytes > 64, "no entry is split"
    assert len(parts) > 2
    assert all(len(p) <= 2 * flush_bytes for p in parts[:-1])
    assert len(parts[-1]) <= 2 * flush_bytes + 20
    _strict_check(b"".join(parts), tmp_path, repo.refs)


# -- incremental fetches -------------------------------------------------------------------


def test_incremental_thin_fetch_is_fixable(
    repo: GeneratedRepo, view: View, old_repo: Path, tmp_path: Path
) -> None:
    old = rev_parse(repo.path, history_cuts(repo.path)[1])
    new = rev_parse(repo.path, "main")
    plan = plan_fetch(view, [new], [old], thin=True)
    want = rev_list_objects(repo.path, new.hex(), "--not", old.hex())
    assert _oids(view, plan) == want
    pack, stats, _ = _write(view, plan)
    assert stats.thin_kept > 0, "deltas against the client's objects stay thin"
    entries = verify_pack(pack, tmp_path, fix_thin_from=old_repo)
    assert want <= {oid_from_hex(e.oid) for e in entries}


def test_incremental_fetch_without_thin_is_self_contained(
    repo: GeneratedRepo, view: View, tmp_path: Path
) -> None:
    old = rev_parse(repo.path, history_cuts(repo.path)[1])
    new = rev_parse(repo.path, "main")
    plan = plan_fetch(view, [new], [old], thin=False)
    pack, stats, _ = _write(view, plan)
    assert stats.thin_kept == 0 and stats.resolved > 0
    entries = verify_pack(pack, tmp_path)
    assert {oid_from_hex(e.oid) for e in entries} == _oids(view, plan)


def test_up_to_date_fetch_is_empty(repo: GeneratedRepo, view: View, tmp_path: Path) -> None:
    main = rev_parse(repo.path, "main")
    plan = plan_fetch(view, [main], [main])
    assert plan.object_count == 0
    pack, stats, _ = _write(view, plan)
    assert len(pack) == 32 and stats.object_count == 0


def test_unknown_haves_are_ignored_and_unknown_wants_refused(
    repo: GeneratedRepo, view: View
) -> None:
    main = rev_parse(repo.path, "main")
    stranger = ObjectId(b"\x02" * 20)
    assert plan_fetch(view, [main], [stranger]).ids == plan_fetch(view, [main]).ids
    with pytest.raises(MissingObject):
        plan_fetch(view, [stranger])


# -- filters -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "git_spec"),
    [(BlobNone(), "blob:none"), (BlobLimit(1000), "blob:limit=1000"), (TreeDepth(0), "tree:0"),
     (TreeDepth(1), "tree:1"), (TreeDepth(2), "tree:2"), (TreeDepth(3), "tree:3")],
)  # fmt: skip
def test_filters_match_rev_list(
    repo: GeneratedRepo, view: View, tmp_path: Path, spec: FetchFilter, git_spec: str
) -> None:
    main = rev_parse(repo.path, "main")
    plan = plan_fetch(view, [main], filter=spec)
    want = rev_list_objects(repo.path, f"--filter={git_spec}", "main")
    assert _oids(view, plan) == want
    pack, _, _ = _write(view, plan)
    entries = verify_pack(pack, tmp_path)
    assert {oid_from_hex(e.oid) for e in entries} == want
    if isinstance(spec, BlobNone):
        assert all(e.type != b"blob" for e in entries)
        assert any(e.type == b"tree" for e in entries)


def test_blob_limit_zero_is_blob_none(repo: GeneratedRepo, view: View) -> None:
    main = rev_parse(repo.path, "main")
    assert (
        plan_fetch(view, [main], filter=BlobLimit(0)).ids
        == plan_fetch(view, [main], filter=BlobNone()).ids
    )


# -- shallow -------------------------------------------------------------------------------------


def test_deepen_1_is_the_tip_and_its_tree(repo: GeneratedRepo, view: View, tmp_path: Path) -> None:
    main = rev_parse(repo.path, "main")
    plan = plan_fetch(view, [main], deepen=1)
    assert _oids(view, plan) == rev_list_objects(repo.path, "--no-walk", "main")
    assert plan.shallow == (main,)
    pack, _, _ = _write(view, plan)
    assert {oid_from_hex(e.oid) for e in verify_pack(pack, tmp_path)} == _oids(view, plan)


@pytest.mark.parametrize("depth", [2, 4])
def test_deepen_n_matches_a_shallow_clone(repo: GeneratedRepo, view: View, depth: int) -> None:
    main = rev_parse(repo.path, "main")
    plan = plan_fetch(view, [main], deepen=depth)
    commits = run_git(["rev-list", "--first-parent", f"--max-count={depth}", "main"], cwd=repo.path)
    # Commits within ``depth`` by the shortest path; merges bring their other parents too.
    out = run_git(["rev-list", "--parents", "main"], cwd=repo.path)
    parents = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    level, seen = [main.hex().encode()], {main.hex().encode()}
    for _ in range(depth - 1):
        level = list(dict.fromkeys(p for c in level for p in parents[c] if p not in seen))
        seen.update(level)
    assert set(commits.split()) <= seen
    want = rev_list_objects(repo.path, "--no-walk", *(c.decode() for c in seen))
    assert _oids(view, plan) == want
    cut = {oid_from_hex(c) for c in level if parents[c]}
    assert set(plan.shallow) == cut


def test_deepen_must_be_positive(repo: GeneratedRepo, view: View) -> None:
    with pytest.raises(InvalidArgument):
        plan_fetch(view, [rev_parse(repo.path, "main")], deepen=0)


# -- include-tag ---------------------------------------------------------------------------------


def test_include_tag_sends_tags_of_sent_commits(repo: GeneratedRepo, view: View) -> None:
    tag_values = [oid_from_hex(v) for n, v in repo.refs.items() if n.startswith(b"refs/tags/")]
    annotated = [t for t in tag_values if _type_of(view, t) == ObjectType.TAG]
    assert annotated, "the fixture has annotated tags"
    heads = [oid_from_hex(v) for n, v in repo.refs.items() if n.startswith(b"refs/heads/")]
    plan = plan_fetch(view, heads, include_tag=tag_values)
    without = plan_fetch(view, heads)
    added = set(plan.ids) - set(without.ids)
    expected: set[int | None] = set()
    for t in annotated:
        target = rev_parse(repo.path, t.hex() + "^{}")
        if (view.id_of_oid(target) or -1) in without.ids:
            expected.add(view.id_of_oid(t))
    assert expected and added == expected


# -- wants of any kind (a partial clone fetching what it lacks) ----------------------------------


@pytest.mark.parametrize("spec", [None, BlobNone(), TreeDepth(0), BlobLimit(1)])
def test_tree_and_blob_wants_are_sent_despite_the_filter(
    repo: GeneratedRepo, view: View, spec: FetchFilter | None
) -> None:
    tree = rev_parse(repo.path, "main^{tree}")
    blob = rev_parse(repo.path, "main~1:" + _first_blob_path(repo.path))
    plan = plan_fetch(view, [tree, blob], filter=spec)
    git_filter = [] if spec is None else ["--filter=blob:none"]
    want = rev_list_objects(repo.path, *git_filter, tree.hex()) | {blob}
    if isinstance(spec, TreeDepth):
        want = {tree, blob}  # the given objects alone: tree:0 keeps nothing below them
    elif isinstance(spec, BlobLimit):
        want = rev_list_objects(repo.path, "--filter=blob:limit=1", tree.hex()) | {blob}
    assert _oids(view, plan) == want


def _first_blob_path(repo: Path) -> str:
    out = run_git(["ls-tree", "main~1"], cwd=repo)
    return next(line.split(b"\t")[1].decode() for line in out.splitlines() if b" blob " in line)


# -- shallow clients, against git's own upload-pack over file:// -----------------------------


def _all_objects(git_dir: Path) -> set[ObjectId]:
    out = run_git(["cat-file", "--batch-all-objects", "--batch-check=%(objectname)"], cwd=git_dir)
    return {oid_from_hex(line) for line in out.split()}


def _shallow_file(git_dir: Path) -> set[ObjectId]:
    path = git_dir / "shallow"
    return {oid_from_hex(x) for x in path.read_bytes().split()} if path.exists() else set()


def _shallow_clone(repo: Path, into: Path, *args: str) -> Path:
    url = "file://" + str(repo)
    run_git(["clone", "--quiet", "--bare", "--single-branch", "--branch=main", *args, url,
             str(into)], cwd=into.parent)  # fmt: skip
    return into


@pytest.mark.parametrize(
    ("fetch_args", "kwargs"),
    [(["--deepen=2"], {"deepen": 2, "deepen_relative": True}),
     (["--depth=4"], {"deepen": 4}),
     (["--unshallow"], {"deepen": 0x7FFFFFFF})],
)  # fmt: skip
def test_shallow_client_deepens_as_with_git(
    repo: GeneratedRepo,
    view: View,
    tmp_path: Path,
    fetch_args: list[str],
    kwargs: dict[str, object],
) -> None:
    client = _shallow_clone(repo.path, tmp_path / "client.git", "--depth=2")
    before, shallow_before = _all_objects(client), _shallow_file(client)
    assert shallow_before
    main = rev_parse(repo.path, "main")
    plan = plan_fetch(view, [main], [main], client_shallow=sorted(shallow_before), **kwargs)  # type: ignore[arg-type]
    run_git(["fetch", "--quiet", *fetch_args, "origin"], cwd=client)
    assert _oids(view, plan) == _all_objects(client) - before
    shallow_after = _shallow_file(client)
    assert set(plan.shallow) == shallow_after - shallow_before
    assert set(plan.unshallow) == shallow_before - shallow_after
    pack, _, _ = _write(view, plan)
    assert len(verify_pack(pack, tmp_path)) == len(plan.ids)


def test_shallow_client_without_deepen_gets_what_it_lacks(
    repo: GeneratedRepo, view: View, tmp_path: Path
) -> None:
    """A depth-1 client of an older commit fetches main: ``closure(haves)`` would hide
    objects behind its boundary that it lacks."""
    url = "file://" + str(repo.path)
    old, main = rev_parse(repo.path, "main~3"), rev_parse(repo.path, "main")
    client = tmp_path / "client.git"
    client.mkdir()
    run_git(["init", "--quiet", "--bare", "."], cwd=client)
    run_git(["-c", "protocol.version=2", "fetch", "--quiet", "--depth=1", url,
             f"{old.hex()}:refs/heads/old"], cwd=client)  # fmt: skip
    before = _all_objects(client)
    assert _shallow_file(client) == {old}
    plan = plan_fetch(view, [main], [old], client_shallow=[old])
    run_git(["fetch", "--quiet", url, "main:refs/heads/main"], cwd=client)
    assert _oids(view, plan) == _all_objects(client) - before
    assert plan.shallow == () and plan.unshallow == ()
    assert _oids(view, plan) != _oids(view, plan_fetch(view, [main], [old]))


def test_shallow_since_and_exclude_match_git(
    repo: GeneratedRepo, view: View, tmp_path: Path
) -> None:
    main = rev_parse(repo.path, "main")
    since = int(run_git(["log", "-1", "--format=%ct", "main~3"], cwd=repo.path))
    client = _shallow_clone(repo.path, tmp_path / "since.git", f"--shallow-since={since}")
    plan = plan_fetch(view, [main], deepen_since=since)
    assert _oids(view, plan) == _all_objects(client)
    assert plan.shallow, "the cut is inside the history"
    assert set(plan.shallow) == _shallow_file(client)

    other = next(n for n in repo.refs if n.startswith(b"refs/heads/") and n != b"refs/heads/main")
    name = other.decode().removeprefix("refs/heads/")
    client = _shallow_clone(repo.path, tmp_path / "not.git", f"--shallow-exclude={name}")
    plan = plan_fetch(view, [main], deepen_not=[oid_from_hex(repo.refs[other])])
    assert _oids(view, plan) == _all_objects(client)
    assert plan.shallow
    assert set(plan.shallow) == _shallow_file(client)


def test_deepen_since_selecting_nothing_is_refused(repo: GeneratedRepo, view: View) -> None:
    main = rev_parse(repo.path, "main")
    with pytest.raises(InvalidArgument):
        plan_fetch(view, [main], deepen_since=2**40)
    with pytest.raises(InvalidArgument):
        plan_fetch(view, [main], deepen=2, deepen_since=1)
