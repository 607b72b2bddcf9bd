from collections.abc import Callable, Sequence
from typing import TypeVar

# An object id: 20 raw bytes (callers may use a NewType of bytes).
_Oid = TypeVar("_Oid", bound=bytes)

def segment(
    commit: _Oid,
    tree: _Oid,
    parent_trees: Sequence[_Oid],
    body: Callable[[_Oid], bytes],
    unusual: Callable[[_Oid], bytes],
    visit: Callable[[_Oid, bool, _Oid], None],
    too_deep: Callable[[int, _Oid], object],
    depth_max: int,
    entries_max: int,
    /,
) -> list[_Oid]: ...
