"""Where the tests find the checkout and MILC's reference files: ``from fixture_paths import FIXTURES, ROOT`` (a
module of its own, not ``conftest``: with several conftest.py files in the tree, ``import conftest`` names whichever
was imported first)."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# MILC's reference files: ../shared/fixtures/milc/ beside the checkout, or HMC_MILC_FIXTURES (for a copy carried
# to the GPU machine, which has no ../shared/fixtures).
FIXTURES = Path(os.environ.get("HMC_MILC_FIXTURES", ROOT.parent / "shared" / "fixtures" / "milc"))
