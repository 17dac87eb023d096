"""Progress display for long loads: a tqdm bar on a terminal, nothing otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any


def progress_enabled(setting: bool | None) -> bool:
    """``progress=None`` means: show a bar when stderr is a terminal."""
    if setting is None:
        return sys.stderr.isatty()
    return bool(setting)


class LoadProgress:
    """Files done out of the total, with lines read and MB/s as postfix."""

    def __init__(self, total_files: int, enabled: bool, description: str = "loading") -> None:
        self._bar: Any = None
        self._started = time.perf_counter()
        self._files_done = 0
        if enabled:
            from tqdm import tqdm  # only paid for when a bar is shown

            self._bar = tqdm(total=total_files, desc=description, unit="file", leave=False)

    def update(self, counters: Any) -> None:
        if self._bar is None:
            return
        done = counters.files_done
        if done > self._files_done:
            self._bar.update(done - self._files_done)
            self._files_done = done
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        self._bar.set_postfix(
            lines=f"{counters.lines:,}",
            MB_s=f"{counters.bytes / elapsed / 1e6:.1f}",
            refresh=False,
        )
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
