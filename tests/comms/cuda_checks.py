"""Multi-rank checks of the GPU transports, run under mpiexec with the project on PYTHONPATH:
``python tests/comms/cuda_checks.py CASE OUT [options]`` (tests/comms/test_gpu_transports.py launches them).

Every rank checks itself against the answer computed from a global field that every rank can build (same seed),
and against the ``mpi`` reference (the host engine); rank 0 writes OUT/CASE.json; any mismatch exits non-zero.

Cases:
  halo        halos of depth 1 and 3 through mpi (host engine, the reference), event and stream_gated: bitwise equal;
              many exchanges enqueued without a host synchronisation (credits, double buffer), two outstanding
              exchanges, NumPy faces, growth of the buffers; the registry is empty after close.
  flush       HMC_P2P_FORCE_FLUSH=1 (set by the caller): the engine's one-line notice with the driver's answer.
  split       push/pop with different exchange counts per sub-grid, then a correct full exchange; no leaks.
  graph       stream_gated in graph mode: a round trip (one link an exchange; in credit-free mode, the default,
              the other links get a signal without data) captured through comms.cuda.graph.CapturedGraph,
              replayed N times with new data each time, the same answer as uncaptured every time; device time
              per replay; its launch refused once the engine left graph mode.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def _grid_arg(text):
    return tuple(int(v) for v in text.split("x"))


def _slab(axis, start, stop):
    return (slice(None),) * axis + (slice(start, stop),)


class Field:
    """A global complex site field (t, z, y, x, 3), the same on every rank, and this rank's block of it."""

    def __init__(self, lattice, grid, seed):
        nx, ny, nz, nt = lattice
        rng = np.random.default_rng(seed)
        shape = (nt, nz, ny, nx, 3)
        self.g = rng.normal(size=shape) + 1j * rng.normal(size=shape)
        self.lattice = lattice
        self.local = tuple(n // p for n, p in zip(lattice, grid.dims))
        self.offset = tuple(c * n for c, n in zip(grid.coords, self.local))
        sl = tuple(slice(o, o + n) for o, n in zip(reversed(self.offset), reversed(self.local)))
        self.loc = np.ascontiguousarray(self.g[sl])

    def expected(self, mu, side, depth, add=0.0):
        """The slabs the neighbour on ``side`` sends: its last (side 0) or first (side 1) ``depth`` slabs."""
        axis = 3 - mu
        n = self.local[mu]
        o = self.offset[mu]
        N = self.lattice[mu]
        idx = [(o - depth + i) % N for i in range(depth)] if side == 0 else [(o + n + i) % N for i in range(depth)]
        # the other axes: this rank's block
        sl = [slice(off, off + m) for off, m in zip(reversed(self.offset), reversed(self.local))]
        sl[axis] = slice(None)
        return np.take(self.g[tuple(sl)], idx, axis=axis) + add


def _faces(loc, partitioned, depth):
    sends = {}
    for mu in range(4):
        if partitioned[mu]:
            axis = 3 - mu
            n = loc.shape[axis]
            sends[(mu, 0)] = loc[_slab(axis, 0, depth)]
            sends[(mu, 1)] = loc[_slab(axis, n - depth, n)]
    return sends


def _fail(rank, text):
    print(f"rank {rank}: FAIL {text}", file=sys.stderr, flush=True)
    raise SystemExit(3)


def case_halo(out, grid_text, lattice_text, partition, transports, iters):
    import cupy as cp

    from comms import ProcessGrid, world
    from comms.cuda import vmm

    comm = world()
    lattice = _grid_arg(lattice_text)
    report = {"grid": grid_text, "lattice": lattice_text, "partition": partition, "ranks": comm.size,
              "env": {k: os.environ.get(k) for k in ("HMC_P2P_MASK", "HMC_P2P_FAKE_CLIQUE", "HMC_P2P_DATA",
                                                     "CUDA_MPS_PIPE_DIRECTORY") if os.environ.get(k)}}
    ref = {}
    for tr in ["mpi"] + [t for t in transports if t != "mpi"]:
        t0 = time.perf_counter()
        grid = ProcessGrid(_grid_arg(grid_text), partitioned=partition or None, transport=tr)
        f = Field(lattice, grid, 11)
        eng = grid.halo
        rows = grid.transport_table(everywhere=True)
        mine = {r["link"]: r["transport"] for r in rows if r["rank"] == grid.rank}
        kinds = sorted({r["transport"] for r in rows})
        got_all = {}
        dev = None if tr == "mpi" else cp.asarray(f.loc)
        for depth in (1, 3):
            if tr == "mpi":
                got = eng.start(_faces(f.loc, grid.partitioned, depth)).finish()
            else:
                got = {k: cp.asnumpy(v) for k, v in eng.start(_faces(dev, grid.partitioned, depth)).finish().items()}
            for (mu, side), a in got.items():
                want = f.expected(mu, side, depth)
                if not np.array_equal(a, want):
                    _fail(grid.rank, f"{tr} halo depth {depth} ({mu},{side}) differs from the global field")
                if tr == "mpi":
                    ref[(depth, mu, side)] = a
                elif not np.array_equal(a, ref[(depth, mu, side)]):
                    _fail(grid.rank, f"{tr} halo depth {depth} ({mu},{side}) differs from mpi's")
                got_all[(depth, mu, side)] = True
        if tr != "mpi":
            # many exchanges without a host synchronisation: new data each time, results kept on the device
            kept = []
            for i in range(iters):
                shifted = dev + float(i)
                kept.append(eng.start(_faces(shifted, grid.partitioned, 1)).finish())
            # two outstanding exchanges at once, depth 3 then depth 1
            h1 = eng.start(_faces(dev * 2.0, grid.partitioned, 3))
            h2 = eng.start(_faces(dev * 3.0, grid.partitioned, 1))
            r1, r2 = h1.finish(), h2.finish()
            # NumPy faces through the same engine (staged through the device)
            r3 = eng.start(_faces(f.loc, grid.partitioned, 2)).finish()
            eng.sync("check")
            for i, res in enumerate(kept):
                for (mu, side), a in res.items():
                    if not np.array_equal(cp.asnumpy(a), f.expected(mu, side, 1, float(i))):
                        _fail(grid.rank, f"{tr} pipelined exchange {i} ({mu},{side}) differs")
            for res, depth, scale in ((r1, 3, 2.0), (r2, 1, 3.0)):
                for (mu, side), a in res.items():
                    if not np.array_equal(cp.asnumpy(a), f.expected(mu, side, depth) * scale):
                        _fail(grid.rank, f"{tr} outstanding exchange depth {depth} ({mu},{side}) differs")
            for (mu, side), a in r3.items():
                if not isinstance(a, np.ndarray) or not np.array_equal(a, f.expected(mu, side, 2)):
                    _fail(grid.rank, f"{tr} numpy faces ({mu},{side}) differ")
            # a larger face: the segments grow collectively, then the halo is still right
            big = cp.asarray(np.tile(f.loc, (1, 1, 1, 1, 200)))
            if eng.state.buffer_index != 1:
                eng.start(_faces(dev, grid.partitioned, 1)).finish()           # grow from buffer index 1
            capacity = getattr(eng, "capacity", None)
            rb = eng.start(_faces(big, grid.partitioned, 3)).finish()
            grew = getattr(eng, "capacity", None) != capacity
            if grew and eng.state.buffer_index != 1:  # the growth restarted the protocol: the exchange used buffer 0
                _fail(grid.rank, f"{tr} buffer index {eng.state.buffer_index} after the grown exchange, not 1")
            for (mu, side), a in rb.items():
                want = np.tile(f.expected(mu, side, 3), (1, 1, 1, 1, 200))
                if not np.array_equal(cp.asnumpy(a), want):
                    _fail(grid.rank, f"{tr} grown exchange ({mu},{side}) differs")
            report.setdefault("notices", {})[tr] = list(getattr(eng, "notices", []))
            report.setdefault("policy", {})[tr] = getattr(eng, "policy", None)
            report.setdefault("capacity", {})[tr] = getattr(eng, "capacity", None)
        grid.close()
        left = vmm.leaked()
        if left:
            _fail(grid.rank, f"{tr}: registry not empty after close: {left}")
        tables = comm.gather(mine, root=0)
        report.setdefault("links", {})[tr] = kinds
        report.setdefault("tables", {})[tr] = tables
        report.setdefault("seconds", {})[tr] = round(time.perf_counter() - t0, 3)
    report["registry_after_close"] = vmm.leaked()
    if comm.rank == 0:
        Path(out, "halo.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"rank {comm.rank}: halo ok {report['links']}", flush=True)


def case_flush(out, grid_text, lattice_text):
    import cupy as cp

    from comms import ProcessGrid, world

    comm = world()
    grid = ProcessGrid(_grid_arg(grid_text), partitioned="t", transport="stream_gated")
    eng = grid.halo
    f = Field(_grid_arg(lattice_text), grid, 5)
    dev = cp.asarray(f.loc)
    got = eng.start(_faces(dev, grid.partitioned, 1)).finish()
    ok = all(np.array_equal(cp.asnumpy(a), f.expected(mu, side, 1)) for (mu, side), a in got.items())
    rep = {"notices": eng.notices, "policy": eng.policy, "flush_answer": eng.flush_answer, "correct": bool(ok),
           "facts": eng.facts[0]}
    grid.close()
    if comm.rank == 0:
        Path(out, "flush.json").write_text(json.dumps(rep, indent=1))
    if not ok:
        _fail(comm.rank, "halo with the forced FLUSH policy differs")


def case_split(out, grid_text, lattice_text, split_text, transport):
    import cupy as cp

    from comms import ProcessGrid, world
    from comms.cuda import vmm

    comm = world()
    grid = ProcessGrid(_grid_arg(grid_text), transport=transport)
    f = Field(_grid_arg(lattice_text), grid, 7)
    dev = cp.asarray(f.loc)
    eng = grid.halo
    for _ in range(3):
        got = eng.start(_faces(dev, grid.partitioned, 1)).finish()
    split = _grid_arg(split_text)
    sub_dims = [d // s for d, s in zip(grid.dims, split)]
    colour = sum(c // sd for c, sd in zip(grid.coords, sub_dims))     # differs between neighbouring sub-grids
    grid.push(split)
    sub = grid.halo
    # sub-grids run different numbers of exchanges (1 + colour)
    sub_parts = grid.partitioned
    n_sub = 0
    if any(sub_parts):
        for _ in range(1 + colour):
            sub.start(_faces(dev, sub_parts, 1)).finish()
            n_sub += 1
    table_sub = [r["transport"] for r in grid.transport_table(everywhere=True)] if any(sub_parts) else []
    grid.pop()
    got = eng.start(_faces(dev, grid.partitioned, 2)).finish()
    for (mu, side), a in got.items():
        if not np.array_equal(cp.asnumpy(a), f.expected(mu, side, 2)):
            _fail(comm.rank, f"full exchange after pop ({mu},{side}) differs")
    grid.close()
    left = vmm.leaked()
    rep = {"sub_exchanges": comm.gather(n_sub, root=0), "sub_table": table_sub, "registry_after_close": left}
    if left:
        _fail(comm.rank, f"registry not empty: {left}")
    if comm.rank == 0:
        Path(out, "split.json").write_text(json.dumps(rep, indent=1))


def case_graph(out, L, replays):
    import cupy as cp

    from comms import ProcessGrid, world
    from comms.base import CommsError
    from comms.cuda import vmm
    from comms.cuda.graph import CapturedGraph
    from comms.grid import mpi

    comm = world()
    n = comm.size
    grid = ProcessGrid((1, 1, 1, n), comm, partitioned=(False, False, False, True), transport="stream_gated")
    eng = grid.halo
    eng.set_graph_mode(True)
    rng = np.random.default_rng(100 + grid.rank)
    shape = (L, L, L, 3)
    face0 = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    fwd = grid.neighbours[3][1]
    r2 = np.random.default_rng(100 + fwd)
    nb0 = r2.normal(size=shape) + 1j * r2.normal(size=shape)
    face = cp.asarray(face0)
    dest = cp.empty_like(face)
    back = cp.empty_like(face)

    def round_trip():
        eng.start({(3, 0): face}).finish({(3, 1): dest})
        eng.start({(3, 1): dest}).finish({(3, 0): back})

    s = cp.cuda.Stream(non_blocking=True)
    with s:
        round_trip()                               # uncaptured, graph mode: allocates the send buffers
        s.synchronize()
    if not (np.array_equal(cp.asnumpy(dest), nb0) and np.array_equal(cp.asnumpy(back), face0)):
        _fail(grid.rank, "uncaptured round trip in graph mode is wrong")
    with s:
        g = CapturedGraph(s, round_trip)           # one link an exchange (credit-free: the others signal, no data)
        hist_d = cp.empty((replays,) + shape, dtype=face.dtype)
        hist_b = cp.empty((replays,) + shape, dtype=face.dtype)
        comm.Barrier()
        t0 = time.perf_counter()
        for i in range(replays):
            face += 1.0                             # new data each replay (outside the graph)
            g.launch(s)
            hist_d[i] = dest
            hist_b[i] = back
        s.synchronize()
        t_check = time.perf_counter() - t0
        # timing: replays alone
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        comm.Barrier()
        t0 = time.perf_counter()
        e0.record(s)
        for _ in range(replays):
            g.launch(s)
        t_host = time.perf_counter() - t0
        e1.record(s)
        e1.synchronize()
        t_wall = time.perf_counter() - t0
        dev_ms = cp.cuda.get_elapsed_time(e0, e1)
    hd, hb = cp.asnumpy(hist_d), cp.asnumpy(hist_b)
    bad = []
    mine, theirs = face0.copy(), nb0.copy()
    for i in range(replays):                      # the same sequence of additions as on the device: bitwise
        mine += 1.0
        theirs += 1.0
        if not (np.array_equal(hd[i], theirs) and np.array_equal(hb[i], mine)):
            bad.append(i)
    if bad:
        _fail(grid.rank, f"graph replays {bad[:5]} (of {len(bad)}) differ")
    # back to counters: an uncaptured exchange is still right, and the graph is refused (captured in graph mode)
    credit_free = bool(eng.credit_free)
    eng.set_graph_mode(False)
    try:
        g.launch(s)
        _fail(grid.rank, "a graph-mode graph launched in counter mode was not refused")
    except CommsError as e:
        refused = str(e)
    face[...] = cp.asarray(face0)
    eng.start({(3, 0): face}).finish({(3, 1): dest})
    eng.sync("after graph")
    if not np.array_equal(cp.asnumpy(dest), nb0):
        _fail(grid.rank, "counter-mode exchange after graph mode is wrong")
    g.close()
    grid.close()
    left = vmm.leaked()
    if left:
        _fail(grid.rank, f"registry not empty: {left}")
    rep = {"L": L, "bytes": int(face.nbytes), "replays": replays, "ranks": n, "credit_free": credit_free,
           "refused": refused,
           "round_trip_device_us": comm.allreduce(dev_ms * 1e3 / replays, op=mpi().MAX),
           "round_trip_host_launch_us": t_host * 1e6 / replays, "round_trip_wall_us": t_wall * 1e6 / replays,
           "checked_replays_s": t_check}
    if comm.rank == 0:
        Path(out, f"graph_L{L}.json").write_text(json.dumps(rep, indent=1))
    print(f"rank {comm.rank}: graph ok {rep}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python tests/comms/cuda_checks.py")
    ap.add_argument("case", choices=["halo", "flush", "split", "graph"])
    ap.add_argument("out")
    ap.add_argument("--grid", default="1x1x1x2")
    ap.add_argument("--lattice", default="4x4x4x8")
    ap.add_argument("--partition", default="")
    ap.add_argument("--transports", default="event,stream_gated")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--split", default="1x1x1x2")
    ap.add_argument("--transport", default="stream_gated")
    ap.add_argument("--L", type=int, default=4)
    ap.add_argument("--replays", type=int, default=1000)
    a = ap.parse_args(argv)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    if a.case == "halo":
        case_halo(a.out, a.grid, a.lattice, a.partition, a.transports.split(","), a.iters)
    elif a.case == "flush":
        case_flush(a.out, a.grid, a.lattice)
    elif a.case == "split":
        case_split(a.out, a.grid, a.lattice, a.split, a.transport)
    else:
        case_graph(a.out, a.L, a.replays)
    return 0


if __name__ == "__main__":
    sys.exit(main())
