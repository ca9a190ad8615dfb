"""MILC's Coulomb / Landau gauge fixing (lattice.gauge_fix): a gauge transformation of the links that leaves
gauge-invariant observables alone, raises the functional at every step and ends at its stationary point; MILC's
own numbers on its sample lattice are tests/hmc/test_milc_spectrum.py's."""
import numpy as np
import pytest

from lattice import CounterRNG, GaugeField, Geometry, plaquette, polyakov_loop, su3
from lattice.gauge import random_gauge_transformation
from lattice.gauge_fix import GaugeFixError, coulomb_divergence, gauge_fix, gauge_fix_functional


def smooth_field(geom, seed=3, width=0.4):
    """Links exp(width P) with Gaussian algebra elements P: far from a pure gauge, but not a hot start."""
    w = np.random.default_rng(seed).normal(size=(4,) + geom.shape + (8,))
    return GaugeField(geom, su3.expm_su3(width * su3.algebra_from_coefficients(w)))


@pytest.fixture(scope="module")
def scrambled():
    geom = Geometry((4, 4, 4, 4))
    u = smooth_field(geom)
    return u, u.gauge_transform(random_gauge_transformation(geom, CounterRNG(5)))


@pytest.fixture(scope="module", params=[3, None], ids=["coulomb", "landau"])
def fixed(request, scrambled):
    """(gauge_dir, the scrambled field, its gauge-fixed field, result, transformation) at a tight tolerance."""
    _, u = scrambled
    return (request.param, u) + gauge_fix(u, request.param, 1.8, 300, 1e-12, track=True)


def test_gauge_fix_is_a_gauge_transformation(fixed):
    gauge_dir, u, v, res, g = fixed
    assert res.converged and res.step >= 1
    assert np.allclose(plaquette(v), plaquette(u), rtol=0, atol=1e-12)
    assert abs(polyakov_loop(v) - polyakov_loop(u)) < 1e-12
    assert np.abs(v.links - u.gauge_transform(g).links).max() < 1e-12
    assert su3.unitarity_violation(v.links) < 1e-13
    assert gauge_fix_functional(v, gauge_dir) > gauge_fix_functional(u, gauge_dir) + 0.3


def test_functional_rises_every_step_to_a_stationary_point(fixed):
    gauge_dir, u, v, res, _ = fixed
    steps = np.diff(res.history)
    assert (steps > -1e-14).all(), steps.min()
    assert res.history[-1] == pytest.approx(res.action) and abs(res.delta) < 1e-12
    assert coulomb_divergence(u, gauge_dir) > 0.1
    assert coulomb_divergence(v, gauge_dir) < 1e-4


def test_pure_gauge_is_fixed_to_unit_links():
    """A gauge transformation of the unit field reaches the functional's maximum 1 (Landau gauge)."""
    geom = Geometry((4, 4, 4, 4))
    u = GaugeField.unit(geom).gauge_transform(random_gauge_transformation(geom, CounterRNG(11)))
    v, res, _ = gauge_fix(u, None, 1.8, 500, 1e-13)
    assert gauge_fix_functional(u, None) < 0.1
    assert gauge_fix_functional(v, None) == pytest.approx(1.0, abs=1e-10)


def test_gauge_copies_agree_on_invariants(scrambled, fixed):
    """Fixing U and a gauge transform of U gives fields of the same functional and the same invariants (both
    reach the one maximum the smooth field has near its start)."""
    gauge_dir, _, b, rb, _ = fixed
    a, ra, _ = gauge_fix(scrambled[0], gauge_dir, 1.8, 300, 1e-12)
    assert ra.action == pytest.approx(rb.action, abs=1e-9)
    assert np.allclose(plaquette(a), plaquette(b), rtol=0, atol=1e-12)


def test_milc_line_and_errors(scrambled):
    _, u = scrambled
    _, res, _ = gauge_fix(u, 3, 1.8, 1, 1e-6)
    assert res.step == 1 and not res.converged and res.delta == 0.0      # MILC: no delta after a single step
    assert res.milc_line().startswith("GFIX: Ended at step 1. Av gf action ")
    for kw, word in ((dict(gauge_dir=4), "gauge_dir"), (dict(omega=2.5), "over-relaxation"),
                     (dict(max_steps=0), "max_steps")):
        with pytest.raises(GaugeFixError, match=word):
            gauge_fix(u, **kw)


def test_partitioned_lattice_fixes_bitwise_alike(scrambled):
    """Every partitioned dimension on the halo path (one rank its own neighbour): the same links, bit for bit, as
    the whole lattice (shifts are exact data movement, sums exact)."""
    from comms import ProcessGrid
    from lattice import get_backend

    _, u = scrambled
    geom = Geometry(u.geom.dims, get_backend("numpy"), ProcessGrid((1, 1, 1, 1), partitioned="xyzt"))
    try:
        a, ra, _ = gauge_fix(u, 3, 1.8, 8, 1e-6)
        b, rb, _ = gauge_fix(GaugeField(geom, u.links.copy()), 3, 1.8, 8, 1e-6)
        assert np.array_equal(a.links, b.links) and ra.history == rb.history
    finally:
        geom.grid.close()                  # its engine and shm window (the teardown check)
