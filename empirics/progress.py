"""A dependency-free progress line on stderr (quiet when stderr is not a terminal, unless forced).

`NTKM_PROGRESS=0` silences the bars and the log lines, `NTKM_PROGRESS=1` forces both; `NTKM_PROGRESS_BARS=0`
turns off only the bars (the parallel workers of `verify claims` do, as two bars would share one line).
"""

from __future__ import annotations

import os
import sys
import time


class Progress:
    """`with Progress(total, "training") as p: p.update(1, "loss=0.3")`."""

    def __init__(self, total: int, label: str, enabled: bool | None = None):
        self.total = max(1, total)
        self.label = label
        self.done = 0
        self.start = time.perf_counter()
        if enabled is None:
            enabled = sys.stderr.isatty() or os.environ.get("NTKM_PROGRESS") == "1"
        bars = os.environ.get("NTKM_PROGRESS_BARS") != "0"
        self.enabled = enabled and bars and os.environ.get("NTKM_PROGRESS") != "0"
        self._last = 0.0

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.perf_counter()
        if not self.enabled or (now - self._last < 0.2 and self.done < self.total):
            return
        self._last = now
        frac = self.done / self.total
        bar = "#" * int(24 * frac)
        line = f"\r{self.label:<24} [{bar:<24}] {self.done}/{self.total} {now - self.start:6.1f}s {note}"
        sys.stderr.write(line[:160])
        sys.stderr.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def log(msg: str) -> None:
    """One status line on stderr (results go to stdout)."""
    if os.environ.get("NTKM_PROGRESS") != "0":
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()
