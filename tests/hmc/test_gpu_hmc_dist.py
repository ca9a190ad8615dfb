"""A short HISQ 2+1+1 RHMC trajectory on several ranks equals the single-rank one, through the product's own entry
points (``python -m hmc --backend B --grid .. --transport T run``, launched with mpiexec; the run file read back).

GPU (the device machine; with HMC_GPU_MPS=1 the ranks share the H200 under MPS, as tests/comms): ``--backend cupy``
on a 4x4x8x8 lattice, one rank (the reference: the single-GPU HISQ and gauge kernels, the 1-rank hop), then 2 ranks
(grid 1 1 1 2) through ``event``, ``stream_gated`` and ``mpi``, and 4 ranks (grid 1 1 2 2) through
``stream_gated``. Every local extent is even and >= 3 in the split directions, so the fermion operator runs the
distributed GPU hop (solvers.staggered_dist_cuda.DistHop: pack kernel, exchange through the transport, interior and
exterior kernels); the gauge and HISQ link code runs its array form with shifts through the same halo engine.
CPU (CI, marked mpi only): the same test body with ``--backend numpy`` on 4^4, 2 ranks through ``mpi`` and 4 ranks
through ``shm`` (tests/hmc/test_rhmc_mpi.py runs 2 and 4 ranks through the default, shm, for two trajectories).

One trajectory (3G1F, tau 0.5 in 2 steps; Philox, fixed seed) from the configuration one NumPy trajectory after a
cold start (so the HISQ U(3) projection and its derivative see no degenerate eigenvalues, where the 1-rank GPU
kernels and their array twins could round differently); both trajectories are warmups, so no Metropolis draw can
differ. The ranks add their parts of every sum in another order (and on the GPU the 1-rank reference uses the fused
single-GPU kernels, the ranks their array twins), so the numbers agree to rounding, not bitwise: start and end
actions to 1e-10 relative, dH to 1e-10 of the Hamiltonian, plaquettes (Polyakov loop, link trace) to 1e-12
relative, links to 1e-10 (on the CPU the differences are ~1e-16 relative); a halo or transport fault changes them at
the per-cent level. The transport table stored in the run file (and printed by rank 0) must name the requested
transport on every link of every rank (with the data policy for the GPU transports). With HMC_GPU_REPORT_DIR set,
each case writes its table and differences there (hmc_dist_<backend>_<ranks>_<transport>.json).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, keep_gpu_report
from tests.hmc.hisq211_decks import short_hisq211_deck

try:
    from tests.comms.test_gpu_transports import TIMEOUT, _env, launch, mps, needs_mpi  # noqa: F401  (fixture)
except Exception:  # pragma: no cover - the module imports without a GPU
    launch = mps = _env = None
    TIMEOUT = 150
    needs_mpi = pytest.mark.skip(reason="tests.comms.test_gpu_transports is unavailable")

pytestmark = pytest.mark.mpi

LATTICE = {"cupy": (4, 4, 8, 8), "numpy": (4, 4, 4, 4)}
RTOL_ACTION = 1e-10        # g, h, f at the start and the end, relative
RTOL_PLAQ = 1e-12          # plaquettes (and Polyakov loop, link trace), relative
ATOL_LINKS = 1e-10         # every link element
KEYS_ACTION = ("g_start", "h_start", "f_start", "g_end", "h_end", "f_end")
KEYS_LOOPS = ("plaq_ss", "plaq_st", "ploop_re", "ploop_im", "link_trace")     # RTOL_PLAQ of max(|value|, 1)


_gpu = pytest.mark.gpu
CASES = [
    pytest.param("numpy", 2, (1, 1, 1, 2), "mpi", id="numpy-2-mpi"),
    pytest.param("numpy", 4, (1, 1, 2, 2), "shm", id="numpy-4-shm"),
    pytest.param("cupy", 2, (1, 1, 1, 2), "event", marks=_gpu, id="cupy-2-event"),
    pytest.param("cupy", 2, (1, 1, 1, 2), "stream_gated", marks=_gpu, id="cupy-2-stream_gated"),
    pytest.param("cupy", 2, (1, 1, 1, 2), "mpi", marks=_gpu, id="cupy-2-mpi"),
    pytest.param("cupy", 4, (1, 1, 2, 2), "stream_gated", marks=_gpu, id="cupy-4-stream_gated"),
]

_REFERENCE = {}            # backend -> (starting run file, the 1-rank run's state) or the error: made once


def _hmc(n, backend, args, mps):  # noqa: F811
    """``python -m hmc --backend B ARGS`` on n ranks (mpiexec) or in one process (n = 0); its stdout."""
    if n:
        return launch(n, ["-m", "hmc", "--backend", backend] + args, mps).stdout
    cmd = [sys.executable, "-m", "hmc", "--backend", backend] + args
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(mps), timeout=TIMEOUT)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def _reference(backend, tmp_path_factory, mps):  # noqa: F811
    """The starting run file (cold start, then one 1-rank NumPy trajectory; made once per backend) and the
    single-rank trajectory from it on ``backend``."""
    if backend not in _REFERENCE:
        try:
            _REFERENCE[backend] = _make_reference(backend, tmp_path_factory, mps)
        except BaseException as e:             # the other cases of the backend fail at once, not after a re-run
            _REFERENCE[backend] = e
            raise
    if isinstance(_REFERENCE[backend], BaseException):
        pytest.fail(f"the 1-rank {backend} reference failed: {_REFERENCE[backend]!s:.2000}")
    return _REFERENCE[backend]


def _make_reference(backend, tmp_path_factory, mps):  # noqa: F811
    from hmc import runfile

    d = tmp_path_factory.mktemp(f"hmc_dist_{backend}")
    deck = d / "deck.toml"
    deck.write_text(short_hisq211_deck("short RHMC 2+1+1 trajectory on 1, 2 and 4 ranks", 8642, LATTICE[backend],
                                       warmups=2))
    init = d / "init.h5"
    _hmc(0, "numpy", ["init", str(deck), "-o", str(init)], mps)
    _hmc(0, "numpy", ["run", str(init), "--trajectories", "1", "--no-progress"], mps)
    ref = d / "ref.h5"
    shutil.copy(init, ref)
    out = _hmc(0, backend, ["run", str(ref), "--no-progress"], mps)
    assert out.count("RUNNING COMPLETED") == 1 and f"({backend}, " in out, out[-3000:]
    st = runfile.load(ref)
    assert st.trajectory == 2 and st.comms == []                # one rank: no halo, no transport
    row = st.history[1]
    assert row["warmup"] == 1 and row["accepted"] == 1 and row["g_start"] > 0 and row["cg_md"] > 0
    return init, st


def _close(a, b, rtol):
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1.0)


def differences(ref, st) -> dict:
    """What the n-rank trajectory's record differs by from the 1-rank one: links (max abs), actions, dH,
    plaquettes (abs), and the CG iteration counts of both."""
    ra, rb = ref.history[1], st.history[1]
    out = {"links": float(np.abs(np.asarray(st.links) - np.asarray(ref.links)).max()),
           "H_start": abs(ra["g_start"] + ra["h_start"] + ra["f_start"]), "dH_ref": ra["dH"]}
    for k in KEYS_ACTION + ("dH",) + KEYS_LOOPS:
        out[k] = abs(ra[k] - rb[k])
    out["cg"] = {k: [ra[k], rb.get(k)] for k in sorted(ra) if k.startswith("cg_")}
    return out


def compare(ref, st, diff):
    """The n-rank trajectory against the 1-rank one (tolerances: module docstring)."""
    assert st.trajectory == ref.trajectory == 2
    assert ref.history[0] == st.history[0]                     # the common starting trajectory, read back
    ra, rb = ref.history[1], st.history[1]
    assert set(ra) == set(rb)
    for k in ("traj", "warmup", "accepted"):
        assert ra[k] == rb[k], (k, ra[k], rb[k])
    assert diff["links"] <= ATOL_LINKS, diff
    for k in KEYS_ACTION:
        assert _close(ra[k], rb[k], RTOL_ACTION), (k, ra[k], rb[k], diff)
    assert diff["dH"] <= RTOL_ACTION * diff["H_start"], diff
    for k in KEYS_LOOPS:
        assert _close(ra[k], rb[k], RTOL_PLAQ), (k, ra[k], rb[k], diff)
    for k, (a, b) in diff["cg"].items():       # the same solves; rounding may move a stopping point by an iteration
        assert abs(a - b) <= 2 + 0.01 * a, (k, a, b)


def check_transport(st, out, n, grid, transport, backend):
    """Every resolved link of every rank (run file /comms, printed by rank 0) is the requested transport."""
    rows = st.comms
    split = [mu for mu in range(4) if grid[mu] > 1]
    assert sorted({r["rank"] for r in rows}) == list(range(n)), rows
    assert len(rows) == 2 * len(split) * n, rows                  # both directions of each split dimension, each rank
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
    assert f"({backend}, " in out, out[-3000:]                  # the backend asked for ran
    st = runfile.load(path)
    diff = differences(ref, st)
    keep_gpu_report(f"hmc_dist_{backend}_{n}_{transport}.json", {"transport_table": st.comms, "differences": diff})
    print(f"{backend} {n} ranks {transport}: {json.dumps(diff)}")
    check_transport(st, out, n, grid, transport, backend)
    compare(ref, st, diff)
