"""Guards of issue 7's scaling study (solvers/multigrid/README notes): the outer flexible GCR must see its residual
fall below the rounding floor of its |r|^2 recurrence, so that a long Krylov cycle (``nkrylov``) stops at the
tolerance instead of running on to the next restart."""
import numpy as np

from lattice import Geometry
from solvers.multigrid.krylov import fgcr, norm2


def test_fgcr_stops_at_tolerance_below_recurrence_floor():
    """A diagonal system with eigenvalues in [1, 4]: GCR reaches 1e-12 in ~20 directions. The recurrence
    |r|^2 - |<q, r>|^2/|q|^2 alone stalls near 1e-8 relative residual (it subtracts numbers of the size of |b|^2);
    without measuring |r|^2 below that floor the solve ran to maxiter (200) and far below the tolerance."""
    geom = Geometry((4, 4, 4, 4))
    rng = np.random.default_rng(1)
    shape = tuple(geom.shape) + (3,)
    d = rng.uniform(1.0, 4.0, shape) * np.exp(1j * rng.uniform(-0.3, 0.3, shape))
    b = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    x, res = fgcr(lambda v: d * v, lambda r: r, geom, b, 1e-12, 200, nkrylov=200, true_residual=True)
    true = np.sqrt(norm2(geom, b - d * x) / norm2(geom, b))
    assert res.converged and true <= 1e-12
    assert res.iters < 60, f"{res.iters} iterations: the residual recurrence stalled at its rounding floor"
    assert true > 1e-15, "ran far past the tolerance"
