"""What the machine says about itself and its processes, read from /proc: the CPU and memory
a results file names, the load average, process CPU time and RSS, and the whole machine's CPU
time."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time of the processes so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def machine() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    return (
        f"{os.cpu_count()} vCPU ({model}), {int(mem) / 1024 / 1024:.1f} GiB RAM, "
        f"Linux {platform.release()}, Python {platform.python_version()}"
    )


def load_average() -> str:
    return " / ".join(Path("/proc/loadavg").read_text().split()[:3])


def machine_busy() -> float:
    """CPU seconds spent by everything on the machine (all cores), from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / os.sysconf("SC_CLK_TCK")
