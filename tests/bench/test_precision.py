"""``hmc bench precision`` (bench/precision.py): the comparison's arithmetic, and one tiny run of both settings."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.precision import compare, mean_error, observables, report_lines

ROOT = Path(__file__).resolve().parents[2]


def test_mean_error_is_the_standard_error():
    m, e = mean_error([1.0, 2.0, 3.0, 4.0])
    assert m == 2.5 and e == pytest.approx(math.sqrt((1.5**2 + 0.5**2) * 2 / 3 / 4))
    assert math.isnan(mean_error([1.0])[1])


def _rows(plaqs, dhs, warm=1):
    return [{"traj": i + 1, "plaq_ss": 3 * p, "plaq_st": 3 * p, "dH": d, "exp_mdH": math.exp(-d),
             "accepted": int(d < 0.5)} for i, (p, d) in enumerate(zip(plaqs, dhs))]


def test_compare_flags_a_shifted_plaquette_and_keeps_warmups_out():
    ref = observables(_rows([0.1, 0.60, 0.61, 0.59, 0.60], [9.0, 0.1, 0.2, 0.3, 0.2]), warmups=1)
    same = observables(_rows([0.9, 0.60, 0.61, 0.59, 0.60], [1.0, 0.1, 0.2, 0.3, 0.2]), warmups=1)
    moved = observables(_rows([0.1, 0.70, 0.71, 0.69, 0.70], [9.0, 0.1, 0.2, 0.3, 0.2]), warmups=1)
    assert len(ref["plaquette"]) == 4
    ok = compare(ref, same, [(1e-9, 2e-9, 3e-9), (4e-9, 1e-9, -5e-9)])
    assert all(o["agree_within_2_sigma"] for o in ok["observables"].values())
    assert ok["observables"]["plaquette"]["max_abs_difference_per_trajectory"] == 0.0
    assert ok["reversibility"] == {"max_dU": 4e-9, "max_dP": 2e-9, "max_abs_dH": 5e-9, "trajectories": 2}
    bad = compare(ref, moved, [])
    assert not bad["observables"]["plaquette"]["agree_within_2_sigma"]
    assert bad["observables"]["dH"]["agree_within_2_sigma"] and bad["reversibility"] is None
    assert any("NO" in line for line in report_lines(bad))


@pytest.mark.timeout(300)
def test_tiny_run_compares_single_md_solves_with_double(tmp_path):
    r = subprocess.run([sys.executable, "-m", "hmc", "bench", "precision", "--lattice", "4", "--deck",
                        "runs/hisq211_8.toml", "--trajectories", "2", "--warmups", "1", "--steps", "2",
                        "--cgprec", "1", "2", "2", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=280)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "precision_4.json").read_text())
    assert res["cgprec"] == [1, 2, 2] and res["reference_cgprec"] == [2, 2, 2]
    # same seed, MD solves to the same 1e-5 tolerance: the chains agree far below the statistical errors
    assert res["observables"]["plaquette"]["max_abs_difference_per_trajectory"] < 1e-6
    assert res["reversibility"]["trajectories"] == 2 and res["reversibility"]["max_dU"] < 1e-6
    assert "reversibility of the test setting" in r.stdout
