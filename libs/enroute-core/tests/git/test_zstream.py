"""zlib streams of pack entries: exact sizes and exact stream ends (gitformat-pack.txt)."""

from __future__ import annotations

import os
import random
import zlib

import pytest

from enroute_core.base.errors import InvalidPack
from enroute_core.git.source import BytesSource
from enroute_core.git.zstream import (
    ExactInflater,
    deflate,
    deflate_bound,
    inflate_at,
    inflate_exact,
)

SEED = int(os.environ.get("ENROUTE_SEED") or random.SystemRandom().randrange(2**32))


def test_deflate_round_trip_and_bound() -> None:
    rng = random.Random(SEED)
    print(f"ENROUTE_SEED={SEED}")
    for size in (0, 1, 100, 5000, 70_000):
        data = rng.randbytes(size)
        stream = deflate(data)
        assert zlib.decompress(stream) == data
        assert len(stream) <= deflate_bound(size)


@pytest.mark.parametrize("window", [1, 3, 64, 1 << 16])
def test_inflate_at_finds_the_exact_end(window: int) -> None:
    rng = random.Random(SEED)
    print(f"ENROUTE_SEED={SEED}")
    data = rng.randbytes(3000) + b"a" * 3000
    stream = deflate(data)
    source = BytesSource(b"head" + stream + b"next entry bytes")
    got, used = inflate_at(source, 4, len(data), source.size, window_bytes=window)
    assert (got, used) == (data, len(stream))


def test_inflate_exact_checks_the_size() -> None:
    stream = deflate(b"twelve bytes")
    assert inflate_exact(stream + b"rest", 12) == (b"twelve bytes", len(stream))
    for size in (0, 11, 13):
        with pytest.raises(InvalidPack):
            inflate_exact(stream, size)


def test_truncated_and_garbled_streams() -> None:
    stream = deflate(b"some data " * 20)
    for cut in range(len(stream)):
        with pytest.raises(InvalidPack):
            inflate_exact(stream[:cut], 200)
        source = BytesSource(stream[:cut])
        with pytest.raises(InvalidPack):
            inflate_at(source, 0, 200, cut)
    with pytest.raises(InvalidPack, match="zlib"):
        inflate_exact(b"\xff" * 20, 5)


def test_inflater_never_holds_more_than_size_plus_one() -> None:
    bomb = deflate(b"\x00" * 10_000_000)
    inflater = ExactInflater(1000)
    with pytest.raises(InvalidPack, match="more than"):
        inflater.feed(bomb)


def test_inflate_at_continues_from_a_prefix_the_caller_read() -> None:
    data = b"prefix me " * 500
    stream = deflate(data)
    raw = b"hd" + stream + b"after"
    source = BytesSource(raw)
    for cut in (0, 1, 5, len(stream) // 2, len(stream), len(stream) + 5):
        prefix = raw[2 : 2 + cut]
        got = inflate_at(source, 2, len(data), len(raw), window_bytes=7, prefix=prefix)
        assert got == (data, len(stream)), cut
