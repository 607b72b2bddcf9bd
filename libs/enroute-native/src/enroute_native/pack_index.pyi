from collections.abc import Callable
from typing import Any, TypeVar

_Info = TypeVar("_Info", bound=tuple[Any, ...])

def index_pack(
    read_seq: Callable[[int, int], bytes],
    read_at: Callable[[int, int], bytes],
    check_end: Callable[[int], object],
    find: Callable[[Any], tuple[int, bytes] | None],
    on_object: Callable[[int, Any, int, bytes | None], object] | None,
    sha1: Callable[[bytes], Any],
    info_type: type[_Info],
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
    /,
) -> tuple[_Info, ...] | None: ...
