"""Device-resident coarse levels (issues 17, 18; docs/multigrid.md "Device-resident coarse levels"): the steps of the
deepest K-cycle solve captured as CUDA graphs and replayed.

On the H200 at 32^4 the level below the last K-cycle GCR (level 3: 4^4 x 96 unknowns) spent 0.55 ms per stencil
application against ~85 us of traffic: each GCR step there launched ~100 small CuPy kernels from Python and read
its scalars back 3 to 4 times (Gram-Schmidt coefficients, |q|^2 and <q, r>, the smoother's least squares on the
host). With :class:`.krylov.GCRRun` every scalar of a step stays on the device (device sums, the smoother's
least-squares kernel, coefficients as device arrays), so a step, preconditioner included (restriction, the coarsest
dense inverse, prolongation, the GCR smoother), is pure stream work: here it is captured once per Krylov index j
and replayed by every later solve of that level; the host reads (|r|^2, |q|^2) once per step for the stop test, so
the iteration counts, and the answers, are those of the host-driven steps.

What is captured: the GCR of level L-1 (L the coarsest) when the coarsest solve is the device's dense inverse
(:class:`.precision.DenseInverse`) on one GPU: its preconditioner has no host decision in it. Shallower levels'
GCR steps contain a whole adaptive solve and stay host-driven (with device scalars: one read per step). On several
ranks the reductions go through the host (MPI) and nothing is captured. ``mg_graph`` (HMC_MG_GRAPH, default on;
the override :func:`set_graph`) switches it off.

How: a dedicated non-blocking stream captures (:class:`comms.cuda.graph.CapturedGraph`, the solvers' capture) and
replays, joined to the caller's stream by two events per replay. Every array a step touches outside the step lives
in the persistent buffers of one :class:`.krylov.GCRRun` per level; the step's temporaries, allocated during the
capture, come from a CuPy memory pool of the level's own (``cupy.cuda.using_allocator``), which nothing but the
capture uses and which lives as long as the graphs, so a replay cannot overwrite a live array of the host-driven
code and no block a graph writes is ever given back to the device. Each j is run eagerly the first time (kernel
compilation, the tables), captured the second time; just before its capture it runs once eagerly on the capture
stream with the level's pool and is undone, so that cuBLAS's and CUB's set-up for that stream and every block the
capture asks the pool for are made outside the capture (no allocation from the device inside it). The
statistics (applications, smoother steps, iterations, direct solves) counted by Python during the capture are
added per replay (:class:`Tally`); the levels below the captured one then report no time of their own (their
work is inside the replays, timed as the captured level's). A capture that fails (an operation that reads back to
the host) switches the graphs off for the hierarchy with a note, and the steps run eagerly.
"""
from __future__ import annotations

import warnings

import numpy as np

from lattice.placement import set_switch, switch_on

from . import timing
from .krylov import GCRRun
from .lattice import kernel_products

COUNTS = ("cycles", "krylov_iters", "solves", "direct_solves", "smoother_steps")


def set_graph(on: bool | None) -> bool | None:
    """Capture the deepest K-cycle GCR's steps (True), never (False), or None: as each geometry's ``mg_graph``
    says; returns the previous override."""
    return set_switch("mg_graph", on)


class Tally:
    """The integer statistics of a solve that Python counts while a step runs: every level counter's applications
    and columns and the solver's per-level counts (``lstats()``: the current solve's dicts)."""

    def __init__(self, counters, lstats):
        self.counters, self.lstats = counters, lstats

    def read(self) -> np.ndarray:
        vals = [c.applies for c in self.counters] + [c.columns for c in self.counters]
        vals += [d[k] for d in self.lstats() for k in COUNTS]
        return np.asarray(vals, dtype=np.int64)

    def set(self, vals) -> None:
        n = len(self.counters)
        for i, c in enumerate(self.counters):
            c.applies, c.columns = int(vals[i]), int(vals[n + i])
        it = iter(vals[2 * n:])
        for d in self.lstats():
            for k in COUNTS:
                d[k] = int(next(it))

    def add(self, delta) -> None:
        self.set(self.read() + delta)


class LevelGraphs:
    """The captured steps of one level's GCR: the persistent :class:`.krylov.GCRRun`, one graph per Krylov index,
    the capture stream and the events joining it to the caller's stream. ``emulate`` (CPU tests): a "graph" reruns
    the step eagerly with the statistics restored, then adds the captured counts, as a replay does."""

    def __init__(self, apply, precondition, geom, like, nkrylov: int, tally: Tally, emulate: bool = False):
        self.geom, self.xp, self.tally, self.emulate = geom, geom.xp, tally, bool(emulate)
        self.run = GCRRun(apply, precondition, geom, like, nkrylov, persistent=True)
        self.run.stepper = self.step
        self.shape, self.dtype = tuple(like.shape), like.dtype
        self.graphs, self.deltas, self.seen = {}, {}, set()
        self.failed = None
        self.replays = self.captures = 0
        if not self.emulate:
            cp = self.xp
            self.stream = cp.cuda.Stream(non_blocking=True)
            self.pool = cp.cuda.MemoryPool()     # the captured steps' temporaries: this pool, nobody else's
            self.joined = cp.cuda.Event(disable_timing=True)
            self.done = cp.cuda.Event(disable_timing=True)

    def fits(self, b) -> bool:
        return tuple(b.shape) == self.shape and b.dtype == self.dtype

    def step(self, run, j: int) -> None:
        if self.failed is not None or j not in self.seen:
            self.seen.add(j)
            run.step(j)                      # eager: compiles, warms the pool; the next time is captured
            return
        if j not in self.graphs and not self._capture(run, j):
            run.step(j)
            return
        self._launch(j)

    def _capture(self, run, j) -> bool:
        before = self.tally.read()
        old = timing.set_sync(False)         # no clock may synchronize inside a capture
        try:
            if self.emulate:                 # "capture": run the step for its counts, then undo its writes
                self._undone(run, j)
                graph = (lambda: run.step(j))
            else:
                from comms.cuda.graph import CapturedGraph

                # the step once eagerly on the capture stream, undone: cuBLAS's and CUB's set-up for the stream
                # and every block the capture will ask the pool for are made outside the capture
                with kernel_products():          # the stacked products by kernel, not cuBLAS (lattice.bmm)
                    self._on_stream(lambda: self._undone(run, j))
                    self.tally.set(before)
                    with self.xp.cuda.using_allocator(self.pool.malloc):
                        graph = CapturedGraph(self.stream, lambda: run.step(j))
        except Exception as exc:             # noqa: BLE001 - any failure: run eagerly from now on
            self.failed = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"multigrid: the level's GCR step could not be captured in a CUDA graph ({self.failed}); "
                          "its steps run host-driven", RuntimeWarning, stacklevel=2)
            return False
        finally:
            timing.set_sync(old)
            delta = self.tally.read() - before
            self.tally.set(before)           # the capture ran nothing: its counts come back per replay
        self.graphs[j], self.deltas[j] = graph, delta
        self.captures += 1
        return True

    @staticmethod
    def _undone(run, j) -> None:
        saved = [a.copy() for a in run.buffers()]
        run.step(j)
        for a, v in zip(run.buffers(), saved):
            a[...] = v

    def _on_stream(self, fn) -> None:
        """``fn()`` on the capture stream with this level's memory pool, ordered after the caller's stream's work
        and before its next."""
        cp = self.xp
        cur = cp.cuda.get_current_stream()
        self.joined.record(cur)
        self.stream.wait_event(self.joined)
        with self.stream, cp.cuda.using_allocator(self.pool.malloc):
            fn()
        self.done.record(self.stream)
        cur.wait_event(self.done)

    def _launch(self, j) -> None:
        graph = self.graphs[j]
        if self.emulate:
            before = self.tally.read()
            graph()
            self.tally.set(before)
        else:
            self._on_stream(lambda: graph.launch(self.stream))
        self.tally.add(self.deltas[j])
        self.replays += 1

    def counters(self) -> dict:
        return {"graph_replays": self.replays, "graph_captures": self.captures}

    def close(self) -> None:
        for g in self.graphs.values():
            if hasattr(g, "close"):
                g.close()
        self.graphs.clear()


def graphed_level(hierarchy, params) -> int | None:
    """The level whose GCR steps are captured (L - 1, L the coarsest), or None: the switch off, not one GPU, the
    coarsest solve not the device's dense inverse, or no K-cycle GCR (three levels)."""
    cyc = hierarchy.cycle
    L = len(hierarchy.ops) - 1
    geom = hierarchy.ops[-1].geom
    if L < 3 or not switch_on("mg_graph", geom.config):
        return None
    if not (geom.backend.is_gpu or _EMULATE["on"]) or geom.grid.active_comm.size != 1:
        return None
    lu = cyc.lu if cyc is not None else None
    if lu is None or not (getattr(lu, "on_device", False) or _EMULATE["on"]):
        return None
    return L - 1


_EMULATE = {"on": False}


def set_emulation(on: bool) -> bool:
    """Testing hook: NumPy hierarchies take the graph path too, with replays emulated (:class:`LevelGraphs`
    ``emulate``); returns the previous setting."""
    old, _EMULATE["on"] = _EMULATE["on"], bool(on)
    return old


def level_graphs(hierarchy, level: int, apply, precondition, like, nkrylov: int, tally: Tally) -> LevelGraphs:
    """The :class:`LevelGraphs` of ``level`` kept on the hierarchy (made on first use)."""
    store = hierarchy.__dict__.setdefault("graphs", {})
    lg = store.get(level)
    if lg is None or not lg.fits(like):
        geom = hierarchy.cycle.ops[level].geom
        lg = store[level] = LevelGraphs(apply, precondition, geom, like, nkrylov, tally,
                                        emulate=not geom.backend.is_gpu)
    return lg


def graph_counters(hierarchy) -> dict:
    """Replays and captures so far of every level's graphs of ``hierarchy`` (and the first failure, if any)."""
    out = {"graph_replays": 0, "graph_captures": 0}
    for lg in hierarchy.__dict__.get("graphs", {}).values():
        for k, v in lg.counters().items():
            out[k] += v
        if lg.failed is not None:
            out["graph_failed"] = lg.failed
    return out
