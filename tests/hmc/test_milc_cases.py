"""MILC's own regression suite (ks_imp_rhmc/test): every case of the checklist is
run by ``hmc check --milc`` (its sample deck through ``hmc milc``, in a fresh process) and must pass MILC's
comparison with the sample output under its errtol file. One core: 12-30 s CPU per case (runs/milc/README.md); the
run starts in the background when the session's collection ends (tests/background.py), on the core the serial suite
leaves idle.
"""
import sys

import pytest

from fixture_paths import FIXTURES
from hmc.milc.compare import read_checklist
from hmc.milc.runner import check_milc
from tests import background
from tests.conftest import launch_env, numpy_simd_pinned

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


def _check_command(folder):
    """``hmc check --milc`` of every case, two at a time (``--jobs 2``), the outputs kept in ``folder/out``."""
    return [sys.executable, "-m", "hmc", "check", "--milc", str(MILC_TEST), *CASES, "--search", str(FIXTURES),
            "--out-dir", str(folder / "out"), "--jobs", "2", "--no-progress"]


background.register("milc_case_outputs", _check_command, launch_env({"OPENBLAS_NUM_THREADS": "1", **numpy_simd_pinned()}), "test_milc_cases")


@pytest.fixture(scope="module")
def milc_case_outputs(milc_test):
    """Every case's output (the background run of :func:`_check_command`) and what that run printed; each test
    below then compares its own case's output (``--test-out``)."""
    run = background.result("milc_case_outputs")
    return run.folder / "out", (run.stdout + run.stderr).splitlines()


@pytest.mark.parametrize("case", CASES)
def test_case_passes_milc_comparison(milc_test, milc_case_outputs, case):
    folder, run_log = milc_case_outputs
    lines = [ln for ln in run_log if case in ln]          # what the run said of this case (an hmc milc failure)
    test_out = folder / f"{case}.test-out"
    assert test_out.exists(), "\n".join(lines)
    failed = check_milc(milc_test, [case], test_out=test_out, log=lines.append, show_progress=False)
    assert failed == 0, "\n".join(lines)
    assert test_out.read_text().count("G_LOOP:") >= 34
