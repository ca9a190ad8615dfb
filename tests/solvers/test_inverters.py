"""Inverters as operator -> inverter factories and the field spaces they act on (docs/architecture.md, 'Inverters and
field spaces'): the factories compose, every shift inverter answers in one shape, the composed spellings are bitwise
the named entry points, and a vector of another space is a one-line error naming the space."""
import numpy as np
import pytest

from lattice import Geometry
from solvers import (COLOUR_VECTOR, FieldSpace, FunctionOperator, StaggeredDslash, cg, even_odd, even_odd_inverse,
                     hybrid_multishift_cg, mixed_cg, mixed_multishift_cg, mixed_precision, multi_shift, multishift_cg,
                     norm2, project, refined)
from solvers.blas_cuda import _fits
from solvers.operator import fused_blas
from solver_testlib import random_field, random_links

SHIFTS = [0.05, 0.4, 2.0]
TOL = 1e-9


@pytest.fixture(scope="module")
def system():
    geom = Geometry((4, 4, 4, 4))
    fat, long = random_links(geom, 3)
    d = StaggeredDslash(geom, fat, long)
    b = project(random_field(geom, np.random.default_rng(3)), geom, 0)
    return geom, d, d.even_odd(0.0).normal, b


def _true_residuals(geom, a, b, xs, shifts=SHIFTS):
    return [np.sqrt(norm2(geom, b - a(x) - s * x) / norm2(geom, b)) for s, x in zip(shifts, xs)]


def test_even_odd_of_mixed_precision_cg_solves_to_tolerance(system):
    geom, d, _, _ = system
    full = random_field(geom, np.random.default_rng(4))
    x, st = even_odd(mixed_precision(cg(TOL, 2000)))(d.even_odd(0.2)).solve(full)
    assert st.converged and st.true_residual <= TOL and st.precision == "single/double"
    r = full - d.matrix(0.2)(x)
    assert np.sqrt(norm2(geom, r) / norm2(geom, full)) == pytest.approx(st.full_residual)
    assert st.full_residual < 1e3 * TOL
    y, sy = even_odd_inverse(d.even_odd(0.2), mixed_cg(TOL, 2000)).solve(full)     # the named spelling: same bits
    assert np.array_equal(x, y) and sy.iters == st.iters
    z, sz = mixed_precision(even_odd(cg(TOL, 2000)))(d.even_odd(0.2)).solve(full)   # made mixed from outside
    assert np.array_equal(x, z) and sz.matvecs == st.matvecs


def test_every_shift_inverter_answers_in_one_shape(system):
    geom, _, a, b = system
    variants = {"multishift": multishift_cg(SHIFTS, TOL, 2000),
                "hybrid": refined(multishift_cg(SHIFTS, TOL, 2000), cg(TOL, 2000)),
                "mixed": mixed_precision(multishift_cg(SHIFTS, TOL, 2000)),
                "one by one": multi_shift(cg(TOL, 2000), SHIFTS)}
    answers = {}
    for name, factory in variants.items():
        inv = factory(a)
        xs, st = inv.solve(b)
        assert inv.space == a.space and inv.shifts == tuple(SHIFTS) and st.shifts == tuple(SHIFTS), name
        assert len(xs) == len(SHIFTS) and all(x.shape == a.space.shape and x.dtype == np.complex128 for x in xs)
        assert st.converged and len(st.true_residuals) == len(SHIFTS), name
        assert max(_true_residuals(geom, a, b, xs)) <= TOL * 1.01, name
        answers[name] = xs
    for name, xs in answers.items():
        for x, y in zip(xs, answers["multishift"]):
            assert np.sqrt(norm2(geom, x - y) / norm2(geom, y)) < 1e3 * TOL, name


def test_composed_spellings_are_the_named_entry_points_bitwise(system):
    geom, d, a, b = system
    fat, long = random_links(geom, 3)
    a0 = StaggeredDslash(geom, fat, 0.98 * long).even_odd(0.0).normal        # as if another Naik epsilon
    named, sn = hybrid_multishift_cg(SHIFTS, TOL, 2000, refine_maxiter=400)(a0, a).solve(b)
    composed, sc = refined(multishift_cg(SHIFTS, TOL, 2000, raise_on_fail=False, check_residual=False),
                           cg(TOL, 400, raise_on_fail=False), sloppy=lambda _: a0, name="hybrid")(a).solve(b)
    assert all(np.array_equal(x, y) for x, y in zip(named, composed))
    assert sn.extra["refine_milc_iters"] == sc.extra["refine_milc_iters"] > len(SHIFTS)
    named, sn = mixed_multishift_cg(SHIFTS, TOL, 2000)(a).solve(b)
    composed, sc = mixed_precision(multishift_cg(SHIFTS, TOL, 2000))(a).solve(b)
    assert all(np.array_equal(x, y) for x, y in zip(named, composed)) and sn.flops == sc.flops
    xs, st = multi_shift(cg(TOL, 2000), SHIFTS)(a).solve(b)
    for s, x, one in zip(SHIFTS, xs, st.extra["solves"]):
        y, sy = cg(TOL, 2000)(a.shifted(s)).solve(b)
        assert np.array_equal(x, y) and sy.iters == one.iters
    assert st.iters == sum(r.iters for r in st.extra["solves"])


def test_a_vector_of_another_space_is_a_one_line_error(system):
    geom, _, a, b = system
    assert a.space == FieldSpace(geom, COLOUR_VECTOR, 0, np.complex128)
    assert a.shifted(0.1).space == a.space and cg(TOL)(a).space == a.space
    assert a.converted(np.complex64).space == a.space.converted(np.complex64)
    inverters = (cg(TOL)(a), multishift_cg(SHIFTS, TOL)(a), mixed_precision(multishift_cg(SHIFTS, TOL))(a))
    wrong = {"shape": np.zeros(geom.shape + (4,), complex), "dtype": np.ones(b.shape, np.int64),
             "parity": project(random_field(geom, np.random.default_rng(5)), geom, 1)}
    for inv in inverters:
        for what, v in wrong.items():
            with pytest.raises(ValueError) as e:
                inv.solve(v)
            msg = str(e.value)
            assert "\n" not in msg and str(a.space) in msg and "even sites" in msg, (what, msg)
    with pytest.raises(ValueError, match="other parity"):
        cg(TOL)(a).solve(wrong["parity"])
    x, st = cg(TOL)(a).solve(np.zeros_like(b))               # the zero vector belongs to every space
    assert st.converged and not x.any()
    with pytest.raises(TypeError, match="mixed_precision takes"):
        mixed_precision(lambda op: op)
    with pytest.raises(TypeError, match="even-odd operator"):
        even_odd(cg(TOL))(a)


def test_the_parity_support_test_runs_only_on_the_array_placement(system, monkeypatch):
    """On a device placement the support count (a reduction and a host sync per solve) is skipped; the shape and
    dtype are still checked."""
    import solvers.operator as opmod
    from lattice.placement import Placement

    geom, _, a, b = system
    other = project(random_field(geom, np.random.default_rng(5)), geom, 1)
    counts = []
    count = opmod.FieldSpace._nonzero
    monkeypatch.setattr(opmod.FieldSpace, "_nonzero", lambda self, v, parity=None: counts.append(parity) or
                        count(self, v, parity))
    with pytest.raises(ValueError, match="other parity"):
        a.space.check(other)
    assert counts == [0, None]
    monkeypatch.setattr(opmod, "placement_of", lambda geom: Placement.WHOLE)
    counts.clear()
    a.space.check(other)
    a.space.check(b)
    assert counts == []
    with pytest.raises(ValueError, match="shape"):
        a.space.check(np.zeros(geom.shape + (4,), complex))
    with pytest.raises(ValueError, match="dtype"):
        a.space.check(np.ones(b.shape, np.int64))


def test_generic_solvers_take_any_site_shape():
    """A field of two components per site: CG and the multishift CG allocate, count and solve on its space; the
    fused kernels (written for colour vectors) do not claim it."""
    geom = Geometry((4, 4, 4, 4))
    diag = 1.0 + np.random.default_rng(6).random(geom.shape + (2,))
    op = FunctionOperator(geom, lambda v: diag * v, hermitian=True, site_shape=(2,), name="diag")
    assert op.space.shape == geom.shape + (2,) and op.space.site_size == 2 and op.space.zeros().shape == op.space.shape
    b = random_field(geom, np.random.default_rng(7))[..., :2].copy()
    x, st = cg(1e-12)(op).solve(b)
    assert np.allclose(x, b / diag, rtol=0, atol=1e-11) and st.flops > 0
    xs, _ = multishift_cg([0.0, 1.0], 1e-12)(op).solve(b)
    assert np.allclose(xs[1], b / (diag + 1.0), rtol=0, atol=1e-11)
    with pytest.raises(ValueError, match=r"site shape \(2,\)"):
        cg(1e-12)(op).solve(random_field(geom, np.random.default_rng(7)))
    assert fused_blas(op) is None
    assert _fits(geom, None, op.space.converted(np.complex128)) is False
    assert _fits(geom, None, FieldSpace(geom, COLOUR_VECTOR)) is True
