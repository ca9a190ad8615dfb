"""GPU halo benchmark: ``mpiexec -n 2 python -m bench.halo_cuda --transport mpi,event,stream_gated [--graph]``
(``hmc bench halo --transport ...`` comes here when a GPU transport is named). Start it under MPS with
``python -m comms.cuda.mps run -- mpiexec ...`` (docs/halo-protocol.md, "Several ranks on one GPU").

The ranks form a ring along t (grid 1x1x1xN, t partitioned). Faces are L^3 sites of colour vectors (complex128,
48 bytes a site) or 3x3 matrices (144 bytes) on the device. Per transport and size:

* one-way: back-to-back exchanges of the same face (each rank sends to its backward neighbour and receives from the
  forward one); the exchanges are independent, so this is the pipelined cost per exchange (run-ahead bounded by the
  double buffer);
* round trip: the face goes to the backward neighbour and the received face comes straight back: two dependent
  exchanges, each waiting for the previous one's data (a latency);
* device time: CUDA events on the compute stream around the loop, per exchange (per round trip);
* host time: the time the host spends in start() + finish() per exchange (for stream_gated this is only the
  enqueueing; for mpi and event it includes the host waits); wall: host time to the end of the device work.

``mpi`` here is the GPU engine with every link on MPI: device -> host, Isend/Irecv, host -> device.
``--graph``: stream_gated in graph mode (credit-free by default, HMC_P2P_CREDIT_FREE), the round trip captured
through comms.cuda.graph.CapturedGraph (the solvers' capture) and replayed (device time and host launch time per
replay), after a check that every replay gives the uncaptured answer; there each exchange carries every link (the
face to both neighbours, as in the hop), so the graph rows move twice the bytes of the other rows per exchange.

Each number is the median over ``--repeats`` loops, the slowest rank's.

Measured on the device machine (one H200, driver 580.159.04, cupy 14.2, cuda-bindings 13.3.1, Open MPI 4.1.6),
2 ranks, colour vectors, microseconds; one-way per exchange, RT per round trip (two dependent exchanges)::

    MPS on       L   bytes    1-way dev  1-way host    RT dev   RT host
    mpi          2     384      107.5      107.5      211.4     211.4
    event        2     384       77.8       77.8      159.3     159.2
    stream_gated 2     384       58.8       58.8      114.0     114.0
    mpi          8   24576      136.6      136.6      277.2     277.1
    event        8   24576       80.8       80.8      164.0     163.9
    stream_gated 8   24576       61.0       60.9      121.0     120.9
    mpi         16  196608      276.9      276.8      557.1     557.1
    event       16  196608       80.7       80.6      166.3     166.2
    stream_gated16  196608       61.6       61.5      120.7     120.6
    mpi         32 1572864     1394.9     1394.7     2793.2    2792.8
    event       32 1572864       78.9       78.7      148.6     148.2
    stream_gated32 1572864       54.1       53.9      106.0     105.6
    graph (stream_gated, round trip captured, replayed; then one link an exchange, with credits, CuPy's capture):
        RT dev 31.4 / 31.8 / 32.3 / 32.8 / 34.6 at L = 2, 4, 8,
        16, 32, host launch 27.5 .. 30.3
    no MPS (time slicing): mpi 334 / 375 / 1540 one-way at L = 2, 8, 32; event 2169 / 2130 / 1923; stream_gated
        2205 / 2204 / 2145 (device; host 60-85); graph RT 325 / 328 / 329

Without graph capture every transport is bound by Python on the host (device time = host time: the device waits for
the host to enqueue; about 15 driver calls per stream-gated exchange); the graph removes that but cupy's
Graph.launch itself costs about 28 us of host time per replay, as much as the replay's device time.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from comms.halo import FALLBACK
from comms.transport.registry import with_capabilities


def measured() -> tuple:
    """What this bench measures: the GPU engine with every link on mpi, and each registered GPU transport."""
    return (FALLBACK,) + with_capabilities(gpu_buffers=True)
ELEMENTS = {"vector": ((3,), 48), "matrix": ((3, 3), 144)}


def _grid(n, tr, config=None):
    from comms import ProcessGrid, world
    from comms.halo import ProtocolState

    from comms.cuda.transports import GpuHaloEngine

    g = ProcessGrid((1, 1, 1, n), world(), partitioned=(False, False, False, True), transport=tr, config=config)
    if tr == FALLBACK:              # the GPU engine with every link on MPI (device faces staged through the host)
        g._protocol = ProtocolState()
        g._ctx.engine = GpuHaloEngine(g, g._ctx, g._protocol, FALLBACK)
    return g


def _loop(eng, face, dest, back, reps, round_trip, cp):
    cs = cp.cuda.get_current_stream()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record(cs)
    t0 = time.perf_counter()
    for _ in range(reps):
        eng.start({(3, 0): face}).finish({(3, 1): dest})
        if round_trip:
            eng.start({(3, 1): dest}).finish({(3, 0): back})
    t_host = time.perf_counter() - t0
    e1.record(cs)
    e1.synchronize()
    t_wall = time.perf_counter() - t0
    return cp.cuda.get_elapsed_time(e0, e1) * 1e-3, t_host, t_wall


def bench_halo(transports=None, sizes=(2, 4, 8, 16, 32), element="vector",
               reps=200, repeats=7, graph=False, graph_reps=500, config=None):
    """Rows of one-way and round-trip times per transport and face size (module docstring); ``config``: the run
    configuration of the grids (default: from the environment)."""
    import cupy as cp

    from comms import world
    from comms.grid import mpi

    from comms.grid import CommsError

    known = measured()
    transports = known if transports is None else transports
    bad = [t for t in transports if t not in known]
    if bad:
        raise CommsError(f"the GPU halo bench measures {', '.join(known)}, not {', '.join(bad)} (measure "
                         "the CPU transports in a separate run)")
    MPI = mpi()
    comm = world()
    n = comm.size
    inner, site_bytes = ELEMENTS[element]
    grids = {tr: _grid(n, tr, config) for tr in transports}
    engines = {tr: g.halo for tr, g in grids.items()}
    for e in engines.values():
        e.reserve(max(sizes) ** 3 * site_bytes)
    g0 = grids[transports[0]]
    fwd = g0.neighbours[3][1]
    gpus = len(set(comm.allgather(cp.cuda.Device().id)))          # one GPU shared (MPS) or one rank per GPU
    rows = []
    for L in sizes:
        shape = (L, L, L) + inner
        rng = np.random.default_rng(1000 + g0.rank)
        h = rng.normal(size=shape) + 1j * rng.normal(size=shape)
        w = np.random.default_rng(1000 + fwd)
        expect = w.normal(size=shape) + 1j * w.normal(size=shape)
        face = cp.asarray(h)
        dest = cp.empty_like(face)
        back = cp.empty_like(face)
        nbytes = int(face.nbytes)
        r = max(20, min(reps, int(reps * 4096 / max(L ** 3, 1)) if L >= 16 else reps))
        res = {tr: {"one": [], "rt": []} for tr in transports}
        for tr, eng in engines.items():
            eng.start({(3, 0): face}).finish({(3, 1): dest})
            eng.start({(3, 1): dest}).finish({(3, 0): back})
            eng.sync("bench check") if hasattr(eng, "sync") else cp.cuda.get_current_stream().synchronize()
            ok = np.array_equal(cp.asnumpy(dest), expect) and np.array_equal(cp.asnumpy(back), h)
            if comm.allreduce(int(not ok), op=MPI.SUM):
                raise RuntimeError(f"GPU halo bench: wrong data through {tr} at L={L}")
            _loop(eng, face, dest, back, 10, True, cp)                 # warm-up
        for _ in range(repeats):                                         # interleaved transports
            for tr, eng in engines.items():
                comm.Barrier()
                d, hst, wl = _loop(eng, face, dest, back, r, False, cp)
                res[tr]["one"].append([comm.allreduce(v / r, op=MPI.MAX) for v in (d, hst, wl)])
                comm.Barrier()
                d, hst, wl = _loop(eng, face, dest, back, max(1, r // 2), True, cp)
                res[tr]["rt"].append([comm.allreduce(v / max(1, r // 2), op=MPI.MAX) for v in (d, hst, wl)])
        for tr, eng in engines.items():
            one = np.median(np.array(res[tr]["one"]), axis=0) * 1e6
            rt = np.median(np.array(res[tr]["rt"]), axis=0) * 1e6
            kinds = sorted({l.transport for l in eng.links.values()})
            rows.append({"transport": tr, "links": "+".join(kinds), "ranks": n, "gpus": gpus, "L": L,
                         "bytes": nbytes, "element": element, "one_way_device_us": one[0], "one_way_host_us": one[1],
                         "one_way_wall_us": one[2], "round_trip_device_us": rt[0], "round_trip_host_us": rt[1],
                         "round_trip_wall_us": rt[2], "reps": r, "repeats": repeats,
                         "policy": getattr(eng, "policy", "")})
    for tr in reversed(transports):
        grids[tr].close()
    if graph:
        rows += bench_graph(sizes, element, graph_reps, repeats, config)
    return rows


def bench_graph(sizes, element, replays, repeats, config=None):
    """stream_gated round trip captured in a CUDA graph (binary flags; credit-free where the configuration asks for
    it, the default) through :class:`comms.cuda.graph.CapturedGraph`, the solvers' capture, replayed: device and
    host time. As in the hop, each exchange carries every link: the face goes to both neighbours and the received
    faces go straight back."""
    import cupy as cp

    from comms import world
    from comms.cuda.graph import CapturedGraph
    from comms.grid import mpi

    MPI = mpi()
    comm = world()
    n = comm.size
    inner, site_bytes = ELEMENTS[element]
    grid = _grid(n, "stream_gated", config)
    eng = grid.halo
    eng.reserve(max(sizes) ** 3 * site_bytes)
    eng.set_graph_mode(True)
    nb = grid.neighbours[3]
    rows = []
    s = cp.cuda.Stream(non_blocking=True)
    for L in sizes:
        shape = (L, L, L) + inner
        h = np.random.default_rng(1000 + grid.rank)
        h = h.normal(size=shape) + 1j * h.normal(size=shape)
        expect = {}
        for side in (0, 1):                             # side 0: from the backward neighbour, 1: the forward one
            w = np.random.default_rng(1000 + nb[side])
            expect[side] = w.normal(size=shape) + 1j * w.normal(size=shape)
        face = cp.asarray(h)
        dest = {(3, side): cp.empty_like(face) for side in (0, 1)}
        back = {(3, side): cp.empty_like(face) for side in (0, 1)}

        def round_trip():
            eng.start({(3, 0): face, (3, 1): face}).finish(dest)
            eng.start({(3, 1): dest[(3, 1)], (3, 0): dest[(3, 0)]}).finish(back)

        def right():
            return (all(np.array_equal(cp.asnumpy(dest[(3, side)]), expect[side]) for side in (0, 1))
                    and all(np.array_equal(cp.asnumpy(b), h) for b in back.values()))

        with s:
            round_trip()
            s.synchronize()
            g = CapturedGraph(s, round_trip)
            bad = 0
            for i in range(5):
                for a in list(dest.values()) + list(back.values()):
                    a.fill(0)
                g.launch(s)
                s.synchronize()
                bad += not right()
            if comm.allreduce(bad, op=MPI.SUM):
                raise RuntimeError(f"graph replay wrong at L={L}")
            med = _replay_times(g, s, replays, repeats, comm, cp)
        g.close()
        rows.append({"transport": "stream_gated+graph", "links": "stream_gated", "ranks": n, "L": L,
                     "bytes": int(face.nbytes), "element": element, "one_way_device_us": float("nan"),
                     "one_way_host_us": float("nan"), "one_way_wall_us": float("nan"),
                     "round_trip_device_us": med[0], "round_trip_host_us": med[1], "round_trip_wall_us": med[2],
                     "reps": replays, "repeats": repeats, "policy": eng.policy, "credit_free": bool(eng.credit_free)})
    eng.set_graph_mode(False)
    grid.close()
    return rows


def _replay_times(g, s, replays, repeats, comm, cp):
    """Median over ``repeats`` of (device, host launch, wall) microseconds per replay of graph ``g`` on stream ``s``,
    the slowest rank's, after 20 warm-up replays."""
    from comms.grid import mpi

    for _ in range(20):
        g.launch(s)
    s.synchronize()
    samples = []
    for _ in range(repeats):
        comm.Barrier()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s)
        t0 = time.perf_counter()
        for _ in range(replays):
            g.launch(s)
        th = time.perf_counter() - t0
        e1.record(s)
        e1.synchronize()
        tw = time.perf_counter() - t0
        dv = cp.cuda.get_elapsed_time(e0, e1) * 1e-3
        samples.append([comm.allreduce(v / replays, op=mpi().MAX) for v in (dv, th, tw)])
    return np.median(np.array(samples), axis=0) * 1e6


def format_rows(rows, mps_line="") -> str:
    if not rows:
        return "(no results)"
    ranks, element = rows[0]["ranks"], rows[0]["element"]
    gpus = rows[0].get("gpus")
    where = f"on {gpus} GPU(s)" if gpus else ""
    lines = [f"GPU halo exchange, ring of {ranks} rank(s) along t {where}, faces of L^3 sites "
             f"({element}, complex128); times in microseconds per exchange (one-way) or per round trip"
             + (f"; {mps_line}" if mps_line else ""),
             f"{'transport':>18} {'L':>3} {'bytes':>8} | {'1way dev':>9} {'1way host':>9} {'1way wall':>9} | "
             f"{'RT dev':>9} {'RT host':>9} {'RT wall':>9}"]
    for r in rows:
        lines.append(f"{r['transport']:>18} {r['L']:>3} {r['bytes']:>8} | {r['one_way_device_us']:>9.2f} "
                     f"{r['one_way_host_us']:>9.2f} {r['one_way_wall_us']:>9.2f} | {r['round_trip_device_us']:>9.2f} "
                     f"{r['round_trip_host_us']:>9.2f} {r['round_trip_wall_us']:>9.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.halo_cuda")
    ap.add_argument("--transport", default=",".join(measured()))
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    ap.add_argument("--element", choices=list(ELEMENTS), default="vector")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--graph-reps", type=int, default=500)
    ap.add_argument("--json", default="")
    ap.add_argument("--label", default="")
    a = ap.parse_args(argv)
    from comms import world
    from comms.config import RunConfig

    config = RunConfig.from_environment()       # each rank under mpiexec: the launch's configuration
    transports = tuple(t.strip() for t in a.transport.split(",") if t.strip())
    rows = bench_halo(transports, a.sizes, a.element, a.reps, a.repeats, a.graph, a.graph_reps, config)
    if world().rank == 0:
        mps = "MPS on" if config.launch.mps_pipe_directory else "no MPS"
        label = f"{a.label}; {mps}" if a.label else mps
        print(format_rows(rows, label), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"label": label, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
