"""The layer writer's output: a large write goes out unbuffered, with the same bytes and
hashes as the same data written in small pieces (docs/ingest.md, "Memory"); an entry
appended in pieces makes the layer its whole append makes."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable

import pytest

from enroute_core.base.errors import InvalidArgument
from enroute_core.git.objects import ObjectType, object_id
from enroute_core.git.pack import OBJ_BLOB, encode_entry_header
from enroute_core.storage.layer import Kind, LayerWriter
from enroute_core.storage.layer.writer import _FLUSH_BYTES, _Output


def _written(pieces: list[bytes]) -> tuple[bytes, list[bytes], bytes, list[int]]:
    """What the sink got, the chunk hashes, the root, and the sizes of the sink's blocks."""
    blocks: list[bytes] = []
    out = _Output(blocks.append)
    for piece in pieces:
        out.write(piece)
    chunks = out.stop_chunks()
    out.write(b"index region")
    root = out.root()
    assert out.pos == sum(len(p) for p in pieces) + len(b"index region")
    return b"".join(blocks), chunks, root, [len(b) for b in blocks]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_large_write_goes_out_whole_with_the_same_bytes_and_hashes(seed: int) -> None:
    rng = random.Random(seed)
    print(f"seed {seed}")
    large = rng.randbytes(3 * _FLUSH_BYTES + rng.randrange(1000))
    small = [rng.randbytes(rng.randrange(1, 5000)) for _ in range(50)]
    pieces = [*small[:25], large, *small[25:]]
    step = 4096
    split = [p[i : i + step] for p in pieces for i in range(0, len(p), step)]
    whole, chunks, root, sizes = _written(pieces)
    assert (whole, chunks, root) == _written(split)[:3]
    assert len(large) in sizes, "the large write was copied into the buffer"


def _layer(append: Callable[[LayerWriter], None]) -> bytes:
    blocks: list[bytes] = []
    writer = LayerWriter(blocks.append)
    append(writer)
    writer.finish()
    return b"".join(blocks)


@pytest.mark.parametrize("seed", [0, 1])
def test_an_entry_appended_in_pieces_makes_the_same_layer(seed: int) -> None:
    """``append_pieces`` (ingest's copy of a large object's entry) writes the layer that
    ``append`` of the whole entry writes: the same bytes, table and hashes."""
    rng = random.Random(seed)
    print(f"seed {seed}")
    body = rng.randbytes(2 * _FLUSH_BYTES + rng.randrange(1000))
    entry = encode_entry_header(OBJ_BLOB, len(body)) + zlib.compress(body, 1)
    oid = object_id(ObjectType.BLOB, body)
    small = b"small"
    small_entry = encode_entry_header(OBJ_BLOB, len(small)) + zlib.compress(small)
    small_oid = object_id(ObjectType.BLOB, small)
    cut = rng.randrange(20, 4096)
    pieces = [entry[i : i + _FLUSH_BYTES] for i in range(cut, len(entry), _FLUSH_BYTES)]

    def whole(writer: LayerWriter) -> None:
        writer.append(oid, Kind.BLOB, entry, len(body))
        writer.append(small_oid, Kind.BLOB, small_entry, len(small))

    def in_pieces(writer: LayerWriter) -> None:
        writer.append_pieces(oid, Kind.BLOB, entry[:cut], pieces, length=len(entry), size=len(body))
        writer.append(small_oid, Kind.BLOB, small_entry, len(small))

    assert _layer(in_pieces) == _layer(whole)


@pytest.mark.parametrize("change", [-1, 1])
def test_pieces_that_do_not_add_up_are_refused(change: int) -> None:
    body = bytes(range(256)) * 64
    entry = encode_entry_header(OBJ_BLOB, len(body)) + zlib.compress(body)
    writer = LayerWriter(lambda _: None)
    with pytest.raises(InvalidArgument, match="entry pieces"):
        writer.append_pieces(
            object_id(ObjectType.BLOB, body), Kind.BLOB, entry[:10], [entry[10:]],
            length=len(entry) + change, size=len(body),
        )  # fmt: skip
    with pytest.raises(InvalidArgument, match="finished"):
        writer.finish()
