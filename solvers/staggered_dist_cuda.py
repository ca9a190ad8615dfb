"""The distributed HISQ hop on the GPU, halos through the transports of comms.cuda without host staging, and a
CG iteration whose reductions also stay on the device, so that a stream-gated Dslash or CG iteration can be captured
in a CUDA graph and replayed with no Python per exchange.

API (what ``hmc bench dslash --grid ...`` and the scaling tool use)
-------------------------------------------------------------------

Build the operator as usual on a partitioned CuPy geometry; the transport is the grid's::

    from comms import ProcessGrid
    from lattice import Geometry, get_backend
    from solvers import StaggeredDslash
    grid = ProcessGrid((1, 1, 1, 2), transport="stream_gated")      # or "event", "mpi" (HMC_P2P_TRANSPORT)
    geom = Geometry((8, 8, 8, 16), get_backend("cupy"), grid)
    D = StaggeredDslash(geom, fat, long)      # its hop is a DistHop (registered here for lattice.placement)
    D.hop(psi, parity, out)                   # pack kernel -> exchange -> interior kernel (overlapped) -> exterior

Every ``StaggeredDslash`` / even-odd operator / ``solvers.cg`` solve on such a geometry then uses it; with every
link ``stream_gated`` the CG and multishift iterations run device-resident from CUDA graphs (solvers/krylov_graph.py),
else their reductions go through ``geom.sum`` on the host. For graphs and timing (the runners live in
:mod:`bench.dslash_dist_cuda`, above the product):

* ``DslashRunner(D, psi, graph=False)``: ``run()`` applies the full D (two hops, two exchanges) into ``runner.out``
  on its own stream; ``graph=True`` (stream_gated only: every link must be peer-to-peer) switches the engine to
  binary flags (docs/halo-protocol.md "CUDA graphs", option 1), captures D once and ``run()`` replays the graph.
* ``cg_iteration_seconds(D, mass, b, iters)``: seconds per iteration of the production CG on A = 4m^2 - D_pq D_qp
  (whole solves of exactly ``iters`` iterations).
* ``device_time(fn, reps, stream)``: seconds per call of ``fn`` from device events around ``reps`` calls (the
  maximum over ranks, median of three blocks); ``DslashRunner.time(reps)``.
* Per-phase split: ``hop = D._hop_impl; hop.profile = PhaseProfile(); ...; hop.profile.summary()`` gives device
  ms per call for pack, post (enqueueing the sends), interior, wait (the compute stream waiting for the halo, incl.
  the unpack copy), exterior, and the host time spent in each; recording costs a few microseconds, so time without
  it.
* ``graph_split(D, psi)``: device us per hop of graphs with only the kernels, only the exchange, and both.
* ``close_graph_mode(geom)``: back to counters (collective) after graph work.
* ``geom.grid.halo.parallel_recv`` (HMC_P2P_PARALLEL_RECV, default on): stream_gated receive chains per link on
  their own streams (parallel graph branches) or one after the other on the compute stream; set it before capture.
* In graph mode with in-place receive and peer sums, ``HMC_P2P_CREDIT_FREE=1`` drops the credit waits and credits
  (comms/cuda/creditfree.py) and ``HMC_P2P_BATCH_SIGNALS=1`` sends every link's signal in one batch
  (docs/halo-protocol.md "Credit-free graph mode", "Batched signals"); :meth:`DistHop.__call__` meets their
  conditions (one exchange at a time, every link, released on the stream of the next pack).

Layout: faces are whole slabs (both parities) of depth 3 (Naik) or 1, packed by one kernel into one contiguous
send buffer [face (mu, dir) in sorted order]; received faces land in one ghost buffer [(mu, side)], which the
exterior kernel reads directly (kernel ``hop_dist`` of solvers/kernels/staggered_hop.cu). Interior sites: every hop
stays in the local block; exterior sites: the rest, each computed whole by one thread (all 16 hops in the fixed hop
order), so the answer is deterministic and does not depend on the decomposition or the transport.

Measured on one H200 with 2 and 4 ranks under MPS: runs/gpu_transports/README.md (a captured stream-gated hop is
55 us at 4^4 and 8^4 per rank on 2 ranks, a captured CG iteration 171-179 us; uncaptured transports are Python-bound).
Tested: tests/solvers/test_gpu_distributed.py (double precision; the single-precision kernels are the same template,
not yet run distributed on the device).
"""
from __future__ import annotations

import time

import numpy as np

from comms.stencil import Stencil, device_engine
from lattice import cuda_source
from lattice.placement import Placement, implements

from .staggered_cuda import BLOCK, CudaHop, hop_suffix



def _is_gpu_engine(engine) -> bool:
    """Whether the grid's halo engine moves device faces (the GPU engine of comms.cuda)."""
    return device_engine(engine)


class PhaseProfile:
    """Accumulates device and host time per phase of :class:`DistHop` calls (device events on the compute
    stream; host perf_counter). ``summary()``: {phase: {"device_ms": per call, "host_ms": per call}}."""

    PHASES = ("pack", "post", "interior", "wait", "exterior")

    def __init__(self):
        self.calls = 0
        self.pending = []
        self.device = dict.fromkeys(self.PHASES, 0.0)
        self.host = dict.fromkeys(self.PHASES, 0.0)

    def collect(self):
        import cupy as cp

        for evs, hs in self.pending:
            evs[-1].synchronize()
            for k, ph in enumerate(self.PHASES):
                self.device[ph] += cp.cuda.get_elapsed_time(evs[k], evs[k + 1])
                self.host[ph] += 1e3 * (hs[k + 1] - hs[k])
            self.calls += 1
        self.pending = []

    def summary(self) -> dict:
        self.collect()
        n = max(self.calls, 1)
        return {ph: {"device_ms": self.device[ph] / n, "host_ms": self.host[ph] / n} for ph in self.PHASES}


class DistHop(CudaHop):
    """``f(psi, parity, out, a, x, b)`` for a StaggeredDslash on a partitioned CuPy geometry (see the module
    docstring); ``twin=True`` runs the same index arithmetic in NumPy (CPU tests of the layout). Full-lattice
    fields only (no parity-compact mode: the faces and site lists are full-lattice)."""

    compact = False

    #: no batched hop across ranks (its faces would need buffers for n fields): StaggeredDslash.hop_many loops
    many = None

    def __init__(self, dslash, twin: bool = False):
        self.dslash = dslash
        geom = dslash.geom
        self.geom, self.twin = geom, bool(twin)
        self.xp = geom.xp
        self.engine = geom.grid.halo
        self.gpu_engine = _is_gpu_engine(self.engine)
        self.naik = dslash.naik
        self.depth = 3 if self.naik else 1
        self.local = tuple(geom.local_dims)
        self.pdims = [mu for mu in range(4) if geom.grid.partitioned[mu]]
        self.pmask = sum(1 << mu for mu in self.pdims)
        self.profile = None
        self._soa = {}
        dtype = np.dtype(dslash.dtype)
        self.dtype = dtype
        self.real = np.float32 if dtype == np.complex64 else np.float64
        self.suffix = hop_suffix(dslash)
        # faces, buffers and site lists: this hop's own stencil (fixed buffers: their addresses go into graphs)
        steps = (1, -1, 3, -3) if self.naik else (1, -1)
        self.stencil = Stencil(geom, [(mu, s) for mu in range(4) for s in steps], self.depth)
        self.bufs = self.stencil.buffers((3,), dtype)
        faces = self.stencil.faces                      # sorted (mu, dir); both sides of every partitioned mu
        self.keys = [f.key for f in faces]
        self.face_shape = {f.key[0]: f.shape + (3,) for f in faces}
        self.total = 3 * sum(f.size for f in faces)
        self.sendbuf, self.ghost = self.bufs.send[0], self.bufs.ghost[0]
        self.sends, self.recvs = self.bufs.send_views[0], self.bufs.ghost_views[0]
        table = [[f.key[0], f.key[1], 3 * f.send_at, 3 * f.size] for f in faces]
        goff = np.zeros(8, dtype=np.int64)
        for f in faces:
            goff[2 * f.recv_key[0] + f.recv_key[1]] = 3 * f.ghost_at
        self.goff_host = goff
        self.table_host = np.asarray(table, dtype=np.int32).reshape(-1, 4)
        xp = self.xp
        self.goff = xp.asarray(goff)
        self.table = xp.asarray(self.table_host.ravel() if len(table) else np.zeros(4, np.int32))
        # interior / exterior sites per output parity, as checkerboard indices (x fastest, even nx: j = site // 2)
        parity = np.sum(np.unravel_index(np.arange(geom.local_volume), geom.shape), axis=0) % 2
        self.sites = {p: tuple(xp.asarray((s[parity[s] == p] // 2).astype(np.int32))
                               for s in (self.stencil.interior, self.stencil.exterior)) for p in (0, 1)}
        size = {mu: int(np.prod(fs)) for mu, fs in self.face_shape.items()}
        if self.gpu_engine:
            self.engine.reserve(int(max(size.values(), default=1)) * dtype.itemsize)
        # received in place (HMC_P2P_IN_PLACE with every link stream_gated): the exterior kernel reads the faces in
        # the engine's receive buffer; goff of that layout, made here (outside any capture)
        self.in_place = bool(self.gpu_engine and not self.twin and self.keys and self.engine.receives_in_place())
        self._goff_ip = None
        if self.in_place:
            self.in_place_ghost({f.recv_key: self.engine.face_address(0, *f.recv_key) for f in faces})
        if not self.twin:
            be = geom.backend
            cp = xp
            suffix = "single" if dtype == np.complex64 else "double"
            self.k_hop = cuda_source.function(be, "solvers", "staggered_hop.cu", f"hop_dist_{self.suffix}")
            self.k_pack = cuda_source.function(be, "solvers", "staggered_hop.cu", f"pack_{suffix}")
            self.cp = cp

    def graph_key(self) -> tuple:
        """:meth:`CudaHop.graph_key` plus this hop's own buffers and site lists (their addresses are baked into a
        captured application) and its engine, with its segment and capacity: the receive, in place or copied out,
        reads the segment, which a growth of the buffers moves."""
        own = (self.sendbuf, self.ghost, self.goff, self.table) + tuple(a for p in (0, 1) for a in self.sites[p])
        segment = getattr(self.engine, "seg", None) if self.gpu_engine else None
        seg = (segment.ptr, self.engine.capacity) if segment is not None else ()
        return super().graph_key() + tuple(a.data.ptr for a in own) + (id(self.engine),) + seg

    def _decode(self, j, parity):
        nx, ny, nz, nt = self.local
        half = nx // 2
        row, k = j // half, j % half
        y = row % ny
        row = row // ny
        z = row % nz
        t = row // nz
        x = 2 * k + ((parity + y + z + t) & 1)
        return (x, y, z, t)

    # --- the phases ---------------------------------------------------------------------------------------------
    def pack(self, psi):
        """All faces of ``psi`` into the send buffer (one kernel)."""
        if self.twin:
            self.stencil.pack(psi, self.bufs)
            return
        if not self.total:
            return
        nx, ny, nz, nt = self.local
        self.k_pack(((self.total + BLOCK - 1) // BLOCK,), (BLOCK,),
                    (psi, self.sendbuf, self.table, np.int32(len(self.keys)), np.int64(self.total), np.int32(nx),
                     np.int32(ny), np.int32(nz), np.int32(nt), np.int32(self.depth)))

    def start(self):
        """Post the exchange of the packed faces (the stencil: device to device with a GPU engine, one staging copy
        each way through the host with the CPU engine); returns the buffers in flight (None when nothing is
        partitioned)."""
        if not self.keys:
            return None
        return self.stencil.post(self.bufs)

    def finish(self, ex):
        """Wait for the halo (device-side for the GPU transports) and land it in the ghost buffer."""
        if ex is not None:
            self.stencil.complete(ex)

    def receive(self, ex):
        """What the exterior kernel reads: None after :meth:`finish` (the ghost buffer), or, received in place
        (HMC_P2P_IN_PLACE, ``engine.receives_in_place()``), only the device waits and no copy: (the held exchange,
        whose ``release()`` must follow the exterior kernel, the (ghost, goff) kernel arguments that read the
        engine's receive buffer) (docs/halo-protocol.md "In-place receive")."""
        if ex is None or not self.in_place:
            self.finish(ex)
            return None
        held, where = self.stencil.receive_in_place(ex)
        return held, self.in_place_ghost(where)

    def in_place_ghost(self, where: dict) -> tuple:
        """(base address as a kernel argument, device goff) that make the exterior kernel read face (mu, side) at
        ``where[(mu, side)]``: goff[2 mu + side] = (where - base) / itemsize, base the lowest address. The offsets
        are the same for both halo buffers (one layout, shifted) and change only when the segment grows: then a
        new goff is made, which a capture cannot do (capture again after the grow)."""
        base = min(where.values())
        goff = in_place_offsets(where, self.dtype.itemsize)
        if self._goff_ip is None or not np.array_equal(self._goff_ip[0], goff):
            if not self.twin and self.xp.cuda.get_current_stream().is_capturing():
                raise RuntimeError("the halo segment changed since the in-place offsets were made: capture again")
            self._goff_ip = (goff, self.xp.asarray(goff))
        return np.uintp(base), self._goff_ip[1]

    def compute(self, psi, parity, out, a, x, b, which, ghost=None, frozen=None):
        """The hop on the interior (which=0) or exterior (1) sites of ``parity``; ``ghost``: (ghost, goff) kernel
        arguments where the faces are read (default: this hop's ghost buffer); ``frozen``: as for
        :class:`CudaHop` (the exchange still runs: every rank's solve stops at the same iteration)."""
        sites = self.sites[parity][which]
        n = int(sites.size)
        if n == 0:
            return
        ghost, goff = (self.ghost, self.goff) if ghost is None else ghost
        if self.twin:
            return self._twin_compute(psi, parity, out, a, x, b, sites, ghost, goff)
        nx, ny, nz, nt = self.local
        links, clong, _ = self._entry(parity)
        xarg = x if (x is not None and a != 0.0) else 0
        self.k_hop(((n + BLOCK - 1) // BLOCK,), (BLOCK,),
                   (psi, links, out, xarg, self.real(a), self.real(b), np.int32(parity), np.int32(self.nhop),
                    np.int32(nx), np.int32(ny), np.int32(nz), np.int32(nt), sites, np.int64(n), ghost,
                    goff, np.int32(self.pmask), np.int32(self.depth), np.int32(clong), 0 if frozen is None else frozen))

    def __call__(self, psi, parity, out, a, x, b, frozen=None):
        xp = self.xp
        psi = xp.ascontiguousarray(psi)
        if x is not None and a != 0.0:
            x = xp.ascontiguousarray(x)
        mark = self._marks()
        mark(0)
        self.pack(psi)
        mark(1)
        ex = self.start()
        mark(2)
        self.compute(psi, parity, out, a, x, b, 0, frozen=frozen)
        mark(3)
        held = self.receive(ex)
        mark(4)
        self.compute(psi, parity, out, a, x, b, 1, None if held is None else held[1], frozen=frozen)
        if held is not None:
            held[0].release()                      # the credits, after the exterior kernel read the faces
        mark(5)

    def _marks(self):
        """mark(k): phase boundary k of the profile (device event and host clock), a no-op without a profile."""
        prof = self.profile
        if prof is None:
            return lambda k: None
        cp = self.cp
        evs, hs = [cp.cuda.Event() for _ in range(6)], []
        prof.pending.append((evs, hs))

        def mark(k):
            evs[k].record()
            hs.append(time.perf_counter())
        return mark

    # --- the NumPy twin of the kernel's index arithmetic (CPU tests) --------------------------------------------
    def _twin_compute(self, psi, parity, out, a, x, b, sites, ghost, goff):
        from .staggered import hop_table

        sites = np.asarray(sites)
        c = [np.asarray(v) for v in self._decode(sites, parity)]
        n = self.local
        links = self.dslash._links[parity]            # (nhop, V/2, 3, 3)
        flat = psi.reshape(-1, 3)
        acc = np.zeros((sites.size, 3), dtype=self.dtype)
        for h, (mu, step) in enumerate(hop_table(self.naik)):
            m = c[mu] + step
            v = np.empty((sites.size, 3), dtype=self.dtype)
            out_of = ((m < 0) | (m >= n[mu])) if mu in self.pdims else np.zeros(sites.size, bool)
            cc = list(c)
            cc[mu] = m % n[mu]
            s = cc[0] + n[0] * (cc[1] + n[1] * (cc[2] + n[2] * cc[3]))
            v[~out_of] = flat[s[~out_of]]
            if out_of.any():
                side = (m >= 0).astype(np.int64)
                r = np.where(side == 1, m - n[mu], m + self.depth)
                d = list(n)
                d[mu] = self.depth
                cg = list(c)
                cg[mu] = r
                s = cg[0] + d[0] * (cg[1] + d[1] * (cg[2] + d[2] * cg[3]))
                g = np.asarray(goff)[2 * mu + side] + 3 * s                 # complex elements, as the kernel
                v[out_of] = ghost.ravel()[g[out_of, None] + np.arange(3)]
            acc += np.einsum("sij,sj->si", links[h, sites], v)
        res = b * acc
        o = c[0] + n[0] * (c[1] + n[1] * (c[2] + n[2] * c[3]))
        if x is not None and a != 0.0:
            res += a * x.reshape(-1, 3)[o]
        out.reshape(-1, 3)[o] = res


def in_place_offsets(where: dict, itemsize: int) -> np.ndarray:
    """goff (8 int64, [2 mu + side]) of faces at device addresses ``where[(mu, side)]`` read from the lowest one, in
    elements of ``itemsize`` bytes (the exterior kernel's ``ghost + goff[2 mu + side]``)."""
    base = min(where.values())
    goff = np.zeros(8, dtype=np.int64)
    for (mu, side), addr in where.items():
        if (addr - base) % itemsize:
            raise ValueError(f"face ({mu}, {side}) at {addr:#x} is not {itemsize}-byte aligned to {base:#x}")
        goff[2 * mu + side] = (addr - base) // itemsize
    return goff


class PeerRankSums:
    """The rank sums of the device-resident solvers (solvers/krylov_graph.py, ``DeviceSums``) in one step over all
    node peers (HMC_P2P_PEER_SUMS; comms/cuda/peersum.py, docs/halo-protocol.md "Peer sums"): this rank's partial
    (the fused pair, or the exact records) is written into its own area of the halo segment (:meth:`local`); then
    :meth:`total` signals every peer and waits for all of them (two batches of memory operations), gathers the k
    partials in rank order, reading the peers' areas through their mappings, and sums them: fast pairs left to right
    in rank order (one kernel, the additions of ``rank_sum``), exact records gathered (one kernel) and added as
    integers, rounded once (the same bits for any rank count). Every graph must span an even number of sums (the areas alternate; comms/cuda/peersum.py)."""

    def __init__(self, geom, shape, dtype, peer):
        self.backend, self.peer, self.xp = geom.backend, peer, geom.xp
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.gathered = self.xp.zeros((peer.k,) + self.shape, self.dtype)
        self._key, self.tables = None, None
        self.refresh()

    def refresh(self):
        """Address tables and own-area views, (re)made when a segment moved (a grow, the switch to graph mode);
        called before every capture (solvers/krylov_graph.py ``GraphLoop.capture``), never during one. The tables
        are rewritten in place, so that a kept graph never reads a freed table (its key holds the segment address,
        so a graph of the old addresses is not replayed while they are stale)."""
        peer = self.peer
        key = tuple(peer.base(r) for r in range(peer.k))
        if key == self._key:
            return
        if self._key is not None and self.xp.cuda.get_current_stream().is_capturing():
            raise RuntimeError("the halo segments moved since the peer-sum tables were made: capture again")
        tables = [np.asarray(peer.areas(b), dtype=np.uint64) for b in (0, 1)]
        if self.tables is None:
            self.tables = [self.xp.asarray(t) for t in tables]
        else:
            for dev, t in zip(self.tables, tables):
                dev[...] = self.xp.asarray(t)
        self.own = [peer.own_array(b, self.shape, self.dtype) for b in (0, 1)]
        self._key = key

    def local(self):
        """Where this rank's partial of the next sum goes (its own area of that sum's parity)."""
        self.refresh()
        return self.own[self.peer.index]

    def total(self, result, exact: bool) -> None:
        """The sum over the ranks of the partials just written to :meth:`local`, into ``result`` ((2,) float64)."""
        from lattice.exact_sum_cuda import gather_words, pair_sum, round_records

        b = self.peer.parity()
        self.peer.exchange(self.xp.cuda.get_current_stream().ptr, b)
        if exact:
            gather_words(self.backend, self.tables[b], self.gathered)
            round_records(self.backend, self.gathered, result)
        else:
            pair_sum(self.backend, self.tables[b], result)       # rank_sum's additions, read in place


def peer_rank_sums(geom, shape, dtype):
    """A :class:`PeerRankSums` for partials of ``shape`` and ``dtype`` where the grid's halo engine does one-step
    peer sums (collective decision, comms/cuda/transports.py ``_decide_peer_sums``), else None (the rings)."""
    peer = geom.grid.halo.peer_sum()
    if peer is None or not peer.fits(int(np.prod(shape)) * np.dtype(dtype).itemsize):
        return None
    return PeerRankSums(geom, shape, dtype, peer)


def _layout_fits(geom, dslash) -> bool:
    """Even local extents, each partitioned one at least the face depth (else the array body)."""
    depth = 3 if dslash.naik else 1
    if any(n % 2 for n in geom.local_dims):
        return False
    return not any(geom.grid.partitioned[mu] and geom.local_dims[mu] < depth for mu in range(4))


@implements("staggered.hop", Placement.DISTRIBUTED, fits=_layout_fits)
def make_hop(dslash):
    """The hop on a DISTRIBUTED GPU geometry (a partitioned grid, or a one-rank sub-grid of a split grid): a
    DistHop."""
    return DistHop(dslash)
