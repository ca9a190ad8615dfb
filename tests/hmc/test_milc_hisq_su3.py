"""MILC's su3_rhmc_hisq_su3 build (HISQ links with the SU(3) unitarization group): its sample deck
su3_rhmc_hisq_su3.f2111 (May 2009, not in MILC's checklist) run by ``hmc check --milc`` as MILC's checklist would run
it, at PRECISION 2 and 1 (the single-precision build's output compared with the double run in that build's formats),
every selected line from delta S on within its errtol; and the start action, which the errtol does not select. The
check runs in the background from the end of the collection (tests/background.py)."""
import sys

import pytest

from fixture_paths import FIXTURES
from milc_folders import MILC_TEST, checklist_folder
from tests import background
from tests.conftest import launch_env

CASE = "su3_rhmc_hisq_su3.f2111"


def _check_command(folder):
    """``hmc check --milc`` of a checklist of the case at PRECISION 1 and 2, two at a time, outputs in folder/out."""
    test = checklist_folder(folder / "test", "su3_rhmc_hisq_su3", "f2111", "delta")
    return [sys.executable, "-m", "hmc", "check", "--milc", str(test), "--search", str(FIXTURES), "--out-dir",
            str(folder / "out"), "--jobs", "2", "--no-progress"]


background.register("su3_f2111_check", _check_command, launch_env({"OPENBLAS_NUM_THREADS": "1"}),
                    "test_milc_hisq_su3")


@pytest.fixture
def su3_f2111_check():
    return background.result("su3_f2111_check")


def test_milc_su3_rhmc_hisq_su3_f2111(su3_f2111_check):
    r = su3_f2111_check
    assert r.returncode == 0 and "2 cases, 0 failed" in r.stdout, r.stdout + r.stderr      # hmc check: 0 failed
    out = (r.folder / "out" / f"{CASE}.2.test-out").read_text().splitlines()
    sample = (MILC_TEST / f"{CASE}.2.sample-out").read_text().splitlines()
    # the start action: g and h to MILC's digits, f (through the SU(3) links) to 3e-7
    start = [l for l in out if l.startswith("ACTION:")][0].split("=")[1].split()
    milc = [l for l in sample if l.startswith("ACTION:")][0].split("=")[1].split()
    assert [float(a) for a in start[:2]] == pytest.approx([float(b) for b in milc[:2]], abs=1e-9)
    assert abs(float(start[2]) - float(milc[2])) < 1e-6
