"""A pack indexed while it arrives, as ``git index-pack --stdin`` reads what
``pack-objects`` sends (builtin/index-pack.c, ``fill()``: it reads stdin as it
parses, and checks the trailer once the stream ended). docs/ingest.md, "Speed".

The reader waits for the bytes it asks and never before the body's end takes
the last 20 bytes for entries; the index of a pack fed in pieces equals the
index of the whole pack; a body cut mid-way stops the reader with ``BodyCut``,
the receive loop's fault, never an indexing error.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from enroute_core.base.errors import InvalidPack, LimitExceeded
from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import Limits
from enroute_core.git.delta import create_delta
from enroute_core.git.growing import BodyCut
from enroute_core.git.pack import OBJ_BLOB
from enroute_core.git.packindexer import ObjectSink, PackIndexResult, index_pack
from enroute_core.git.packwrite import PackWriter
from enroute_core.git.source import BytesSource
from enroute_core.storage.growing import GrowingSpool
from enroute_testing.repogen import RepoSpec, generate_repo, pack_objects

_SPEC = RepoSpec(seed=23, commits=80, branches=2, merge_every=9, files=40, file_bytes=2000,
                 binary_files=2, large_file_bytes=300_000)  # fmt: skip


class _Spool:
    """A spool as the receive loop's: bytes appended, read below what was appended."""

    def __init__(self) -> None:
        self.data = bytearray()

    @property
    def size(self) -> int:
        return len(self.data)

    def read_at(self, offset: int, length: int) -> bytes:
        assert offset + length <= len(self.data), "read past what was appended"
        return bytes(self.data[offset : offset + length])


def _feeder(spool: _Spool, source: GrowingSpool, pieces: list[bytes], *, end: bool = True,
            before_last: threading.Event | None = None) -> threading.Thread:  # fmt: skip
    """Append ``pieces`` one by one (the last only once ``before_last`` is set, if given),
    then end the body."""

    def run() -> None:
        for i, piece in enumerate(pieces):
            if before_last is not None and i == len(pieces) - 1:
                before_last.wait(30)
            spool.data += piece
            source.grew(len(spool.data))
            time.sleep(0.001)
        if end:
            source.end()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.fixture(scope="module")
def git_pack(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return pack_objects(generate_repo(tmp_path_factory.mktemp("g") / "r.git", _SPEC).path)


def _calls() -> tuple[list[tuple[int, ObjectId, int, bytes | None]], ObjectSink]:
    seen: list[tuple[int, ObjectId, int, bytes | None]] = []
    return seen, lambda i, oid, t, body: seen.append((i, oid, t, body))


def test_reads_wait_for_their_bytes_and_the_trailer_stays_back() -> None:
    spool = _Spool()
    source = GrowingSpool(spool)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(source.read_entries(0, 30, 30)))
    reader.start()
    spool.data += bytes(range(40))
    source.grew(40)
    time.sleep(0.05)
    assert reader.is_alive(), "handed bytes that may be the trailer before the end"
    spool.data += bytes(range(40, 60))
    source.grew(60)
    reader.join(5)
    assert got == [bytes(range(30))]
    # what has arrived past the least asked, up to what was asked; never the last 20 bytes
    spool.data += bytes(range(60, 70))
    source.grew(70)
    assert source.read_entries(30, 20, 5) == bytes(range(30, 50))
    source.end()  # the end tells where the trailer is: entries stop 20 bytes before it
    assert source.read_entries(45, 100_000, 10) == bytes(range(45, 50))
    assert source.read_entries(50, 100_000, 10) == b""
    assert source.read_at(65, 100) == bytes(range(65, 70))
    assert source.size == 70
    assert source.consumed == 70


def test_a_cut_body_raises_to_a_waiting_reader() -> None:
    source = GrowingSpool(_Spool())
    raised: list[BaseException] = []

    def read() -> None:
        try:
            source.read_at(0, 10)
        except BodyCut as exc:
            raised.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.02)
    source.cut("the client went")
    reader.join(5)
    assert [str(e) for e in raised] == ["the client went"]
    with pytest.raises(BodyCut):
        _ = source.size


@pytest.mark.interop
@pytest.mark.parametrize("threads", [1, 4])
def test_a_pack_indexed_as_it_arrives_is_indexed_as_whole(git_pack: bytes, threads: int) -> None:
    """Same columns and the same ``on_object`` calls, by the compiled pass (it did not give
    up), and the indexer had read into the pack before its last piece arrived."""
    limits = Limits()
    whole_seen, whole_sink = _calls()
    whole = index_pack(BytesSource(git_pack), limits=limits, on_object=whole_sink, threads=threads)
    spool = _Spool()
    source = GrowingSpool(spool)
    last = threading.Event()
    consumed_before_last: list[int] = []

    def watch() -> None:  # the last piece waits until the indexer read half of the rest
        deadline = time.monotonic() + 30
        while source.consumed < len(git_pack) // 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        consumed_before_last.append(source.consumed)
        last.set()

    threading.Thread(target=watch, daemon=True).start()
    pieces = [*_pieces(git_pack[: len(git_pack) - 7], 4096), git_pack[len(git_pack) - 7 :]]
    feeder = _feeder(spool, source, pieces, before_last=last)
    seen, sink = _calls()
    streamed = index_pack(source, limits=limits, on_object=sink, threads=threads)
    feeder.join(5)
    assert streamed.compiled and whole.compiled
    assert streamed == whole
    assert seen == whole_seen
    assert consumed_before_last[0] >= len(git_pack) // 2, "no overlap: indexing waited for the end"


def _small_pack() -> bytes:
    chunks: list[bytes] = []
    writer = PackWriter(chunks.append)
    base = b"".join(b"line %d of a base\n" % i for i in range(200))
    writer.header(3)
    writer.add_full(OBJ_BLOB, base)
    writer.add_ofs_delta(12, create_delta(base, base + b"one\n"))
    writer.add_full(OBJ_BLOB, b"another\n" * 50)
    writer.finish()
    return b"".join(chunks)


def _streamed(data: bytes, limits: Limits | None = None) -> PackIndexResult:
    spool = _Spool()
    source = GrowingSpool(spool)
    feeder = _feeder(spool, source, _pieces(data, 100))
    try:
        return index_pack(source, limits=limits or Limits())
    finally:
        feeder.join(5)


def _error(data: bytes, limits: Limits | None = None, streamed: bool = False) -> str:
    with pytest.raises((InvalidPack, LimitExceeded)) as info:
        if streamed:
            _streamed(data, limits)
        else:
            index_pack(BytesSource(data), limits=limits or Limits())
    return f"{type(info.value).__name__}: {info.value}"


@pytest.mark.parametrize(
    "damage",
    ["stray", "trailer", "truncated", "short", "header-only", "count"],
)
def test_a_bad_pack_fails_streamed_as_it_fails_whole(damage: str) -> None:
    pack = _small_pack()
    bad = {
        "stray": pack[:-20] + b"xyz" + pack[-20:],
        "trailer": pack[:-1] + bytes([pack[-1] ^ 1]),
        "truncated": pack[:-30],
        "short": pack[:25],
        "header-only": pack[:12],
        "count": pack[:8] + (10**6).to_bytes(4, "big") + pack[12:],
    }[damage]
    assert _error(bad, streamed=True) == _error(bad)


def test_the_delta_expansion_bound_holds_streamed() -> None:
    """The compiled pass bounds what the deltas declare by the bytes read so far (the pack
    is at least that): what it cannot judge, the reference judges on the whole pack."""
    pack = _small_pack()
    ok = _streamed(pack)
    assert ok == index_pack(BytesSource(pack))
    tight = Limits(pack_delta_expansion_ratio_max=1, pack_delta_expansion_free_bytes=0)
    result_size = ok.objects.object_sizes[1]
    assert result_size > len(pack)
    assert _error(pack, tight, streamed=True) == _error(pack, tight)
    exact = replace(tight, pack_delta_expansion_free_bytes=result_size - len(pack))
    assert _streamed(pack, exact) == index_pack(BytesSource(pack), limits=exact)


def test_a_body_cut_mid_pack_stops_the_indexer_with_body_cut(git_pack: bytes) -> None:
    spool = _Spool()
    source = GrowingSpool(spool)
    feeder = _feeder(spool, source, _pieces(git_pack[: len(git_pack) // 2], 8192), end=False)
    feeder.join(10)
    threading.Timer(0.05, source.cut, ("the client went",)).start()
    with pytest.raises(BodyCut):
        index_pack(source, limits=Limits())


def test_the_count_waits_for_the_bytes_it_claims() -> None:
    """The indexer's tables are sized by the header's count: a streamed pack claiming more
    entries than its bytes can hold is not allocated for before the bytes are in."""
    pack = _small_pack()
    claims = pack[:8] + (1000).to_bytes(4, "big") + pack[12:]
    spool = _Spool()
    source = GrowingSpool(spool)
    spool.data += claims
    source.grew(len(claims))
    done = threading.Event()
    raised: list[Exception] = []

    def index() -> None:
        try:
            index_pack(source)
        except InvalidPack as exc:
            raised.append(exc)
        done.set()

    threading.Thread(target=index, daemon=True).start()
    time.sleep(0.05)
    assert not done.is_set(), "indexing started before the claimed entries could be in"
    assert source.consumed == 12
    source.end()
    assert done.wait(5)
    assert "claims 1000 entries" in str(raised[0])


def test_reads_after_the_end_take_no_lock_and_a_cut_still_stops_them() -> None:
    """Ingest's later steps read the spool an entry at a time once the body is in: those
    reads do not wait on the lock the receive loop writes under; a cut still raises."""
    spool = _Spool()
    source = GrowingSpool(spool)
    spool.data += bytes(range(50))
    source.grew(50)
    source.end()

    class NoLock:
        def __enter__(self) -> None:
            raise AssertionError("a read after the end took the lock")

        def __exit__(self, *exc: object) -> None:
            return None

    lock, source._changed = source._changed, NoLock()  # type: ignore[assignment]
    assert source.read_at(10, 5) == bytes(range(10, 15))
    assert source.read_at(45, 100) == bytes(range(45, 50))
    source._changed = lock
    source.cut("the push was cancelled")
    with pytest.raises(BodyCut):
        source.read_at(10, 5)
