from array import array
from collections.abc import Callable

def write_run(
    table: bytes | memoryview,
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
def check_rows(table: bytes | memoryview, start: int, data_end: int, externals: int, /) -> int: ...
