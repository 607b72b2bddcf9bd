from array import array
from typing import Any

def append_run(
    run: tuple[list[Any], ...],
    first: int,
    pos: int,
    index: dict[bytes, int],
    pending: dict[bytes, int],
    kind_bytes: bytearray,
    depth_column: array[int],
    kind_type: type,
    pack_types: tuple[int, ...],
    merged: bool,
    objects_max: int,
    object_bytes_max: int,
    depth_max: int,
    /,
) -> (
    tuple[
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
        bytes,
        dict[bytes, int],
        tuple[list[bytes], list[bytes], list[bytes], list[bytes]],
        list[tuple[int, Any]],
        dict[int, bytes],
        dict[int, bytes],
        dict[bytes, int],
    ]
    | None
): ...
