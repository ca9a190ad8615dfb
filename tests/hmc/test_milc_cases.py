"""MILC's own regression suite (ks_imp_rhmc/test): every case of the checklist is
run by ``hmc check --milc`` (its sample deck through ``hmc milc``, in a fresh process) and must pass MILC's
comparison with the sample output under its errtol file. One core: 12-30 s CPU per case (runs/milc/README.md).
"""
import pytest

from fixture_paths import FIXTURES
from hmc.milc.compare import read_checklist
from hmc.milc.runner import check_milc

MILC_TEST = FIXTURES / "ks_imp_rhmc"

# every case of the checklist (su3_rhmc_hisq_su3 and su3_spectrum_hisq are not in it)
CASES = [f"{name}.{prec}" for prec in (1, 2) for name in (
    "su3_leapfrog", "su3_omelyan_rhmc", "su3_rhmc_hisq", "su3_rhmc_hisq.f211", "su3_rhmc_hisq.f2111", "su3_rhmd_hisq")]


@pytest.fixture(scope="module")
def milc_test():
    if not (MILC_TEST / "checklist").exists():
        pytest.skip(f"MILC's test folder {MILC_TEST} is absent (the shared fixtures folder ../shared/fixtures/milc/)")
    return MILC_TEST


def test_cases_are_in_the_checklist(milc_test):
    prefixes = {c.prefix for c in read_checklist(milc_test)}
    assert set(CASES) == prefixes


@pytest.mark.parametrize("case", CASES)
def test_case_passes_milc_comparison(milc_test, case, tmp_path):
    lines = []
    failed = check_milc(milc_test, [case], search=[FIXTURES], out_dir=tmp_path, log=lines.append)
    assert failed == 0, "\n".join(lines)
    assert (tmp_path / f"{case}.test-out").read_text().count("G_LOOP:") >= 34
