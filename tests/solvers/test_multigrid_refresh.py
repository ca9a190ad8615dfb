"""The near-null space's rule for new links (docs/multigrid.md 6, :class:`solvers.multigrid.Subspace`): with
``refresh_every`` None every link update refreshes the vectors; with N >= 1 a link update refreshes them only once
N epochs (RHMC trajectories) have begun since they were made or last refreshed, and otherwise keeps them and only
rebuilds X^-1 and the coarse operators (a thin update); 0 never refreshes. Every solve still converges to the
tolerance on the true residual. A smooth 4^4 HISQ field (exp(0.3 H) of a Gaussian algebra field) and a second one."""
import math

import numpy as np
import pytest

from force.hisq_links import hisq_links
from lattice import CounterRNG, GaugeField, Geometry, su3
from solvers import StaggeredDslash, norm2
from solvers.multigrid import MultigridError, Subspace, multigrid

from solver_testlib import random_field

TOL = 1e-10
MASS = 0.05


def smooth_links(geom, seed):
    rng = CounterRNG(seed)
    w = rng.gaussian("smooth", geom.site_ids(), 32).reshape(geom.shape + (4, 8))
    h = np.ascontiguousarray(np.moveaxis(su3.algebra_from_coefficients(w), -3, 0))
    return hisq_links(GaugeField(geom, su3.expm_su3(0.3 * h) @ GaugeField.unit(geom).links), eps=0.0)


@pytest.fixture(scope="module")
def fields():
    geom = Geometry((4, 4, 4, 4))
    return geom, smooth_links(geom, 5), smooth_links(geom, 6), random_field(geom, np.random.default_rng(3))


@pytest.mark.parametrize("every, events", [(None, ["built", "refreshed", "refreshed"]),
                                           (2, ["built", "updated", "refreshed"]),
                                           (0, ["built", "updated", "updated"])])
def test_refresh_rule(fields, every, events):
    geom, a, b, src = fields
    D = StaggeredDslash(geom, a.fat, a.long)
    inv = multigrid(TOL, nv=8, setup_iters=30, refresh_iters=10, refresh_every=every)(D.matrix(MASS))
    sub = inv.subspace
    got, kept = [], []
    for links in (None, b, a):                     # the first links, an update, and back
        if links is not None:
            sub.new_epoch()
            D.set_links(links.fat, links.long)
        vectors = sub.vectors[0] if sub.vectors else None
        x, st = inv.solve(src)
        got.append(st.setup)
        kept.append(sub.vectors[0] is vectors)
        r = math.sqrt(norm2(geom, src - D.matrix(MASS)(x)) / norm2(geom, src))
        assert st.converged and r <= TOL, (every, st.setup, r)
        if st.setup != "built":                    # new links: the hierarchy is on them, whatever the rule
            assert inv.hierarchy.version == sub.version and sub.links is D._store.links
    assert got == events
    assert kept == [False] + [e == "updated" for e in events[1:]]     # a thin update keeps the very vectors
    assert inv.solve(src)[1].setup == "reused"
    assert sub.counts == {w: events.count(w) for w in ("built", "refreshed", "updated")} | {"rebuilt": 0}


def test_bad_refresh_every_is_one_line(fields):
    geom, a, _, _ = fields
    D = StaggeredDslash(geom, a.fat, a.long)
    inv = multigrid(TOL, nv=8, setup_iters=5)(D.matrix(MASS))
    for call in (lambda: Subspace(inv.params, -1),
                 lambda: multigrid(TOL, nv=8, subspace=inv.subspace, refresh_every=1)):
        with pytest.raises(MultigridError) as e:
            call()
        assert len(str(e.value).splitlines()) == 1 and "refresh_every" in str(e.value)
