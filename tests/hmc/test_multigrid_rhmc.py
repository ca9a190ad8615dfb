"""Multigrid for the smallest shifts of the light pseudofermion's heat-bath (GR) and action (FA) solves (issue 7,
docs/multigrid.md 7): the pole p acts as a mass sqrt(p)/2, solved as the even part of a full-lattice multigrid solve;
multishift CG keeps the other poles. On a smooth 4^4 HISQ field with MILC's 2+1+1 rational functions the
pseudofermion and the action agree with all-CG to the solver tolerance, the near-null vectors are kept across
poles and refreshed (not rebuilt) after a gauge update, and the MD solves stay multishift CG."""
import math

import numpy as np
import pytest

from hmc.rhmc import FermionMonomial, PseudofermionTerm
from hmc.rational_file import read_rationals
from hmc.momenta import random_momenta
from lattice import CounterRNG, GaugeField, Geometry, su3
from solvers.multigrid.shifts import MultigridShiftInverse, MultigridShifts
from tests.conftest import fixture_path
from tests.hmc.hisq211_decks import LIGHT, cgresid_triples, hisq211_deck

TOL = 1e-10


def smooth_field(geom, rng, spread=0.3):
    return GaugeField(geom, su3.expm_su3(spread * random_momenta(geom, rng, "smooth")) @ GaugeField.unit(geom).links)


def monomial(pfs, which):
    return FermionMonomial([PseudofermionTerm(pfs[i], TOL, TOL, TOL, 10000) for i in which])


def test_light_shifts_by_multigrid_agree_with_all_cg():
    pfs = read_rationals(fixture_path("rationals.sample.su3_rhmc_hisq_f211"))
    geom = Geometry((4, 4, 4, 4))
    u = smooth_field(geom, CounterRNG(5))
    ref, mg = monomial(pfs, [0, 1]), monomial(pfs, [0, 1])
    shifts = MultigridShifts(2, nv=8, setup_iters=30)
    mg.use_multigrid(shifts)
    assert mg.multigrid_terms == (0,)                       # pseudofermion 0 holds the light mass
    ref.refresh(u, CounterRNG(9))
    mg.refresh(u, CounterRNG(9))
    for a, b in zip(ref.phi, mg.phi):
        assert math.sqrt(float(np.vdot(a - b, a - b).real) / float(np.vdot(a, a).real)) < 10 * TOL
    s_ref, s_mg = ref.action(u), mg.action(u)
    assert abs(s_mg - s_ref) <= 10 * TOL * abs(s_ref)
    gr = mg.stats.records("GR")
    infos = gr[0].stats.extra["multigrid"]
    poles = sorted(pfs[0]["GR"].poles)
    assert [i["pole"] for i in infos] == poles[:2] and all(i["residual"] <= TOL for i in infos)
    assert "multigrid" not in gr[1].stats.extra                        # pseudofermion 1: all CG
    # one call shape: the multigrid's poles come from a shift inverter factory as every other solve's
    ls = mg.links(u)
    A = ls.ops[mg.terms[0].naik_epsilon][1]
    assert isinstance(mg._shift_inverter(ls, 0, "GR")(A), MultigridShiftInverse)
    assert not isinstance(mg._shift_inverter(ls, 0, "MD")(A), MultigridShiftInverse)
    assert not isinstance(mg._shift_inverter(ls, 1, "GR")(A), MultigridShiftInverse)
    assert gr[0].stats.shifts is not None and len(gr[0].stats.shifts) == len(poles) - 2
    # a gauge update: the kept near-null vectors are refreshed, X^-1 and the coarse operators rebuilt
    u2 = smooth_field(geom, CounterRNG(6))
    s_ref2, s_mg2 = ref.action(u2), mg.action(u2)
    assert abs(s_mg2 - s_ref2) <= 10 * TOL * abs(s_ref2)
    fa = mg.stats.records("FA")[-2].stats.extra["multigrid"]
    assert fa[0]["setup"][0] == "refreshed"
    mg.force(u2)
    assert all("multigrid" not in r.stats.extra for r in mg.stats.records("MD"))


def deck_text(rationals, multigrid="", cgresid="1e-10", grid="[1, 1, 1, 1]"):
    return hisq211_deck(LIGHT, {
        "run": {"seed": "86658", "trajectories": "1", "rng": '"philox"', "start": None},
        "lattice": {"grid": grid},
        "fermions": {"rationals": f'"{rationals}"', "cgresid_md_fa_gr": cgresid_triples("1e-8", cgresid),
                     "pbp_masses": "[0.01]", "pbp_error": "1e-10"},
    }, extra={"fermions": multigrid})


def test_deck_multigrid_section_and_bad_blocks():
    from hmc import deck as deckmod

    rat = fixture_path("rationals.sample.su3_rhmc_hisq_f211")
    d = deckmod.loads(deck_text(rat, "[multigrid]\nlight_shifts = 2\nnv = 8\nblocks = [[4, 4, 4, 4]]"))
    assert d["multigrid"]["light_shifts"] == 2 and deckmod.multigrid_options(d["multigrid"])["nv"] == 8
    assert "multigrid" not in deckmod.loads(deck_text(rat))
    for section, grid, words in (
            ("[multigrid]\nblocks = [[3, 4, 4, 4]]", "[1, 1, 1, 1]", "is odd"),
            ("[multigrid]\nblocks = [[4, 4, 4, 4]]", "[1, 1, 1, 2]", "does not tile the local extent 2"),
            ("[multigrid]\nblocks = [[2, 2, 2, 2]]", "[1, 1, 1, 1]", "narrower than 3"),
            ("[multigrid]\nlevels = 4\nblocks = [[4, 4, 4, 4]]", "[1, 1, 1, 1]", "need 2"),
            ("[multigrid]\nnv = 0", "[1, 1, 1, 1]", "near-null"),
            ("[multigrid]\ncoarsest = \"qr\"", "[1, 1, 1, 1]", "coarsest")):
        with pytest.raises(deckmod.DeckError, match=words) as e:
            deckmod.loads(deck_text(rat, section, grid=grid))
        assert len(str(e.value).splitlines()) == 1 and "[multigrid]" in str(e.value)


def test_hmc_run_with_multigrid_light_shifts_matches_all_cg(tmp_path, capsys):
    """One cold-start 4^4 RHMC trajectory with [multigrid] light_shifts = 2 (GR and FA at 1e-10) and pbp = true:
    the same actions, delta H and PBP as all-CG to the solver tolerance, the same MD solves."""
    from hmc.cli import main
    from hmc.runfile import load

    rat = fixture_path("rationals.sample.su3_rhmc_hisq_f211")
    runs = {}
    mg = "[multigrid]\nlight_shifts = 2\nnv = 8\nsetup_iters = 30\npbp = true"
    for name, section in (("cg", ""), ("mg", mg)):
        deck = tmp_path / f"{name}.toml"
        deck.write_text(deck_text(rat, section))
        out = str(tmp_path / f"{name}.h5")
        assert main(["init", str(deck), "-o", out]) == 0
        assert main(["run", out, "--no-progress"]) == 0
        runs[name] = load(out).history[-1]
        assert capsys.readouterr().out.count("PBP: mass 1.000000e-02 ") == 1
    a, b = runs["cg"], runs["mg"]
    for key in ("f_start", "f_end", "h_start", "h_end", "g_start", "g_end"):
        assert abs(a[key] - b[key]) <= 1e-8 * max(1.0, abs(a[key])), key
    assert abs(a["dH"] - b["dH"]) <= 1e-6 and a["accepted"] == b["accepted"]
    assert a["cg_md"] == b["cg_md"]                              # the MD solves stay multishift CG
    for key in ("pbp0_re_even", "pbp0_re_odd", "pbp0_im_even", "pbp0_im_odd", "pbp0_faction"):
        assert abs(a[key] - b[key]) <= 1e-8, key                 # PBP by multigrid = by CG


def test_pbp_by_multigrid_equals_cg():
    """PBP (MILC's f_meas: (2/V) sum_parity g^dag M^-1 g, FACTION) on a smooth 4^4 HISQ field with a Philox source:
    multigrid (full lattice) and MILC's two CG solves (mat_invert_uml) agree; Im pbp is the same on both parities
    once solved exactly (M^-1 = 2m K - D K with K = (4m^2 - D^2)^-1 parity-diagonal: the 2m K part is real on each
    parity, the D K part gives T_odd = -conj(T_even))."""
    from force.hisq_links import hisq_links
    from hmc.measure import pbp, pbp_source
    from solvers import StaggeredDslash
    from solvers.multigrid import multigrid

    geom = Geometry((4, 4, 4, 4))
    u = smooth_field(geom, CounterRNG(5))
    links = hisq_links(u, eps=0.0)
    D = StaggeredDslash(geom, links.fat, links.long)
    g = pbp_source(geom, CounterRNG(7))
    m = 0.01
    a = pbp(D, m, g, 1e-12)
    b = pbp(D, m, g, 1e-12, inverse=multigrid(1e-12, nv=8, setup_iters=30)(D.matrix(m)))
    assert a["solver"] == "cg" and b["solver"] == "mg" and a["converged"] and b["converged"]
    for key in ("re_even", "re_odd", "im_even", "im_odd", "faction"):
        assert abs(a[key] - b[key]) <= 1e-9, key
    assert abs(a["im_even"] - a["im_odd"]) <= 1e-9 and abs(a["faction"] - 1.5) < 0.1


@pytest.mark.slow
def test_pbp_reproduces_milc_su3_rhmc_hisq_2(tmp_path, capsys):
    """MILC's su3_rhmc_hisq.2 with its PBP measurement (pbp masses 0.0018 and 0.018, error_for_propagator 1e-6):
    after the trajectory, MILC's generator draws the sources and MILC's two CG solves give its PBP and FACTION
    numbers within MILC's errtol (runs/references/su3_rhmc_hisq.2.json)."""
    import json

    from hmc.run import init_run, run
    from tests.conftest import ROOT

    ref = json.loads((ROOT / "runs" / "references" / "su3_rhmc_hisq.2.json").read_text())
    text = (ROOT / "runs" / "milc_su3_rhmc_hisq.toml").read_text()
    text = text.replace('rationals = "rationals/', f'rationals = "{ROOT / "runs" / "rationals"}/')
    text = text.replace("max_multicg = 2500", "max_multicg = 2500\npbp_masses = [0.0018, 0.018]")
    deck = tmp_path / "pbp.toml"
    deck.write_text(text)
    out = str(tmp_path / "t.h5")
    init_run(str(deck), out, str(fixture_path("lat.sample.l6666.hisq")), log=lambda *a: None,
             rationals=str(fixture_path("rationals.sample.su3_rhmc_hisq")))
    lines = []
    row = run(out, show_progress=False, log=lines.append).history[-1]
    for i, (want, tol) in enumerate(zip(ref["measurements"]["PBP"], ref["errtol"]["PBP"])):
        got = [row[f"pbp{i}_{k}"] for k in ("re_even", "re_odd", "im_even", "im_odd")]
        want_v = [want[k] for k in ("re_even", "re_odd", "im_even", "im_odd")]
        assert np.all(np.abs(np.array(got) - want_v) <= np.array(tol["values"])), (got, want_v)
        assert abs(row[f"pbp{i}_faction"] - want["faction"]) <= 1e-6
    assert sum(line.startswith("PBP: mass ") for line in lines) == 2


def test_near_null_space_kept_across_trajectories_and_resume(tmp_path, capsys):
    """Three 4^4 RHMC trajectories with [multigrid] light_shifts = 2, run as 2 and a resume of 1, against all-CG:
    the same accept/reject, delta H and plaquette to the solver tolerance's effect. The near-null vectors are made
    once per ``hmc run`` (trajectories 1 and 3, the resume regenerating them from the seed), refreshed once in
    trajectory 2 (refresh_every = 1: one trajectory has begun since they were made) and otherwise kept with only
    the coarse operators rebuilt for the new links (thin updates); a run that made them anew every trajectory
    fails here. Each trajectory prints one MG line with these numbers."""
    from hmc.cli import main
    from hmc.runfile import load

    rat = fixture_path("rationals.sample.su3_rhmc_hisq_f211")
    mg = "[multigrid]\nlight_shifts = 2\nnv = 8\nsetup_iters = 30\nrefresh_every = 1"
    rows = {}
    for name, section in (("cg", ""), ("mg", mg)):
        deck = tmp_path / f"{name}.toml"
        deck.write_text(deck_text(rat, section).replace('trajectories = 1', 'trajectories = 3'))
        out = str(tmp_path / f"{name}.h5")
        assert main(["init", str(deck), "-o", out]) == 0
        assert main(["run", out, "--no-progress", "--trajectories", "2"]) == 0
        assert main(["run", out, "--no-progress"]) == 0              # the resume: a new process's state
        rows[name] = load(out).history
        lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("MG:")]
        assert len(lines) == (3 if name == "mg" else 0)
    assert len(rows["cg"]) == len(rows["mg"]) == 3
    for a, b in zip(rows["cg"], rows["mg"]):
        assert a["accepted"] == b["accepted"] and abs(a["dH"] - b["dH"]) <= 1e-6
        for key in ("plaq_ss", "plaq_st", "f_start", "f_end"):
            assert abs(a[key] - b[key]) <= 1e-8 * max(1.0, abs(a[key])), key
        assert a["cg_md"] == b["cg_md"] and "mg_solves" not in a
    mgr = rows["mg"]
    assert [r["mg_built"] for r in mgr] == [1, 0, 1]               # once per process, never per trajectory
    assert [r["mg_refreshed"] for r in mgr] == [0, 1, 0]
    assert [r["mg_updated"] for r in mgr] == [1, 0, 1]             # the end's action solve after a build
    assert all(r["mg_solves"] >= 4 and r["mg_outer"] > 0 for r in mgr)
    # a refresh costs less than making the vectors anew on a moved field (the cold start's build is cheap: the
    # relaxation of free-field vectors stops early)
    assert mgr[1]["mg_setup_fine_applies"] < mgr[2]["mg_setup_fine_applies"]
    assert all(r["time_fermion_mg_setup"] > 0 for r in mgr)


def test_documented_deck_section_validates_and_reaches_the_solver():
    """The [multigrid] example of docs/multigrid.md "Multigrid in an RHMC run" is a valid section, and its
    refresh_every reaches the near-null space of the monomial hmc run builds; a negative refresh_every is a one-line
    error naming the key."""
    import re

    from hmc import deck as deckmod
    from hmc.assemble import make_fermion_monomial, load_rationals
    from tests.conftest import ROOT

    rat = fixture_path("rationals.sample.su3_rhmc_hisq_f211")
    doc = (ROOT / "docs" / "multigrid.md").read_text()
    section = re.search(r"```toml\n(\[multigrid\].*?)```", doc, re.S).group(1).replace("refresh_every = 1",
                                                                                          "refresh_every = 3")
    d = deckmod.loads(deck_text(rat, section))
    mono = make_fermion_monomial(d, load_rationals(d, path=str(rat)))
    assert mono.multigrid.refresh_every == 3 and mono.multigrid.nshifts == 2 and mono.stats.multigrid
    assert mono.multigrid.mg["precision"] == "single" and mono.multigrid.mg["nv"] == 24
    with pytest.raises(deckmod.DeckError, match="refresh_every") as e:
        deckmod.loads(deck_text(rat, "[multigrid]\nrefresh_every = -1"))
    assert len(str(e.value).splitlines()) == 1
