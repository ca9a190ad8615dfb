"""Gauge actions (docs/conventions.md 2, 3.4, 5): loop tables, MILC's coefficients, action and force."""
import math
from pathlib import Path

import numpy as np
import pytest

from force import loops
from force.gauge_action import GaugeAction, SymanzikAction, WilsonAction, symanzik_coefficients
from lattice import CounterRNG, GaugeField, Geometry, su3
from lattice.gauge import plaquette, random_gauge_transformation


@pytest.fixture(scope="module")
def geom():
    return Geometry((4, 4, 4, 4))


def _algebra_field(geom, rng, stream):
    """A traceless anti-Hermitian matrix for every link, MILC's Gaussian momentum distribution."""
    w = rng.gaussian(stream, geom.site_ids(), 32).reshape(geom.shape + (4, 8))
    return su3.algebra_from_coefficients(np.moveaxis(w, 4, 0))


@pytest.fixture(scope="module")
def smooth(geom):
    """Links exp(0.3 * random algebra): far from unit (<ReTr P>/3 ~ 0.6) but smooth enough for derivatives."""
    u = GaugeField(geom, su3.expm_su3(0.3 * _algebra_field(geom, CounterRNG(20240611), "smooth")))
    assert 0.3 < plaquette(u)[0] / 3 < 0.9
    return u


ACTIONS = {
    "wilson": lambda: WilsonAction(6.0),
    "symanzik_hisq": lambda: SymanzikAction(7.4, 0.89, 3, "hisq"),
    "symanzik_asqtad": lambda: SymanzikAction(7.2, 0.85, 3, "asqtad"),
    "symanzik_asqtad_nf": lambda: SymanzikAction(7.2, 0.85, 3, "asqtad_nf"),
    "symanzik_none": lambda: SymanzikAction(8.0, 0.87, 0, "none"),
}


# loop shapes ---------------------------------------------------------------------------------------------
def test_loop_counts_and_uniqueness():
    table = loops.loop_table()
    assert {k: len(v) for k, v in table.items()} == {"plaquette": 6, "rectangle": 12, "parallelogram": 16}
    for name, paths in table.items():
        assert all(loops.is_closed(p) for p in paths)
        keys = {loops.canonical(p) for p in paths}
        assert len(keys) == len(paths), f"{name}: two paths are the same geometric loop"
        # reversing or rotating a loop gives one already in the table
        for p in paths:
            assert loops.canonical(loops.reverse(p)) in keys
            assert loops.canonical(p[1:] + p[:1]) in keys


def test_loop_geometry():
    table = loops.loop_table()
    planes = {frozenset(loops.direction(s) for s in p) for p in table["plaquette"]}
    assert planes == {frozenset((a, b)) for a in range(4) for b in range(a + 1, 4)}
    # rectangles: every plane, long side along either axis
    long_sides = set()
    for p in table["rectangle"]:
        dirs = [loops.direction(s) for s in p]
        assert len(set(dirs)) == 2
        long_sides.add((frozenset(dirs), max(set(dirs), key=dirs.count)))
    assert len(long_sides) == 12
    # parallelograms: three distinct axes, each stepped once forward and once backward
    triples = {}
    for p in table["parallelogram"]:
        dirs = [loops.direction(s) for s in p]
        assert len(set(dirs)) == 3 and all(dirs.count(d) == 2 for d in dirs)
        triples[frozenset(dirs)] = triples.get(frozenset(dirs), 0) + 1
    assert sorted(triples.values()) == [4, 4, 4, 4]


def test_loop_encoding_and_milc_order():
    assert loops.to_milc((loops.X, loops.Y, -loops.X, -loops.Y)) == (0, 1, 7, 6)
    assert loops.from_milc((0, 0, 1, 7, 7, 6)) == loops.RECTANGLE
    assert loops.format_path(loops.PARALLELOGRAM) == "+x+y+z-x-y-z"
    # MILC's make_loop_table order (first entries of its G_LOOP lines)
    table = loops.loop_table()
    assert [loops.to_milc(p) for p in table["plaquette"]] == [
        (0, 1, 7, 6), (0, 2, 7, 5), (0, 3, 7, 4), (1, 2, 6, 5), (1, 3, 6, 4), (2, 3, 5, 4)]
    assert loops.to_milc(table["rectangle"][3]) == (1, 1, 0, 6, 6, 7)
    assert loops.to_milc(table["parallelogram"][1]) == (0, 1, 5, 7, 6, 2)


# coefficients ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("beta,u0,nf,c_rt,c_pg", [
    (7.4, 0.89, 3, -4.181006e-02, 5.149203e-04),
    (6.7, 0.89, 4, -3.316969e-02, 2.809994e-03),
    (6.7, 0.89, 5, -2.452933e-02, 5.105067e-03),
])
def test_hisq_coefficients_match_milc(beta, u0, nf, c_rt, c_pg):
    act = SymanzikAction(beta, u0, nf, "hisq")
    c = act.coefficients
    assert c["plaquette"] == 1.0
    # MILC prints %e: 7 significant digits
    assert f"{c['rectangle']:e}" == f"{c_rt:e}"
    assert f"{c['parallelogram']:e}" == f"{c_pg:e}"
    assert act.multiplicities == {"plaquette": 6, "rectangle": 12, "parallelogram": 16}
    assert "HISQ quark loops" in act.describe() and f"{c_rt:e}" in act.describe()


def test_other_coefficients():
    u0, lnu = 0.87, math.log(0.87)
    # asqtad quark loops (symanzik_1loop_nf_action.h)
    c = symanzik_coefficients(u0, 3, "asqtad_nf")
    assert c["rectangle"] == pytest.approx(-1 / (20 * u0**2) * (1 - (0.6264 - 0.4742 * 3) * lnu), rel=1e-15)
    assert c["parallelogram"] == pytest.approx((0.0433 - 0.012 * 3) * lnu / u0**2, rel=1e-15)
    # pure gauge: (1 + 0.4805 alpha_s), 0.03325 alpha_s with alpha_s = -4 ln u0 / 3.0684
    c0 = symanzik_coefficients(u0, 0, "none")
    assert c0["rectangle"] == pytest.approx(-1 / (20 * u0**2) * (1 - 0.6264 * lnu), rel=1e-5)
    assert c0["parallelogram"] == pytest.approx(0.04335 * lnu / u0**2, rel=2e-4)  # 0.03325*4/3.0684 = 0.043345
    # HISQ and asqtad loops agree at nf = 0 up to MILC's rounding of 0.0433
    assert symanzik_coefficients(u0, 0, "hisq") == symanzik_coefficients(u0, 0, "asqtad_nf")
    assert symanzik_coefficients(1.0, 3, "hisq") == {"plaquette": 1.0, "rectangle": -0.05, "parallelogram": 0.0}
    with pytest.raises(ValueError, match="pure-gauge"):
        symanzik_coefficients(u0, 3, "none")
    with pytest.raises(ValueError, match="quark_loops"):
        SymanzikAction(6.0, u0, 3, "wilson")
    assert WilsonAction(6.0).coefficients == {"plaquette": 1.0}


@pytest.mark.parametrize("nf", [0, 2, 3])
def test_asqtad_coefficients_match_milc(nf):
    """MILC's asqtad builds (su3_leapfrog.2.sample-out: beta 6.5, u0 0.862, dyn_flavors 2 1) print the loop
    coefficients 1, -7.355018e-02, -8.663653e-03: symanzik_1loop_action.h, no nf-dependent quark-loop terms."""
    act = SymanzikAction(6.5, 0.862, nf, "asqtad")
    c = act.coefficients
    assert [f"{c[k]:e}" for k in ("plaquette", "rectangle", "parallelogram")] == [
        "1.000000e+00", "-7.355018e-02", "-8.663653e-03"]
    assert c == symanzik_coefficients(0.862, 0, "none")
    assert c != symanzik_coefficients(0.862, 3, "asqtad_nf")


# action ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_unit_gauge_is_exactly_zero(geom, name):
    act = ACTIONS[name]()
    one = GaugeField.unit(geom)
    assert act.action(one) == 0.0
    f = act.force(one)
    assert f.shape == (4,) + geom.shape + (3, 3)
    assert not np.any(f)


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_gauge_invariance(geom, name):
    act = ACTIONS[name]()
    rng = CounterRNG(7)
    u = GaugeField.random(geom, rng)
    g = random_gauge_transformation(geom, rng)
    v = u.gauge_transform(g)
    assert np.abs(v.links - u.links).max() > 0.1
    s0, s1 = act.action(u), act.action(v)
    assert abs(s1 - s0) <= 1e-12 * abs(s0)
    # the force is covariant: Pdot -> g(x) Pdot g(x)^dag
    f0, f1 = act.force(u), act.force(v)
    assert np.abs(f1 - g @ f0 @ su3.dagger(g)).max() <= 1e-12 * np.abs(f0).max()


def test_wilson_matches_plaquette(geom, smooth):
    ss, st = plaquette(smooth)
    expected = 6.0 * geom.volume * (6 - (3 * ss + 3 * st) / 3)
    assert WilsonAction(6.0).action(smooth) == pytest.approx(expected, rel=1e-13)


def _abelian_field(geom, k):
    """U_x = U_z = U_t = 1, U_y(x) = exp(i phi x T3'), T3' = diag(1, -1, 0), phi = 2 pi k / nx: a constant
    field strength phi in the xy plane (consistent with periodicity)."""
    xp = geom.xp
    phi = 2 * np.pi * k / geom.dims[0]
    x, _, _, _ = geom.coordinates()
    links = su3.identity_like((4,) + geom.shape, xp)
    links[1, ..., 0, 0] = np.exp(1j * phi * x)
    links[1, ..., 1, 1] = np.exp(-1j * phi * x)
    return GaugeField(geom, links), phi


def test_abelian_field_analytic(geom):
    u, phi = _abelian_field(geom, 1)
    vol = geom.volume

    def deficit(flux):  # 1 - ReTr W / 3 for a loop enclosing this flux
        return (2.0 / 3.0) * (1 - math.cos(flux))

    beta = 5.5
    assert WilsonAction(beta).action(u) == pytest.approx(beta * vol * deficit(phi), rel=1e-14)
    # Symanzik: 1 xy plaquette, 2 xy rectangles (flux 2 phi), 8 parallelograms spanning x and y (flux +-phi)
    act = SymanzikAction(beta, 0.88, 3, "hisq")
    c = act.coefficients
    expected = beta * vol * (c["plaquette"] * deficit(phi) + 2 * c["rectangle"] * deficit(2 * phi)
                             + 8 * c["parallelogram"] * deficit(phi))
    assert act.action(u) == pytest.approx(expected, rel=1e-13)
    tr = act.loop_traces(u)
    assert sorted(tr["plaquette"]) == pytest.approx([1 + 2 * math.cos(phi)] + [3.0] * 5, abs=1e-13)
    assert sum(abs(t - 3) > 1e-12 for t in tr["parallelogram"]) == 8
    assert act.gaction(u) == pytest.approx(3 * act.action(u) / (beta * vol), rel=1e-14)


# force ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_force_is_traceless_antihermitian(smooth, name):
    f = ACTIONS[name]().force(smooth)
    scale = np.abs(f).max()
    assert scale > 1.0
    assert np.abs(f + su3.dagger(f)).max() <= 1e-14 * scale
    assert np.abs(su3.trace(f)).max() <= 1e-14 * scale


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_force_matches_finite_difference(geom, smooth, name):
    """dS/dtau along U -> exp(tau Omega) U at tau = 0 equals sum Tr(Pdot Omega) (docs/conventions.md 3.4, 5.2)."""
    act = ACTIONS[name]()
    f = act.force(smooth)
    # a random direction, and one with a component along the force so that dS/dtau is not small by accident
    omega_random = _algebra_field(geom, CounterRNG(1), "omega")
    omega_mixed = _algebra_field(geom, CounterRNG(2), "omega") + f / np.abs(f).max()
    for omega in (omega_random, omega_mixed):
        predicted = float((f * omega.swapaxes(-1, -2)).sum().real)

        def s(tau):
            return act.action(GaugeField(geom, su3.expm_su3(tau * omega) @ smooth.links))

        h = 1e-5
        central = (s(h) - s(-h)) / (2 * h)
        assert abs(central - predicted) <= 1e-8 * abs(predicted), (central, predicted)
        # fourth order (Richardson) at a larger step: free of rounding and of the h^2 term
        h = 5e-4
        richardson = (8 * (s(h) - s(-h)) - (s(2 * h) - s(-2 * h))) / (12 * h)
        assert abs(richardson - predicted) <= 1e-9 * abs(predicted), (richardson, predicted)


def test_custom_action_and_closed_loops(geom, smooth):
    """A GaugeAction with an explicit loop list (here: the plaquettes written out) is the Wilson action."""
    paths = [(a, b, -a, -b) for a in range(1, 5) for b in range(a + 1, 5)]
    custom = GaugeAction(6.0, {"plaquette": (1.0, paths)})
    wilson = WilsonAction(6.0)
    assert custom.action(smooth) == pytest.approx(wilson.action(smooth), rel=1e-14)
    assert np.abs(custom.force(smooth) - wilson.force(smooth)).max() < 1e-12
    with pytest.raises(ValueError, match="not closed"):
        GaugeAction(1.0, {"open": (1.0, [(1, 2, -1)])})


# MILC reference ---------------------------------------------------------------------------------------------
from tests.conftest import FIXTURES as MILC_FIXTURES  # noqa: E402


def test_milc_sample_lattice_gauge_action():
    """lat.sample.l6666.hisq, re-unitarized as MILC does in double precision: MILC's su3_rhmc_hisq prints
    g = 1.91689566918234e+04 (beta 7.4, u0 0.89, nf 3, HISQ loops) and GACTION 5.996295 (docs/conventions.md 4.2)."""
    path = MILC_FIXTURES / "lat.sample.l6666.hisq"
    if not path.is_file():
        pytest.skip(f"MILC sample lattice not found at {path} (the shared fixtures folder beside the repository)")
    try:
        from lattice.io import read_gauge
    except ImportError as e:
        pytest.skip(f"lattice.io.read_gauge is not available ({e})")
    u, _ = read_gauge(path, reunitarize=True)
    act = SymanzikAction(7.4, 0.89, 3, "hisq")
    g = act.action(u)
    assert g == pytest.approx(1.91689566918234e+04, rel=1e-13)
    assert f"{act.gaction(u):f}" == "5.996295"


def test_milc_asqtad_sample_lattice_gauge_action():
    """lat.sample.l6666b650m010m050, re-unitarized: MILC's su3_leapfrog.2 prints ACTION: g = 1.67770842632224e+04
    (beta 6.5, u0 0.862, asqtad, dyn_flavors 2 1) before its first step."""
    path = MILC_FIXTURES / "lat.sample.l6666b650m010m050"
    if not path.is_file():
        pytest.skip(f"MILC sample lattice not found at {path} (the shared fixtures folder beside the repository)")
    from lattice.io import read_gauge

    u, _ = read_gauge(path, reunitarize=True)
    g = SymanzikAction(6.5, 0.862, 3, "asqtad").action(u)
    assert g == pytest.approx(1.67770842632224e+04, rel=1e-13)            # MILC prints 15 digits; errtol 0.03
