"""The device-resident solver iterations (solvers.krylov_graph) on one GPU give the host-driven fused path's
iterates bitwise: CG (Chronopoulos-Gear, double and single precision, with restarts), mixed-precision CG in its
one-reduction form, the multishift CG in double and single precision; for any number of iterations per graph.
Run on the device: pytest -m gpu."""
import numpy as np
import pytest

from comms import ProcessGrid
from comms.config import RunConfig
from lattice import Geometry, get_backend
from solvers import StaggeredDslash, cg, mixed_cg, mixed_precision, multishift_cg, project
from solvers.multishift import MultishiftCG

from solver_testlib import random_field, random_links

pytestmark = pytest.mark.gpu

DIMS = (4, 4, 8, 8)


def _dslash(iters, fat, long, capture=0, while_body=0):
    cfg = RunConfig(backend="cupy", solver_graph=iters, solver_graph_capture=capture, solver_graph_while=while_body)
    geom = Geometry(DIMS, get_backend("cupy"), ProcessGrid((1, 1, 1, 1), config=cfg))
    xp = geom.xp
    return StaggeredDslash(geom, xp.asarray(fat), xp.asarray(long))


@pytest.fixture(scope="module")
def fields():
    cpu = Geometry(DIMS, get_backend("numpy"))
    fat, long = random_links(cpu, seed=7)
    b = project(random_field(cpu, np.random.default_rng(3)), cpu, 0)
    return fat, long, b


def _solve(iters, fields, make, mass=0.05, dtype=np.complex128, capture=0, while_body=0):
    fat, long, b = fields
    d = _dslash(iters, fat, long, capture, while_body)
    if dtype != np.complex128:
        d = d.converted(dtype)
    A = d.even_odd(mass).normal
    out, st = make(A).solve(d.xp.asarray(b).astype(dtype))
    return out, st


def _same(a, b):
    if isinstance(a, list):
        return all(_same(u, v) for u, v in zip(a, b))
    return bool((a == b).all()) and a.dtype == b.dtype


SOLVERS = {
    "cg": (lambda A: cg(1e-10, 3000)(A), np.complex128, 0.05),
    "cg_light": (lambda A: cg(1e-12, 5000)(A), np.complex128, 0.005),
    "cg_single": (lambda A: cg(1e-5, 3000)(A), np.complex64, 0.05),
    "mixed_one_reduction": (lambda A: mixed_cg(1e-10, 3000, single_reduction=True)(A), np.complex128, 0.05),
    "multishift": (lambda A: multishift_cg([0.0, 0.01, 0.3, 2.0], 1e-10, 3000)(A), np.complex128, 0.0),
    "multishift_single": (lambda A: multishift_cg([0.001, 0.02, 0.5], 1e-5, 3000)(A), np.complex64, 0.0),
    # the converged shifts stopped (stop_converged): the same shifts stop at the same iteration on the device
    "multishift_stop": (lambda A: multishift_cg([0.0, 0.01, 0.3, 2.0], 1e-10, 3000, stop_converged=True)(A),
                        np.complex128, 0.0),
    "multishift_single_stop": (lambda A: multishift_cg([0.001, 0.02, 0.5], 1e-5, 3000, stop_converged=True)(A),
                               np.complex64, 0.0),
    # the mixed-precision first stage (multishift_reliable): single Krylov vectors, double x_i of the light shifts,
    # reliable updates (the device loop stops for each, the host restarts), the final true-residual check
    "multishift_mixed": (lambda A: MultishiftCG((0.0005, 0.01, 0.3, 2.0), 1e-7, 3000, True, True, np.complex64,
                                                0.01)(A), np.complex128, 0.0),
}


@pytest.mark.parametrize("name", sorted(SOLVERS))
@pytest.mark.parametrize("iters", [1, 3, 8])
def test_graph_iterates_equal_host_driven(fields, name, iters):
    make, dtype, mass = SOLVERS[name]
    ref, sr = _solve(0, fields, make, mass, dtype)
    got, sg = _solve(iters, fields, make, mass, dtype)
    assert sr.extra["graph_iterations"] == 0 and sg.extra["graph_iterations"] == iters
    assert sg.extra.get("graph_replays", 0) > 0
    assert (sg.iters, sg.milc_iters, sg.matvecs, sg.converged) == (sr.iters, sr.milc_iters, sr.matvecs, sr.converged)
    assert sg.residual == sr.residual and sg.true_residual == sr.true_residual
    assert sg.residuals == sr.residuals and sg.extra.get("shift_updates") == sr.extra.get("shift_updates")
    assert _same(got, ref)


@pytest.mark.parametrize("name", ["cg", "cg_single", "multishift", "multishift_single", "multishift_mixed"])
@pytest.mark.parametrize("body", [1, 4])
def test_device_side_loop_iterates_equal_host_driven(fields, name, body):
    """``solver_graph_while``: the whole solve (up to a restart or reliable update) as one launch of a while node;
    the host-driven iterates bitwise, and far fewer launches than host checks. A while graph the driver or nvrtc
    refuses fails here with the reason (the runs would warn and keep host checks)."""
    import warnings

    make, dtype, mass = SOLVERS[name]
    ref, sr = _solve(0, fields, make, mass, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got, sg = _solve(8, fields, make, mass, dtype, while_body=body)
    assert (sg.iters, sg.milc_iters, sg.matvecs, sg.converged) == (sr.iters, sr.milc_iters, sr.matvecs, sr.converged)
    assert sg.residual == sr.residual and sg.true_residual == sr.true_residual
    assert _same(got, ref)
    if name != "multishift_mixed":             # (its reliable updates end a launch each)
        assert 0 < sg.extra["graph_replays"] and 8 * sg.extra["graph_replays"] < sg.iters, sg.extra


@pytest.mark.parametrize("name", ["cg", "multishift", "multishift_mixed"])
def test_short_graphs_launched_several_times_equal_host_driven(fields, name):
    """HMC_SOLVER_GRAPH_CAPTURE=2 with HMC_SOLVER_GRAPH=8: graphs of 2 iterations, 4 launches per host check; the
    same iterates and counts as the host-driven path (and so as one graph of 8)."""
    make, dtype, mass = SOLVERS[name]
    ref, sr = _solve(0, fields, make, mass, dtype)
    got, sg = _solve(8, fields, make, mass, dtype, capture=2)
    assert sg.extra["graph_iterations"] == 8 and sg.extra.get("graph_replays", 0) % 4 == 0 < sg.extra["graph_replays"]
    assert (sg.iters, sg.milc_iters, sg.matvecs, sg.converged) == (sr.iters, sr.milc_iters, sr.matvecs, sr.converged)
    assert sg.residual == sr.residual and sg.true_residual == sr.true_residual
    assert _same(got, ref)


def test_graph_stops_at_maxiter_like_the_host(fields):
    make = lambda A: cg(1e-14, 37, raise_on_fail=False)(A)  # noqa: E731
    ref, sr = _solve(0, fields, make)
    got, sg = _solve(8, fields, make)
    assert not sg.converged and sg.iters == sr.iters == 37 and _same(got, ref)


@pytest.mark.parametrize("name", ["cg", "cg_light", "multishift"])
def test_exact_sums_graph_equals_host_driven(fields, name):
    """The "exact" reduction mode: device-resident iterations with exact device sums (lattice.exact_sum_cuda)
    against the host-driven fused path with the same exact sums: the same bits."""
    from solvers import set_reductions

    make, dtype, mass = SOLVERS[name]
    old = set_reductions("exact")
    try:
        ref, sr = _solve(0, fields, make, mass, dtype)
        got, sg = _solve(8, fields, make, mass, dtype)
    finally:
        set_reductions(old)
    assert sg.extra["fused"] and sg.extra["graph_iterations"] == 8 and sg.extra.get("graph_replays", 0) > 0
    assert (sg.iters, sg.matvecs, sg.residual) == (sr.iters, sr.matvecs, sr.residual)
    assert _same(got, ref)


@pytest.mark.parametrize("name", sorted(SOLVERS))
@pytest.mark.parametrize("iters", [0, 8])
def test_compact_vectors_equal_strided(fields, name, iters):
    """Parity-compact Krylov vectors (the default) against the parity's sites of full-lattice ones
    (HMC_SOLVER_FUSED=strided), host-driven and on the device: the same iterations and bits, except the mixed CG,
    whose reliable updates sum |r|^2 and <r, p> as arrays (the compact or the full vectors: rounding)."""
    from solvers.operator import set_fused_blas

    make, dtype, mass = SOLVERS[name]
    got, sg = _solve(iters, fields, make, mass, dtype)
    old = set_fused_blas("strided")
    try:
        ref, sr = _solve(iters, fields, make, mass, dtype)
    finally:
        set_fused_blas(old)
    assert sg.extra["compact"] and not sr.extra["compact"] and sg.extra["graph_iterations"] == iters
    assert sg.converged == sr.converged
    if name == "mixed_one_reduction":       # (two solutions to tol 1e-10: apart by at most cond(A) tol)
        assert abs(sg.iters - sr.iters) <= 2
        g, r = got.get(), ref.get()
        assert np.abs(g - r).max() <= 1e-6 * np.abs(r).max()
        return
    assert (sg.iters, sg.matvecs, sg.residual, sg.true_residual) == (sr.iters, sr.matvecs, sr.residual,
                                                                     sr.true_residual)
    assert sg.true_residuals == sr.true_residuals
    assert _same(got, ref)


REUSE = {
    "cg": lambda: cg(1e-10, 3000),
    "multishift": lambda: multishift_cg([0.0005, 0.01, 0.3, 2.0], 1e-8, 3000),
    # RHMC's cgprec 1: the multishift in single on the converted operator, every shift refined by a mixed CG
    "multishift_cgprec1": lambda: mixed_precision(multishift_cg([0.0005, 0.01, 0.3, 2.0], 1e-8, 3000)),
}


@pytest.mark.parametrize("name", sorted(REUSE))
def test_later_solves_and_link_updates_replay_the_kept_graphs(fields, name):
    """The Krylov vectors are the loop's own (GraphLoop.bind) and the hop's link tables are rebuilt at the same
    addresses (set_links): a second solve, and a solve after a link update, capture no graph, and their answers are
    bitwise those of a solve on a fresh operator (whose own first solve captures)."""
    from solver_testlib import random_links as links

    fat, long, b = fields
    fat2, long2 = links(Geometry(DIMS, get_backend("numpy")), seed=19)
    mass = 0.05 if name == "cg" else 0.0
    d = _dslash(8, fat, long)
    xp = d.xp
    A = d.even_odd(mass).normal
    bb = xp.asarray(b)
    x1, s1 = REUSE[name]()(A).solve(bb)
    x2, s2 = REUSE[name]()(A).solve(bb)
    assert s1.extra.get("graph_captures", 0) > 0 and s2.extra.get("graph_captures", 0) == 0, (s1.extra, s2.extra)
    assert s2.extra.get("graph_replays", 0) > 0 and _same(x2, x1)
    d.set_links(xp.asarray(fat2), xp.asarray(long2))
    x3, s3 = REUSE[name]()(A).solve(bb)
    fresh = _dslash(8, fat2, long2)
    x4, s4 = REUSE[name]()(fresh.even_odd(mass).normal).solve(bb)
    assert s3.extra.get("graph_captures", 0) == 0 < s4.extra.get("graph_captures", 0), (s3.extra, s4.extra)
    assert (s3.iters, s3.residual) == (s4.iters, s4.residual) and _same(x3, x4)
    assert not _same(x3, x1)
