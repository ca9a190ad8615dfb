"""Folders the MILC tests build: a deck beside the project's copy of MILC's rational functions, and a MILC test
folder of one's own (a checklist naming cases that MILC's does not, beside links to MILC's decks and outputs)."""
import shutil

import pytest

from fixture_paths import FIXTURES, ROOT

MILC_TEST = FIXTURES / "ks_imp_rhmc"
SELECT = "'SELECT=PBP|DG|PLAQ|ACTION|delta|G_LOOP'"


def rationals_into(folder, name: str = "rationals.su3_rhmc_hisq"):
    """The project's copy of MILC's su3_rhmc_hisq rational functions, written into ``folder`` as ``name``."""
    shutil.copy(ROOT / "runs" / "rationals" / "rationals.su3_rhmc_hisq", folder / name)
    return folder / name


def checklist_folder(folder, executable: str, case: str, start: str):
    """``folder`` as a MILC test folder for one case at PRECISION 1 and 2 (checklist lines ``exec EXECUTABLE P -
    CASE START RUNNING SELECT=...``) with links to MILC's files of that case and its rational functions; skips the
    test when MILC's fixtures are absent."""
    prefix = executable if case == "-" else f"{executable}.{case}"
    if not (MILC_TEST / f"{prefix}.2.sample-in").exists():
        pytest.skip(f"MILC's test folder {MILC_TEST} is absent (the shared fixtures folder ../shared/fixtures/milc/)")
    folder.mkdir()
    (folder / "checklist").write_text("".join(f"exec {executable}  {p}  -  {case}  {start} RUNNING {SELECT}\n"
                                              for p in (1, 2)))
    for p in list(MILC_TEST.glob(f"{prefix}.*")) + list(MILC_TEST.glob("rationals.*")):
        (folder / p.name).symlink_to(p)
    return folder
