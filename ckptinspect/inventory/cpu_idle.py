"""Whether a CPU is free for the scan worker (inventory/scan_process.py): measured, not guessed.

The load average cannot tell a free second core from a busy one on a small machine: the worker paid
0.83x of the in-process wall with a core free and cost 1.13x with the other core busy, at the same load
average (BENCHMARKS.md, section 20). So on Linux the decision reads what the CPUs did while this report
was reading: ``/proc/stat``'s idle + iowait time of the CPUs this process may run on
(``os.sched_getaffinity``), sampled when the read starts and again when the first headers arrive. The
report's own process is busy in that window, so what stays idle is what a second process could use.

The worker itself starts with the read (its interpreter start then overlaps the network), so its own
CPU time in the window is counted as idle: it would have been, without it.

Elsewhere (no ``/proc/stat``: macOS, Windows) the CPU count and, where there is one, the 1-minute load
average decide once, before the worker would start; without a load average the scan stays in-process.
The decision itself is a pure function of two samples (``worker_pays``), so it is tested without a
machine in any particular state.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

PROC_STAT = "/proc/stat"
# Idle CPU (in CPUs, averaged over the window) needed to start the worker. The worker path costs this
# process ~0.1-0.2 CPU-s (the pipe, the index's process-independent fingerprints, the answers) on a scan of
# ~0.7 CPU-s, and gains only what the worker scans meanwhile: with a whole free core it measured 0.83x of the
# in-process wall, with the other core taken by other work 1.13x (BENCHMARKS.md, section 20). The window is
# the past, and the rest of the machine's load can grow in the next second; 0.7 asks that most of a core
# stayed unused, so a wrong guess is rare and a right one has room for the worker's whole share.
MIN_IDLE_CPUS = 0.7
# Shortest window that can tell (in USER_HZ ticks per CPU, 1/100 s on Linux): /proc/stat counts whole
# ticks, so 10 ticks resolve the idle share to ~0.1 of a CPU.
MIN_WINDOW_TICKS = 10


@dataclass(frozen=True)
class CpuSample:
    """Cumulative ticks per CPU number: (idle + iowait, all states), as /proc/stat counts them."""

    ticks: Mapping[int, tuple[int, int]]


def parse_proc_stat(text: str) -> CpuSample:
    """The per-CPU lines of /proc/stat (``cpuN user nice system idle iowait irq softirq steal ...``).
    guest and guest_nice are already inside user and nice, so only the first eight fields add up."""
    ticks = {}
    for line in text.splitlines():
        if not (line.startswith("cpu") and line[3:4].isdigit()):
            continue
        name, *fields = line.split()
        try:
            values = [int(v) for v in fields[:8]]
            cpu = int(name[3:])
        except ValueError:
            continue
        if len(values) >= 5:
            ticks[cpu] = (values[3] + values[4], sum(values))
    return CpuSample(ticks)


def read_sample(path: str = PROC_STAT) -> CpuSample | None:
    """Now, from /proc/stat; None where there is none (not Linux) or it cannot be read."""
    try:
        with open(path, encoding="ascii", errors="replace") as stat:
            sample = parse_proc_stat(stat.read())
    except OSError:
        return None
    return sample if sample.ticks else None


def usable_cpus() -> set[int] | None:
    """CPU numbers this process may run on (None where the platform does not say: macOS, Windows)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def process_ticks(pid: int) -> int:
    """User + system ticks of a (child) process so far, from /proc/PID/stat; 0 where unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
    except (OSError, IndexError, ValueError):
        return 0


def idle_cpus(first: CpuSample, second: CpuSample, cpus: set[int] | None,
              own_ticks: int = 0) -> tuple[float, float]:
    """(CPUs idle on average between the two samples among ``cpus`` (all when None), the window in ticks
    per CPU); ``own_ticks``, the worker's CPU time in the window, counts as idle."""
    common = [c for c in first.ticks if c in second.ticks and (cpus is None or c in cpus)]
    if not common:
        return 0.0, 0.0
    idle = sum(second.ticks[c][0] - first.ticks[c][0] for c in common) + own_ticks
    window = sum(second.ticks[c][1] - first.ticks[c][1] for c in common) / len(common)
    if window <= 0:
        return 0.0, 0.0
    return max(0.0, idle / window), window


def worker_pays(first: CpuSample, second: CpuSample, cpus: set[int] | None, own_ticks: int = 0) -> bool | None:
    """True: at least MIN_IDLE_CPUS stayed idle over the window; False: less, or fewer than two CPUs to
    run on; None: the window is too short to tell yet."""
    if cpus is not None and len(cpus) < 2:
        return False
    idle, window = idle_cpus(first, second, cpus, own_ticks)
    if window < MIN_WINDOW_TICKS:
        return None
    return idle >= MIN_IDLE_CPUS


def spare_core_without_proc_stat(cpu_count: int | None, load: float | None) -> bool:
    """Where /proc/stat is missing: two CPUs or more and a 1-minute load average that leaves
    MIN_IDLE_CPUS free beside this process (which the average has not seen yet); no load average: False."""
    if not cpu_count or cpu_count < 2 or load is None:
        return False
    return cpu_count - load - 1 >= MIN_IDLE_CPUS


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows
        return None
