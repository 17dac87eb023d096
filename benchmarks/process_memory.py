"""This process's resident memory, for the benchmarks: the current size and the
peak since a reset (Linux's /proc/self). Standard library only, so that the
scripts that run in Paddle's interpreters import it too."""

from __future__ import annotations


def read_status_kb(field: str) -> int:
    """One ``kB`` field of /proc/self/status (``VmRSS``, ``VmHWM``) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field} field (not Linux?)")


def reset_peak() -> None:
    """Sets VmHWM back to the current resident size, so that the next reading
    is the peak of what runs in between (Linux 4.0+)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
