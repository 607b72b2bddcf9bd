"""The repository generator and the git driver, checked against real git.

Interop tests drive git through ``run_git`` (scrubbed environment, pytest
tmp dirs). Pack entry types follow gitformat-pack(5), "Object types";
``cat-file --batch`` framing follows git-cat-file(1), "BATCH OUTPUT".
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import zlib
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from enroute_testing.gitcli import GitFailed, GitTimeout, git_env, run_git
from enroute_testing.repogen import (
    PROFILES,
    QUIRK_IDS,
    GeneratedRepo,
    MiB,
    RepoSpec,
    VerifyPackEntry,
    _relative,
    all_objects,
    cached_repo,
    fast_import_stream,
    generate_repo,
    pack_objects,
    profile,
    verify_pack,
)

# main of RepoSpec() (defaults, seed 0). Moves whenever the generator's output
# changes; every fixture built from a spec moves with it.
GOLDEN_DEFAULT_MAIN = b"385b3b8d377322f8e069f5850294a3a94eef9e85"

FEATURES = RepoSpec(
    seed=7,
    commits=60,
    merge_every=4,
    files=30,
    rename_rate=0.1,
    delete_rate=0.05,
    large_file_bytes=100_000,
    annotated_tags=3,
    lightweight_tags=2,
    file_bytes=1500,
    executable_rate=0.1,
    symlinks=2,
)


@pytest.fixture(scope="module")
def features(tmp_path_factory: pytest.TempPathFactory) -> GeneratedRepo:
    return generate_repo(tmp_path_factory.mktemp("features") / "repo.git", FEATURES)


def git(repo: Path, *args: str) -> bytes:
    return run_git(args, cwd=repo)


def root_commit(repo: Path) -> bytes:
    return git(repo, "rev-list", "--max-parents=0", "main").strip()


def tree_modes(repo: Path, rev: str) -> Counter[bytes]:
    out = git(repo, "ls-tree", "-r", rev)
    return Counter(line.split(b" ", 1)[0] for line in out.splitlines())


# --- no git needed ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"commits": 0},
        {"files": 0},
        {"file_bytes": 0},
        {"branches": -1},
        {"large_file_bytes": -5},
        {"rename_rate": 1.5},
        {"delete_rate": -0.1},
        {"executable_rate": 2.0},
    ],
)
def test_spec_rejects_out_of_range(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        RepoSpec(**bad)  # type: ignore[arg-type]


def test_stream_is_deterministic_and_seeded() -> None:
    spec = RepoSpec(commits=30)
    first = fast_import_stream(spec)
    assert fast_import_stream(spec) == first
    assert fast_import_stream(RepoSpec(commits=30, seed=1)) != first
    assert first.endswith(b"done\n")
    assert first.count(b"\ncommit refs/heads/") + first.startswith(b"commit ") == 30


def test_stream_ignores_hash_seed() -> None:
    # Set or dict order leaking into the stream would differ between hash seeds.
    code = (
        "import hashlib, sys; from enroute_testing.repogen import RepoSpec, fast_import_stream;"
        "sys.stdout.write(hashlib.sha256(fast_import_stream(RepoSpec(commits=40))).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert digests == {
        hashlib.sha256(fast_import_stream(RepoSpec(commits=40))).hexdigest().encode()
    }


def test_relative_symlink_text() -> None:
    assert _relative(b"a/b/c.txt", b"a/x.lnk") == b"b/c.txt"
    assert _relative(b"c.txt", b"a/b/x.lnk") == b"../../c.txt"
    assert _relative(b"a/bc/c.txt", b"a/b/x.lnk") == b"../bc/c.txt"
    assert _relative(b"a/b.txt", b"a/b/x.lnk") == b"../b.txt"
    assert _relative(b"c.txt", b"x.lnk") == b"c.txt"


def test_stream_size_knob_scales_contents() -> None:
    small = fast_import_stream(RepoSpec(commits=5, file_bytes=200))
    big = fast_import_stream(RepoSpec(commits=5, file_bytes=4000))
    assert len(big) > 8 * len(small)


# --- git driver -------------------------------------------------------------------------


@pytest.mark.interop
def test_run_git_scrubs_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_DIR", "/nonexistent")
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Somebody Else")
    env = git_env(tmp_path)
    assert "GIT_DIR" not in env
    assert env["GIT_CONFIG_NOSYSTEM"] == "1"
    assert env["HOME"] == str(tmp_path)
    run_git(["init", "-q", "-b", "main", "."], cwd=tmp_path, home=tmp_path)
    (tmp_path / "f").write_bytes(b"x\n")
    run_git(["add", "f"], cwd=tmp_path, home=tmp_path)
    run_git(["commit", "-q", "-m", "m"], cwd=tmp_path, home=tmp_path)
    commit = run_git(["cat-file", "commit", "HEAD"], cwd=tmp_path, home=tmp_path)
    assert b"author Enroute Test <test@enroute.invalid> 1700000000 +0000\n" in commit
    # Fixed identity and date: the commit id is the same on every machine.
    head = run_git(["rev-parse", "HEAD"], cwd=tmp_path, home=tmp_path).strip()
    assert head == b"756db6564bb0b5ebff43ecc268429a2956046c64"


@pytest.mark.interop
def test_run_git_failure_is_typed(tmp_path: Path) -> None:
    with pytest.raises(GitFailed) as failed:
        run_git(["rev-parse", "--verify", "no-such-ref"], cwd=tmp_path)
    assert failed.value.returncode != 0
    assert b"fatal" in failed.value.stderr or b"not a git" in failed.value.stderr
    assert failed.value.argv[:2] == ("git", "rev-parse")
    out = run_git(["rev-parse", "--verify", "nope"], cwd=tmp_path, check=False)
    assert out == b""


@pytest.mark.interop
def test_run_git_timeout_is_typed(tmp_path: Path) -> None:
    with pytest.raises(GitTimeout):
        run_git(["hash-object", "--stdin"], cwd=tmp_path, input=b"x" * 1000, timeout_s=1e-6)


# --- generator --------------------------------------------------------------------------


@pytest.mark.interop
def test_same_spec_gives_same_repository(tmp_path: Path) -> None:
    one = generate_repo(tmp_path / "one", RepoSpec())
    two = generate_repo(tmp_path / "two", RepoSpec())
    assert one.refs == two.refs
    assert one.refs[b"refs/heads/main"] == GOLDEN_DEFAULT_MAIN
    assert one.head == b"refs/heads/main"
    assert git(one.path, "symbolic-ref", "HEAD").strip() == b"refs/heads/main"
    assert git(one.path, "rev-parse", "--is-bare-repository").strip() == b"true"
    other = generate_repo(tmp_path / "other", RepoSpec(seed=1))
    assert other.refs[b"refs/heads/main"] != one.refs[b"refs/heads/main"]


@pytest.mark.interop
@pytest.mark.parametrize(
    "spec",
    [
        RepoSpec(commits=1, branches=2, annotated_tags=2, lightweight_tags=2),
        RepoSpec(
            commits=12,
            files=1,
            branches=0,
            merge_every=0,
            tree_depth=0,
            binary_files=0,
            annotated_tags=0,
            lightweight_tags=0,
            symlinks=0,
            executable_rate=0.0,
            rename_rate=1.0,
            delete_rate=1.0,
            file_bytes=1,
        ),
    ],
    ids=["one-commit", "bare-minimum"],
)
def test_edge_specs_are_valid(tmp_path: Path, spec: RepoSpec) -> None:
    repo = generate_repo(tmp_path / "r.git", spec)
    git(repo.path, "fsck", "--strict", "--no-dangling")
    assert git(repo.path, "rev-list", "--count", "--all").strip() == b"%d" % spec.commits
    heads = [r for r in repo.refs if r.startswith(b"refs/heads/")]
    assert len(heads) == 1 + spec.branches
    assert len(repo.refs) == len(heads) + spec.annotated_tags + spec.lightweight_tags
    if spec.tree_depth == 0:
        assert b"/" not in git(repo.path, "ls-tree", "-r", "--name-only", "main")


@pytest.mark.interop
def test_refuses_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"")
    with pytest.raises(FileExistsError):
        generate_repo(tmp_path, RepoSpec(commits=2))


@pytest.mark.interop
def test_fsck_strict_passes(features: GeneratedRepo) -> None:
    git(features.path, "fsck", "--strict", "--no-dangling")


@pytest.mark.interop
def test_refs_match_spec(features: GeneratedRepo) -> None:
    refs = features.refs
    shown = [line.split(b" ") for line in git(features.path, "show-ref").splitlines()]
    assert refs == {name: oid for oid, name in shown}
    branches = [r for r in refs if r.startswith(b"refs/heads/")]
    assert b"refs/heads/main" in branches
    assert len(branches) == 1 + FEATURES.branches
    tags = sorted(r for r in refs if r.startswith(b"refs/tags/"))
    kinds = Counter(git(features.path, "cat-file", "-t", t.decode()).strip() for t in tags)
    assert kinds == {b"tag": FEATURES.annotated_tags, b"commit": FEATURES.lightweight_tags}
    tag = git(features.path, "cat-file", "tag", "v1.0.0")
    assert b"\ntype commit\n" in tag and b"\ntagger Release Bot " in tag
    assert git(features.path, "rev-list", "--count", "--all").strip() == b"%d" % FEATURES.commits


@pytest.mark.interop
def test_history_has_merges_and_octopus(features: GeneratedRepo) -> None:
    out = git(features.path, "rev-list", "--parents", "--merges", "main")
    parents = Counter(len(line.split()) - 1 for line in out.splitlines())
    assert parents[2] >= 2
    assert parents[3] >= 1  # an octopus merge
    assert b"Merge branch" in git(features.path, "log", "--merges", "-1", "--format=%s", "main")
    dates = git(features.path, "log", "--all", "--format=%ct").split()
    assert len(set(dates)) == FEATURES.commits  # one fixed, distinct timestamp per commit


@pytest.mark.interop
def test_history_has_renames_and_deletes(features: GeneratedRepo) -> None:
    renames = git(
        features.path, "log", "--all", "-M", "--diff-filter=R", "--name-status", "--format="
    )
    assert len([ln for ln in renames.splitlines() if ln.startswith(b"R")]) >= 2
    deletes = git(features.path, "log", "--all", "--diff-filter=D", "--format=%H")
    assert len(deletes.split()) >= 1


@pytest.mark.interop
def test_modes_binary_large_and_empty(features: GeneratedRepo) -> None:
    root = root_commit(features.path).decode()
    modes = tree_modes(features.path, root)
    assert modes[b"120000"] == FEATURES.symlinks
    assert modes[b"100755"] == round(FEATURES.files * FEATURES.executable_rate)
    assert modes[b"100644"] == FEATURES.files - modes[b"100755"] + FEATURES.binary_files + 2
    listing = git(features.path, "ls-tree", "-r", "-l", root).splitlines()
    sizes = {line.split(b"\t")[1]: line.split()[3] for line in listing}
    assert sizes[b".keep"] == b"0"
    assert sizes[b"large.dat"] == b"%d" % FEATURES.large_file_bytes
    binaries = [p for p in sizes if p.endswith(b".bin")]
    assert len(binaries) == FEATURES.binary_files
    blob = git(features.path, "cat-file", "blob", f"{root}:{binaries[0].decode()}")
    assert len(set(blob)) > 200  # random bytes, not text
    link = next(ln for ln in listing if ln.startswith(b"120000"))
    target = git(features.path, "cat-file", "blob", link.split()[2].decode())
    assert target and not target.startswith(b"/")
    versions = git(features.path, "log", "--all", "--format=%H", "--", "large.dat").split()
    assert len(versions) >= 3


# --- packs and objects ------------------------------------------------------------------


def delta_entries_resolve(entries: list[VerifyPackEntry], expect: bytes) -> int:
    by_oid = {e.oid: e for e in entries}
    deltas = [e for e in entries if e.base_oid is not None]
    for e in deltas:
        assert e.pack_type == expect, e
        assert e.depth >= 1
        assert e.base_oid is not None
        base = by_oid[e.base_oid]
        assert base.type == e.type
        if expect == b"ofs-delta":
            assert base.offset < e.offset
    for e in entries:
        if e.base_oid is None:
            assert e.pack_type == e.type and e.depth == 0
    return len(deltas)


@pytest.mark.interop
@pytest.mark.parametrize("ofs", [True, False])
def test_full_pack_deltas(features: GeneratedRepo, tmp_path: Path, ofs: bool) -> None:
    pack = pack_objects(features.path, ofs_delta=ofs)
    assert pack[:4] == b"PACK"
    assert pack == pack_objects(features.path, ofs_delta=ofs)  # one thread: reproducible
    entries = verify_pack(pack, tmp_path)
    assert len(entries) == int.from_bytes(pack[8:12], "big")
    objects = git(features.path, "rev-list", "--objects", "--all").splitlines()
    assert {e.oid for e in entries} == {line[:40] for line in objects}
    expect = b"ofs-delta" if ofs else b"ref-delta"
    assert delta_entries_resolve(entries, expect) > 20
    assert Counter(e.type for e in entries)[b"tag"] == FEATURES.annotated_tags


@pytest.mark.interop
def test_depth_limit(features: GeneratedRepo, tmp_path: Path) -> None:
    entries = verify_pack(pack_objects(features.path, depth=1), tmp_path)
    assert max(e.depth for e in entries) == 1


@pytest.mark.interop
def test_thin_pack_needs_its_bases(features: GeneratedRepo, tmp_path: Path) -> None:
    thin = pack_objects(features.path, thin=True, revs=["main"], exclude=["main~6"])
    fat = pack_objects(features.path, thin=False, revs=["main"], exclude=["main~6"])
    assert len(thin) < len(fat)
    with pytest.raises(GitFailed) as failed:
        verify_pack(thin, tmp_path)
    assert b"unresolved delta" in failed.value.stderr
    fixed = verify_pack(thin, tmp_path, fix_thin_from=features.path)
    sent = int.from_bytes(thin[8:12], "big")
    assert len(fixed) > sent  # index-pack appended the missing bases
    appended = fixed[sent:]
    assert all(e.base_oid is None for e in appended)
    bases = {e.oid for e in appended}
    assert any(e.pack_type == b"ref-delta" and e.base_oid in bases for e in fixed[:sent])
    assert len(verify_pack(fat, tmp_path)) == int.from_bytes(fat[8:12], "big")


@pytest.mark.interop
def test_pack_revs_and_exclusions(features: GeneratedRepo, tmp_path: Path) -> None:
    def oids(pack: bytes) -> set[bytes]:
        return {e.oid for e in verify_pack(pack, tmp_path)}

    def listed(*args: str) -> set[bytes]:
        return {ln[:40] for ln in git(features.path, "rev-list", "--objects", *args).splitlines()}

    assert oids(pack_objects(features.path, revs=["main~3"])) == listed("main~3")
    ranged = pack_objects(features.path, revs=["main", "--not", "main~3"])
    assert oids(ranged) == listed("main", "^main~3")
    assert oids(pack_objects(features.path, revs=["main"], exclude=["main~3"])) == oids(ranged)


@pytest.mark.interop
def test_all_objects_is_complete_and_exact(features: GeneratedRepo) -> None:
    objects = all_objects(features.path)
    reachable = git(features.path, "rev-list", "--objects", "--all").splitlines()
    assert len(objects) == len(reachable)
    counts = dict(
        line.split(b": ") for line in git(features.path, "count-objects", "-v").splitlines()
    )
    assert len(objects) == int(counts[b"count"]) + int(counts[b"in-pack"])
    assert [o[0] for o in objects] == sorted(o[0] for o in objects)
    for oid, kind, body in objects:
        header = b"%s %d\x00" % (kind, len(body))
        assert hashlib.sha1(header + body).hexdigest().encode() == oid
    kinds = Counter(kind for _, kind, _ in objects)
    assert kinds[b"commit"] == FEATURES.commits
    assert kinds[b"tag"] == FEATURES.annotated_tags


@pytest.mark.interop
@pytest.mark.slow
def test_large_history(tmp_path: Path) -> None:
    spec = RepoSpec(commits=2000, files=500)
    repo = generate_repo(tmp_path / "big.git", spec)
    assert git(repo.path, "rev-list", "--count", "--all").strip() == b"2000"
    assert len(git(repo.path, "ls-tree", "-r", "--name-only", "main").splitlines()) > 500


# --- large-project profiles -------------------------------------------------------------


def test_large_profile_promises_the_real_project_shape() -> None:
    # The numbers issue 20 asks of the benchmark's profile; generating it takes minutes,
    # so CI checks the spec here and the shape on its scaled-down copy below.
    spec = PROFILES["large"]
    assert spec.commits >= 80_000
    assert spec.wide_files >= 3_000
    assert spec.repack_depth == 50
    assert len(spec.big_blob_bytes) >= 3
    assert all(20 * MiB <= size <= 100 * MiB for size in spec.big_blob_bytes)
    tags = spec.annotated_tags + spec.lightweight_tags + spec.blob_tags + spec.tree_tags
    assert 900 <= tags <= 1100
    assert spec.quirks and spec.blob_tags and spec.tree_tags and spec.octopus_width > 2
    assert spec.rename_rate > 0 and spec.merge_every > 0
    assert profile("large", seed=3, quirks=False) == replace(spec, seed=3, quirks=False)


def fsck_ids(repo: Path) -> tuple[int, Counter[str]]:
    """git fsck's exit status and the message ids it reports, with their counts."""
    done = subprocess.run(
        ["git", "fsck", "--no-dangling"],
        cwd=repo,
        env=git_env(repo.parent),
        capture_output=True,
        text=True,
        check=False,
    )
    ids = Counter(m.group(1) for m in re.finditer(r": (\w+): ", done.stderr))
    return done.returncode, ids


@pytest.mark.interop
def test_quirks_write_every_legacy_id(tmp_path: Path) -> None:
    spec = RepoSpec(commits=3, files=3, quirks=True, blob_tags=1, tree_tags=1)
    repo = generate_repo(tmp_path / "quirks.git", spec)
    status, ids = fsck_ids(repo.path)
    assert status != 0  # the identity family is an error for git fsck
    assert set(ids) == QUIRK_IDS
    assert ids["badTimezone"] == 2  # "--700" and "+051800"
    # Six legacy commits, one per author quirk, under the generated root.
    assert int(git(repo.path, "rev-list", "--count", "--all")) == spec.commits + 6
    assert b" --700\n" in git(repo.path, "cat-file", "commit", root_commit(repo.path).decode())
    plain = generate_repo(tmp_path / "plain.git", replace(spec, quirks=False))
    git(plain.path, "fsck", "--strict", "--no-dangling")
    assert int(git(plain.path, "rev-list", "--count", "--all")) == spec.commits


@pytest.mark.interop
def test_cached_repo_generates_once(tmp_path: Path) -> None:
    spec = RepoSpec(commits=4, files=2)
    first, took = cached_repo(spec, tmp_path, "small")
    assert took > 0 and first.refs == generate_repo(tmp_path / "fresh" / "repo", spec).refs
    marker = first.path / "marker"
    marker.write_bytes(b"")
    again, took_again = cached_repo(spec, tmp_path, "small")
    assert again.path == first.path and marker.exists() and took_again == took
    other, _ = cached_repo(replace(spec, seed=1), tmp_path, "small")
    assert other.path != first.path
    assert not [p for p in tmp_path.iterdir() if "." in p.name]  # no half-made directory left


@pytest.fixture(scope="module")
def large_ci(tmp_path_factory: pytest.TempPathFactory) -> GeneratedRepo:
    return generate_repo(tmp_path_factory.mktemp("large-ci") / "repo.git", profile("large-ci"))


@pytest.mark.interop
@pytest.mark.slow
def test_large_ci_has_the_large_shape(large_ci: GeneratedRepo) -> None:
    repo, spec = large_ci.path, large_ci.spec
    # Deep delta chains: the repacked pack, as `git verify-pack -v` lists it.
    (index,) = (repo / "objects" / "pack").glob("*.idx")
    depths = Counter(
        int(parts[5])
        for parts in map(bytes.split, git(repo, "verify-pack", "-v", str(index)).splitlines())
        if len(parts) == 7 and parts[1] in (b"blob", b"tree", b"commit", b"tag")
    )
    assert max(depths) == spec.repack_depth == 50
    # A wide tree.
    assert len(git(repo, "ls-tree", "main:i18n").splitlines()) == spec.wide_files >= 3000
    # Big blobs of each kind: random bytes do not deflate, text and nibbles do.
    listing = git(repo, "ls-tree", "-l", "main:assets").splitlines()
    sizes = {line.split(b"\t")[1]: int(line.split()[3]) for line in listing}
    assert len(sizes) == len(spec.big_blob_bytes)
    for name, size in sizes.items():  # "<kind>-<n>.bin" is big_blob_bytes[n - 1]
        want = spec.big_blob_bytes[int(name.split(b"-")[1].split(b".")[0]) - 1]
        assert abs(size - want) < want / 100  # a patch of text lines moves the size a little
    for name, ratio in ((b"random-1.bin", 0.99), (b"text-2.bin", 0.5), (b"nibbles-3.bin", 0.7)):
        body = git(repo, "cat-file", "blob", f"main:assets/{name.decode()}")
        assert (len(zlib.compress(body, 1)) / len(body) > ratio) == (name == b"random-1.bin")
    # Tags: on commits (annotated and lightweight), on a blob and on a tree.
    kinds = Counter(
        tuple(line.split())
        for line in git(
            repo, "for-each-ref", "--format=%(objecttype) %(*objecttype)", "refs/tags"
        ).splitlines()
    )
    assert kinds == {
        (b"tag", b"commit"): spec.annotated_tags,
        (b"commit",): spec.lightweight_tags,
        (b"tag", b"blob"): spec.blob_tags,
        (b"tag", b"tree"): spec.tree_tags,
    }
    # Merges, octopus merges wider than two branches, renames.
    out = git(repo, "rev-list", "--parents", "--merges", "main")
    parents = Counter(len(line.split()) - 1 for line in out.splitlines())
    assert parents[2] > 10 and parents[3] >= 1 and max(parents) > 3
    renames = git(repo, "log", "--all", "-M", "--diff-filter=R", "--format=", "--name-status")
    assert len(renames.splitlines()) > 10
    # The legacy quirks, and nothing else git fsck would report.
    _, ids = fsck_ids(repo)
    assert set(ids) == QUIRK_IDS
