"""RHMC with MILC's cgprec_md_fa_gr = 1 for the MD solves (solvers.multishift.mixed_multishift_cg): the trajectory
stays reversible, its dH agrees with the double-precision run to the solver tolerance, and the deck key reaches the
solver."""
import numpy as np
import pytest

from force.gauge_action import SymanzikAction
from hmc.deck import DeckError
from hmc.monomials import GaugeMonomial
from hmc.momenta import random_momenta
from hmc.rhmc import FermionMonomial, PseudofermionTerm
from hmc.trajectory import hamiltonian, molecular_dynamics, reversibility_check
from lattice import CounterRNG, Geometry
from tests.conftest import fixture_path
from tests.hmc.test_rhmc import _schedule, f211_rationals, small_deck, smooth_field


def _setup(prec):
    geom = Geometry((4, 4, 4, 4))
    rng = CounterRNG(11)
    u = smooth_field(geom, rng)
    pfs = f211_rationals()
    f = FermionMonomial([PseudofermionTerm(pfs[i], 1e-8, 1e-10, 1e-10, 10000, prec) for i in (0, 4)])
    g = GaugeMonomial(SymanzikAction(6.7, 0.89, 4, "hisq"))
    f.refresh(u, rng)
    return u, random_momenta(geom, rng), [g, f]


def test_single_precision_md_solves_are_reversible_and_agree():
    u, p, mons = _setup((1, 2, 2))
    rev = reversibility_check(u, p, mons, _schedule(4))
    assert rev["links"] < 1e-8 and rev["momenta"] < 1e-8
    solvers = {r.stats.solver for r in mons[1].stats.solves if r.phase == "MD"}
    assert solvers == {"mixed-precision multishift CG"}
    dh = {}
    for prec in ((1, 2, 2), (2, 2, 2)):
        u, p, mons = _setup(prec)
        h0 = hamiltonian(u, p, mons).total
        molecular_dynamics(u, p, _schedule(4), mons)
        dh[prec] = hamiltonian(u, p, mons).total - h0
    assert abs(dh[(1, 2, 2)]) > 1e-3
    assert abs(dh[(1, 2, 2)] - dh[(2, 2, 2)]) < 1e-5, dh


def test_deck_precision_triples():
    from hmc import deck as deckmod
    from hmc.assemble import load_rationals, make_fermion_monomial
    rat = fixture_path("rationals.sample.su3_rhmc_hisq_f211")
    d = deckmod.loads(small_deck(rat, extra="cgprec_md_fa_gr = [[1, 2, 2], [1, 2, 2], [1, 2, 2], [1, 2, 2], [1, 2, 1]]"))
    mono = make_fermion_monomial(d, load_rationals(d, path=str(rat)))
    assert [t.single_precision("MD") for t in mono.terms] == [True] * 5
    assert [t.single_precision("GR") for t in mono.terms] == [False] * 4 + [True]
    assert not any(t.single_precision("FA") for t in mono.terms)
    with pytest.raises(DeckError, match="cgprec_md_fa_gr"):
        deckmod.loads(small_deck(rat, extra="cgprec_md_fa_gr = [[3, 2, 2]]"))
    d = deckmod.loads(small_deck(rat, extra="cgprec_md_fa_gr = [[1, 2, 2]]"))
    with pytest.raises(DeckError, match="one triple per pseudofermion"):
        load_rationals(d, path=str(rat))
