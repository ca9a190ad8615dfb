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


@pytest.fixture(scope="module")
def one_trajectory(tmp_path_factory):
    """``hmc bench rhmc`` of one 4^4 trajectory on the CPU: (completed process, its output folder)."""
    tmp_path = tmp_path_factory.mktemp("bench_rhmc")
    r = subprocess.run([sys.executable, "-m", "hmc", "--backend", "numpy", "bench", "rhmc", "--lattice", "4",
                        "--deck", "runs/hisq211_8.toml", "--trajectories", "1", "--steps-for", "4=4", "--out",
                        str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=launch_env(), timeout=600)
    return r, tmp_path


def test_one_trajectory_and_its_report(one_trajectory):
    r, tmp_path = one_trajectory
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[1] == "== 4x4x4x4 on numpy: 3g1f steps 4 tau 1.0, 5 pseudofermions", r.stdout
    assert re.match(r"traj 1: total +[\d.]+ s \| solvers +[\d.]+ s \(", lines[2]), lines[2]
    assert "multishift iterations GR" in lines[3] and "Dslash share of solver time" in lines[3]
    assert "solver CUDA graphs" not in r.stdout          # none on the CPU (the history holds zeros)
    for name in ("hisq211_4_numpy.toml", "hisq211_4_numpy.h5", "init_4_numpy.log", "run_4_numpy.log"):
        assert (tmp_path / name).is_file(), name


# bytes a site of each floor on the 4^4 run of runs/hisq211_8.toml (bench/rhmc_floors.py's formulas, by hand): the
# deck's pseudofermions have 9/11/11 (MD/GR/FA) poles, then four of 7/9/9; two Naik-epsilon groups; all in double
# The deck stops converged shifts (stop_converged_shifts): the MD floor is its iterations x (A + the base
# system's 5 vectors) plus the shift updates made x 4 vectors
FLOOR_BYTES = {"solvers GR": 2864 + (5 + 4 * 9) * 24, "solvers FA": 2864 + (5 + 4 * 9) * 24,
               "solvers MD": 2864 + 5 * 24, "link smearing": 144 * (16 + 8 * 2),
               "fermion force: outer products": (9 + 4 * 7) * (1560 + 48) + 8 * 144 * 2,
               "fermion force: chain rule": 144 * (16 + 8 * 2), "gauge force": 12 * 144}


def test_each_phase_has_its_floor_and_the_fraction_reached(one_trajectory):
    """The table after each trajectory: time, floor = counts x bytes a site x V / (measured copy bandwidth), floor /
    time; the JSON beside it holds the same rows."""
    import json

    r, tmp_path = one_trajectory
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if "floors at copy bandwidth" in line)
    assert "outside the molecular dynamics: momenta" in lines[head - 1]     # the trajectory's own timers
    bw = float(re.search(r"floors at copy bandwidth ([\d.]+) GB/s", lines[head]).group(1))
    got, shift_updates = {}, None
    for line in lines[head + 1:head + 8]:
        m = re.match(r"^ {8}(.+?) +([\d.e+-]+) +([\d.e+-]+) +([\d.]+)%  (\d+) "
                     r"(?:iterations|builds|evaluations|calls) x (\d+) B/site", line)
        assert m, line
        got[m.group(1)] = [float(m.group(i)) for i in (2, 3, 4)] + [int(m.group(5)), int(m.group(6))]
        if m.group(1) == "solvers MD":
            shift_updates = re.search(r"\+ (\d+) shift updates x (\d+) B/site", line)
    assert {k: v[4] for k, v in got.items()} == FLOOR_BYTES
    assert shift_updates and int(shift_updates.group(2)) == 4 * 24          # x_i and p_i read and written
    extra = {"solvers MD": int(shift_updates.group(1)) * 4 * 24}
    data = json.loads((tmp_path / "floors_4_numpy.json").read_text())
    (traj,) = data["trajectories"]
    assert traj["copy_GBps"] == pytest.approx(bw, abs=0.05) and data["lattice"] == [4, 4, 4, 4]
    rows = {p["phase"]: p for p in traj["phases"]}
    assert set(rows) == set(FLOOR_BYTES)
    for name, (t, floor, pct, count, per_site) in got.items():
        p = rows[name]
        assert p["floor_s"] == pytest.approx((count * per_site + extra.get(name, 0)) * 4 ** 4
                                             / (traj["copy_GBps"] * 1e9), rel=1e-12)
        assert p["fraction"] == pytest.approx(p["floor_s"] / p["time_s"], rel=1e-12) and 0 < p["fraction"] < 1
        assert (t, floor) == pytest.approx((p["time_s"], p["floor_s"]), rel=1e-3) and pct == pytest.approx(
            100 * p["fraction"], abs=6e-3)
    it = re.search(r"multishift iterations GR (\d+) FA (\d+) MD (\d+)", lines[3])
    assert [got[f"solvers {ph}"][3] for ph in ("GR", "FA", "MD")] == [int(x) for x in it.groups()]
    assert got["gauge force"][3] == 3 * 4 and got["fermion force: chain rule"][3] == 4   # 3G1F, 4 steps
    assert "GFLOP a call" in lines[head + 7]
    # the staged kernels' own byte model beside the smearing and chain-rule floors: 2 levels of 64 and 120 matrices
    for name, per_site in (("link smearing", 2 * 64 * 144), ("fermion force: chain rule", 2 * 120 * 144)):
        line = next(x for x in lines[head + 1:head + 8] if x.lstrip().startswith(name))
        assert f"the staged kernels' model {per_site} B/site" in line, line
        assert rows[name]["model_s"] == pytest.approx(got[name][3] * per_site * 4 ** 4 / (traj["copy_GBps"] * 1e9),
                                                      rel=1e-12)
    assert all(rows[n]["model_s"] is None for n in rows if n not in ("link smearing", "fermion force: chain rule"))


def test_make_deck_sets_the_solver_precisions(tmp_path):
    """--cgprec MD FA GR: the same cgprec_md_fa_gr triple for each of the deck's pseudofermions, which the deck
    reader takes (and the default leaves the deck's precisions alone)."""
    from bench.rhmc import make_deck
    from hmc import deck as deckmod
    from tests.conftest import ROOT

    out = tmp_path / "d.toml"
    make_deck(ROOT / "runs" / "hisq211_16.toml", out, 8, 12, 2, (1, 2, 2))
    d = deckmod.loads(out.read_text())
    assert d["fermions"]["cgprec_md_fa_gr"] == [[1, 2, 2]] * len(d["fermions"]["cgresid_md_fa_gr"])
    make_deck(ROOT / "runs" / "hisq211_16.toml", out, 8, 12, 2)
    assert deckmod.loads(out.read_text())["fermions"]["cgprec_md_fa_gr"] == []


@pytest.mark.parametrize("tty,no_progress", [(True, False), (True, True), (False, False)])
def test_trajectory_runs_show_hmc_runs_progress_on_a_terminal(monkeypatch, tty, no_progress):
    """bench rhmc / precision: the run's own progress line reaches a terminal on stderr unless --no-progress; off a
    terminal (or with it) stdout and stderr go to the log and hmc run draws nothing."""
    from bench import rhmc

    seen = {}
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty, raising=False)
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: seen.update(argv=argv, **kw) or
                        subprocess.CompletedProcess(argv, 0))
    log = object()
    assert rhmc.run_trajectories("numpy", "r.h5", 3, log, progress=not no_progress) == 0
    show = tty and not no_progress
    assert ("--no-progress" in seen["argv"]) == (not show)
    argv = seen["argv"]
    assert argv[argv.index("run"):argv.index("run") + 4] == ["run", "r.h5", "--trajectories", "3"]
    assert seen["stdout"] is log and seen["stderr"] is (None if show else log)


def test_report_line_of_the_solver_graphs():
    """A trajectory whose solvers captured CUDA graphs (the GPU) gets a line with the captures, their host seconds
    and the launches (history columns graph_captures, graph_replays, time_fermion_graph_capture); an older run file
    without the columns (-1) none."""
    from bench.rhmc import _trajectory_lines

    row = {"traj": 2, "cg_gr": 10, "cg_fa": 10, "cg_md": 40, "dH": 0.1, "plaq_ss": 1.5, "plaq_st": 1.5,
           "time_total": 2.0, "time_fermion_solver_MD": 1.0, "fermion_link_builds": 5}
    got = _trajectory_lines(dict(row, graph_captures=31, graph_replays=293, time_fermion_graph_capture=0.1885), None)
    assert got[2] == ("        solver CUDA graphs: 31 captured (0.189 s of host time, inside the solver times), "
                      "293 launches")
    assert not any("CUDA graphs" in x for x in _trajectory_lines(dict(row, graph_captures=-1, graph_replays=-1),
                                                                None))


def test_report_line_of_the_stopped_shifts():
    """A trajectory whose MD solves stopped converged shifts ([fermions] stop_converged_shifts) gets the line of the
    shift updates made against shifts x iterations; one that updated every shift, or an older file (-1), none."""
    from bench.rhmc import _trajectory_lines

    row = {"traj": 2, "cg_gr": 10, "cg_fa": 10, "cg_md": 40, "dH": 0.1, "plaq_ss": 1.5, "plaq_st": 1.5,
           "time_total": 2.0, "time_fermion_solver_MD": 1.0, "fermion_link_builds": 5}
    got = _trajectory_lines(dict(row, shift_slots_md=360, shift_updates_md=102), None)
    assert got[2] == "        MD shift updates: 102 of 360 (28.3 %: the converged shifts stopped)"
    for slots, made in ((360, 360), (-1, -1)):
        assert not any("shift updates" in x for x in _trajectory_lines(dict(row, shift_slots_md=slots,
                                                                               shift_updates_md=made), None))


def test_md_floor_follows_the_runs_half_links():
    """A single-precision solve's hop counts the links the run kept in 16 bits (bench.rhmc_floors, from the run
    file's configuration); double-precision solves are unchanged."""
    from bench.rhmc_floors import solver_iteration_bytes

    v = 4 ** 4
    vectors = 5 * 24 * v // 2
    assert solver_iteration_bytes(v, 0, True) == 1432 * v + vectors
    assert solver_iteration_bytes(v, 0, True, "naik") == 1304 * v + vectors
    assert solver_iteration_bytes(v, 0, True, "all") == 1048 * v + vectors
    assert solver_iteration_bytes(v, 0, False, "all") == solver_iteration_bytes(v, 0, False) == 2864 * v + 2 * vectors
