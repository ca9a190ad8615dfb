"""Per-level clocks of the multigrid solve: compute, coarse-grid halo exchange and global reductions.

docs/multigrid.md ("What to expect"): the coarse levels are latency-bound (tiny halos, many reductions), so the time of
each level is reported split three ways. The solver makes the clock of the level it works on *active*
(:func:`active`, nested as the K-cycle recurses); the two places that communicate charge it:

* :func:`lattice.global_sums` (every reduction of the Krylov solvers and of the set-up): ``reduce``;
* :meth:`lattice.CoarseGeometry.shift` on a partitioned dimension (the coarse stencil's halo exchange through
  ``comms``, whatever the transport): ``halo``.

* :func:`cuda.extended` (the one exchange of the coarse stencil kernel on a partitioned grid): ``halo``.

A level's compute time is its exclusive wall time less the two. The fine levels' halo exchange happens inside the
staggered operator (its own overlapped exchange), so it is part of their compute time here.

On the GPU, work is queued: a host clock read around an exchange would see the enqueue of a device-to-device
transfer (event, stream_gated), and a reduction's copy to the host would absorb every kernel queued before it.
While timing is on - a level clock is active and a GPU operator has registered its stream
(:func:`use_device`) - :func:`now` therefore synchronizes the current stream before reading the clock, so that
the time between two readings is that communication's own. The run configuration's ``mg_timing_sync``
(HMC_MG_TIMING_SYNC=0; or the override :func:`set_sync`) skips the synchronizations (the split then shows host-side
times).
"""
from __future__ import annotations

import time
from contextlib import contextmanager


class LevelClock:
    """Seconds and counts of one level's halo exchanges and reductions."""

    __slots__ = ("halo", "halo_count", "reduce", "reduce_count")

    def __init__(self):
        self.reset()

    def reset(self):
        self.halo = 0.0
        self.halo_count = 0
        self.reduce = 0.0
        self.reduce_count = 0


_STACK: list = []


@contextmanager
def active(clock: LevelClock | None):
    """Charge communication to ``clock`` inside the block (None: to nobody)."""
    _STACK.append(clock)
    try:
        yield clock
    finally:
        _STACK.pop()


def current() -> LevelClock | None:
    return _STACK[-1] if _STACK else None


def charge_halo(seconds: float):
    c = current()
    if c is not None:
        c.halo += seconds
        c.halo_count += 1


def charge_reduce(seconds: float):
    c = current()
    if c is not None:
        c.reduce += seconds
        c.reduce_count += 1


_SYNC = {"on": None, "configured": True, "device": None}    # on: set_sync's override; configured: use_device's


def use_device(synchronize, sync: bool = True):
    """Register the device stream's ``synchronize`` (a GPU level operator does, once built) and whether the clock
    readings synchronize it (``sync``: its geometry's configuration, ``mg_timing_sync``)."""
    _SYNC["device"], _SYNC["configured"] = synchronize, bool(sync)


def set_sync(on: bool | None) -> bool | None:
    """Synchronize the device at clock readings while timing is on (True) or never (False), whatever the
    configuration says, or None: as configured again; returns the previous override (None when there was none)."""
    old, _SYNC["on"] = _SYNC["on"], None if on is None else bool(on)
    return old


def now() -> float:
    """time.perf_counter(), after synchronizing the registered device stream while timing is on (see above)."""
    sync = _SYNC["device"]
    on = _SYNC["on"] if _SYNC["on"] is not None else _SYNC["configured"]
    if sync is not None and on and current() is not None:
        sync()
    return time.perf_counter()
