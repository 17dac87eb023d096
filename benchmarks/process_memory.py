"""Resident memory, for the benchmarks: a process's current size and this
process's peak since a reset (Linux's /proc). Standard library only, so that the
scripts that run in Paddle's interpreters import it too."""

from __future__ import annotations


def read_status_kb(field: str, pid: int | str = "self") -> int:
    """One ``kB`` field of /proc/PID/status (``VmRSS``, ``VmHWM``) in bytes;
    PID: this process by default."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no {field} field (not Linux?)")


def reset_peak() -> None:
    """Sets VmHWM back to the current resident size, so that the next reading
    is the peak of what runs in between (Linux 4.0+)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
