"""MILC's su3_rhmc_hisq_su3 build (HISQ links with the SU(3) unitarization group): its sample deck
su3_rhmc_hisq_su3.f2111 (May 2009, not in MILC's checklist) run by ``hmc check --milc`` as MILC's checklist would run
it, at PRECISION 2 and 1 (the single-precision build's output compared with the double run in that build's formats),
every selected line from delta S on within its errtol; and the start action, which the errtol does not select."""
import pytest

from fixture_paths import FIXTURES
from hmc.milc.runner import check_milc
from milc_folders import MILC_TEST, checklist_folder

CASE = "su3_rhmc_hisq_su3.f2111"


def test_milc_su3_rhmc_hisq_su3_f2111(tmp_path):
    folder = checklist_folder(tmp_path / "test", "su3_rhmc_hisq_su3", "f2111", "delta")
    lines = []
    failed = check_milc(folder, [], search=[FIXTURES], out_dir=tmp_path / "out", log=lines.append, jobs=2)
    assert failed == 0, "\n".join(lines)
    out = (tmp_path / "out" / f"{CASE}.2.test-out").read_text().splitlines()
    sample = (MILC_TEST / f"{CASE}.2.sample-out").read_text().splitlines()
    # the start action: g and h to MILC's digits, f (through the SU(3) links) to 3e-7
    start = [l for l in out if l.startswith("ACTION:")][0].split("=")[1].split()
    milc = [l for l in sample if l.startswith("ACTION:")][0].split("=")[1].split()
    assert [float(a) for a in start[:2]] == pytest.approx([float(b) for b in milc[:2]], abs=1e-9)
    assert abs(float(start[2]) - float(milc[2])) < 1e-6
