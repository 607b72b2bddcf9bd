from collections.abc import Callable
from typing import Any

def index_pack(
    read_seq: Callable[..., bytes],
    read_at: Callable[[int, int], bytes],
    check_end: Callable[[int], object],
    find: Callable[[Any], tuple[int, bytes] | None],
    on_object: Callable[[int, Any, int, bytes | None], object] | None,
    sha1: Callable[[bytes], Any],
    count: int,
    end: int,
    size_max: int,
    object_bytes_max: int,
    free_bytes: int,
    ratio_max: int,
    depth_max: int,
    cache_max: int,
    window: int,
    expansion_max: int,
    stream_min: int,
    threads: int,
    streamed: int = 0,
    expansion_free: int = 0,
    expansion_ratio: int = 0,
    /,
) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes] | None:
    """(offsets, oids, types, sizes, object sizes, lengths, depths, base oids, has a base,
    entry types, header lengths): columns in pack order, native byte order (int64/uint64
    for offsets and sizes, int32 for depths and header lengths, 20 bytes per oid)."""
