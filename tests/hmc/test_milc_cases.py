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


@pytest.fixture(scope="module")
def outputs(milc_test, tmp_path_factory):
    """Every case's output, the cases run two at a time (the CI machine's two cores: ``hmc check --milc --jobs
    2``); each test below then compares its own case's output (``--test-out``)."""
    out, lines = tmp_path_factory.mktemp("milc_cases"), []
    check_milc(milc_test, CASES, search=[FIXTURES], out_dir=out, log=lines.append, jobs=2, show_progress=False)
    return out, lines


@pytest.mark.parametrize("case", CASES)
def test_case_passes_milc_comparison(milc_test, outputs, case):
    folder, run_log = outputs
    lines = [ln for ln in run_log if case in ln]          # what the run said of this case (an hmc milc failure)
    test_out = folder / f"{case}.test-out"
    assert test_out.exists(), "\n".join(lines)
    failed = check_milc(milc_test, [case], test_out=test_out, log=lines.append, show_progress=False)
    assert failed == 0, "\n".join(lines)
    assert test_out.read_text().count("G_LOOP:") >= 34
