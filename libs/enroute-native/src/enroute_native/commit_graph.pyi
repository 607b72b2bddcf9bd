from array import array

def first_graph(
    first: int,
    local_indexes: array[int],
    tree_refs: array[int],
    times: array[int],
    parent_starts: array[int],
    parent_counts: array[int],
    member_starts: array[int],
    member_counts: array[int],
    parent_refs: array[int],
    member_refs: array[int],
    /,
) -> tuple[bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes] | None: ...
