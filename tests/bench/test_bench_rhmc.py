"""``hmc bench rhmc`` (bench/rhmc.py, the suite ``rhmc``) on the CPU: the deck written from the production deck,
one 4^4 trajectory through ``hmc init`` and ``hmc run``, and the per-phase report read back from the run file."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest

from tests.conftest import ROOT, launch_env


def test_deck_takes_lattice_steps_rationals_and_counts(tmp_path):
    from bench.rhmc import RATIONALS, make_deck

    make_deck(ROOT / "runs" / "hisq211_8.toml", tmp_path / "d.toml", 4, 6, 3)
    d = tomllib.loads((tmp_path / "d.toml").read_text())
    src = tomllib.loads((ROOT / "runs" / "hisq211_8.toml").read_text())
    assert d["lattice"]["dims"] == [4, 4, 4, 4] and d["integrator"]["steps"] == 6
    assert d["fermions"]["rationals"] == str(RATIONALS) and RATIONALS.is_file()
    assert d["run"]["trajectories"] == 3 and d["run"]["warmups"] == 3
    assert d["integrator"]["tau"] == src["integrator"]["tau"] and d["gauge"] == src["gauge"]


def test_steps_for_the_lattice():
    import argparse

    from bench.rhmc import steps_for

    a = argparse.Namespace(steps=None, steps_for=["32=36", "16=20"], lattice=32)
    assert steps_for(a) == 36
    assert steps_for(argparse.Namespace(steps=None, steps_for=["32=36"], lattice=8)) is None
    assert steps_for(argparse.Namespace(steps=7, steps_for=["32=36"], lattice=32)) == 7
    with pytest.raises(SystemExit, match="write L=STEPS"):
        steps_for(argparse.Namespace(steps=None, steps_for=["32:36"], lattice=32))


def test_one_trajectory_and_its_report(tmp_path):
    r = subprocess.run([sys.executable, "-m", "hmc", "--backend", "numpy", "bench", "rhmc", "--lattice", "4",
                        "--deck", "runs/hisq211_8.toml", "--trajectories", "1", "--steps-for", "4=4", "--out",
                        str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=launch_env(), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[1] == "== 4x4x4x4 on numpy: 3g1f steps 4 tau 1.0, 5 pseudofermions", r.stdout
    assert re.match(r"traj 1: total +[\d.]+ s \| solvers +[\d.]+ s \(", lines[2]), lines[2]
    assert "multishift iterations GR" in lines[3] and "Dslash share of solver time" in lines[3]
    for name in ("hisq211_4_numpy.toml", "hisq211_4_numpy.h5", "init_4_numpy.log", "run_4_numpy.log"):
        assert (tmp_path / name).is_file(), name
