"""``hmc scaling --what rhmc``: one short HISQ 2+1+1 RHMC trajectory per timed loop, on 4^4 over 1 and 2 ranks:
answers agree, phases and graph counters stored, report rendered; the operation's deck, phase split and answer
comparison."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.bench.scaling_helpers import MPIEXEC, hmc, needs_mpi
from tests.conftest import ROOT

pytestmark = pytest.mark.mpi

h5py = pytest.importorskip("h5py")

# the RHMC trajectory (--what rhmc)

RHMC_STUDY = ["--lattice", "4^4", "--ranks", "1", "2", "--transports", "mpi", "--what", "rhmc", "--repeats", "1",
              "--traj-steps", "2", "--halo-sizes", "--timeout", "150"]


@pytest.fixture(scope="module")
def rhmc_study(tmp_path_factory):
    """One short HISQ 2+1+1 RHMC trajectory per timed loop on 4^4, 1 rank and 2 ranks (mpi): 2 + 2 trajectories."""
    if MPIEXEC is None:
        pytest.skip("mpiexec is not on PATH")
    path = tmp_path_factory.mktemp("scaling_rhmc") / "rhmc.h5"
    r = hmc(RHMC_STUDY + ["-o", str(path)], timeout=300)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return path, r


@needs_mpi
def test_rhmc_study_answers_agree_and_phases_are_stored(rhmc_study):
    from bench.scaling.worker_context import RHMC_PHASES, RHMC_TAU

    path, r = rhmc_study
    assert "2 configuration(s) run, 0 failed" in r.stdout and " rhmc " in r.stdout
    with h5py.File(path, "r") as f:
        assert json.loads(f.attrs["parameters"])["rhmc_tau"] == RHMC_TAU
        assert set(f["configs"]) == {"l4x4x4x4_n1_serial", "l4x4x4x4_n2_mpi"}
        one, two = f["configs"]["l4x4x4x4_n1_serial"], f["configs"]["l4x4x4x4_n2_mpi"]
        a1, a2 = json.loads(one.attrs["answers"]), json.loads(two.attrs["answers"])
        assert set(a1) == set(a2) == {"rhmc_dH", "rhmc_H_end", "rhmc_plaquette", "rhmc_cg_iterations"}
        assert a1["rhmc_cg_iterations"] == a2["rhmc_cg_iterations"] > 100
        assert abs(a1["rhmc_dH"]) < 0.1 and a1["rhmc_H_end"] > 1e3              # a modest dH, a real action
        assert abs(a2["rhmc_dH"] - a1["rhmc_dH"]) <= 1e-10 * a1["rhmc_H_end"]
        assert np.isclose(a2["rhmc_plaquette"], a1["rhmc_plaquette"], rtol=1e-12, atol=0)
        assert bool(two.attrs["answers_agree"]), two.attrs["answers_note"]
        note = two.attrs["answers_note"]
        assert "RHMC CG iterations equal" in note and "RHMC dH diff" in note and "RHMC H rel. diff" in note
        for g, n in ((one, 1), (two, 2)):
            d = g["rhmc"]
            assert g.attrs["status"] == "ok" and d.attrs["reps"] == 1 and d.attrs["steps"] == 2
            assert d.attrs["tau"] == RHMC_TAU and d.attrs["repeatable"]
            assert json.loads(d.attrs["cg_iterations"])["md"] > 0 and d.attrs["link_builds"] >= 3
            graphs = json.loads(d.attrs["graphs"])           # CUDA-graph captures per rank: none on the CPU
            assert graphs["names"] == ["graph_capture_s", "graph_captures", "graph_replays"]
            assert graphs["per_rank"] == [[0.0, 0.0, 0.0]] * n
            s = d["samples_s"][()]
            assert s.shape == (1,) and s[0] > 0
            ph = d["phases"][()]
            assert ph.shape == (n, len(RHMC_PHASES)) and list(d["phases"].attrs["names"]) == list(RHMC_PHASES)
            assert ph.min() >= 0 and ph[:, :3].min() > 0                   # every solve phase was timed
            # the phases of a rank add up to its trajectory time; the sample is the slowest rank's
            assert np.all(ph.sum(axis=1) <= s[0] * 1.01) and np.all(ph.sum(axis=1) >= 0.5 * s[0])
        eff = two["rhmc"].attrs["efficiency"]
        assert eff > 0 and np.isclose(eff * 2 * two["rhmc"].attrs["median_s"], one["rhmc"].attrs["median_s"])
        summary = f["summary"][()]
        assert np.all(summary["rhmc_s"] > 0) and np.all(summary["rhmc_efficiency"] > 0)
        assert np.all(np.isnan(summary["dslash_s"]))


@needs_mpi
def test_rhmc_study_report(rhmc_study):
    path, r = rhmc_study
    md = (path.with_name("rhmc_report") / "report.md").read_text()
    # the time unit follows the slowest trajectory (ms below 2 s, s above)
    assert re.search(r"RHMC traj\. (ms|s) \| RHMC speed-up \| RHMC eff\. \| RHMC solver share \| answers agree \|", md)
    rows = [l for l in md.splitlines() if l.startswith("| 1 | 1x1x1x1 |") or l.startswith("| 2 | 1x1x1x2 |")]
    assert len(rows) == 2 and all(l.rstrip().endswith("| yes |") for l in rows)
    assert rows[0].split(" | ")[6:8] == ["1.00", "1.00"]                  # the baseline's speed-up and efficiency
    assert "3G1F with 2 steps, tau 0.05" in md and "multishift CG iterations per trajectory GR" in md
    for name in ("time_vs_ranks.png", "speedup_efficiency.png", "phases.png"):
        p = path.with_name("rhmc_report") / name
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000, name
        assert f"]({name})" in md
    assert " rhmc " in r.stdout.split("report:")[1] and "eff.rhmc" in r.stdout      # the terminal table


def test_rhmc_deck_and_phases():
    """The rhmc operation's deck goes through the project's deck machinery, with the package's rational functions,
    and its phase split adds up to the trajectory's time without counting the fermion force's parts twice."""
    from hmc import deck as deckmod
    from hmc.assemble import make_monomials, make_schedule
    from bench.scaling.ops import rhmc_deck, rhmc_phases
    from bench.scaling.worker_context import RHMC_PHASES, RHMC_TAU

    d = deckmod.loads(rhmc_deck((4, 4, 4, 8), 4))
    assert d["lattice"]["dims"] == [4, 4, 4, 8] and d["integrator"]["steps"] == 4
    assert d["integrator"]["tau"] == RHMC_TAU and d["integrator"]["scheme"] == "3g1f"
    assert d["fermions"]["dyn_mass"] == [0.013, 0.065, 0.838] and d["gauge"]["beta"] == 5.8
    assert d["fermions"]["rationals"] == str(ROOT / "runs" / "rationals" / "rationals.hisq211_b580")
    mons = make_monomials(d)
    assert [m.kind for m in mons] == ["gauge", "fermion"] and len(mons[1].terms) == 5
    assert make_schedule(d, mons)
    timers = {"links": 0.5, "force_gauge": 1.0, "force_fermion": 9.0, "total": 20.0}
    fermion = {"time_fermion_links": 1.0, "time_fermion_solver_GR": 2.0, "time_fermion_solver_FA": 3.0,
               "time_fermion_solver_MD": 5.0, "time_fermion_outer": 1.0, "time_fermion_force_chain": 2.0}
    ph = dict(zip(RHMC_PHASES, rhmc_phases(timers, fermion, ["gauge"])))
    assert ph == {"solver_gr": 2.0, "solver_fa": 3.0, "solver_md": 5.0, "fermion_links": 1.0, "fermion_force": 3.0,
                  "gauge_force": 1.0, "link_update": 0.5, "other": 4.5}


def test_rhmc_answers_comparison():
    from bench.scaling.study import compare_answers

    ref = {"rhmc_dH": 0.01, "rhmc_H_end": 5000.0, "rhmc_plaquette": 3.6, "rhmc_cg_iterations": 700}
    agree, note = compare_answers(ref, dict(ref, rhmc_dH=0.01 + 1e-8))
    assert agree and "RHMC dH diff 1.0e-08" in note
    agree, note = compare_answers(ref, dict(ref, rhmc_dH=0.01 + 1e-5))
    assert not agree and "RHMC dH diff" in note
    agree, note = compare_answers(ref, dict(ref, rhmc_H_end=5000.0 * (1 + 1e-9)))
    assert not agree and "RHMC H rel. diff" in note
    agree, note = compare_answers(ref, dict(ref, rhmc_cg_iterations=701))
    assert not agree and "RHMC CG iterations 701 vs 700" in note
    agree, note = compare_answers(ref, dict(ref, rhmc_cg_iterations=701), bitwise=False)    # GPU rounding
    assert agree and "(GPU rounding)" in note
    assert not compare_answers(ref, dict(ref, rhmc_cg_iterations=720), bitwise=False)[0]


def test_rhmc_is_not_run_on_graph_rows():
    """A CUDA-graph row times the captured dslash and CG only: its RHMC trajectory is the uncaptured row's (n/a)."""
    from bench.scaling.worker import run

    res = run({"key": "l4x4x4x4_n1_graph", "lattice": [4, 4, 4, 4], "ranks": 1, "transport": "serial",
               "grid": [1, 1, 1, 1], "what": ["rhmc"], "graph": True, "backend": "numpy", "traj_steps": 2,
               "repeats": 1, "min_time": 0.0})
    assert res["status"] == "ok" and res["ops"]["rhmc"]["status"] == "n/a" and not res["answers"]
