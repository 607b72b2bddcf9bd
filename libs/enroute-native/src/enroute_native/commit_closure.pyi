from array import array

def closure(
    graphs: tuple[
        tuple[
            int,
            int,
            array[int],
            array[int],
            array[int],
            array[int],
            array[int],
            array[int],
            array[int],
        ],
        ...,
    ],
    starts: array[int],
    end: int,
    /,
) -> bytes | None: ...
