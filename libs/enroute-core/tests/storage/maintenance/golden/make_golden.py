"""Write the golden vectors of the maintenance records (docs/formats/maintenance.md).

Run from libs/enroute-core: ../../.venv/bin/python tests/storage/maintenance/golden/make_golden.py
"""

from __future__ import annotations

from pathlib import Path

from enroute_core.storage.maintenance import LayerFile, Lease, SweepEntry, SweepRecord, TrashMarker

HERE = Path(__file__).resolve().parent

LEASE = Lease(holder="compute-a", term=3, acquired_us=1_700_000_000_000_000,
              expires_us=1_700_000_060_000_000)  # fmt: skip
SWEEP = SweepRecord(
    updated_us=1_700_000_600_000_000,
    entries=(
        SweepEntry(LayerFile(0x10, bytes(range(16))), 1_700_000_000_000_000),
        SweepEntry(LayerFile(0x10, bytes(range(1, 17))), 1_700_000_300_000_000),
        SweepEntry(LayerFile(0x2A, b"\xff" * 16), 1_700_000_600_000_000),
    ),
)
TRASH = TrashMarker(incarnation=2, last_upload_gen=130, time_us=1_700_000_000_000_000)
VECTORS = {"lease.bin": LEASE.encode(), "sweep.bin": SWEEP.encode(), "trash.json": TRASH.encode()}


def main() -> None:
    for name, data in VECTORS.items():
        (HERE / name).write_bytes(data)


if __name__ == "__main__":
    main()
