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
    oid_list: list[bytes],
    kind_oids: tuple[list[bytes], ...],
    kind_runs: list[tuple[int, Any]],
    base_map: dict[int, bytes],
    context_map: dict[int, bytes],
    kind_type: type,
    pack_types: tuple[int, ...],
    merged: bool,
    objects_max: int,
    object_bytes_max: int,
    depth_max: int,
    /,
) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes] | None: ...
