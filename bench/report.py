"""Shared by every benchmark: measure repeatedly and write a section of docs/benchmarks.md.

Benchmarks report ratios against the reference (C git) measured in the same run
on the same machine, with min / median / max over repeats and the peak RSS of
the measuring process.
"""

from __future__ import annotations

import os
import platform
import re
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# ENROUTE_BENCH_REPORT sends a trial run's section to another file instead.
REPORT = Path(os.environ.get("ENROUTE_BENCH_REPORT") or ROOT / "docs" / "benchmarks.md")


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_bytes(path: str) -> bytes:
    """A small /proc file, read with bare system calls. The samplers (``bench.git.Meter``
    and the reference bridge's) read dozens of them every 20 ms beside the measured
    clients; ``Path.read_text`` made a sample of ``enroute dev``'s four processes cost
    about 1 ms, these reads 0.13 ms."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def children_of(pid: int) -> list[int]:
    """The child processes of ``pid``: each thread lists the ones it started."""
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            found += map(int, proc_bytes(f"/proc/{pid}/task/{task}/children").split())
        except FileNotFoundError:  # the thread ended between the listing and the read
            continue
    return found


def hwm_kib(pid: int) -> int:
    """``VmHWM`` of ``pid`` (/proc/PID/status): its peak resident set, in KiB."""
    status = proc_bytes(f"/proc/{pid}/status")
    at = status.find(b"\nVmHWM:")
    return 0 if at < 0 else int(status[at + 7 : status.index(b"kB", at)])


def cpu_ticks(pid: int, *, reaped: bool = False) -> int:
    """utime + stime of ``pid`` in clock ticks (/proc/PID/stat); with ``reaped``, also
    those of the children it has waited for (cutime + cstime)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12]) + (int(f[13]) + int(f[14]) if reaped else 0)


@dataclass(frozen=True)
class Series:
    """Seconds (or another unit) of repeated runs of one measurement."""

    samples: tuple[float, ...]

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)


def repeat(fn: Callable[[], object], runs: int) -> Series:
    """Time ``fn`` ``runs`` times with a monotonic clock."""
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return Series(tuple(samples))


def run_command(argv: Sequence[str], **kwargs: object) -> float:
    """Run a reference command once; return its wall time in seconds."""
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, **kwargs)  # type: ignore[call-overload]
    return time.perf_counter() - start


def peak_rss_mib() -> float:
    """Peak resident set of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    git = subprocess.run(
        ["git", "--version"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}, {git}"
    )


def fmt3(series: Series, scale: float = 1.0, digits: int = 3) -> str:
    return " / ".join(f"{v * scale:.{digits}f}" for v in (series.min, series.median, series.max))


def write_section(name: str, lines: Sequence[str]) -> None:
    """Replace (or append) the section of ``docs/benchmarks.md`` owned by benchmark ``name``."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    target = f"-m {spec.name}" if spec else shlex.quote(os.path.relpath(sys.argv[0], ROOT))
    command = " ".join(["python", target, *map(shlex.quote, sys.argv[1:])])
    body = "\n".join(
        [
            f"<!-- bench:{name} -->",
            f"## {name}",
            "",
            f"- when: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
            f"- machine: {machine()}",
            f"- command: `{command}`",
            f"- peak RSS of the benchmark process: {peak_rss_mib():.0f} MiB",
            "",
            *lines,
            f"<!-- /bench:{name} -->",
        ]
    )
    text = (
        REPORT.read_text()
        if REPORT.exists()
        else ("# Benchmarks\n\nWritten by the scripts in `bench/`; do not edit sections by hand.\n")
    )
    pattern = re.compile(
        rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.S
    )
    if pattern.search(text):
        text = pattern.sub(lambda _m: body, text)
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    REPORT.write_text(text)
