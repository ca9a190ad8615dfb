"""The halo buffers reserved before the first solve (force.hisq_cuda.reserve_force_halos): the largest face of the
HISQ link build's and force's padded exchanges is known in advance, so that none of them grows the engine's buffers
after the solvers have captured CUDA graphs over its segment (a growth moves it: every solve would capture again).
CPU, one process with its dimensions forced onto the halo path (the rank is its own neighbour)."""
from __future__ import annotations

import numpy as np
import pytest

from comms import ProcessGrid
from force import hisq_cuda
from lattice import Geometry, get_backend


def _partitioned(partition="zt"):
    return Geometry((4, 4, 6, 8), get_backend("numpy"), ProcessGrid((1, 1, 1, 1), partitioned=partition))


def _asked(geom):
    """The face sizes the engine is asked for from now on."""
    engine, asked = geom.grid.halo, []
    reserve = engine.reserve
    engine.reserve = lambda nbytes: asked.append(nbytes) or reserve(nbytes)
    return asked


@pytest.mark.parametrize("partition", ["t", "zt", "xyzt"])
def test_no_padded_exchange_of_the_force_asks_for_more(partition):
    """Each padded exchange the link build and the force make (hisq_cuda's pad / pad_alike / outer_acc shapes)
    asks for at most force_halo_bytes, and the largest of them asks for exactly that."""
    geom = _partitioned(partition)
    try:
        asked, n = _asked(geom), 9
        links = np.zeros((4,) + geom.shape + (3, 3), dtype=np.complex128)
        hisq_cuda.pad(geom, links, hisq_cuda.naik_depth())
        hisq_cuda.pad_alike(geom, hisq_cuda.VJP_DEPTH, links, links)
        hisq_cuda.pad_alike(geom, hisq_cuda.naik_depth(), links, links)
        geom.padded(np.zeros(geom.shape + (3, n), dtype=np.complex128), hisq_cuda.OUTER_DEPTH)
        assert max(asked) == hisq_cuda.force_halo_bytes(geom, n)
    finally:
        geom.grid.close()


def test_the_monomial_reserves_once_before_its_first_solve(monkeypatch):
    """FermionMonomial.links reserves at its first build on a geometry (the largest MD pole count of its
    pseudofermions), not at the link updates after it; off a padded GPU geometry the reservation does nothing."""
    from hmc.momenta import random_momenta
    from hmc.rational_file import read_rationals
    from hmc.rhmc import FermionMonomial, PseudofermionTerm
    from lattice import CounterRNG, GaugeField, su3
    from tests.conftest import fixture_path

    pfs = read_rationals(fixture_path("rationals.sample.su3_rhmc_hisq_f211"))[:2]
    geom = _partitioned()
    try:
        asked = _asked(geom)
        monkeypatch.setattr(hisq_cuda, "pads_on_gpu", lambda g, depth: True)
        m = FermionMonomial([PseudofermionTerm(p, 1e-10, 1e-10, 1e-10, 10000) for p in pfs])
        u = GaugeField(geom, su3.expm_su3(0.3 * random_momenta(geom, CounterRNG(5), "smooth"))
                       @ GaugeField.unit(geom).links)
        m.links(u)
        want = hisq_cuda.force_halo_bytes(geom, max(len(t.approximation("MD").residues) for t in m.terms))
        assert asked[0] == want and want > 0
        asked.clear()
        m.links(GaugeField(geom, 1.0 * u.links))
        assert want not in asked          # the second build's exchanges only: no reservation again
    finally:
        geom.grid.close()
    monkeypatch.undo()
    plain = _partitioned()
    try:
        asked = _asked(plain)
        hisq_cuda.reserve_force_halos(plain, 9)
        assert asked == []
    finally:
        plain.grid.close()
