"""Helpers for the solver tests (imported as ``solver_testlib``): MILC's staggered phases, free-field and random
HISQ-like links, random fields."""
import numpy as np

from lattice import CounterRNG, GaugeField, su3


def milc_phases(geom, antiperiodic=True):
    """eta_mu(x) times the boundary sign, shape (4, nt, nz, ny, nx) (docs/conventions.md 1.2):
    eta_t = 1, eta_x = (-1)^t, eta_y = (-1)^(t+x), eta_z = (-1)^(t+x+y); -1 on t-links of the last time slice."""
    x, y, z, t = geom.coordinates()
    eta = np.stack([(-1.0) ** t, (-1.0) ** (t + x), (-1.0) ** (t + x + y), np.ones(geom.shape)])
    if antiperiodic:
        eta[3] = np.where(t == geom.dims[3] - 1, -1.0, 1.0)
    return eta


def phased(geom, links, antiperiodic=True):
    return links * milc_phases(geom, antiperiodic)[..., None, None]


def naik(geom, w):
    """W_mu(x) W_mu(x+mu) W_mu(x+2mu) for every mu (the long-link path)."""
    return np.stack([w[mu] @ geom.shift(w[mu], mu, 1) @ geom.shift(w[mu], mu, 2) for mu in range(4)])


def free_links(geom, c1=9 / 8, cn=-1 / 24, antiperiodic=True):
    """Fat and long links of the unit gauge with MILC's phases: c1 * eta and cn * (three phased unit links)."""
    u = phased(geom, su3.identity_like((4,) + geom.shape), antiperiodic)
    return c1 * u, cn * naik(geom, u)


def random_links(geom, seed=1, cn=-1 / 24, antiperiodic=True):
    """HISQ-like links on a Haar-random SU(3) field: fat = phased U, long = cn * U U U (phases included)."""
    u = phased(geom, GaugeField.random(geom, CounterRNG(seed)).links, antiperiodic)
    return u, cn * naik(geom, u)


def random_matrices(geom, rng):
    """Arbitrary complex 3x3 matrices on every link (for algebraic identities)."""
    s = (4,) + geom.shape + (3, 3)
    return rng.standard_normal(s) + 1j * rng.standard_normal(s)


def random_field(geom, rng, dtype=np.complex128):
    s = geom.shape + (3,)
    return (rng.standard_normal(s) + 1j * rng.standard_normal(s)).astype(dtype)


def vdot(a, b):
    return np.vdot(a.ravel(), b.ravel())


def rel(a, b):
    return np.linalg.norm((a - b).ravel()) / np.linalg.norm(b.ravel())


def partitioned_pair(dims=(4, 4, 4, 4), seed=21):
    """(plain geometry, the same lattice on a one-rank grid with every dimension on the halo path, random HISQ-like
    (fat, long) links): the pair of the bitwise decomposition tests. Skips where no MPI library gives the
    self-exchange."""
    import pytest

    from comms import ProcessGrid
    from lattice import Geometry

    plain = Geometry(dims)
    try:
        part = Geometry(dims, grid=ProcessGrid(partitioned="xyzt"))
    except Exception as exc:        # no MPI library for the self-exchange
        pytest.skip(f"partitioned one-rank grid unavailable: {exc}")
    return plain, part, random_links(plain, seed=seed)
