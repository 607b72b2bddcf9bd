"""The layer writer's output: a large write goes out unbuffered, with the same bytes and
hashes as the same data written in small pieces (docs/ingest.md, "Memory")."""

from __future__ import annotations

import random

import pytest

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
