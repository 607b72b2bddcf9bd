from array import array
from collections.abc import Callable
from typing import TypeVar

# An object id: 20 raw bytes (callers may use a NewType of bytes).
_Oid = TypeVar("_Oid", bound=bytes)
_Kind = TypeVar("_Kind")

def plan_run(
    pack: bytes | Callable[[int, int], bytes],
    order: list[_Oid],
    start: int,
    run_bytes_max: int,
    by_oid: dict[_Oid, int],
    columns: tuple[bytes, ...],
    placed: dict[_Oid, _Kind],
    context: dict[_Oid, _Oid],
    thin: set[_Oid],
    held: dict[_Oid, int],
    contains: Callable[[_Oid], bool],
    depth_max: int,
    depths: array[int],
    externals: set[_Oid],
    stream_bytes: int,
    /,
) -> tuple[
    int,
    tuple[
        list[_Oid],
        list[_Kind],
        list[bytes | None],
        list[int],
        list[_Oid | None],
        list[int],
        list[_Oid | None],
    ],
    list[int],
    bool,
]: ...
def bases_first(
    order: list[_Oid],
    by_oid: dict[_Oid, int],
    columns: tuple[bytes, ...],
    placed: dict[_Oid, _Kind],
    kind: _Kind,
    /,
) -> list[_Oid]: ...
