"""Programs that the comms tests launch under mpiexec (or as one process): ``python worker.py CASE OUT [args]``.

Every case checks itself on every rank against the single-process answer computed from the global field (which
every rank can build: the RNG is counter-based by global site), writes what the test needs under OUT (rank 0, as
JSON or .npz), and exits non-zero on any mismatch.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from comms import CommsError, CommsTimeout, ProcessGrid, world  # noqa: E402
from comms.grid import _SingleComm  # noqa: E402
from lattice import CounterRNG, GaugeField, Geometry  # noqa: E402


def grid_arg(text):
    return tuple(int(v) for v in text.split("x"))


def single_geometry(dims):
    return Geometry(dims, grid=ProcessGrid((1, 1, 1, 1), comm=_SingleComm(), partitioned=(False,) * 4))


def site_field(dims, seed, extra=(3,)):
    """A global complex site field, the same on every rank."""
    nx, ny, nz, nt = dims
    rng = np.random.default_rng(seed)
    shape = (nt, nz, ny, nx) + extra
    return rng.normal(size=shape) + 1j * rng.normal(size=shape)


def emit(out, name, obj):
    if world().rank == 0:
        Path(out, name).write_text(json.dumps(obj, indent=1))


# -----------------------------------------------------------------------------------------------------------
def case_halo(out, grid_text, lattice_text, partition=""):
    """Halos of depth 1 and 3 and shifts by +-1..3 (and a multi-hop one) through mpi and through shm: bitwise the
    neighbours' slabs of the global field, so shm == mpi == single process."""
    dims = grid_arg(lattice_text)
    ref = single_geometry(dims)
    f = site_field(dims, 11)
    report = {}
    for tr in ("mpi", "shm"):
        grid = ProcessGrid(grid_arg(grid_text), partitioned=partition or None, transport=tr)
        g = Geometry(dims, grid=grid)
        loc = g.local_part(f)
        kinds = {r["link"]: r["transport"] for r in grid.transport_table(everywhere=True) if r["rank"] == grid.rank}
        for depth in (1, 3):
            h = g.halo(loc, depth)
            for (mu, side), got in h.items():
                axis = 3 - mu
                n = g.local_dims[mu]
                # the neighbour's slabs are the ones next to ours in the global field
                want = np.roll(f, -n, axis=axis) if side == 1 else np.roll(f, depth, axis=axis)
                wl = g.local_part(want)
                sl = [slice(None)] * 4
                sl[axis] = slice(0, depth)
                if not np.array_equal(got, wl[tuple(sl)]):
                    raise SystemExit(f"rank {grid.rank}: {tr} halo depth {depth} {mu},{side} differs")
        for mu in range(4):
            for k in (1, -1, 2, -2, 3, -3, 5):
                got = g.shift(loc, mu, k)
                if not np.array_equal(got, g.local_part(ref.shift(f, mu, k))):
                    raise SystemExit(f"rank {grid.rank}: {tr} shift mu={mu} k={k} differs")
        # start/finish with interior work in between, two outstanding at once
        mu0 = grid.partitioned.index(True)
        h1 = g.shift_start(loc, mu0, 1)
        h2 = g.shift_start(loc, mu0, -3)
        interior = loc * 2
        a2, a1 = h2.finish(), h1.finish()
        if not (np.array_equal(a1, g.local_part(ref.shift(f, mu0, 1)))
                and np.array_equal(a2, g.local_part(ref.shift(f, mu0, -3))) and interior.shape == loc.shape):
            raise SystemExit(f"rank {grid.rank}: {tr} overlapped shifts differ")
        _grown_exchange_restarts_at_buffer_0(grid, tr, mu0)
        report[tr] = sorted(set(kinds.values()))
        grid.close()
    emit(out, "halo.json", {"ranks": world().size, "transports": report})


def _grown_exchange_restarts_at_buffer_0(grid, tr, mu0):
    """An exchange whose faces outgrow the buffers restarts the protocol (buffer index 0 on every rank) and uses
    buffer 0, whatever the index was before: the next exchange uses buffer 1 (the alternation credit-free order
    needs). Faces of 4 MB from each side, each the sender's rank."""
    eng = grid.halo
    small = np.full(8, float(grid.rank))
    while eng.state.buffer_index != 1:
        eng.start({(mu0, 0): small, (mu0, 1): small}).finish()
    big = np.full(1 << 19, float(grid.rank))
    got = eng.start({(mu0, 0): big, (mu0, 1): big}).finish()
    peers = grid.neighbours[mu0]                  # side 0 comes from the backward neighbour, side 1 the forward one
    if any(not np.all(got[(mu0, s)] == peers[s]) for s in (0, 1)):
        raise SystemExit(f"rank {grid.rank}: {tr} grown exchange carried the wrong faces")
    if tr == "shm" and eng.state.buffer_index != 1:
        raise SystemExit(f"rank {grid.rank}: {tr} buffer index {eng.state.buffer_index} after the grown exchange")


def case_physics(out, grid_text, lattice_text="4x4x4x8"):
    """Plaquette, Symanzik action and force, HISQ links, Polyakov loop and link trace, gathered on rank 0; plus
    a MILC file written from the distributed field and read back by every rank."""
    from force.gauge_action import SymanzikAction
    from force.hisq_links import hisq_links
    from lattice import link_trace, plaquette, polyakov_loop
    from lattice.io import read_gauge, write_gauge

    dims = grid_arg(lattice_text)
    g = Geometry(dims, grid=ProcessGrid(grid_arg(grid_text)))
    u = GaugeField.random(g, CounterRNG(77))
    act = SymanzikAction(7.4, 0.89, 3, "hisq")
    res = {"plaq": plaquette(u), "ploop": [polyakov_loop(u).real, polyakov_loop(u).imag],
           "link_trace": link_trace(u), "action": act.action(u)}
    force = act.force(u)
    links = hisq_links(u)
    arrays = {"force": g.gather(np.moveaxis(force, 0, 4)), "fat": g.gather(np.moveaxis(links.fat, 0, 4)),
              "long": g.gather(np.moveaxis(links.long, 0, 4)), "links": g.gather(u.site_major())}
    path = os.path.join(out, "phys.ildg")     # 64-bit, so the re-read is exact (MILC v5 is single precision)
    info = write_gauge(path, u, "ildg")
    v, _ = read_gauge(path, geom=g)
    res["reread_equal"] = bool(g.grid.sum(int(not np.array_equal(v.links, u.links))) == 0)
    res["write_info_same"] = world().allgather(repr(info)) == [repr(info)] * world().size
    res["table"] = g.grid.transport_table()
    g.grid.close()
    if world().rank == 0:
        np.savez(os.path.join(out, "phys.npz"), **arrays)
        emit(out, "phys.json", res)


def case_split(out, reset="1"):
    """4 ranks, grid 1x1x2x2, shm: a full exchange; push two 1x1x2x1 sub-grids that run 3 and 2 exchanges; pop;
    the counters are zero everywhere; the next full exchange is right. reset=0 skips the resets on pop."""
    reset = reset == "1"
    dims = (4, 4, 4, 4)
    grid = ProcessGrid((1, 1, 2, 2), transport="shm")
    eng = grid.halo
    serial = [0]

    def full_exchange(tag):
        """Every rank sends faces stamped with (rank, exchange number); check what arrives."""
        serial[0] += 1
        sends, want = {}, {}
        for mu in (2, 3):
            for d in (0, 1):
                sends[(mu, d)] = np.full((5,), 1000.0 * grid.active_comm.rank + serial[0] + 0.25 * d)
                peer = grid.neighbours[mu][1 - d]
                want[(mu, 1 - d)] = 1000.0 * peer + serial[0] + 0.25 * d
        got = grid.halo.start(sends).finish()
        bad = [k for k in got if not np.all(got[k] == want[k])]
        return bad

    errors = []
    if full_exchange("before"):
        errors.append("before push")
    grid.push((1, 1, 1, 2))
    sub_t = grid.coords  # coordinates inside the sub-grid
    n_sub = 3 if grid.rank in (0, 1) else 2
    for _ in range(n_sub):
        serial[0] += 1
        sends = {(2, d): np.full((5,), 1000.0 * grid.active_comm.rank + serial[0]) for d in (0, 1)}
        got = grid.halo.start(sends).finish()
        for (mu, side), arr in got.items():
            peer = grid.neighbours[mu][side]
            if not np.all(arr == 1000.0 * peer + serial[0]):
                errors.append("inside sub-grid")
    sub_counters = grid.halo.counters()
    from comms.halo import leaked

    live_pushed = leaked(grid.owner)
    grid.pop(reset=reset)
    live_popped = leaked(grid.owner)
    counters = eng.counters()
    world().Barrier()            # everyone has looked before anyone signals the next exchange
    zero = (counters["send"] == [[0, 0]] * 4 and counters["recv"] == [[0, 0]] * 4
            and counters["buffer_index"] == 0 and counters["signal_slots"] == [[0, 0]] * 4
            and counters["ack_slots"] == [[[0, 0], [0, 0]]] * 4)
    serial[0] = 100
    try:
        bad = full_exchange("after")
        outcome = "ok" if not bad else f"wrong halo on {bad}"
    except CommsTimeout as e:
        outcome = f"timeout: {e}"
    results = before_close = world().gather({"rank": grid.rank, "errors": errors, "zero_after_pop": zero, "after": outcome, "counters_after_pop": counters,
                              "sub_exchanges": n_sub, "sub_send": sub_counters["send"], "sub_coords": sub_t})
    if reset:
        grid.close()
        live_closed = leaked(grid.owner)
        results = world().gather({"pushed": live_pushed, "popped": live_popped, "closed": live_closed})
        results = results and [dict(r, **l) for r, l in zip(before_close, results)]
    emit(out, "split.json", results)
    if not reset:
        world().Barrier()        # rank 0 has written the results
        os._exit(0)              # the broken state may leave peers waiting: do not finalize


def case_geq(out):
    """2 ranks, 1x1x1x2, shm: rank 1 finishes exchange 1 only after rank 0 has already signalled exchange 2."""
    grid = ProcessGrid((1, 1, 1, 2), transport="shm")
    eng = grid.halo
    r = grid.rank
    peer = 1 - r

    def sends(n):
        return {(3, d): np.full((7,), 10.0 * r + n) for d in (0, 1)}

    ok = True
    ex1 = eng.start(sends(1))
    if r == 1:
        deadline = time.monotonic() + 20
        while eng.windows.own_header[3 * 2 + 0] < 2 and time.monotonic() < deadline:   # wait for rank 0's 2nd signal
            time.sleep(0.01)
    got1 = ex1.finish()
    ok &= all(np.all(v == 10.0 * peer + 1) for v in got1.values())
    observed = dict((f"{k[0]},{k[1]}", v) for k, v in ex1.observed.items())
    ex2 = eng.start(sends(2))
    got2 = ex2.finish()
    ok &= all(np.all(v == 10.0 * peer + 2) for v in got2.values())
    res = world().gather({"rank": r, "ok": bool(ok), "observed_ex1": observed})
    grid.close()
    emit(out, "geq.json", res)


def case_stall(out, transport):
    """1x1x1x4 ring: rank 2 stops; its neighbours must fail within HMC_COMMS_TIMEOUT with a message naming the
    rank, the link and the counters."""
    grid = ProcessGrid((1, 1, 1, 4), transport=transport)
    eng = grid.halo
    world().Barrier()
    if grid.rank == 2:
        time.sleep(30)
        os._exit(0)
    t0 = time.monotonic()
    try:
        eng.start({(3, d): np.zeros(4) for d in (0, 1)}).finish()
        eng.start({(3, d): np.zeros(4) for d in (0, 1)}).finish()
    except CommsTimeout as e:
        line = f"TIMEOUT rank {grid.rank} after {time.monotonic() - t0:.2f} s: {e}"
        Path(out, f"timeout.{grid.rank}").write_text(line)
        time.sleep(1.0)          # let the other neighbour report before the launcher ends the job
        os._exit(3)
    print(f"COMPLETED rank {grid.rank}", flush=True)
    os._exit(0)


def case_table(out, grid_text):
    """Only resolve the links (asymmetric settings, fake cliques) and exchange once along every link."""
    dims = (4, 4, 4, 4)
    grid = ProcessGrid(grid_arg(grid_text))
    g = Geometry(dims, grid=grid)
    f = site_field(dims, 5)
    ref = single_geometry(dims)
    for mu in range(4):
        for k in (1, -2):
            if not np.array_equal(g.shift(g.local_part(f), mu, k), g.local_part(ref.shift(f, mu, k))):
                raise SystemExit(f"rank {grid.rank}: shift {mu} {k} differs")
    rows = grid.transport_table(everywhere=True)
    grid.close()
    emit(out, "table.json", rows)


def case_solvers(out, grid_text, lattice_text="4x4x4x4"):
    """HISQ dslash, even-odd normal operator and CG / mixed CG / multishift CG (exact reductions) on the
    distributed field: the solutions gathered on rank 0 (compared bitwise with one process by the test)."""
    sys.path.insert(0, str(ROOT / "tests" / "solvers"))
    from solver_testlib import random_field, random_links
    from solvers import StaggeredDslash, cg, mixed_cg, multishift_cg, project, set_reductions

    set_reductions("exact")
    dims = grid_arg(lattice_text)
    ref = single_geometry(dims)
    fat, long = random_links(ref, seed=21)
    psi = random_field(ref, np.random.default_rng(1))
    b = project(random_field(ref, np.random.default_rng(2)), ref, 0)
    g = Geometry(dims, grid=ProcessGrid(grid_arg(grid_text)))

    def lp(a):          # this rank's part of a (4, nt, nz, ny, nx, ...) link array
        return np.ascontiguousarray(np.moveaxis(g.local_part(np.moveaxis(a, 0, 4)), 4, 0))

    d = StaggeredDslash(g, lp(fat), lp(long))
    arrays = {"dslash": g.gather(d(g.local_part(psi))),
              "normal": g.gather(d.even_odd(0.1).normal(g.local_part(psi)))}
    stats = {}
    for name, solver in (("cg", cg(1e-8, 2000)), ("mixed_cg", mixed_cg(1e-8, 2000))):
        x, st = solver(d.even_odd(0.4).normal).solve(g.local_part(b))
        arrays[name] = g.gather(x)
        stats[name] = [st.iters, st.true_residual]
    xs = multishift_cg([0.64, 2.0], 1e-8)(d.even_odd(0.0).normal)(g.local_part(b))
    for i, x in enumerate(xs):
        arrays[f"multishift{i}"] = g.gather(x)
    g.grid.close()
    if world().rank == 0:
        np.savez(os.path.join(out, "solvers.npz"), **arrays)
        emit(out, "solvers.json", stats)


CASES = {"solvers": case_solvers, "halo": case_halo, "physics": case_physics, "split": case_split, "geq": case_geq, "stall": case_stall,
         "table": case_table}

if __name__ == "__main__":
    try:
        CASES[sys.argv[1]](*sys.argv[2:])
    except CommsError as e:
        print(f"CommsError rank {world().rank}: {e}", file=sys.stderr, flush=True)
        os._exit(4)
