"""Background runs of tests/hmc (tests/background.py): the project's TOML twins of MILC's test decks
(runs/milc_*.toml), each run once per session by ``hmc init`` + ``hmc run`` in a fresh process at the lowest CPU
priority, on the core the serial suite leaves idle. A test asks for a twin by fixture name (``twin_...``) and gets
its printed lines and its run file; every comparison with MILC's output stays in the test. A twin used by two
tests (su3_rhmc_hisq.2: test_rhmc.py and test_milc_loops.py) runs once."""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass

import pytest

from tests import background
from tests.conftest import ROOT, fixture_path, launch_env, numpy_simd_pinned

# fixture name: (deck in runs/, MILC's lattice it starts from, MILC's rational functions or None: the deck's own,
# the first test file that uses it)
TWINS = {
    "twin_su3_leapfrog": ("milc_su3_leapfrog.toml", "lat.sample.l6666b650m010m050", None, "test_milc_asqtad"),
    "twin_su3_omelyan_rhmc": ("milc_su3_omelyan_rhmc.toml", "lat.sample.l6666b650m010m050", None, "test_milc_asqtad"),
    "twin_su3_rhmc_hisq": ("milc_su3_rhmc_hisq.toml", "lat.sample.l6666.hisq", "rationals.sample.su3_rhmc_hisq",
                           "test_milc_loops"),
    "twin_su3_rhmc_hisq_f211": ("milc_su3_rhmc_hisq_f211.toml", "lat.sample.hisq.f211b670.l6666",
                                "rationals.sample.su3_rhmc_hisq_f211", "test_rhmc"),
}


@dataclass
class Twin:
    """A twin's trajectories: ``lines``, what ``hmc run`` printed (MILC's lines and the project's summaries);
    ``path``, its run file (read it with hmc.runfile.load; shared: do not write to it)."""
    lines: list
    path: str


def _twin_command(deck: str, lattice: str, rationals: str | None):
    def command(folder):
        out = str(folder / "t.h5")
        init = [sys.executable, "-m", "hmc", "init", str(ROOT / "runs" / deck), "-o", out, "--from-lattice",
                str(fixture_path(lattice))] + (["--rationals", str(fixture_path(rationals))] if rationals else [])
        run = [sys.executable, "-m", "hmc", "run", out, "--no-progress"]
        script = f"{shlex.join(init)} > init.log && exec {shlex.join(run)}"
        return ["sh", "-c", script]
    return command


def twin_result(name: str) -> Twin:
    r = background.result(name)
    assert r.returncode == 0, f"{r.command} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return Twin(r.stdout.splitlines(), str(r.folder / "t.h5"))


def _twin_fixture(name: str):
    @pytest.fixture(scope="session", name=name)
    def fixture():
        return twin_result(name)
    return fixture


for _name, (*_args, _first_user) in TWINS.items():
    background.register(_name, _twin_command(*_args), launch_env({"OPENBLAS_NUM_THREADS": "1", **numpy_simd_pinned()}), _first_user)
    globals()[_name] = _twin_fixture(_name)
