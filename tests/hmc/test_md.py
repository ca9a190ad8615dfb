"""Molecular dynamics: schedules, reversibility, dH scaling, momenta (docs/conventions.md 5.4, 5.5)."""
import numpy as np
import pytest

from force.gauge_action import SymanzikAction, WilsonAction
from hmc.integrators import IntegratorError, Level, build_schedule, describe, force_evaluations, total_time
from hmc.momenta import kinetic_energy, random_momenta
from hmc.monomials import GaugeMonomial
from hmc.trajectory import hamiltonian, hmc_trajectory, molecular_dynamics, reversibility_check
from lattice import CounterRNG, GaugeField, Geometry, su3


def smooth_field(geom, rng, spread=0.3):
    """Links exp(spread * random algebra): plaquettes far from 3 but far from random too."""
    return GaugeField(geom, su3.expm_su3(spread * random_momenta(geom, rng, "smooth")) @ GaugeField.unit(geom).links)


@pytest.mark.parametrize("levels", [
    [Level("leapfrog", 7, ["g"])],
    [Level("omelyan", 6, ["g"])],
    [Level("omelyan", 4, ["f"]), Level("leapfrog", 3, ["g"])],
    [Level("leapfrog", 2, ["f"]), Level("omelyan", 2, ["h"]), Level("leapfrog", 3, ["g"])],
    [Level("3g1f", 10, ["f"]), Level("leapfrog", 1, ["g"])],
])
def test_schedules_integrate_tau(levels):
    s = build_schedule(levels, 0.8)
    assert abs(total_time(s) - 0.8) < 1e-14
    for lv in levels:
        for name in lv.monomials:
            assert abs(total_time(s, name) - 0.8) < 1e-14
    assert describe(s).count("\n") == len(s) - 1
    # symmetric schedules are what make MD reversible
    flat = [(op[0], round(op[-1], 12)) for op in s]
    assert flat == flat[::-1]


def test_3g1f_counts_like_milc():
    s = build_schedule([Level("3g1f", 10, ["f"]), Level("leapfrog", 1, ["g"])], 0.2)
    assert force_evaluations(s) == {"f": 10, "g": 30}  # 2 F and 6 G per 2 eps


def test_bad_integrators():
    with pytest.raises(IntegratorError, match="even"):
        Level("omelyan", 3)
    with pytest.raises(IntegratorError, match="unknown"):
        Level("rk4", 2)


def test_momenta_distribution():
    geom = Geometry((4, 4, 4, 4))
    p = random_momenta(geom, CounterRNG(4))
    assert np.abs(p + su3.dagger(p)).max() == 0
    assert np.abs(su3.trace(p)).max() < 1e-15
    # h = sum [1/2 Tr P^dag P - 4] has mean 0 and variance 4 per link (8 dof, chi^2/2 each)
    h = kinetic_energy(geom, p)
    assert abs(h) < 5 * np.sqrt(4 * 4 * geom.volume)


def _setup(action, seed=1, dims=(4, 4, 4, 4)):
    geom = Geometry(dims)
    rng = CounterRNG(seed)
    u = smooth_field(geom, rng)
    p = random_momenta(geom, rng)
    return geom, u, p, [GaugeMonomial(action)]


@pytest.mark.parametrize("scheme", ["leapfrog", "omelyan"])
@pytest.mark.parametrize("action", [WilsonAction(5.7), SymanzikAction(7.4, 0.89, 3, "hisq")],
                         ids=["wilson", "symanzik"])
def test_reversibility(scheme, action):
    geom, u, p, mon = _setup(action)
    s = build_schedule([Level(scheme, 8, ["gauge"])], 1.0)
    rev = reversibility_check(u, p, mon, s)
    assert rev["links"] < 1e-12
    assert rev["momenta"] < 1e-12
    assert abs(rev["dH"]) < 1e-10


def _dh(u, p, mon, levels):
    v, q = u.copy(), p.copy()
    h0 = hamiltonian(v, q, mon).total
    molecular_dynamics(v, q, build_schedule(levels, 1.0), mon)
    return hamiltonian(v, q, mon).total - h0


@pytest.fixture(scope="module")
def thermalized():
    """A 4^4 Wilson beta 5.7 configuration after 15 trajectories from a hot start, and fresh momenta."""
    geom = Geometry((4, 4, 4, 4))
    rng = CounterRNG(3)
    u = GaugeField.random(geom, rng)
    mon = [GaugeMonomial(WilsonAction(5.7))]
    s = build_schedule([Level("omelyan", 10, ["gauge"])], 1.0)
    for _ in range(15):
        u, _res = hmc_trajectory(u, rng, mon, s)
    return u, random_momenta(geom, rng), mon


@pytest.mark.parametrize("scheme,steps", [("leapfrog", 32), ("omelyan", 16)])
def test_dh_scales_as_step_squared(thermalized, scheme, steps):
    u, p, mon = thermalized
    d1 = _dh(u, p, mon, [Level(scheme, steps, ["gauge"])])
    d2 = _dh(u, p, mon, [Level(scheme, 2 * steps, ["gauge"])])
    assert 3.2 < abs(d1 / d2) < 4.8, (d1, d2)


def test_omelyan_beats_leapfrog(thermalized):
    """At the same step size (one Omelyan cycle per leapfrog step, h = 1/32) Omelyan's dH is about 10x smaller
    (Takaishi & de Forcrand; docs/conventions.md 5.5). MILC counts an Omelyan cycle as two steps."""
    u, p, mon = thermalized
    lf = _dh(u, p, mon, [Level("leapfrog", 32, ["gauge"])])
    om = _dh(u, p, mon, [Level("omelyan", 64, ["gauge"])])
    assert abs(om) < abs(lf) / 5, (om, lf)


def test_nested_equals_single_level_for_one_monomial_split():
    """Splitting one action over two time scales still integrates the same Hamiltonian: dH small and scaling."""
    geom, u, p, _ = _setup(WilsonAction(5.7), seed=5)
    a = GaugeMonomial(WilsonAction(2.85), "half_a")
    b = GaugeMonomial(WilsonAction(2.85), "half_b")
    d1 = _dh(u, p, [a, b], [Level("omelyan", 4, ["half_a"]), Level("leapfrog", 2, ["half_b"])])
    d2 = _dh(u, p, [a, b], [Level("omelyan", 8, ["half_a"]), Level("leapfrog", 2, ["half_b"])])
    assert abs(d2) < abs(d1)


def test_trajectory_metropolis_and_unchanged_input():
    geom, u, p, mon = _setup(WilsonAction(5.7))
    before = u.links.copy()
    s = build_schedule([Level("omelyan", 8, ["gauge"])], 1.0)
    v, res = hmc_trajectory(u, CounterRNG(2), mon, s)
    assert np.array_equal(u.links, before)
    assert res.accepted == (res.delta_h <= 0 or np.exp(-res.delta_h) >= res.xrandom)
    assert (v is u) == (not res.accepted)
    assert su3.unitarity_violation(v.links) < 1e-14
