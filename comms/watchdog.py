"""A bound on the waits that no host call can bound: the device-side waits of uncaptured GPU exchanges.

A stream_gated exchange enqueues ``cuStreamWaitValue64`` on the device and returns; the host blocks later, in
whatever call first waits for that stream (a reduction's copy to the host, a synchronize), and that call has no
timeout: a stopped or hung peer would hold this rank forever (docs/faults.md, "dead rank"). So the GPU engine hands
each such exchange to a :class:`Watchdog`: an event recorded after the exchange's waits, and what it waits for. A
daemon thread asks every watched event, every ``period`` seconds, whether it has completed; one that has not after
the communication timeout is reported in one line naming the rank, the peer and the link, and the process exits
with status 1 (the launcher then ends the job). The blocked thread cannot be interrupted from Python, so exiting is
the only bounded way out; the run file is not being written while the rank waits for a halo, and a save it was in
leaves only a temporary file that the next ``hmc run`` removes.

CUDA-free: ``query(handle) -> bool`` (completed?) is injected, so the deadline logic is tested on the CPU
(tests/comms/test_watchdog.py). Captured graphs are not watched: their replays have a bounded wait of their own
(solvers/krylov_graph.py).
"""
from __future__ import annotations

import os
import sys
import threading
import time


class Watchdog:
    """Deadlines of watched device events; ``on_expire(text)`` (default: print the line, exit 1) when one passes."""

    def __init__(self, query, timeout: float, on_expire=None, period: float = 0.1, setup=None):
        self.query, self.timeout, self.period = query, float(timeout), float(period)
        self.on_expire = on_expire or _exit_with
        self.setup = setup                   # run once in the watching thread (e.g. make a CUDA context current)
        self._entries = {}                   # key -> (handle, deadline, text)
        self._lock = threading.Lock()
        self._thread = None
        self._stop = threading.Event()

    def watch(self, key, handle, text: str) -> None:
        """Watch ``handle`` (completed by the device when the waits before it are satisfied) for ``timeout`` seconds
        from now; ``text`` says what it waits for. A later watch with the same key replaces the entry (the same
        event recorded again on the same stream completes only after the earlier record)."""
        with self._lock:
            self._entries[key] = (handle, time.monotonic() + self.timeout, text)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hmc comms watchdog", daemon=True)
            self._thread.start()

    def pending(self) -> int:
        with self._lock:
            return len(self._entries)

    def check(self, now: float | None = None) -> list[str]:
        """One round: forget completed events, return (and pass to ``on_expire``) the texts of expired ones."""
        now = time.monotonic() if now is None else now
        with self._lock:
            entries = list(self._entries.items())
        expired = []
        for key, (handle, deadline, text) in entries:
            if self.query(handle):
                with self._lock:
                    if self._entries.get(key, (None,))[0] is handle and self._entries[key][1] == deadline:
                        del self._entries[key]
            elif now > deadline:
                expired.append(text)
        if expired:
            self.on_expire(expired[0])
        return expired

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._entries.clear()

    def _run(self):
        if self.setup is not None:
            self.setup()
        while not self._stop.wait(self.period):
            self.check()


def _exit_with(text: str):
    sys.stderr.write(f"hmc: {text}\n")
    sys.stderr.flush()
    os._exit(1)
