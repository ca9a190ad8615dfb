"""A short HISQ 2+1+1 RHMC trajectory on several ranks equals the single-rank one, through the product's own entry
points (``python -m hmc --backend B --grid .. --transport T run``, launched with mpiexec; the run file read back).

GPU (the device machine; with HMC_GPU_MPS=1 the ranks share the H200 under MPS, as tests/comms): ``--backend cupy``
on a 4x4x8x8 lattice, one rank (the reference: the single-GPU HISQ and gauge kernels, the 1-rank hop), then 2 ranks
(grid 1 1 1 2) through ``event``, ``stream_gated`` and ``mpi``, and 4 ranks (grid 1 1 2 2) through
``stream_gated``. Every local extent is even and >= 3 in the split directions, so the fermion operator runs the
distributed GPU hop (solvers.staggered_dist_cuda.DistHop: pack kernel, exchange through the transport, interior and
exterior kernels); the gauge and HISQ link code runs its array form with shifts through the same halo engine.
CPU (CI, marked mpi only): the same test body with ``--backend numpy`` on 4^4 through ``mpi`` and ``shm``.

One trajectory from a cold start (Philox, fixed seed; the trajectory is a warmup, so no Metropolis draw can differ),
3G1F, tau 0.5 in 2 steps. The ranks add their parts of every sum in another order (and on the GPU the 1-rank
reference uses the fused single-GPU kernels, the ranks their array twins), so the numbers agree to rounding, not
bitwise: start and end actions to 1e-10 relative, dH to 1e-10 of the Hamiltonian, plaquettes to 1e-12 relative,
links to 1e-10; a halo or transport fault changes them at the per-cent level. The transport table stored in the run
file (and printed by rank 0) must name the requested transport on every link of every rank (with the data policy for
the GPU transports).
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from tests.conftest import ROOT

try:
    from tests.comms.test_gpu_transports import launch, mps, needs_mpi  # noqa: F401  (fixture)
except Exception:  # pragma: no cover - the module imports without a GPU
    launch = mps = None
    needs_mpi = pytest.mark.skip(reason="tests.comms.test_gpu_transports is unavailable")

pytestmark = pytest.mark.mpi

LATTICE = {"cupy": (4, 4, 8, 8), "numpy": (4, 4, 4, 4)}
RTOL_ACTION = 1e-10        # g, h, f at the start and the end, relative
RTOL_PLAQ = 1e-12          # plaquettes (and link trace), relative
ATOL_LINKS = 1e-10         # every link element
KEYS_ACTION = ("g_start", "h_start", "f_start", "g_end", "h_end", "f_end")

DECK = """
[run]
name = "short RHMC 2+1+1 trajectory on 1, 2 and 4 ranks"
seed = 8642
trajectories = 1
warmups = 1
start = "cold"
rng = "philox"
[lattice]
dims = [{dims}]
[gauge]
action = "symanzik"
beta = 5.8
u0 = 0.85535
quark_loops = "hisq"
nf = 4
[fermions]
rationals = "{rationals}"
dyn_mass = [0.013, 0.065, 0.838]
dyn_flavors = [2, 1, 1]
cgresid_md_fa_gr = [[1e-8, 1e-10, 1e-10], [1e-8, 1e-10, 1e-10], [1e-8, 1e-10, 1e-10], [1e-8, 1e-10, 1e-10],
                    [1e-8, 1e-10, 1e-10]]
[integrator]
scheme = "3g1f"
steps = 2
tau = 0.5
link_exponential = "taylor8"
reunitarize = "cycle"
"""

_gpu = pytest.mark.gpu
CASES = [
    pytest.param("numpy", 2, (1, 1, 1, 2), "mpi", id="numpy-2-mpi"),
    pytest.param("numpy", 2, (1, 1, 1, 2), "shm", id="numpy-2-shm"),
    pytest.param("numpy", 4, (1, 1, 2, 2), "shm", id="numpy-4-shm"),
    pytest.param("cupy", 2, (1, 1, 1, 2), "event", marks=_gpu, id="cupy-2-event"),
    pytest.param("cupy", 2, (1, 1, 1, 2), "stream_gated", marks=_gpu, id="cupy-2-stream_gated"),
    pytest.param("cupy", 2, (1, 1, 1, 2), "mpi", marks=_gpu, id="cupy-2-mpi"),
    pytest.param("cupy", 4, (1, 1, 2, 2), "stream_gated", marks=_gpu, id="cupy-4-stream_gated"),
]

_REFERENCE = {}            # backend -> (initial run file, the 1-rank run's state), made once per session


def _hmc(n, backend, args, mps):  # noqa: F811
    return launch(n, ["-m", "hmc", "--backend", backend] + args, mps).stdout


def _reference(backend, tmp_path_factory, mps):  # noqa: F811
    """The cold-start run file (made once) and the single-rank trajectory on ``backend``."""
    if backend not in _REFERENCE:
        from hmc import runfile

        d = tmp_path_factory.mktemp(f"hmc_dist_{backend}")
        deck = d / "deck.toml"
        deck.write_text(DECK.format(dims=", ".join(map(str, LATTICE[backend])),
                                    rationals=ROOT / "runs" / "rationals" / "rationals.hisq211_b580"))
        init = d / "init.h5"
        _hmc(1, "numpy", ["init", str(deck), "-o", str(init)], mps)
        ref = d / "ref.h5"
        shutil.copy(init, ref)
        out = _hmc(1, backend, ["run", str(ref), "--no-progress"], mps)
        assert out.count("RUNNING COMPLETED") == 1, out[-3000:]
        st = runfile.load(ref)
        assert st.trajectory == 1 and st.comms == []                # one rank: no halo, no transport
        row = st.history[0]
        assert row["warmup"] == 1 and row["plaq_ss"] < 3.0 - 1e-3   # off the cold start
        _REFERENCE[backend] = (init, st)
    return _REFERENCE[backend]


def _close(a, b, rtol):
    return abs(a - b) <= rtol * max(abs(a), abs(b))


def compare(ref, st):
    """The n-rank trajectory against the 1-rank one (tolerances: module docstring)."""
    assert st.trajectory == ref.trajectory == 1
    diff = float(np.abs(np.asarray(st.links) - np.asarray(ref.links)).max())
    assert diff <= ATOL_LINKS, f"links differ by {diff:.3e}"
    ra, rb = ref.history[0], st.history[0]
    assert set(ra) == set(rb)
    h = abs(ra["g_start"] + ra["h_start"] + ra["f_start"])
    for k in KEYS_ACTION:
        assert _close(ra[k], rb[k], RTOL_ACTION), (k, ra[k], rb[k])
    assert abs(ra["dH"] - rb["dH"]) <= RTOL_ACTION * h, ("dH", ra["dH"], rb["dH"], h)
    for k in ("plaq_ss", "plaq_st", "link_trace"):
        assert _close(ra[k], rb[k], RTOL_PLAQ), (k, ra[k], rb[k])
    for k in ("traj", "warmup", "accepted"):
        assert ra[k] == rb[k], (k, ra[k], rb[k])


def check_transport(st, out, n, grid, transport, backend):
    """Every resolved link of every rank (run file /comms, printed by rank 0) is the requested transport."""
    rows = st.comms
    split = [mu for mu in range(4) if grid[mu] > 1]
    assert sorted({r["rank"] for r in rows}) == list(range(n)), rows
    assert len(rows) == 2 * sum(len(split) for _ in range(n)), rows     # both directions of each split dimension
    for r in rows:
        assert r["transport"] == transport, r
        if backend == "cupy" and transport != "mpi":
            assert r.get("policy") in ("copy_engine", "remote_write"), r
    assert "comms: grid" in out and out.count(f" {transport}") >= len(rows), out[-3000:]


@needs_mpi
@pytest.mark.parametrize("backend,n,grid,transport", CASES)
def test_short_rhmc_trajectory_on_ranks_equals_one_rank(tmp_path, tmp_path_factory, mps, backend, n, grid,  # noqa: F811
                                                        transport):
    from hmc import runfile

    init, ref = _reference(backend, tmp_path_factory, mps)
    path = tmp_path / f"t{n}_{transport}.h5"
    shutil.copy(init, path)
    out = _hmc(n, backend, ["--grid", *map(str, grid), "--transport", transport, "run", str(path), "--no-progress"],
               mps)
    assert out.count("RUNNING COMPLETED") == 1 and out.count("GRSOURCE: sum = ") == 5, out[-3000:]
    st = runfile.load(path)
    check_transport(st, out, n, grid, transport, backend)
    compare(ref, st)
