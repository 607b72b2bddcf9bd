from array import array
from collections.abc import Callable

def write_run(
    rows: list[tuple[int, int, int]],
    i: int,
    last: int,
    start: int,
    limit: int,
    pos0: int,
    ofs: bool,
    offsets: array[int],
    rank0: int,
    outside: Callable[[int], int],
    read: Callable[[int, int], bytes],
    /,
) -> tuple[int, bytes, bytes, int, int, int] | None: ...
