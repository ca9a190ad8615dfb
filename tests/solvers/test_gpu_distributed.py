"""The distributed GPU hop (solvers.staggered_dist_cuda): pack kernel, exchange through each transport, interior and
exterior kernels; CG through it; the stream-gated Dslash and CG iteration captured in CUDA graphs.

CPU (always): the NumPy twin of the kernels' index arithmetic (faces, ghost layout, interior/exterior split) equals
StaggeredDslash.hop on partitioned grids of one process. GPU + MPI (the device machine; HMC_GPU_MPS=1 runs the
launches under MPS): this file is launched under mpiexec in script mode on 2 and 4 ranks; every rank compares with
the single-rank GPU results it computes itself from the same global fields.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, keep_gpu_report

try:
    from tests.comms.test_gpu_transports import launch, mps, needs_mpi  # noqa: F401  (fixture)
except Exception:  # pragma: no cover - the GPU test module always imports
    launch = mps = None
    needs_mpi = pytest.mark.skip(reason="tests.comms.test_gpu_transports is unavailable")


# --------------------------------------------------------------------------------------------------------------
# CPU: the twin

@pytest.mark.parametrize("partition,naik", [("xt", True), ("yzt", False), ("xyzt", True)])
def test_twin_layout_equals_the_hop(partition, naik):
    from comms import ProcessGrid
    from lattice import Geometry, get_backend
    from solvers import StaggeredDslash
    from solvers.staggered_dist_cuda import DistHop

    geom = Geometry((4, 6, 4, 8), get_backend("numpy"), ProcessGrid((1, 1, 1, 1), partitioned=partition))
    try:
        fat, long, psi = _fields(geom, naik)
        d = StaggeredDslash(geom, fat, long)
        h = DistHop(d, twin=True)
        assert sum(len(s) for s in h.sites[0]) == geom.local_volume // 2
        for p in (0, 1):
            ref = d.hop(psi, p, a=0.3, x=psi, b=-1.0)
            out = np.zeros_like(psi)
            h(psi, p, out, 0.3, psi, -1.0)
            assert np.abs(out - ref).max() < 1e-13
    finally:
        geom.grid.close()


@pytest.mark.parametrize("partition,naik", [("xt", True), ("yzt", False)])
def test_twin_exterior_reads_faces_in_place(partition, naik):
    """In-place receive (HMC_P2P_IN_PLACE): the exterior kernel's ghost + goff[2 mu + side] read every face where
    the engine's receive buffer holds it (a stand-in segment of buffers [b][dim][side] of ``cap`` bytes after a
    header, comms/cuda/segment.py), through the offsets of ``in_place_offsets``; the hop equals the copying one."""
    from comms import ProcessGrid
    from lattice import Geometry, get_backend
    from solvers import StaggeredDslash
    from solvers.staggered_dist_cuda import DistHop, in_place_offsets

    geom = Geometry((4, 6, 4, 8), get_backend("numpy"), ProcessGrid((1, 1, 1, 1), partitioned=partition))
    try:
        fat, long, psi = _fields(geom, naik)
        h = DistHop(StaggeredDslash(geom, fat, long), twin=True)
        cap, b = 1 << 16, 1
        seg = np.zeros((4096 + 16 * cap) // 16, dtype=np.complex128)
        for p in (0, 1):
            ref = np.zeros_like(psi)
            h(psi, p, ref, 0.3, psi, -1.0)                    # the copying path: faces in h.ghost
            where = {}
            for key, at, shape in h.stencil.ghost_rows():
                addr = 4096 + ((b * 4 + key[0]) * 2 + key[1]) * cap
                face = h.ghost[3 * at:3 * (at + int(np.prod(shape)))]
                assert 16 * face.size <= cap
                seg[addr // 16:addr // 16 + face.size] = face
                where[key] = addr
            goff = in_place_offsets(where, 16)
            out = np.zeros_like(psi)
            h.compute(psi, p, out, 0.3, psi, -1.0, 0)
            h.compute(psi, p, out, 0.3, psi, -1.0, 1, (seg[min(where.values()) // 16:], goff))
            assert np.array_equal(out, ref)
            seg[:] = 0
            h.compute(psi, p, out, 0.3, psi, -1.0, 1, (seg[min(where.values()) // 16:], goff))
            assert not np.array_equal(out, ref)                # the faces were read from the segment
    finally:
        geom.grid.close()


def _random_links(geom, rng, stream, scale):
    g = rng.gaussian(stream, geom.site_ids(), 4 * 18).reshape(tuple(geom.shape) + (4, 3, 3, 2))
    m = (g[..., 0] + 1j * g[..., 1]) * scale
    return geom.xp.ascontiguousarray(geom.xp.moveaxis(m, -3, 0))


def _fields(geom, naik=True, seed=3):
    from lattice import CounterRNG

    rng = CounterRNG(seed)
    fat = _random_links(geom, rng, "fat", 0.3)
    long = _random_links(geom, rng, "long", 0.05) if naik else None
    g = rng.gaussian("src", geom.site_ids(), 6).reshape(tuple(geom.shape) + (3, 2))
    return fat, long, g[..., 0] + 1j * g[..., 1]


# --------------------------------------------------------------------------------------------------------------
# GPU: launched under mpiexec

CASES = [(2, "1x1x1x2", "4x4x4x16"), (4, "1x1x2x2", "4x4x8x8")]


@pytest.mark.gpu
@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("n,grid,lattice", CASES)
def test_distributed_dslash_and_cg(tmp_path, mps, n, grid, lattice):  # noqa: F811
    """Halos (depth 1 and 3) of event and stream_gated bitwise mpi's and the global field's; D, CG and multishift CG
    equal the single-rank GPU results for every transport; on stream_gated the solvers' iterations run from CUDA
    graphs and agree with the host-driven ones; the captured stream-gated D replayed 1000 times equals the uncaptured
    D each time."""
    launch(n, [str(Path(__file__)), "dist", str(tmp_path), grid, lattice], mps)
    rep = json.loads(Path(tmp_path, "dist.json").read_text())
    keep_gpu_report(f"dist_{n}.json", rep)
    for tr in ("mpi", "event", "stream_gated"):
        r = rep["transports"][tr]
        assert r["halo_bitwise"] == {"1": True, "3": True}, (tr, r)
        assert r["dslash_rel"] < 1e-14, (tr, r)
        assert r["dslash_bitwise"], (tr, r)        # one thread per site, the same hop order: the one-rank bits
        # fast sums (local vdot per rank) round differently from one rank's: close, within a few iterations
        assert r["cg_rel"] < 1e-7 and abs(r["cg_iters"] - rep["reference"]["cg_iters"]) <= 5, (tr, r)
        # the fused kernels serve the distributed solves too (local sums, then one exact sum over the ranks)
        assert r["cg_fused"] and r["multishift_fused"], (tr, r)
        assert r["multishift_rel"] < 1e-7 and abs(r["multishift_iters"] - rep["reference"]["multishift_iters"]) <= 5
        # exact sums (HMC_SOLVER_SUMS=exact) and a bitwise hop: the single-rank CG, bit for bit
        assert r["cg_exact_bitwise"] and r["cg_iters_exact"] == rep["reference"]["cg_iters_exact"], (tr, r)
        # device-resident iterations (CUDA graphs, solvers.krylov_graph) where every link can be captured; their
        # rank sums (in grid order on the device) round differently from the host's exact sum of the rank partials
        graph = 8 if tr == "stream_gated" else 0
        assert r["cg_graph_iterations"] == r["multishift_graph_iterations"] == graph, (tr, r)
        for key in ("cg_graph_vs_host", "multishift_graph_vs_host"):
            rel, diter = r[key]
            assert (rel == 0.0 and diter == 0) if not graph else (rel < 1e-7 and abs(diter) <= 3), (tr, key, r)
    g = rep["graph"]
    assert g["replays"] == 1000 and g["replays_bad"] == 0
    assert rep["registry_after_close"] == []


@pytest.mark.gpu
@pytest.mark.mpi
@needs_mpi
@pytest.mark.parametrize("n,grid,lattice", CASES)
def test_in_place_receive_and_peer_sums(tmp_path, mps, n, grid, lattice):  # noqa: F811
    """stream_gated with HMC_P2P_IN_PLACE and HMC_P2P_PEER_SUMS on against both off (docs/halo-protocol.md
    "In-place receive", "Peer sums"): the halo and D bitwise the copying path's, the device-resident CG (8 iterations
    a graph) within the fast sums' rounding, the exact-sum CG and multishift bitwise; the CG graph holds fewer
    memory-operation and copy nodes an iteration (CapturedGraph.node_census, kept in the GPU report)."""
    launch(n, [str(Path(__file__)), "switches", str(tmp_path), grid, lattice], mps)
    rep = json.loads(Path(tmp_path, "switches.json").read_text())
    keep_gpu_report(f"switches_{n}.json", rep)
    off, on = rep["off"], rep["on"]
    assert (off["in_place"], off["peer_sums"], on["in_place"], on["peer_sums"]) == (False, False, True, True), rep
    assert all(rep["all_ranks"]), rep         # D, exact CG and multishift bitwise, both halos right, on every rank
    assert on["cg_graph_iterations"] == off["cg_graph_iterations"] == 8, rep
    rel, diter = rep["cg_on_vs_off"]
    assert rel < 1e-7 and abs(diter) <= 3, rep
    assert rep["cg_exact_bitwise"] and rep["multishift_exact_bitwise"], rep
    con, coff = on["census"], off["census"]
    comm_nodes = lambda c: sum(v for k, v in c.items() if k not in ("KERNEL", "EMPTY"))  # noqa: E731
    assert con.get("MEMCPY", 0) < coff.get("MEMCPY", 0) and comm_nodes(con) < comm_nodes(coff), rep
    free = rep["credit_free"]                 # HMC_P2P_CREDIT_FREE (docs/halo-protocol.md "Credit-free graph mode")
    assert free["credit_free"] and not on["credit_free"] and free["cg_graph_iterations"] == 8, rep
    rel, diter = rep["credit_free_cg"]
    assert rel < 1e-7 and abs(diter) <= 3, rep
    assert comm_nodes(free["census"]) < comm_nodes(con) and free["census"].get("MEMCPY", 0) == con.get("MEMCPY", 0)
    batched = rep["batched"]                  # HMC_P2P_BATCH_SIGNALS: one signal batch per exchange (with credits)
    assert comm_nodes(batched["census"]) < comm_nodes(con) and batched["cg_graph_iterations"] == 8, rep


# --------------------------------------------------------------------------------------------------------------
# script mode

def _rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def _expected_ghost(hop, glob, geom):
    """The ghost buffer the exchange must deliver, from the global field (pure data movement: exact)."""
    out = np.zeros(hop.total, dtype=hop.dtype)
    base = hop.ghost.data.ptr
    for (mu, side), v in hop.recvs.items():
        axis = 3 - mu
        n, o, N = geom.local_dims[mu], geom.offset[mu], geom.dims[mu]
        dep = hop.depth
        idx = [(o - dep + i) % N for i in range(dep)] if side == 0 else [(o + n + i) % N for i in range(dep)]
        sl = [slice(off, off + m) for off, m in zip(reversed(geom.offset), reversed(geom.local_dims))]
        sl[axis] = slice(None)
        blk = np.take(glob[tuple(sl)], idx, axis=axis)
        k = (v.data.ptr - base) // hop.dtype.itemsize
        out[k:k + v.size] = blk.ravel()
    return out


def _dist(out, grid_text, lattice_text):
    sys.path.insert(0, str(ROOT))
    import cupy as cp

    from comms import ProcessGrid, world
    from comms.cuda import vmm
    from comms.grid import _SingleComm
    from lattice import Geometry, get_backend
    from solvers import StaggeredDslash, cg, multishift_cg
    from solvers.operator import set_reductions
    from bench.dslash_dist_cuda import close_graph_mode
    from solvers.krylov_graph import set_solver_graph
    from solvers.staggered_dist_cuda import DistHop

    comm = world()
    dims = tuple(int(v) for v in lattice_text.split("x"))
    gdims = tuple(int(v) for v in grid_text.split("x"))
    be = get_backend("cupy")
    npbe = get_backend("numpy")
    one = lambda: ProcessGrid((1, 1, 1, 1), comm=_SingleComm(), partitioned=(False,) * 4)  # noqa: E731
    gnp = Geometry(dims, npbe, one())
    fat, long, psi = _fields(gnp, True)
    gref = Geometry(dims, be, one())
    dref = StaggeredDslash(gref, cp.asarray(fat), cp.asarray(long))
    mass = 0.05
    A = dref.even_odd(mass).normal
    bglob = cp.asnumpy(dref.even_odd(mass).prepare(cp.asarray(psi)))
    ref_hop = [cp.asnumpy(dref.hop(cp.asarray(psi), p, a=0.3, x=cp.asarray(psi), b=-1.0)) for p in (0, 1)]
    ref_x, ref_st = cg(1e-9, 2000)(A).solve(cp.asarray(bglob))
    ref_x = cp.asnumpy(ref_x)
    shifts = (0.0, 0.02, 0.3, 1.5)
    ref_xs, ref_ms = multishift_cg(shifts, 1e-9, 2000)(A).solve(cp.asarray(bglob))
    ref_xs = [cp.asnumpy(v) for v in ref_xs]
    old_mode = set_reductions("exact")            # decomposition-independent sums: the distributed CG is bitwise
    ref_xe, ref_ste = cg(1e-9, 2000)(A).solve(cp.asarray(bglob))
    ref_xe = cp.asnumpy(ref_xe)
    set_reductions(old_mode)
    rep = {"grid": gdims, "lattice": dims, "ranks": comm.size,
           "reference": {"cg_iters": ref_st.iters, "cg_iters_exact": ref_ste.iters,
                         "multishift_iters": ref_ms.iters, "fused": [ref_st.extra["fused"], ref_ms.extra["fused"]]},
           "transports": {}}
    fails = []

    def local(g, a):
        return np.ascontiguousarray(g.local_part(a))

    def local_links(g, a):
        return cp.asarray(np.ascontiguousarray(g.local_part(a.transpose(1, 2, 3, 4, 0, 5, 6)).transpose(4, 0, 1, 2, 3,
                                                                                                       5, 6)))

    halos = {}
    for tr in ("mpi", "event", "stream_gated"):
        grid = ProcessGrid(gdims, transport=tr)
        geom = Geometry(dims, be, grid)
        r = {}
        lfat, llong = local_links(geom, fat), local_links(geom, long)
        lpsi = cp.asarray(local(geom, psi))
        r["halo_bitwise"] = {}
        for depth, lg in ((3, llong), (1, None)):
            d = StaggeredDslash(geom, lfat, lg)
            h = d._hop_impl
            if not isinstance(h, DistHop) or h.depth != depth:
                fails.append(f"{tr}: the registered hop is {type(h).__name__} (depth {getattr(h, 'depth', '?')})")
                continue
            h.pack(lpsi)
            h.finish(h.start())
            got = cp.asnumpy(h.ghost)
            want = _expected_ghost(h, psi, geom)
            halos.setdefault(depth, {})[tr] = got
            r["halo_bitwise"][str(depth)] = bool(np.array_equal(got[:h.total], want[:h.total]) and
                                                 np.array_equal(got, halos[depth]["mpi"]))
        d = StaggeredDslash(geom, lfat, llong)
        r["dslash_rel"] = max(_rel(cp.asnumpy(d.hop(lpsi, p, a=0.3, x=lpsi, b=-1.0)), local(geom, ref_hop[p]))
                              for p in (0, 1))
        r["dslash_bitwise"] = all(np.array_equal(cp.asnumpy(d.hop(lpsi, p, a=0.3, x=lpsi, b=-1.0)),
                                                 local(geom, ref_hop[p])) for p in (0, 1))
        lb = cp.asarray(local(geom, bglob))
        x, st = cg(1e-9, 2000)(d.even_odd(mass).normal).solve(lb)
        r["cg_rel"] = _rel(cp.asnumpy(x), local(geom, ref_x))
        r["cg_iters"], r["cg_fused"] = st.iters, st.extra["fused"]
        r["cg_graph_iterations"] = st.extra["graph_iterations"]
        xs, st = multishift_cg(shifts, 1e-9, 2000)(d.even_odd(mass).normal).solve(lb)
        r["multishift_rel"] = max(_rel(cp.asnumpy(v), local(geom, w)) for v, w in zip(xs, ref_xs))
        r["multishift_iters"], r["multishift_fused"] = st.iters, st.extra["fused"]
        r["multishift_graph_iterations"] = st.extra["graph_iterations"]
        old_graph = set_solver_graph(0)            # the host-driven iterations of the same solvers
        try:
            xh, sth = cg(1e-9, 2000)(d.even_odd(mass).normal).solve(lb)
            xsh, stmh = multishift_cg(shifts, 1e-9, 2000)(d.even_odd(mass).normal).solve(lb)
        finally:
            set_solver_graph(old_graph)
        r["cg_graph_vs_host"] = (_rel(cp.asnumpy(x), cp.asnumpy(xh)), r["cg_iters"] - sth.iters)
        r["multishift_graph_vs_host"] = (max(_rel(cp.asnumpy(v), cp.asnumpy(w)) for v, w in zip(xs, xsh)),
                                         r["multishift_iters"] - stmh.iters)
        old_mode = set_reductions("exact")
        x, st = cg(1e-9, 2000)(d.even_odd(mass).normal).solve(lb)
        set_reductions(old_mode)
        r["cg_exact_bitwise"] = bool(np.array_equal(cp.asnumpy(x), local(geom, ref_xe)))
        r["cg_iters_exact"] = st.iters
        if tr == "stream_gated":
            rep["graph"] = _graph_checks(d, lpsi, fails)
        close_graph_mode(geom)
        rep["transports"][tr] = r
        grid.close()
    rep["registry_after_close"] = vmm.leaked()
    allf = comm.allgather(fails)
    if comm.rank == 0:
        rep["fails"] = [f"rank {k}: {f}" for k, fs in enumerate(allf) for f in fs]
        Path(out, "dist.json").write_text(json.dumps(rep, indent=1, default=str))
    print(f"rank {comm.rank}: {json.dumps(rep, default=str)}", flush=True)
    if any(allf):
        raise SystemExit(f"rank {comm.rank}: {fails}")


def _graph_checks(d, lpsi, fails):
    """stream_gated: D captured and replayed 1000 times with four inputs in turn, each replay against the
    uncaptured D of that input."""
    import cupy as cp

    from bench.dslash_dist_cuda import DslashRunner

    inputs = [lpsi * (1.0 + 0.25 * k) for k in range(4)]
    plain = DslashRunner(d, lpsi, graph=False)
    refs = []
    with plain.stream:
        for v in inputs:
            plain.psi[...] = v
            refs.append(plain.run().copy())
        plain.psi[...] = lpsi
    plain.stream.synchronize()
    run = DslashRunner(d, lpsi, graph=True)
    n = 1000
    hist = cp.empty((n,) + run.out.shape, dtype=run.out.dtype)
    with run.stream:
        for i in range(n):
            run.psi[...] = inputs[i % 4]
            run.out[...] = 0
            run.run()
            hist[i] = run.out
    run.stream.synchronize()
    bad = [i for i in range(n) if not bool(cp.array_equal(hist[i], refs[i % 4]))]
    if bad:
        fails.append(f"graph D: replays {bad[:5]} (of {len(bad)}) differ from the uncaptured D")
    return {"replays": n, "replays_bad": len(bad), "dslash_graph_s": run.time(100), "dslash_s": plain.time(100)}


def _halo_in_place(h, lpsi):
    """The ghost buffer one exchange delivers, read where it landed when the hop receives in place."""
    import cupy as cp

    h.pack(lpsi)
    held = h.receive(h.start())
    if held is None:
        return cp.asnumpy(h.ghost)
    ex, (base, _) = held
    got = cp.zeros_like(h.ghost)
    for (mu, side), v in h.recvs.items():
        k = (v.data.ptr - h.ghost.data.ptr) // h.dtype.itemsize
        at = int(base) + int(h._goff_ip[0][2 * mu + side]) * h.dtype.itemsize
        src = h.engine._dev_view(at, (v.size,), h.dtype)
        got[k:k + v.size] = src
    ex.release()
    return cp.asnumpy(got)


def _switched(gdims, dims, fat, long, psi, bglob, on, credit_free=False, batch_signals=False):
    """One stream_gated grid with the in-place receive and peer sums ``on`` or off (and ``credit_free``,
    HMC_P2P_CREDIT_FREE, and ``batch_signals``, HMC_P2P_BATCH_SIGNALS): its halo, D, CG (fast and exact sums) and
    exact multishift, and the census of one CG graph per iteration."""
    import dataclasses

    import cupy as cp

    from comms import ProcessGrid
    from comms.config import RunConfig
    from lattice import Geometry, get_backend
    from solvers import StaggeredDslash, cg, multishift_cg
    from solvers.krylov_graph import loop_for
    from solvers.operator import set_reductions
    from bench.dslash_dist_cuda import close_graph_mode

    cfg = dataclasses.replace(RunConfig.from_environment(), p2p_in_place=on, p2p_peer_sums=on, solver_graph=8,
                              p2p_credit_free=credit_free, p2p_batch_signals=batch_signals)
    grid = ProcessGrid(gdims, transport="stream_gated", config=cfg)
    geom = Geometry(dims, get_backend("cupy"), grid)
    loc = lambda a: cp.asarray(np.ascontiguousarray(geom.local_part(a)))  # noqa: E731
    links = lambda a: cp.asarray(np.ascontiguousarray(geom.local_part(a.transpose(1, 2, 3, 4, 0, 5, 6)).transpose(
        4, 0, 1, 2, 3, 5, 6)))  # noqa: E731
    d = StaggeredDslash(geom, links(fat), links(long))
    h, lpsi, lb = d._hop_impl, loc(psi), loc(bglob)
    r = {"in_place": bool(h.in_place), "peer_sums": grid.halo.peer_sum() is not None}
    r["halo"] = _halo_in_place(h, lpsi)
    r["halo_bitwise"] = bool(np.array_equal(r["halo"][:h.total], _expected_ghost(h, psi, geom)[:h.total]))
    r["dslash"] = [cp.asnumpy(d.hop(lpsi, p, a=0.3, x=lpsi, b=-1.0)) for p in (0, 1)]
    A = d.even_odd(0.05).normal
    x, st = cg(1e-9, 2000)(A).solve(lb)
    r["cg"], r["cg_iters"], r["cg_graph_iterations"] = cp.asnumpy(x), st.iters, st.extra["graph_iterations"]
    loop = loop_for(geom, "cg", 8, np.float64)
    census = loop.graph.node_census()
    r["census"] = {k: v / loop.held for k, v in sorted(census.items())}
    r["credit_free"] = bool(grid.halo.credit_free)
    old = set_reductions("exact")
    try:
        r["cg_exact"] = cp.asnumpy(cg(1e-9, 2000)(A).solve(lb)[0])
        r["ms_exact"] = [cp.asnumpy(v) for v in multishift_cg((0.0, 0.02, 0.3), 1e-9, 2000)(A).solve(lb)[0]]
    finally:
        set_reductions(old)
    close_graph_mode(geom)
    grid.close()
    return r


def _switches(out, grid_text, lattice_text):
    sys.path.insert(0, str(ROOT))
    from comms import world
    from solvers import StaggeredDslash
    from tests.force.cuda_host import single_rank_geometry

    comm = world()
    dims = tuple(int(v) for v in lattice_text.split("x"))
    gdims = tuple(int(v) for v in grid_text.split("x"))
    gnp = single_rank_geometry(dims)
    fat, long, psi = _fields(gnp, True)
    dnp = StaggeredDslash(gnp, fat, long)
    bglob = np.asarray(dnp.even_odd(0.05).prepare(psi))
    off, on = (_switched(gdims, dims, fat, long, psi, bglob, s) for s in (False, True))
    free = _switched(gdims, dims, fat, long, psi, bglob, True, credit_free=True)
    batched = _switched(gdims, dims, fat, long, psi, bglob, True, batch_signals=True)
    rep = {"grid": gdims, "lattice": dims, "ranks": comm.size,
           "dslash_bitwise": all(np.array_equal(a, b) for a, b in zip(off["dslash"], on["dslash"])),
           "cg_on_vs_off": (_rel(on["cg"], off["cg"]), on["cg_iters"] - off["cg_iters"]),
           "cg_exact_bitwise": bool(np.array_equal(on["cg_exact"], off["cg_exact"])),
           "multishift_exact_bitwise": all(np.array_equal(a, b) for a, b in zip(on["ms_exact"], off["ms_exact"])),
           "credit_free_bitwise": bool(all(np.array_equal(a, b) for a, b in zip(off["dslash"], free["dslash"]))
                                       and np.array_equal(free["cg_exact"], off["cg_exact"])
                                       and all(np.array_equal(a, b) for a, b in zip(free["ms_exact"], off["ms_exact"]))
                                       and free["halo_bitwise"]),
           "batched_bitwise": bool(all(np.array_equal(a, b) for a, b in zip(off["dslash"], batched["dslash"]))
                                   and np.array_equal(batched["cg_exact"], off["cg_exact"])
                                   and batched["halo_bitwise"]),
           "credit_free_cg": (_rel(free["cg"], on["cg"]), free["cg_iters"] - on["cg_iters"])}
    for name, r in (("off", off), ("on", on), ("credit_free", free), ("batched", batched)):
        rep[name] = {k: v for k, v in r.items() if not isinstance(v, (np.ndarray, list))}
    flags = comm.allgather([rep["dslash_bitwise"], rep["cg_exact_bitwise"], rep["multishift_exact_bitwise"],
                            on["halo_bitwise"], off["halo_bitwise"], rep["credit_free_bitwise"],
                            rep["batched_bitwise"]])
    rep["all_ranks"] = [all(f[i] for f in flags) for i in range(7)]
    if comm.rank == 0:
        Path(out, "switches.json").write_text(json.dumps(rep, indent=1, default=str))
    print(f"rank {comm.rank}: {json.dumps(rep, default=str)}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "dist":
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        _dist(sys.argv[2], sys.argv[3], sys.argv[4])
    if len(sys.argv) >= 5 and sys.argv[1] == "switches":
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        _switches(sys.argv[2], sys.argv[3], sys.argv[4])
