"""Device-resident Krylov iterations: the production CG (Chronopoulos-Gear steps of :class:`solvers.cg.CGInverse`)
and multishift CG (:func:`solvers.multishift.multishift_cg`) on a GPU run whole iterations as replays of a CUDA
graph, with every scalar in device memory and no host synchronisation inside an iteration (docs/architecture.md,
"Device-resident solvers").

One iteration on the device, all on the loop's stream:

1. a one-thread kernel computes the step's scalars from the state vector (beta, p^dag A p, alpha; for the
   multishift, Jegerlehner's zeta_{k+1}, alpha_i, beta_i of every shift, and with ``stop_converged`` which shifts
   stop, reported in the loop's ``fin`` block) with the host code's operations in its
   order (solvers/kernels/fused_blas.cu, compiled without contraction), so the iterates are bitwise those of the
   host-driven fused path on one rank;
2. the vector update kernel reads its coefficients from device memory;
3. the operator writes A r into a persistent buffer (``op.apply_into``: the hop kernels, with their halo exchanges
   through the stream-gated transport on a distributed lattice);
4. the fused reduction (|r|^2, Re<r, A r>) writes this rank's pair into device memory; :class:`DeviceSums` sums the
   pairs over the ranks through the halo engine (ring exchanges along each partitioned dimension, then the pairs
   added in grid-coordinate order, x first: every rank gets the same bits); in the "exact" reduction mode each
   rank's exact records (lattice/exact_sum_cuda.py) travel instead and are added as integers, so the sums are the
   same bits for any decomposition;
5. a one-thread kernel takes the new residual, counts the iteration and applies the solver's stop test; once it
   holds (or on a breakdown) the state is *frozen*: every later kernel of the graph returns at once (the update,
   the hop kernels, which read the state's status slot, and the fused reduction), so replays past the end change
   nothing and cost little more than their launches; on a distributed lattice the halo exchanges and rank sums of
   those replays still run (every rank stops at the same iteration) and carry stale numbers that nothing reads.

Each kind of solve captures once and replays thereafter, across solves and link updates: its loop owns the Krylov
vectors (:meth:`GraphLoop.bind`), and the operators a graph bakes in keep their addresses when their links change
(docs/architecture.md "Device-resident solvers").

``solver_graph`` (HMC_SOLVER_GRAPH, default 8) iterations run per host check: one graph of that many iterations,
or, with ``solver_graph_capture`` (HMC_SOLVER_GRAPH_CAPTURE) an even divisor c of it, a graph of c iterations
launched ``solver_graph / c`` times back to back (a capture costs about as much host time as the iterations it
holds: shorter graphs are cheaper to make, the same iterates; with the graphs kept across solves they are rarely made);
after the launches the state vector comes back to pinned host memory (one small copy and one event), where the host
tests whether the solve stopped. A solve thus pays one host round trip per ``solver_graph`` iterations and at most
``solver_graph - 1`` frozen iterations at its end. With ``solver_graph_while`` k > 0 (one rank) the whole solve is
one launch instead: a while node repeating k iterations until the state stops (:meth:`GraphLoop._while_graph`). The
true-residual checks, restarts and reliable updates stay on the host path.

Where it runs (:func:`graph_iterations`): the fused GPU kernels serve the solve, the operator has ``apply_into``,
and either the whole lattice is on one GPU or every halo link of the distributed lattice can be captured
(``stream_gated``: the engine switches to binary flags, docs/halo-protocol.md "CUDA graphs"); elsewhere (the
``event`` and ``mpi`` transports, CPU) the host-driven iteration runs.
"""
from __future__ import annotations

import time
import weakref

import numpy as np

from comms.base import CommsTimeout
from lattice import cuda_source

#: offsets in the state vector (the S_* names of solvers/kernels/fused_blas.cu)
SLOT = {"g": 0, "d": 1, "g_old": 2, "alpha_old": 3, "beta": 4, "alpha": 5, "k": 6, "fresh": 7, "step_fresh": 8,
        "stop": 9, "delta2": 10, "rmax2": 11, "maxiter": 12, "status": 13, "pap": 14, "res": 16, "shift_stop": 18}
NSTATE = 24
RUNNING, DONE, BREAKDOWN, NONFINITE = 0, 1, 2, 3


_capturable_everywhere = weakref.WeakKeyDictionary()   # halo engine -> every rank's links capture
_LOOPS: "weakref.WeakSet" = weakref.WeakSet()            # every GraphLoop of this process (graph_totals)
_override = {"iters": None}        # set_solver_graph: iterations per graph for every geometry, or None


def set_solver_graph(iters: int | None) -> int | None:
    """Iterations per graph replay for every geometry (0: host-driven), or None to follow each geometry's
    configuration (``solver_graph``) again; returns the previous override, to restore it with (tests, timings)."""
    old = _override["iters"]
    _override["iters"] = None if iters is None else max(0, int(iters))
    return old


def _all_links_capturable(engine) -> bool:
    links = getattr(engine, "links", None) or {}
    return bool(getattr(engine, "device_faces", False)) and all(
        link.kind.capabilities.graph_capture for link in links.values())


def graph_iterations(op, blas) -> int:
    """Iterations per graph replay for a solve with ``op`` on the fused kernels ``blas``, or 0: the host-driven
    iteration (module docstring). Collective on a distributed lattice (every rank answers the same)."""
    geom = op.geom
    iters = int(geom.config.solver_graph if _override["iters"] is None else _override["iters"])
    if iters <= 0 or blas is None or not hasattr(blas, "cg_update_dev") or not hasattr(op, "apply_into"):
        return 0
    if blas.parity is None and getattr(op, "parity", None) in (0, 1):
        return 0            # an even-odd operator on fields that do not vanish on the other parity
    grid = geom.grid
    if not any(grid.partitioned):
        return iters if grid.comm.size == 1 else 0
    engine = grid.halo
    if engine not in _capturable_everywhere:     # links are fixed when the engine is made: ask the ranks once
        _capturable_everywhere[engine] = all(grid.active_comm.allgather(_all_links_capturable(engine)))
    return iters if _capturable_everywhere[engine] else 0


class DeviceSums:
    """The reduction pair (|a|^2, Re<a, w>) of one iteration summed over the ranks on the device, left in
    ``st[res:res + 2]``; :meth:`reduce` runs on the current stream. Fast sums: the fused kernel's pair of each rank
    (:attr:`local`) travels P - 1 steps around the ring along each partitioned dimension of extent P (halo-engine
    exchanges of 16 bytes), then every rank adds the pairs in coordinate order; the dimensions are reduced x, y, z, t.
    Exact sums (the "exact" reduction mode): each rank's exact records (lattice.exact_sum_cuda, 2 x 68 integers)
    travel the same rings and are added as integers, so the result is the correctly rounded sum of every element's
    products, the same bits for any decomposition; one rank rounds its own records in the reduction kernel."""

    def __init__(self, geom, st, kernel, exact=False, peers=False):
        grid = geom.grid
        cp = geom.xp
        self.grid = grid                  # held, so that the loop cache's key (the grid's id) stays this grid's
        self.st, self.kernel, self.exact, self.backend = st, kernel, bool(exact), geom.backend
        self.dims, self.coords = tuple(grid.dims), tuple(grid.coords)
        self.rdims = [mu for mu in range(4) if grid.partitioned[mu] and self.dims[mu] > 1]
        self.engine = grid.halo if self.rdims else None
        res = SLOT["res"]
        self.result = st[res:res + 2]
        if self.exact:
            from lattice.exact_sum_cuda import WIDTH, ExactReducer

            self.reducer = ExactReducer(geom.backend)
            shape, dtype = (2, WIDTH), np.int64
            self.scratch = cp.zeros(2, dtype=np.float64)       # the fused kernel's pair, unused in this mode
            self.rounded = cp.zeros(2, dtype=np.float64)
            self.alone = cp.zeros(shape, dtype=dtype)
        else:
            shape, dtype = (2,), np.float64
        self.vals = {mu: cp.zeros((self.dims[mu],) + shape, dtype=dtype) for mu in self.rdims}
        self.local = self._own(self.rdims[0]) if self.rdims else (self.alone if self.exact else self.result)
        if self.engine is not None:
            self.engine.reserve(2 * int(np.prod(shape)) * 8)
        # --- hook (issue 17, HMC_P2P_PEER_SUMS): one step over all node peers instead of the rings, where the
        # engine does it and the graph spans an even number of sums (solvers/staggered_dist_cuda.PeerRankSums)
        self.peers = None
        if peers and self.rdims:
            from .staggered_dist_cuda import peer_rank_sums

            self.peers = peer_rank_sums(geom, shape, dtype)

    def _own(self, mu):
        return self.vals[mu][self.coords[mu]]

    def before_capture(self) -> None:
        """Bring the peer-sum tables up to the halo segments' current addresses (they move when the engine grows or
        switches to graph mode, e.g. at the first upload after this object was made): a capture bakes them in."""
        if self.peers is not None:
            self.peers.refresh()

    def reduce(self, blas, a, w, shift) -> None:
        """w += shift a (when shift != 0), then the global (|a|^2, Re<a, w>) into ``st[res:res + 2]``; nothing of
        it past the solve's end (the state's status: the fused kernel returns, the rings carry what they hold)."""
        local = self.local if self.peers is None else self.peers.local()
        if not self.exact:
            blas.norm2_redot_into(a, w, shift, local, st=self.st)
        else:
            if shift != 0.0:
                blas.norm2_redot_into(a, w, shift, self.scratch, st=self.st)
            self.reducer.norm2_redot(a, w, local, None if self.rdims else self.result)
        if self.peers is not None:
            self.peers.total(self.result, self.exact)
            return
        self._ranks()

    def _ranks(self):
        from lattice.exact_sum_cuda import round_records

        for i, mu in enumerate(self.rdims):
            P, c, v = self.dims[mu], self.coords[mu], self.vals[mu]
            for s in range(1, P):
                a, b = (c - s + 1) % P, (c - s) % P
                self.engine.start({(mu, 1): v[a]}).finish({(mu, 0): v[b]})
            last = i == len(self.rdims) - 1
            if self.exact:
                round_records(self.backend, v, self.result if last else self.rounded,
                              None if last else self._own(self.rdims[i + 1]))
            else:
                self.kernel((1,), (1,), (v, np.int32(P), self.result if last else self._own(self.rdims[i + 1])))


class GraphLoop:
    """The device-resident iteration of one kind of solve on one local lattice: the state vector and the per-shift
    arrays in one device block with a pinned host twin (one copy each way per upload and per replay), the loop
    stream, the rank sums, and the captured graphs of ``held`` iterations (``launches`` of them per host check),
    kept per key (the addresses the graph
    bakes in: fields, operator links and buffers, the base shift) for reuse by later solves (:data:`KEEP` of them,
    least recently used dropped). Made once per (kind, lattice, precision, shift count) by :func:`loop_for`."""

    KEEP = 8

    def __init__(self, geom, iters: int, nshift: int = 0, real=np.float64, exact=False, kind: str = "cg"):
        from collections import OrderedDict

        import cupyx

        from comms.cuda.graph import CapturedGraph

        cp = geom.xp
        self.cp, self.geom, self.iters, self.n, self.kind = cp, geom, int(iters), int(nshift), kind
        self.held = held_iterations(self.iters, int(getattr(geom.config, "solver_graph_capture", 0)))
        self.launches = self.iters // self.held        # per host check (module docstring)
        self._Graph = CapturedGraph
        self.while_body = int(getattr(geom.config, "solver_graph_while", 0))   # (0 on a distributed lattice, below)
        self.while_failed = None           # why the device-side loop could not be built (then host checks)
        be = geom.backend
        self.k = {name: cuda_source.function(be, "solvers", "fused_blas.cu", name)
                  for name in ("cg_direction", "cg_close", "ms_direction_double", "ms_direction_single", "ms_close",
                               "rank_sum")}
        self.stream = cp.cuda.Stream(non_blocking=True)
        n = self.n
        size = NSTATE + 7 * n         # state, zeta, zeta_prev, stopped shifts, relative shifts, p_i / x_i addresses
        self.dev = cp.zeros(size, dtype=np.float64)
        self.host = cupyx.empty_pinned((size,), dtype=np.float64)
        self.st = self.dev[:NSTATE]
        self.status = self.st[SLOT["status"]:SLOT["status"] + 1]     # what the hop kernels test (frozen)
        self.z, self.zp = self.dev[NSTATE:NSTATE + n], self.dev[NSTATE + n:NSTATE + 2 * n]
        self.fin = self.dev[NSTATE + 2 * n:NSTATE + 4 * n]        # (|r_i|^2, iteration) of each stopped shift
        self.rel = self.dev[NSTATE + 4 * n:NSTATE + 5 * n]
        table = self.dev[NSTATE + 5 * n:].view(np.uint64)
        self.table = (table[:n], table[n:])
        self.coef = cp.zeros(4 * n, dtype=real)
        self.readback = NSTATE + 4 * n   # what comes back per replay: the state, the zetas, the stopped shifts
        self.sums = DeviceSums(geom, self.st, self.k["rank_sum"], exact, peers=self.iters % 2 == 0)
        if self.sums.engine is not None:
            self.while_body = 0            # a halo exchange's doorbells cannot be in a while node's body
        self.done = cp.cuda.Event(disable_timing=True)
        self.joined = cp.cuda.Event(disable_timing=True)
        self.graphs = OrderedDict()
        self.vectors = {}                  # attribute name -> this loop's own Krylov vector (bind)
        self.holder = None                 # weakref to the solve whose attributes are those vectors
        self.replays = 0
        self.capture_s = 0.0
        self.captures = 0
        self.label = f"{nshift} shifts, {np.dtype(real).name}" if nshift else np.dtype(real).name
        self.last_parts = None             # the key of the graph launched last (capture_reason)
        self.held_elsewhere = False        # bind left the solve its own vectors (another solve holds the loop's)
        self.reasons = {}                  # capture_reason -> captures for it
        self.seen = set()                  # every key captured so far (a key seen again: its graph was dropped)
        _LOOPS.add(self)

    def upload(self, z=(), zp=(), rel=(), ptrs=(), **values) -> None:
        """The state vector from ``values`` (slot name -> number; the rest 0) and the per-shift arrays, in one copy
        on the loop stream after the caller's stream has produced the fields."""
        engine = self.sums.engine
        if engine is not None and not engine.graph_mode:
            engine.set_graph_mode(True)       # collective; binary flags serve uncaptured exchanges as well
        host, n = self.host, self.n
        host[:NSTATE] = 0.0
        for name, v in values.items():
            host[SLOT[name]] = float(v)
        if n:
            host[NSTATE:NSTATE + n], host[NSTATE + n:NSTATE + 2 * n] = z, zp
            host[NSTATE + 2 * n:NSTATE + 4 * n] = 0.0
            host[NSTATE + 4 * n:NSTATE + 5 * n] = rel
            host[NSTATE + 5 * n:].view(np.uint64)[...] = ptrs
        self.joined.record(self.cp.cuda.get_current_stream())
        self.stream.wait_event(self.joined)
        self.cp.cuda.runtime.memcpyAsync(self.dev.data.ptr, self.host.ctypes.data, self.dev.nbytes,
                                         self.cp.cuda.runtime.memcpyHostToDevice, self.stream.ptr)

    def bind(self, run, names) -> None:
        """The Krylov vectors ``names`` of ``run`` (attributes a graph bakes in) moved into this loop's own
        buffers, made once per shape: their values copied on the caller's stream and the attributes rebound, so
        that every solve of this kind presents the same addresses and replays the kept graphs (with the operators
        kept across link updates, hmc.rhmc: about one capture per kind of solve in a run, not one per solve).
        While another solve that holds them is alive, ``run`` keeps its own vectors (and captures for them)."""
        holder = self.holder() if self.holder is not None else None
        self.held_elsewhere = holder is not None and holder is not run
        if self.held_elsewhere:
            return
        self.holder = weakref.ref(run)
        for name in names:
            a = getattr(run, name)
            if a is None:
                continue
            buf = self.vectors.get(name)
            if buf is None or buf.shape != a.shape or buf.dtype != a.dtype:
                buf = self.vectors[name] = self.cp.empty_like(a)
            if buf is not a:
                buf[...] = a
                setattr(run, name, buf)

    def capture(self, key, body) -> None:
        """The graph of ``held`` calls of ``body`` for ``key`` (:func:`held_iterations`): a kept one, else captured
        now. ``key``: named parts, ((name, tuple), ...), what the graph bakes in (:func:`capture_reason`)."""
        graph = self.graphs.pop(key, None)
        if graph is None:
            self._note_capture(key)
            self.sums.before_capture()
            t0 = time.perf_counter()
            graph = self._while_graph(body) if self.while_body else None
            if graph is None:
                graph = self._Graph(self.stream, lambda: [body() for _ in range(self.held)])
            self.capture_s += time.perf_counter() - t0
            self.captures += 1
            while len(self.graphs) >= self.KEEP:
                self.graphs.popitem(last=False)[1].close()
        self.graphs[key] = graph
        self.graph = graph
        self.last_parts = key

    def _while_graph(self, body):
        """The whole solve as one launch (``solver_graph_while`` iterations a body, then the loop's condition from
        the state: :class:`comms.cuda.graph.WhileGraph`), or None where the driver or compiler refuses it: the loop
        then keeps host checks, says why once (:attr:`while_failed`, a warning) and does not try again."""
        try:
            from comms.cuda.graph import WhileGraph

            from .krylov_while import while_kernel

            k_while = while_kernel(self.geom.backend)
            st, n = self.st, self.while_body
            return WhileGraph(self.stream, lambda handle: [body() for _ in range(n)]
                              + [k_while((1,), (1,), (st, np.uint64(handle)))])
        except Exception as e:  # noqa: BLE001 - any refusal (nvrtc, driver, binding) falls back to host checks
            import warnings

            self.while_failed, self.while_body = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", 0
            warnings.warn(f"device-side solver loop (HMC_SOLVER_GRAPH_WHILE) unavailable, host checks instead: "
                          f"{self.while_failed}", RuntimeWarning, stacklevel=2)
            return None

    def _note_capture(self, key) -> None:
        """Count the capture under its :func:`capture_reason`; with ``solver_graph_log`` one stderr line."""
        why = ("dropped from the kept graphs (more than KEEP keys in turn)" if key in self.seen else
               capture_reason(nearest_key(self.seen, key, self.last_parts), key, self.held_elsewhere))
        self.seen.add(key)
        self.reasons[why] = self.reasons.get(why, 0) + 1
        if getattr(self.geom.config, "solver_graph_log", False):
            import sys

            print(f"solver graph capture (rank {self.geom.grid.comm.rank}): {self.kind} loop ({self.label}), capture "
                  f"{self.captures + 1}: {why}", file=sys.stderr, flush=True)

    def run(self) -> np.ndarray:
        """Replay until the state leaves RUNNING; returns the state and zetas (host copy). A replay that does not
        finish within the communication timeout (a dead peer) raises CommsTimeout instead of waiting for ever."""
        timeout = float(self.geom.config.comms_timeout)
        status = SLOT["status"]
        nbytes = 8 * self.readback
        rt = self.cp.cuda.runtime
        whole = self.graph.loops_on_device            # a while graph: the whole solve in one launch
        launches = 1 if whole else self.launches
        while True:
            for _ in range(launches):
                self.graph.launch(self.stream)
            self.replays += launches
            rt.memcpyAsync(self.host.ctypes.data, self.dev.data.ptr, nbytes, rt.memcpyDeviceToHost, self.stream.ptr)
            self.done.record(self.stream)
            deadline = time.perf_counter() + timeout
            while not self.done.done:
                if time.perf_counter() > deadline:
                    raise CommsTimeout(f"a device-resident solver iteration did not finish within {timeout:g} s "
                                       "(a peer rank stopped?): raise HMC_COMMS_TIMEOUT if the iterations are "
                                       "that slow")
            if self.host[status] != RUNNING:
                return self.host[:self.readback].copy()
            if whole:
                raise RuntimeError("the device-side solver loop ended with its solve still running: its condition "
                                   "kernel did not see the state (run with HMC_SOLVER_GRAPH_WHILE=0)")

    def counters(self) -> dict:
        """Replays and captures so far (and the seconds the captures took), for the solver statistics."""
        return {"graph_replays": self.replays, "graph_captures": self.captures, "graph_capture_s": self.capture_s}


def capture_reason(last, key, held_elsewhere: bool = False) -> str:
    """Why a loop captures ``key`` ((name, tuple) parts) against ``last`` (:func:`nearest_key`: the nearest key it
    captured before): "first" (no graph yet), else the parts that differ, with the positions inside them ("operator[7, 8]": e.g. the hop's segment address and
    capacity, solvers.staggered_dist_cuda.DistHop.graph_key); "vectors (held by another solve)" where
    :meth:`GraphLoop.bind` left the solve its own vectors."""
    if last is None:
        return "first"
    old, new = dict(last), dict(key)
    changed = []
    for name, parts in new.items():
        was = old.get(name)
        if was == parts:
            continue
        if was is None or len(was) != len(parts):
            changed.append(f"{name}[length {len(parts)}]")
            continue
        where = [i for i, (a, b) in enumerate(zip(was, parts)) if a != b]
        held = " (held by another solve)" if name == "vectors" and held_elsewhere else ""
        # the settings' small numbers (the base shift, the precision flag): say which
        values = [f"{was[i]!r} -> {parts[i]!r}" for i in where
                  if name == "settings" and isinstance(parts[i], (float, bool))]
        shown = f" ({', '.join(values)})" if values else ""
        changed.append(f"{name}[{', '.join(map(str, where))}]{held}{shown}")
    return ", ".join(changed) if changed else "the same key"


def _differences(a, b) -> int:
    """How many positions of two keys ((name, tuple) parts) differ; a part of another length counts whole."""
    old, n = dict(a), 0
    for name, parts in b:
        was = old.get(name)
        n += (sum(x != y for x, y in zip(was, parts)) if was is not None and len(was) == len(parts)
              else len(parts) + 1)
    return n


def nearest_key(seen, key, last=None):
    """The key captured before (``seen``) that differs from ``key`` in the fewest positions (``last``, the key
    launched last, where it is as near): what a new key is compared with, so that a reason names what is new rather
    than what differs from the other operator the loop served just before; None where nothing was seen."""
    best, fewest = last, _differences(last, key) if last is not None else None
    for old in seen:
        n = _differences(old, key)
        if fewest is None or n < fewest:
            best, fewest = old, n
    return best


def capture_reasons() -> dict:
    """{"kind (label): reason": captures} over every loop of this process (:func:`capture_reason`)."""
    out: dict = {}
    for loop in list(_LOOPS):
        for why, n in loop.reasons.items():
            name = f"{loop.kind} ({loop.label}): {why}"
            out[name] = out.get(name, 0) + n
    return out


def held_iterations(iters: int, capture: int) -> int:
    """The iterations one graph holds for ``iters`` per host check: ``capture`` where it divides ``iters`` and is
    even (the peer sums and the credit-free exchanges need an even count per graph; an odd ``iters`` takes rings and
    credits, any divisor), else ``iters``."""
    if 0 < capture < iters and iters % capture == 0 and (capture % 2 == 0 or iters % 2 == 1):
        return capture
    return iters


def graph_totals() -> dict:
    """:meth:`GraphLoop.counters` summed over every loop of this process (replays, captures, capture seconds): what
    a benchmark reads before and after a timed run, e.g. to see how many solves captured a new graph."""
    out = {"graph_replays": 0, "graph_captures": 0, "graph_capture_s": 0.0}
    for loop in list(_LOOPS):
        for k, v in loop.counters().items():
            out[k] += v
    return out


def loop_for(geom, kind: str, iters: int, real=np.float64, nshift: int = 0, exact=False) -> GraphLoop:
    """The :class:`GraphLoop` of ``kind`` ("cg" or "multishift") for this local lattice, precision, shift count
    and reduction mode, made once per backend and process grid."""
    key = ("krylov_graph", kind, tuple(geom.local_dims), np.dtype(real).str, int(nshift), int(iters),
           sum(geom.offset) & 1, id(geom.grid), bool(exact))
    return geom.backend.kernel(key, lambda: GraphLoop(geom, iters, nshift, real, exact, kind))


def _ptrs(*arrays) -> tuple:
    return tuple(a.data.ptr for a in arrays)


def _counted(st, loop, before: dict) -> None:
    """Add the loop's replays and captures since ``before`` to the solver statistics ``st``."""
    for name, v in loop.counters().items():
        st.extra[name] = st.extra.get(name, 0) + v - before[name]


def ratio_squared(zi: float, zp: float, fused: bool) -> float:
    """(zi / zp)^2: on the fused GPU path q * q, the device kernel's arithmetic (``ms_direction``; C's pow(q, 2),
    which q ** 2 calls, is off by one ulp for ~1 q in 1100); on the NumPy path q ** 2, the bits MILC's regression case
    su3_rhmc_hisq.f211.2 was checked with (its PBP lines sit at MILC's errtol: 0.83 of it with pow, 5x with q * q)."""
    q = zi / zp
    return q * q if fused else q ** 2


def cg_iterations(run, iters: int) -> None:
    """Chronopoulos-Gear iterations of ``run`` (a :class:`solvers.cg._CGRun` on the fused GPU path) on the device
    until its stop test holds; ``run``'s scalars, counters and fields are left as the host-driven steps leave them."""
    xp, blas, A = run.xp, run.blas, run.Ak       # (Ak: the operator on the Krylov vectors' layout)
    loop = loop_for(run.geom, "cg", iters, blas.real, exact=blas.exact)
    if run.ps is None:
        run.ps, run.ss = xp.zeros_like(run.rs), xp.zeros_like(run.rs)
    loop.bind(run, ("ps", "ss", "y", "rs", "ws"))
    ps, ss, y, rs, ws = run.ps, run.ss, run.y, run.rs, run.ws
    st, sums, kd, kc = loop.st, loop.sums, loop.k["cg_direction"], loop.k["cg_close"]
    stopped = loop.status

    def body():
        kd((1,), (1,), (st,))
        blas.cg_update_dev(ps, ss, y, rs, ws, st)
        A.apply_into(rs, ws, frozen=stopped)
        sums.reduce(blas, rs, ws, 0.0)
        kc((1,), (1,), (st,))

    k0, before = run.k, loop.counters()
    loop.upload(g=run.g, d=run.d, g_old=run.g_old, alpha_old=run.alpha_old, beta=run.beta, k=k0,
                fresh=run.fresh, stop=run.stop, delta2=run.delta2, rmax2=run.rmax2, maxiter=run.inv.maxiter)
    loop.capture((("vectors", _ptrs(ps, ss, y, rs, ws)), ("operator", A.graph_key()), ("settings", (id(blas),))),
                 body)
    out = loop.run()
    _counted(run.st, loop, before)
    S = SLOT
    run.k = int(out[S["k"]])
    done = run.k - k0
    run.st.matvecs += done
    run.flops += done * (A.flops + run.cg_flops_per_iteration())
    run.g, run.d, run.g_old, run.alpha_old = (float(out[S[n]]) for n in ("g", "d", "g_old", "alpha_old"))
    run.beta, run.rmax2 = float(out[S["beta"]]), float(out[S["rmax2"]])
    run.fresh = bool(out[S["fresh"]])
    status = int(out[S["status"]])
    if status == BREAKDOWN:
        run.breakdown(float(out[S["pap"]]))
    if status == NONFINITE:
        run.nonfinite()


def multishift_iterations(run, iters: int) -> None:
    """Every iteration of ``run`` (a :class:`solvers.multishift_run._MultishiftRun` on the fused GPU path, after
    ``start``) on the device until the base shift converges, ``maxiter``, or (``run.delta2`` > 0) a reliable update
    is due; its scalars, zetas and counters are left as the host-driven iterations leave them. Solutions in double
    with single Krylov vectors (the mixed-precision multishift) take the ``ms_update_dev_mixed`` kernel and double
    coefficients."""
    blas, A, n = run.blas, run.Ak, run.n       # (Ak: the operator on the Krylov vectors' layout)
    mixed = blas.mixed_solutions(run.xs)       # x_i in double with single Krylov vectors: double coefficients
    real = np.float64 if mixed else blas.real
    loop = loop_for(run.geom, "multishift_mixed" if mixed else "multishift", iters, real, n, exact=blas.exact)
    kd = loop.k["ms_direction_single" if real == np.float32 else "ms_direction_double"]
    kc, st, sums, z, zp, rel, coef, table, fin = (loop.k["ms_close"], loop.st, loop.sums, loop.z, loop.zp, loop.rel,
                                                 loop.coef, loop.table, loop.fin)
    loop.bind(run, ("s", "r", "w"))
    s, r, w, s0 = run.s, run.r, run.w, run.s0
    ptrs = tuple(blas._f(a).data.ptr for a in run.ps_i) + tuple(blas.x_address(a) for a in run.xs)

    stopped = loop.status

    def body():
        kd((1,), (1,), (st, z, zp, rel, coef, fin, np.int32(n)))
        blas.ms_update_dev(s, r, w, table, coef, n, st, mixed=mixed)
        A.apply_into(r, w, frozen=stopped)
        sums.reduce(blas, r, w, s0)
        kc((1,), (1,), (st,))

    k0, before = run.k, loop.counters()
    loop.upload(z=run.z, zp=run.z_prev, rel=run.rel, ptrs=ptrs, g=run.g, d=run.d, g_old=run.g_old,
                alpha_old=run.alpha_prev, k=k0, stop=run.stop, maxiter=run.inv.maxiter, delta2=run.delta2,
                rmax2=run.rmax2, shift_stop=run.shift_stop)
    loop.capture((("vectors", _ptrs(s, r, w)), ("operator", A.graph_key()), ("settings", (s0, mixed, id(blas)))),
                 body)
    out = loop.run()
    _counted(run.st, loop, before)
    S = SLOT
    run.k = int(out[S["k"]])
    run.matvecs += run.k - k0
    run.g, run.d, run.g_old, run.alpha_prev = (float(out[S[n_]]) for n_ in ("g", "d", "g_old", "alpha_old"))
    run.rmax2 = float(out[S["rmax2"]])
    run.z = [float(v) for v in out[NSTATE:NSTATE + n]]
    run.z_prev = [float(v) for v in out[NSTATE + n:NSTATE + 2 * n]]
    for i in range(n):                          # the shifts the device stopped (shift_stop), as the host records them
        if out[NSTATE + 2 * n + 2 * i] > 0.0:
            run.finished[i] = (float(out[NSTATE + 2 * n + 2 * i]), int(out[NSTATE + 2 * n + 2 * i + 1]))
    status = int(out[S["status"]])
    if status == BREAKDOWN:
        run.breakdown(run.k, run.g, float(out[S["pap"]]))
    if status == NONFINITE:
        run.nonfinite()
