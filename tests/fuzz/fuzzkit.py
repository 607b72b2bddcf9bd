"""What every fuzz target shares: profiles, the seed, the typed-error property, mutations.

Profiles (hypothesis settings profiles, chosen with ``ENROUTE_FUZZ_PROFILE``):

- ``ci`` (default): each target's ``max_examples`` is the count it names, chosen so
  that the target runs in a few seconds on two busy cores; the seed is fixed
  (``CI_SEED``) so a CI failure replays as it is.
- ``nightly``: fifty times the examples, a fresh random seed each run.

``ENROUTE_SEED=N`` replays a run under either profile; every target prints the
seed and profile it used. No example database is read or written.

The property each target checks: feeding a parser or a state machine anything
lets only typed errors escape (subclasses of ``EnrouteError``, and for each
target only the ones its contract names); never ``IndexError``,
``struct.error``, ``zlib.error``, ``ValueError``, ``KeyError``, ``MemoryError``,
``RecursionError`` or ``AssertionError``. Hangs fail on the hypothesis
deadline; allocations are bounded with :func:`peak_allocation`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import struct
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st

from enroute_core.base.errors import ERROR_TABLE, EnrouteError
from enroute_core.git.pktline import (
    Data,
    Delim,
    Flush,
    PktPacket,
    ResponseEnd,
    encode_event,
    iter_pkt_lines,
)

ROOT = Path(__file__).resolve().parents[2]
CORE_TESTS = ROOT / "libs" / "enroute-core" / "tests"
PROTOCOL_DATA = CORE_TESTS / "protocol" / "testdata"
PACK_DATA = CORE_TESTS / "git" / "testdata"
LAYER_GOLDEN = CORE_TESTS / "storage" / "golden"

PROFILE = os.environ.get("ENROUTE_FUZZ_PROFILE", "ci")
_SCALE = {"ci": 1, "nightly": 50}
assert PROFILE in _SCALE, f"ENROUTE_FUZZ_PROFILE must be one of {sorted(_SCALE)}"
CI_SEED = 20261203
SEED = int(
    os.environ.get("ENROUTE_SEED")
    or (CI_SEED if PROFILE == "ci" else random.SystemRandom().randrange(2**32))
)

_COMMON: dict[str, Any] = {
    "database": None,
    "print_blob": True,
    "suppress_health_check": [
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
    "phases": [Phase.explicit, Phase.generate, Phase.target, Phase.shrink],
}
settings.register_profile("enroute-fuzz-ci", deadline=timedelta(seconds=5), **_COMMON)
settings.register_profile("enroute-fuzz-nightly", deadline=timedelta(seconds=10), **_COMMON)

F = TypeVar("F", bound=Callable[..., Any])


def fuzz_settings(examples: int, **overrides: Any) -> Callable[[F], F]:
    """``@settings`` of the active profile with ``examples`` scaled, and the run's seed."""
    profile = settings.get_profile(f"enroute-fuzz-{PROFILE}")
    chosen = settings(profile, max_examples=examples * _SCALE[PROFILE], **overrides)

    def decorate(test: F) -> F:
        return seed(SEED)(chosen(test))  # type: ignore[no-any-return]

    return decorate


def banner() -> str:
    return f"fuzz profile={PROFILE} ENROUTE_SEED={SEED}"


# -- the property ---------------------------------------------------------------------------


def check_error(exc: EnrouteError, allowed: tuple[type[EnrouteError], ...]) -> None:
    """A typed error of the kinds the target allows, with a table row and a message."""
    assert isinstance(exc, allowed), f"{type(exc).__name__} ({exc}) is not one of {allowed}"
    assert exc.code in ERROR_TABLE, exc.code
    assert isinstance(exc.message, str) and exc.message, repr(exc)
    assert isinstance(exc.details, dict)


@contextlib.contextmanager
def typed_errors(*allowed: type[EnrouteError]) -> Iterator[list[EnrouteError]]:
    """Swallow the allowed typed errors (recorded in the yielded list); anything else fails."""
    caught: list[EnrouteError] = []
    try:
        yield caught
    except EnrouteError as exc:
        check_error(exc, allowed or (EnrouteError,))
        caught.append(exc)


@contextlib.contextmanager
def peak_allocation(limit_bytes: int) -> Iterator[None]:
    """Fail when the block allocates more than ``limit_bytes`` at its peak (tracemalloc)."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    try:
        yield
    finally:
        _, peak = tracemalloc.get_traced_memory()
        if started:
            tracemalloc.stop()
    assert peak - base <= limit_bytes, f"allocated {peak - base} bytes, bound {limit_bytes}"


# -- byte mutations ----------------------------------------------------------------------------

INTERESTING_U8 = (0x00, 0x01, 0x7F, 0x80, 0xFF)
INTERESTING_U32 = (0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)
INTERESTING_U64 = (*INTERESTING_U32, 1 << 32, 1 << 40, (1 << 63) - 1, (1 << 64) - 1)


@st.composite
def _mutation(draw: st.DrawFn, size: int) -> tuple[str, int, bytes | int]:
    kind = draw(
        st.sampled_from(
            ["flip", "set", "insert", "delete", "truncate", "u32be", "u32le", "u64le", "dup"]
        )
    )
    pos = draw(st.integers(0, max(size, 1) - 1))
    if kind == "flip":
        return kind, pos, 1 << draw(st.integers(0, 7))
    if kind == "set":
        return kind, pos, draw(st.sampled_from(INTERESTING_U8) | st.integers(0, 255))
    if kind == "insert":
        return kind, pos, draw(st.binary(min_size=1, max_size=16))
    if kind in ("delete", "dup"):
        return kind, pos, draw(st.integers(1, 64))
    if kind == "truncate":
        return kind, pos, 0
    if kind == "u64le":
        return kind, pos, draw(st.sampled_from(INTERESTING_U64) | st.integers(0, 2**64 - 1))
    return kind, pos, draw(st.sampled_from(INTERESTING_U32) | st.integers(0, 2**32 - 1))


def apply_mutation(data: bytes, mutation: tuple[str, int, bytes | int]) -> bytes:
    kind, pos, arg = mutation
    buf = bytearray(data)
    if not buf:
        return bytes(arg) if isinstance(arg, bytes) else data
    pos %= len(buf)
    if kind == "flip":
        assert isinstance(arg, int)
        buf[pos] ^= arg
    elif kind == "set":
        assert isinstance(arg, int)
        buf[pos] = arg
    elif kind == "insert":
        assert isinstance(arg, bytes)
        buf[pos:pos] = arg
    elif kind == "delete":
        assert isinstance(arg, int)
        del buf[pos : pos + arg]
    elif kind == "dup":
        assert isinstance(arg, int)
        buf[pos:pos] = buf[pos : pos + arg]
    elif kind == "truncate":
        del buf[pos:]
    else:
        assert isinstance(arg, int)
        fmt = {"u32be": ">I", "u32le": "<I", "u64le": "<Q"}[kind]
        packed = struct.pack(fmt, arg)
        buf[pos : pos + len(packed)] = packed
    return bytes(buf)


@st.composite
def mutated(draw: st.DrawFn, seeds: Sequence[bytes], max_mutations: int = 4) -> bytes:
    """One of ``seeds`` (or a splice of two) with up to ``max_mutations`` byte mutations."""
    data = draw(st.sampled_from(seeds))
    if len(seeds) > 1 and draw(st.integers(0, 9)) == 0:
        other = draw(st.sampled_from(seeds))
        cut_a = draw(st.integers(0, len(data)))
        cut_b = draw(st.integers(0, len(other)))
        data = data[:cut_a] + other[cut_b:]
    for mutation in draw(st.lists(_mutation(len(data)), max_size=max_mutations)):
        data = apply_mutation(data, mutation)
    return data


def fuzz_bytes(seeds: Sequence[bytes], max_mutations: int = 4) -> st.SearchStrategy[bytes]:
    """Mutated seeds most of the time, raw bytes some of the time."""
    return st.one_of(
        mutated(seeds, max_mutations),
        mutated(seeds, max_mutations),
        mutated(seeds, max_mutations),
        st.binary(max_size=512),
    )


@st.composite
def chunkings(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` cut at arbitrary points (whole, byte by byte, or random pieces)."""
    mode = draw(st.integers(0, 3))
    if mode == 0 or not data:
        return [data]
    if mode == 1 and len(data) <= 2048:
        return [data[i : i + 1] for i in range(len(data))]
    cuts = sorted(set(draw(st.lists(st.integers(1, max(len(data) - 1, 1)), max_size=12))))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


# -- pkt-line structure -----------------------------------------------------------------------

SPECIAL_PACKETS = (b"0000", b"0001", b"0002", b"0003", b"0004", b"fff1", b"ffff", b"00zz", b"-001")


def packets_of(data: bytes) -> list[bytes]:
    """The wire bytes of each packet of a valid stream (then its trailing bytes, if any)."""
    out: list[bytes] = []
    pos = 0
    for event in iter_pkt_lines_prefix(data):
        raw = encode_event(event)
        out.append(raw)
        pos += len(raw)
    if pos < len(data):
        out.append(data[pos:])
    return out


def iter_pkt_lines_prefix(data: bytes) -> Iterator[PktPacket]:
    """The packets of ``data`` up to the first that does not parse."""
    with contextlib.suppress(EnrouteError):
        yield from iter_pkt_lines(data)


def _payload_mutations(payload: bytes) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.just(payload),
        mutated([payload], 2),
        st.binary(max_size=64),
        st.sampled_from([b"", b"\n", b"\x00", b"ERR boom\n", b"\x01", b"\x02", b"\x03", b"\x04"]),
        st.builds(lambda p, n: p + b"x" * n, st.just(payload), st.integers(1, 300)),
    )


@st.composite
def pkt_stream(draw: st.DrawFn, seeds: Sequence[bytes], extra_lines: Sequence[bytes] = ()) -> bytes:
    """A valid pkt-line stream from ``seeds``, mutated packet by packet, then maybe byte-wise."""
    packets = packets_of(draw(st.sampled_from(seeds)))
    line = st.sampled_from(list(extra_lines)) if extra_lines else st.binary(max_size=40)
    for _ in range(draw(st.integers(0, 4))):
        action = draw(st.integers(0, 6))
        at = draw(st.integers(0, len(packets)))
        if action == 0 and packets:
            del packets[at % len(packets)]
        elif action == 1 and packets:
            packets.insert(at, packets[at % len(packets)])
        elif action == 2:
            packets.insert(at, draw(st.sampled_from(SPECIAL_PACKETS)))
        elif action == 3:
            packets.insert(at, encode_event(Data(draw(line) + draw(st.sampled_from([b"\n", b""])))))
        elif action == 4 and packets:
            i = at % len(packets)
            event = next(iter_pkt_lines_prefix(packets[i]), None)
            if isinstance(event, Data):
                payload = draw(_payload_mutations(event.payload))
                packets[i] = encode_event(Data(payload[:65516]))
        elif action == 5 and len(packets) > 1:
            i, j = at % len(packets), draw(st.integers(0, len(packets) - 1))
            packets[i], packets[j] = packets[j], packets[i]
        elif action == 6:
            packets.insert(
                at, encode_event(draw(st.sampled_from([Flush(), Delim(), ResponseEnd()])))
            )
    data = b"".join(packets)
    if draw(st.integers(0, 4)) == 0:
        data = draw(mutated([data], 2))
    return data


def read_seed(path: Path) -> bytes:
    return path.read_bytes()


def pkt_sequences(lines: Sequence[bytes]) -> st.SearchStrategy[bytes]:
    """Arbitrary sequences of client packets: protocol lines (with or without LF),
    flush-, delim- and response-end-pkts, in any order."""
    packet = st.one_of(
        st.builds(
            lambda line, lf: encode_event(Data(line + lf)),
            st.sampled_from(list(lines)),
            st.sampled_from([b"\n", b""]),
        ),
        st.sampled_from([b"0000", b"0001", b"0002"]),
    )
    return st.lists(packet, max_size=24).map(b"".join)
