"""Multigrid for the smallest shifts of the light pseudofermion's heat-bath (GR) and action (FA) solves (issue 7,
MULTIGRID.md 7): the pole p acts as a mass sqrt(p)/2, solved as the even part of a full-lattice multigrid solve;
multishift CG keeps the other poles. On a smooth 4^4 HISQ field with MILC's 2+1+1 rational functions the
pseudofermion and the action agree with all-CG to the solver tolerance, the near-null vectors are kept across
poles and refreshed (not rebuilt) after a gauge update, and the MD solves stay multishift CG."""
import math

import numpy as np
import pytest

from hmc.rhmc import FermionMonomial, PseudofermionTerm
from hmc.rational import read_rationals
from hmc.momenta import random_momenta
from lattice import CounterRNG, GaugeField, Geometry, su3
from solvers.multigrid.shifts import MultigridShifts
from tests.conftest import fixture_path

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
    triple = f"[1e-8, {cgresid}, {cgresid}]"
    return f"""
[run]
seed = 86658
trajectories = 1
rng = "philox"
[lattice]
dims = [4, 4, 4, 4]
grid = {grid}
[gauge]
action = "symanzik"
beta = 6.7
u0 = 0.89
quark_loops = "hisq"
nf = 4
[fermions]
rationals = "{rationals}"
dyn_mass = [0.01, 0.05, 0.5]
dyn_flavors = [2, 1, 1]
cgresid_md_fa_gr = [{', '.join([triple] * 5)}]
{multigrid}
[integrator]
scheme = "3g1f"
steps = 2
tau = 0.1
link_exponential = "taylor8"
reunitarize = "cycle"
"""


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
    """One cold-start 4^4 RHMC trajectory with [multigrid] light_shifts = 2 (GR and FA at 1e-10): the same actions
    and delta H as all-CG to the solver tolerance, the same MD solves."""
    from hmc.cli import main
    from hmc.runfile import load

    rat = fixture_path("rationals.sample.su3_rhmc_hisq_f211")
    runs = {}
    for name, section in (("cg", ""), ("mg", "[multigrid]\nlight_shifts = 2\nnv = 8\nsetup_iters = 30")):
        deck = tmp_path / f"{name}.toml"
        deck.write_text(deck_text(rat, section))
        out = str(tmp_path / f"{name}.h5")
        assert main(["init", str(deck), "-o", out]) == 0
        assert main(["run", out, "--no-progress"]) == 0
        runs[name] = load(out).history[-1]
    capsys.readouterr()
    a, b = runs["cg"], runs["mg"]
    for key in ("f_start", "f_end", "h_start", "h_end", "g_start", "g_end"):
        assert abs(a[key] - b[key]) <= 1e-8 * max(1.0, abs(a[key])), key
    assert abs(a["dH"] - b["dH"]) <= 1e-6 and a["accepted"] == b["accepted"]
    assert a["cg_md"] == b["cg_md"]                              # the MD solves stay multishift CG
