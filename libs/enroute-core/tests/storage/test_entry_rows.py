"""The object table read as records (``LayerReader.entry_rows``): the compiled check
(``enroute_native.pack_run.check_rows``, docs/native.md) against its reference,
``reader.bad_row``, on drawn tables (seed 004, "Layers": a record's extent lies in
the data region, its base ref is none, an external index or an earlier local one),
and :class:`EntryRows` against ``RECORD`` itself.

The seed is printed; ``ENROUTE_SEED=N`` replays a run.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Callable

import pytest
from enroute_native.pack_run import check_rows

from enroute_core.base.errors import CorruptData
from enroute_core.git.source import BytesSource
from enroute_core.storage.layer import LayerReader
from enroute_core.storage.layer.format import RECORD, REF_EXTERNAL, REF_NONE, S_TABLE
from enroute_core.storage.layer.reader import EntryRows, bad_row
from enroute_testing.synthlayer import reseal, synthetic_layer

SEED = int(os.environ.get("ENROUTE_SEED") or random.SystemRandom().randrange(2**32))
ROUNDS = 2000


def _record(rnd: random.Random, local: int, data_end: int, externals: int, bad: bool) -> bytes:
    """One record from local ``local``: sound, or (``bad``) failing one check at its edge."""
    length = rnd.choice([1, 2, rnd.randrange(1, 1 << 20), (1 << 32) - 1])
    length = min(length, data_end) or 1
    offset = rnd.randrange(0, data_end - length + 1) if length <= data_end else 0
    if rnd.random() < 0.2:
        offset = data_end - length  # ends exactly at the data region's end
    base = rnd.choice(
        [REF_NONE, rnd.randrange(local) if local else REF_NONE]
        + ([REF_EXTERNAL | rnd.randrange(externals)] if externals else [])
    )
    if bad:
        how = rnd.randrange(6)
        if how == 0:
            length = 0
        elif how == 1:
            offset = data_end - length + 1  # one byte past the end
        elif how == 2:
            offset = rnd.choice([data_end + 1, (1 << 64) - 1, 1 << 63])
        elif how == 3:
            base = local  # itself: not an earlier local
        elif how == 4:
            base = rnd.randrange(local, REF_EXTERNAL)
        else:  # an external index at the count, or past it
            base = REF_EXTERNAL | rnd.choice(
                [externals, rnd.randrange(externals, REF_EXTERNAL - 1)]
            )
    oid = rnd.randbytes(20)
    return RECORD.pack(oid, offset, length, rnd.randrange(1 << 40), base, 0, rnd.randrange(50))


def test_compiled_check_matches_the_reference() -> None:
    print(f"ENROUTE_SEED={SEED}")
    rnd = random.Random(SEED)
    found = passed = 0
    for round_ in range(ROUNDS):
        start = rnd.choice([0, 1, rnd.randrange(1 << 20)])
        data_end = rnd.choice([1, 100, rnd.randrange(1, 1 << 40)])
        externals = rnd.choice([0, 1, rnd.randrange(100)])
        n = rnd.randrange(0, 40)
        bad_at = rnd.randrange(n) if n and rnd.random() < 0.6 else -1
        raw = b"".join(
            _record(rnd, start + k, data_end, externals, k == bad_at or rnd.random() < 0.02)
            for k in range(n)
        )
        reference = bad_row(raw, start, data_end, externals)
        got = check_rows(raw, start, data_end, externals)
        assert got == (-1 if reference is None else reference[0]), (
            f"round {round_}, ENROUTE_SEED={SEED}")  # fmt: skip
        found += reference is not None
        passed += reference is None and n > 0
    # the draws reach both answers (a test that cannot fail is a defect)
    assert found > ROUNDS // 3 and passed > ROUNDS // 5, (found, passed)


def test_rows_are_the_records_fields() -> None:
    rnd = random.Random(SEED)
    fields = [
        (rnd.randbytes(20), rnd.randrange(1 << 64), rnd.randrange(1 << 32), rnd.randrange(1 << 64),
         rnd.randrange(1 << 32), rnd.randrange(1 << 32), rnd.randrange(1 << 32))
        for _ in range(50)
    ]  # fmt: skip
    rows = EntryRows(b"".join(RECORD.pack(*f) for f in fields))
    want = [(offset, length, base) for _, offset, length, _, base, _, _ in fields]
    assert len(rows) == 50
    assert [rows[k] for k in range(50)] == want == list(rows)
    for k in (-1, 50):
        with pytest.raises(IndexError):
            rows[k]
    assert not EntryRows(b"")


def test_a_bad_table_is_refused_whole() -> None:
    """A table whose length is not a whole number of records is an argument error, not
    a row."""
    with pytest.raises(ValueError, match="out of range"):
        check_rows(b"\0" * (RECORD.size + 1), 0, 10, 0)


@pytest.mark.parametrize(
    ("field_at", "value", "why"),
    [
        (28, lambda k, ext: 0, "record points outside the data region"),  # length 0
        (40, lambda k, ext: k, "invalid delta base ref"),  # its own index as its base
        (40, lambda k, ext: REF_EXTERNAL | ext, "invalid delta base ref"),  # at the count
    ],
)
def test_a_bad_record_of_a_layer_is_corrupt_data(
    field_at: int, value: Callable[[int, int], int], why: str
) -> None:
    """A layer whose table has one bad record (its checksums made again, so the reader
    meets the record itself): a slab read that covers it raises ``CorruptData`` of the
    object table naming the record; a slab that does not is read."""
    data = synthetic_layer(600)[0]
    good = LayerReader.open(BytesSource(data))
    k = 77
    buf = bytearray(data)
    new = value(k, len(good.external_oids))
    struct.pack_into("<I", buf, good._layout.table_off + k * RECORD.size + field_at, new)
    reader = LayerReader.open(BytesSource(reseal(buf)))
    with pytest.raises(CorruptData, match=why) as raised:
        reader.entry_rows(64, 128)
    assert raised.value.details == {"section": S_TABLE, "local_index": k}
    assert len(reader.entry_rows(0, 64)) == 64
