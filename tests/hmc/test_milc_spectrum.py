"""MILC's su3_spectrum_hisq (not in MILC's checklist; sample outputs of May 2009): its decks, unchanged, through
``hmc check --milc`` as a checklist line ``WARMUPS RUNNING SELECT=...`` would run them, at PRECISION 2 and 1. The
48 selected lines: a trajectory without molecular dynamics (steps_per_trajectory 0: DG = 0 and CHECK: delta S = 0
exactly), PLAQ, G_LOOP, GACTION, MILC's Coulomb gauge fixing (GFIX: the step count exactly, action and delta within
errtol) and PBP/FACTION at the two sea masses on the fixed links; MILC's hvy_pot lines, which the check does not
read, digit for digit too. About 5 s per case on one core."""
import numpy as np
import pytest

from fixture_paths import FIXTURES
from force.gauge_action import WilsonAction
from hmc.integrators import IntegratorError, Level, build_schedule
from hmc.milc.runner import check_milc
from hmc.monomials import GaugeMonomial
from hmc.trajectory import hmc_trajectory
from lattice import CounterRNG, GaugeField, Geometry
from milc_folders import MILC_TEST, checklist_folder

CASE = "su3_spectrum_hisq"


@pytest.fixture(scope="module")
def spectrum_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spectrum")
    folder = checklist_folder(tmp / "test", CASE, "-", "WARMUPS")
    lines = []
    failed = check_milc(folder, [], search=[FIXTURES], out_dir=tmp / "out", log=lines.append, jobs=2)
    return failed, lines, tmp / "out"


def test_su3_spectrum_hisq_passes_milc_comparison(spectrum_run):
    failed, lines, _ = spectrum_run
    assert failed == 0, "\n".join(lines)
    assert sum(f"{CASE}.{p}: ok (48 lines" in line for line in lines for p in (1, 2)) == 2, "\n".join(lines)


def test_gfix_line_is_milcs(spectrum_run):
    """The GFIX line of the double-precision sample: the step count and every printed digit."""
    _, _, out = spectrum_run
    got = [s for s in (out / f"{CASE}.2.test-out").read_text().splitlines() if s.startswith("GFIX:")]
    assert got == ["GFIX: Ended at step 36. Av gf action 8.84999015e-01, delta 1.910e-06"]


def test_skipped_correlators_are_named(spectrum_run):
    _, _, out = spectrum_run
    text = (out / f"{CASE}.2.test-out").read_text()
    assert "SPECTRUM: not computed by hmc milc: spectrum, nl_spectrum, spectrum_mom, spectrum_nlpi2 (" in text


def test_heavy_quark_potential_is_milcs(spectrum_run):
    """hvy_pot after each mass: time-like Wilson lines in Coulomb gauge, gauge-variant, so they check the fixed
    links themselves; every printed digit of the double-precision sample, twice."""
    _, _, out = spectrum_run
    ours = [s for s in (out / f"{CASE}.2.test-out").read_text().splitlines() if s.startswith("POT_LOOP:")]
    milc = [s for s in (MILC_TEST / f"{CASE}.2.sample-out").read_text().splitlines() if s.startswith("POT_LOOP:")]
    assert len(milc) == 16 and ours == milc


def test_trajectory_without_molecular_dynamics():
    """steps 0 (MILC's steps_per_trajectory 0): no operations, the links kept bitwise (not re-unitarized), the
    action measured twice and dH exactly 0; negative steps stay an error."""
    assert build_schedule([Level("3g1f", 0, ["f"]), Level("leapfrog", 1, ["g"])], 1.0) == []
    assert build_schedule([Level("omelyan", 0, ["g"])], 1.0) == []
    with pytest.raises(IntegratorError, match=">= 0"):
        Level("leapfrog", -1)
    geom = Geometry((4, 4, 4, 4))
    u = GaugeField.random(geom, CounterRNG(4))
    v, res = hmc_trajectory(u, CounterRNG(5), [GaugeMonomial(WilsonAction(5.7))], [], reunitarize=True)
    assert np.array_equal(v.links, u.links)
    assert res.end.total == res.start.total and res.delta_h == 0.0 and res.accepted
