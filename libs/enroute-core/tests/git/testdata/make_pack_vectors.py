"""Regenerate the pack golden vectors from real git (run by hand, then review the diff).

    .venv/bin/python libs/enroute-core/tests/git/testdata/make_pack_vectors.py

Writes ``small-ofs.pack`` (OFS_DELTA bases, ``--delta-base-offset``),
``small-ref.pack`` (REF_DELTA bases) and, for each, ``<name>.verify``: the
object lines of ``git verify-pack -v`` as ``oid type size size-in-pack
offset [depth base]``. Ten objects: three commits rewriting one text file,
their trees, and an annotated tag.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from enroute_testing.gitcli import run_git

HERE = Path(__file__).resolve().parent


def _lines(seed: int) -> bytes:
    return b"".join(
        b"line %02d of the pack vector, revision %d\n" % (i, seed if i % 7 == 0 else 0)
        for i in range(40)
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "w"
        work.mkdir()
        run_git(["init", "-q", "-b", "main", "."], cwd=work)
        for rev in range(3):
            (work / "a.txt").write_bytes(_lines(rev))
            run_git(["add", "a.txt"], cwd=work)
            run_git(["commit", "-q", "-m", f"revision {rev}"], cwd=work)
        run_git(["tag", "-a", "-m", "first release", "v1", "HEAD~1"], cwd=work)
        for name, extra in (("small-ofs", ["--delta-base-offset"]), ("small-ref", [])):
            pack = run_git(
                ["pack-objects", "--stdout", "--revs", "-q", "--threads=1", *extra],
                cwd=work,
                input=b"main\nv1\n",
            )
            (HERE / f"{name}.pack").write_bytes(pack)
            check = Path(tmp) / f"{name}.pack"
            check.write_bytes(pack)
            run_git(["index-pack", str(check)], cwd=work)
            listing = run_git(["verify-pack", "-v", str(check.with_suffix(".idx"))], cwd=work)
            rows = [
                line
                for line in listing.splitlines()
                if len(line.split()) in (5, 7)
                and line.split()[1] in (b"commit", b"tree", b"blob", b"tag")
            ]
            (HERE / f"{name}.verify").write_bytes(b"\n".join(rows) + b"\n")


if __name__ == "__main__":
    main()
