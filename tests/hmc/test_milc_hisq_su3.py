"""MILC's su3_rhmc_hisq_su3 build (HISQ links with the SU(3) unitarization group): its sample deck
su3_rhmc_hisq_su3.f2111 (May 2009, not in MILC's checklist) run by ``hmc check --milc`` as MILC's checklist would run
it, at PRECISION 2 and 1 (the single-precision build's output compared with the double run in that build's formats),
every selected line from delta S on within its errtol; and the start action, which the errtol does not select."""
import pytest

from conftest import FIXTURES
from hmc.milc.runner import check_milc

MILC_TEST = FIXTURES / "ks_imp_rhmc"
CASE = "su3_rhmc_hisq_su3.f2111"
CHECKLIST = "".join(f"exec su3_rhmc_hisq_su3  {p}  -  f2111  delta RUNNING 'SELECT=PBP|DG|PLAQ|ACTION|delta|G_LOOP'\n"
                    for p in (1, 2))


def test_milc_su3_rhmc_hisq_su3_f2111(tmp_path):
    if not (MILC_TEST / f"{CASE}.2.sample-in").exists():
        pytest.skip(f"MILC's test folder {MILC_TEST} is absent (the shared fixtures folder ../shared/fixtures/milc/)")
    folder = tmp_path / "test"
    folder.mkdir()
    (folder / "checklist").write_text(CHECKLIST)
    for p in MILC_TEST.glob(f"{CASE}.*"):
        (folder / p.name).symlink_to(p)
    for p in MILC_TEST.glob("rationals.*"):
        (folder / p.name).symlink_to(p)
    lines = []
    failed = check_milc(folder, [], search=[FIXTURES], out_dir=tmp_path / "out", log=lines.append)
    assert failed == 0, "\n".join(lines)
    out = (tmp_path / "out" / f"{CASE}.2.test-out").read_text().splitlines()
    sample = (MILC_TEST / f"{CASE}.2.sample-out").read_text().splitlines()
    # the start action: g and h to MILC's digits, f (through the SU(3) links) to 3e-7
    start = [l for l in out if l.startswith("ACTION:")][0].split("=")[1].split()
    milc = [l for l in sample if l.startswith("ACTION:")][0].split("=")[1].split()
    assert [float(a) for a in start[:2]] == pytest.approx([float(b) for b in milc[:2]], abs=1e-9)
    assert abs(float(start[2]) - float(milc[2])) < 1e-6
