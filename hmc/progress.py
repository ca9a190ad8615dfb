"""Progress of long work, drawn on rank 0 only, to stderr (so stdout keeps MILC's lines and the commands' results).

One line, redrawn in place on a terminal: what is being done, n/N steps, the elapsed time and an estimate of the
remaining one (elapsed per finished step times the steps left). Off the terminal (a pipe, a log file) only the final
line is written. ``hmc run`` draws from its first trajectory; the other commands (:func:`command_progress`: measure,
solve, spectrum, check, export, init when it thermalizes) only once their work has run for :data:`AFTER` seconds, so
a quick command prints nothing, and while a long step runs the line keeps its clock moving. ``--no-progress`` turns
it off.
"""
from __future__ import annotations

import sys
import threading
import time

AFTER = 2.0          # seconds of work before a command's progress shows
REDRAW = 0.5         # seconds between redraws of a step that is still running


class Progress:
    def __init__(self, total: int, label: str, enabled: bool = True, stream=None, after: float = 0.0):
        self.total, self.label = total, label
        self.stream = stream or sys.stderr
        self.enabled = enabled and total > 0
        self.after = after
        self.t0 = time.perf_counter()
        self.done = 0
        self.note = ""
        self._open_line = False          # a partial line is on the terminal
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker = None
        if self.enabled and after > 0 and _isatty(self.stream):
            self._ticker = threading.Thread(target=self._tick, name=f"progress {label}", daemon=True)
            self._ticker.start()

    def update(self, done: int, note: str = "") -> None:
        """``done`` steps of ``total`` finished; ``note``: what runs now (or what was done, at the end)."""
        with self._lock:
            self.done, self.note = done, note
            if self.enabled:
                self._draw(final=done >= self.total)
        if done >= self.total:
            self.close()

    def step(self, note: str = "") -> None:
        """One more step finished; ``note``: what runs next."""
        self.update(self.done + 1, note)

    def close(self) -> None:
        """Stop redrawing and end a partial line (the work ended early, e.g. on an error); idempotent."""
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join(timeout=1.0)
            self._ticker = None
        with self._lock:
            if self._open_line:
                print(file=self.stream, flush=True)
                self._open_line = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _shown(self) -> bool:
        return time.perf_counter() - self.t0 >= self.after

    def _tick(self) -> None:
        while not self._stop.wait(REDRAW):
            with self._lock:
                if not self._stop.is_set():
                    self._draw(final=False)

    def _draw(self, final: bool) -> None:
        if not self._shown():
            return
        tty = _isatty(self.stream)
        if not (tty or final):
            return
        width = 24
        filled = int(width * min(self.done, self.total) / self.total)
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        line = (f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                f"{elapsed:6.1f}s eta {eta:6.1f}s {self.note}")
        print(("\r" if tty else "") + line + ("\n" if final else ""), end="", file=self.stream, flush=True)
        self._open_line = tty and not final


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def add_progress_arg(p) -> None:
    """The ``--no-progress`` switch of a command (as ``hmc run``'s)."""
    p.add_argument("--no-progress", action="store_true", help="no progress line (on stderr, rank 0, shown for work "
                                                              f"over {AFTER:g} s)")


def command_progress(total: int, label: str, enabled: bool = True) -> Progress:
    """The progress of a command other than ``hmc run`` (``enabled``: not ``--no-progress``): rank 0 only, shown once
    the work has run for :data:`AFTER` seconds."""
    return Progress(total, label, enabled=enabled and _rank() == 0, after=AFTER)


def _rank() -> int:
    from comms import world

    return world().rank
