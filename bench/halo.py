"""``hmc bench halo``: halo latency and bandwidth per transport and face size (docs/halo-protocol.md, "What to measure").

The ranks form a ring along t (grid 1x1x1xN, t partitioned even on one rank). Per face size L (L^3 sites of 3x3
complex128 matrices, 144 bytes a site, or 3-vectors, 48 bytes) and transport:

* one-way: one exchange in which every rank sends its face to the backward neighbour and receives the forward
  neighbour's (a shift by one): time per exchange, in a loop of back-to-back exchanges;
* round trip: the face goes to the backward neighbour and the received face comes straight back (two dependent
  exchanges): time per pair;
* bandwidth: face bytes per one-way time;
* host time per exchange: time in start() and finish() minus the time spent waiting for the peer (pack, copies,
  signals, MPI calls, unpack). On the CPU transports all of it is host time; there is no device time.

Every exchange (pair) is timed on its own; a time is the median over ``repeats`` loops of ``reps`` exchanges (the
loop count chosen on rank 0 for about ``min_time / repeats`` seconds a loop), the slowest rank's. The transports'
loops are interleaved so that a busy machine slows them alike, and the median ignores the few exchanges that
another process's time slice stretches.
"""
from __future__ import annotations

import time

import numpy as np

from comms.grid import ProcessGrid, world

ELEMENTS = {"matrix": ((3, 3), 144), "vector": ((3,), 48)}


def _loop(eng, face, dest, back, reps, round_trip):
    """Per-exchange (or per-pair) wall times and host-busy times (wall minus waiting), as arrays."""
    prof = eng.profile
    wall = np.empty(reps)
    busy = np.empty(reps)
    clock = time.perf_counter
    for i in range(reps):
        w0 = prof["wait"]
        t0 = clock()
        eng.start({(3, 0): face}).finish({(3, 1): dest})
        if round_trip:
            eng.start({(3, 1): dest}).finish({(3, 0): back})
        t = clock() - t0
        wall[i] = t
        busy[i] = t - (prof["wait"] - w0)
    return wall, busy


def bench_halo(transports=("mpi", "shm"), sizes=(2, 4, 8, 16), element="matrix", min_time=0.3, repeats=15):
    """Rows of {transport, L, sites, bytes, one_way_us, round_trip_us, bandwidth_MBps, host_us} (on every rank).

    The transports are measured interleaved (loop of transport 1, loop of transport 2, ... ``repeats`` times) so
    that they see the same machine load; a time is the median of the per-exchange times."""
    from comms.transport.registry import with_capabilities
    if any(t in with_capabilities(gpu_buffers=True) for t in transports):      # GPU transports hook: device faces (bench/halo_cuda.py)
        from .halo_cuda import bench_halo as gpu_bench_halo
        return gpu_bench_halo(tuple(transports), tuple(sizes), element)
    comm = world()
    n = comm.size
    inner, site_bytes = ELEMENTS[element]
    grids, engines = {}, {}
    for tr in transports:
        grids[tr] = ProcessGrid((1, 1, 1, n), comm, partitioned=(False, False, False, True), transport=tr)
        engines[tr] = grids[tr].halo
        engines[tr].profile = {"wait": 0.0}
        engines[tr].reserve(max(sizes) ** 3 * site_bytes)
    grid = grids[transports[0]]
    rows = []
    for L in sizes:
        shape = (L, L, L) + inner
        rng = np.random.default_rng(1000 + grid.rank)
        face = rng.normal(size=shape) + 1j * rng.normal(size=shape)
        dest = np.empty_like(face)
        back = np.empty_like(face)
        fwd = grid.neighbours[3][1]
        want = np.random.default_rng(1000 + fwd)
        expect = want.normal(size=shape) + 1j * want.normal(size=shape)
        for tr, eng in engines.items():
            # correctness: the forward neighbour's face arrives, and comes back unchanged
            eng.start({(3, 0): face}).finish({(3, 1): dest})
            ok = np.array_equal(dest, expect)
            eng.start({(3, 1): dest}).finish({(3, 0): back})
            ok = ok and np.array_equal(back, face)
            if grid.sum(int(not ok)) != 0:
                raise RuntimeError(f"halo bench: wrong data through {tr} at L={L}")
        # loop length: about min_time / repeats seconds per loop, chosen on rank 0
        eng = engines[transports[0]]
        reps = 10
        while True:
            t0 = time.perf_counter()
            _loop(eng, face, dest, back, reps, False)
            t = grid.max(time.perf_counter() - t0)
            if t > min_time / repeats / 4 or reps >= 1 << 20:
                break
            reps *= 4
        reps = comm.bcast(max(5, int(reps * (min_time / repeats) / max(t, 1e-9))), root=0)
        samples = {tr: ([], [], []) for tr in transports}
        for _ in range(repeats):
            for tr, eng in engines.items():
                grid.barrier()
                wall, busy = _loop(eng, face, dest, back, reps, False)
                samples[tr][0].append(wall)
                samples[tr][1].append(busy)
                grid.barrier()
                wall, _ = _loop(eng, face, dest, back, max(1, reps // 2), True)
                samples[tr][2].append(wall)
        best = {}
        for tr in transports:
            # the median of the per-exchange times: robust to the other processes of a shared machine, which
            # stretch a few exchanges a lot; the slowest rank's
            one, host, rt = (float(np.median(np.concatenate(x))) for x in samples[tr])
            best[tr] = (grid.max(one), grid.max(host), grid.max(rt))
        for tr, eng in engines.items():
            one, host, rt = best[tr]
            kinds = sorted({l.transport for l in eng.links.values()})
            rows.append({"transport": tr, "links": "+".join(kinds), "ranks": n, "L": L, "sites": L ** 3,
                         "element": element, "bytes": face.nbytes, "one_way_us": one * 1e6,
                         "round_trip_us": rt * 1e6, "bandwidth_MBps": face.nbytes / one / 1e6,
                         "host_us": host * 1e6, "reps": reps, "repeats": repeats})
    for tr in transports:
        engines[tr].profile = None
    for tr in reversed(transports):
        grids[tr].close()
    rows.sort(key=lambda r: (transports.index(r["transport"]), r["L"]))
    return rows


def format_rows(rows) -> str:
    """A table, with the shm/mpi ratios of the one-way and round-trip times where both were measured."""
    if not rows:
        return "(no results)"
    if "one_way_device_us" in rows[0]:                     # GPU transports hook (bench/halo_cuda.py)
        from .halo_cuda import format_rows as gpu_format_rows
        return gpu_format_rows(rows)
    ranks, element = rows[0]["ranks"], rows[0]["element"]
    hdr = (f"halo exchange, ring of {ranks} rank(s) along t, faces of L^3 sites of complex128 "
           f"{'3x3 matrices (144 B/site)' if element == 'matrix' else '3-vectors (48 B/site)'}")
    lines = [hdr, f"{'transport':>9} {'L':>3} {'bytes':>8} {'one-way us':>11} {'round-trip us':>14} "
                  f"{'MB/s':>9} {'host us':>8} {'shm/mpi 1-way':>14} {'shm/mpi RT':>11}"]
    mpi_rows = {r["L"]: r for r in rows if r["transport"] == "mpi"}
    for r in rows:
        ratio1 = ratio2 = ""
        m = mpi_rows.get(r["L"])
        if r["transport"] != "mpi" and m:
            ratio1 = f"{r['one_way_us'] / m['one_way_us']:.2f}"
            ratio2 = f"{r['round_trip_us'] / m['round_trip_us']:.2f}"
        lines.append(f"{r['transport']:>9} {r['L']:>3} {r['bytes']:>8} {r['one_way_us']:>11.2f} "
                     f"{r['round_trip_us']:>14.2f} {r['bandwidth_MBps']:>9.1f} {r['host_us']:>8.2f} "
                     f"{ratio1:>14} {ratio2:>11}")
    return "\n".join(lines)
