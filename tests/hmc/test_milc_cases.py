"""MILC's own regression suite (ks_imp_rhmc/test): each case of the checklist that the project's physics covers is
run by ``hmc check --milc`` (its sample deck through ``hmc milc``, in a fresh process) and must pass MILC's
comparison with the sample output under its errtol file. One core: 15-20 s CPU per HISQ case (runs/milc/README.md).
"""
import pytest

from conftest import FIXTURES
from hmc.milc.compare import read_checklist
from hmc.milc.runner import check_milc

MILC_TEST = FIXTURES / "ks_imp_rhmc"

# the cases whose builds the project runs (su3_leapfrog and su3_omelyan_rhmc need MILC's asqtad integrators,
# su3_rhmc_hisq_su3 the SU(3)-projected HISQ links; hmc.milc.builds)
CASES = ["su3_rhmc_hisq.1", "su3_rhmc_hisq.2", "su3_rhmc_hisq.f211.1", "su3_rhmc_hisq.f211.2",
         "su3_rhmc_hisq.f2111.1", "su3_rhmc_hisq.f2111.2", "su3_rhmd_hisq.1", "su3_rhmd_hisq.2"]


@pytest.fixture(scope="module")
def milc_test():
    if not (MILC_TEST / "checklist").exists():
        pytest.skip(f"MILC's test folder {MILC_TEST} is absent (the shared fixtures folder ../shared/fixtures/milc/)")
    pytest.importorskip("hmc.milc_loops", reason="MILC's G_LOOP lines come from hmc.milc_loops")
    return MILC_TEST


def test_cases_are_in_the_checklist(milc_test):
    prefixes = {c.prefix for c in read_checklist(milc_test)}
    assert set(CASES) <= prefixes


@pytest.mark.parametrize("case", CASES)
def test_case_passes_milc_comparison(milc_test, case, tmp_path):
    lines = []
    failed = check_milc(milc_test, [case], search=[FIXTURES], out_dir=tmp_path, log=lines.append)
    assert failed == 0, "\n".join(lines)
    assert (tmp_path / f"{case}.test-out").read_text().count("G_LOOP:") >= 34
