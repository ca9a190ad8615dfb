"""A progress bar for long work, drawn on rank 0 only, to stderr (so stdout keeps MILC's lines)."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, enabled: bool = True, stream=None):
        self.total, self.label = total, label
        self.stream = stream or sys.stderr
        self.enabled = enabled and total > 0
        self.t0 = time.perf_counter()
        self.done = 0

    def update(self, done: int, note: str = "") -> None:
        self.done = done
        if not self.enabled:
            return
        width = 24
        filled = int(width * done / self.total)
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / done * (self.total - done) if done else 0.0
        line = (f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} "
                f"{elapsed:6.1f}s eta {eta:6.1f}s {note}")
        end = "\n" if done == self.total else ""
        if self.stream.isatty() or done == self.total:
            print(line + end, end="", file=self.stream, flush=True)
