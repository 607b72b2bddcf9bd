"""The lease and sweep record formats and the trash marker (docs/formats/maintenance.md):
golden vectors, round trips, and corruption that lets only ``CorruptData`` escape."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enroute_core.base.errors import CorruptData, InvalidArgument, LimitExceeded
from enroute_core.base.limits import Limits
from enroute_core.storage.maintenance import (
    LayerFile,
    Lease,
    SweepEntry,
    SweepRecord,
    TrashMarker,
)

GOLDEN = Path(__file__).resolve().parent / "golden"
U64 = st.integers(0, 2**64 - 1)


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("maint_golden", GOLDEN / "make_golden.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["maint_golden"] = module
    spec.loader.exec_module(module)
    return module


GEN = generator()
CODECS = {
    "lease.bin": (Lease.decode, GEN.LEASE),
    "sweep.bin": (SweepRecord.decode, GEN.SWEEP),
    "trash.json": (TrashMarker.decode, GEN.TRASH),
}


@pytest.mark.parametrize("name", sorted(CODECS))
def test_golden_vectors_are_what_the_encoders_write(name: str) -> None:
    decode, value = CODECS[name]
    data = (GOLDEN / name).read_bytes()
    assert value.encode() == data
    assert decode(data) == value


def test_golden_trash_marker_is_the_ledgers_bytes() -> None:
    """The ledger writes ``json.dumps`` of these three keys, sorted (lifecycle.py)."""
    assert (GOLDEN / "trash.json").read_bytes() == (
        b'{"incarnation": 2, "last_upload_gen": 130, "time_us": 1700000000000000}'
    )


@pytest.mark.parametrize("name", ["lease.bin", "sweep.bin"])
def test_every_flipped_byte_and_cut_prefix_is_corrupt_data(name: str) -> None:
    decode, _ = CODECS[name]
    data = (GOLDEN / name).read_bytes()
    for i in range(len(data)):
        for bit in (0x01, 0x80):
            bad = bytearray(data)
            bad[i] ^= bit
            with pytest.raises(CorruptData):
                decode(bytes(bad))
    for cut in range(len(data)):
        with pytest.raises(CorruptData):
            decode(data[:cut])
    with pytest.raises(CorruptData):
        decode(data + b"\0")


def test_trash_marker_corruption_is_corrupt_data() -> None:
    data = (GOLDEN / "trash.json").read_bytes()
    for cut in range(len(data)):
        try:
            TrashMarker.decode(data[:cut])
        except CorruptData:
            continue
        raise AssertionError(f"prefix {cut} decoded")
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x80  # not UTF-8 any more, or not JSON
        with pytest.raises(CorruptData):
            TrashMarker.decode(bytes(bad))
    for text in [b"[]", b'{"incarnation": 0, "last_upload_gen": 1, "time_us": 1}',
                 b'{"incarnation": 1, "last_upload_gen": -1, "time_us": 1}',
                 b'{"incarnation": 1, "last_upload_gen": 1, "time_us": 1.5}',
                 b'{"incarnation": 1, "last_upload_gen": 1, "time_us": true}',
                 b'{"incarnation": 1, "last_upload_gen": 1}']:  # fmt: skip
        with pytest.raises(CorruptData):
            TrashMarker.decode(text)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=60).filter(lambda s: len(s.encode()) <= 255), U64, U64, U64)
def test_lease_round_trips(holder: str, term: int, acquired: int, expires: int) -> None:
    lease = Lease(holder, term, acquired, expires)
    assert Lease.decode(lease.encode()) == lease


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.tuples(U64, st.binary(min_size=16, max_size=16)), U64, max_size=40), U64)
def test_sweep_record_round_trips(entries: dict[tuple[int, bytes], int], updated: int) -> None:
    record = SweepRecord(
        updated, tuple(SweepEntry(LayerFile(g, r), t) for (g, r), t in sorted(entries.items()))
    )
    assert SweepRecord.decode(record.encode()) == record


def test_records_refuse_values_they_cannot_hold() -> None:
    with pytest.raises(InvalidArgument):
        Lease("", 1, 0, 0)
    with pytest.raises(InvalidArgument):
        Lease("x" * 256, 1, 0, 0)
    with pytest.raises(InvalidArgument):
        Lease("a", -1, 0, 0)
    f = LayerFile(1, bytes(16))
    with pytest.raises(InvalidArgument):
        SweepRecord(0, (SweepEntry(f, 1), SweepEntry(f, 2)))
    with pytest.raises(InvalidArgument):
        SweepRecord(0, (SweepEntry(LayerFile(1, b"short"), 1),))


def test_sweep_record_count_is_bounded() -> None:
    data = (GOLDEN / "sweep.bin").read_bytes()
    with pytest.raises(LimitExceeded):
        SweepRecord.decode(data, limits=Limits(sweep_record_entries_max=2))


def test_layer_file_names_parse_only_in_their_one_form() -> None:
    f = LayerFile(0x2A, bytes(range(16)))
    assert f.name == "000000000000002a-000102030405060708090a0b0c0d0e0f.layer"
    assert LayerFile.parse(f.name) == f
    for bad in ["2a-00.layer", f.name.upper(), f.name + ".tmp", "x" + f.name, f.name[:-6]]:
        assert LayerFile.parse(bad) is None
