"""MILC's HISQ eigenvalue check (``ks_eigen/test/su3_eigen_hisq.*.2.sample-out``, docs/conventions.md 4.3).

lat.sample.inst (4^4, MILC 1996 format), HISQ links with eps 0, antiperiodic time, u0 1: the lowest 32 eigenvalues
of -D_eo D_oe on the even sites are 0.0461351 (x2), 1.98424 (x2), 2.0337 (x2), 2.07399 (x2), 2.09237 (x2),
2.13513 (x2), 2.1752 (x2), 2.34722 (x16), 2.44517 (x2), printed with %g. The even-site space has 128 * 3 = 384
complex dimensions: the operator is built densely from its action on unit vectors and diagonalized exactly.
"""
import numpy as np
import pytest

from force.hisq_links import hisq_links
from lattice.io import read_gauge
from solvers import ParityHop, StaggeredDslash, parity_sites
from tests.conftest import fixture_path

MILC = [(0.0461351, 2), (1.98424, 2), (2.0337, 2), (2.07399, 2), (2.09237, 2), (2.13513, 2), (2.1752, 2),
        (2.34722, 16), (2.44517, 2)]


def even_matrix(D):
    """The dense matrix of -D_eo D_oe on the even sites (rows and columns: even site in MILC order, colour)."""
    geom = D.geom
    even = parity_sites(geom, 0)
    n = 3 * len(even)
    d_eo, d_oe = ParityHop(D, 0), ParityHop(D, 1)
    a = np.empty((n, n), dtype=np.complex128)
    e = np.zeros(geom.shape + (3,), dtype=np.complex128)
    flat = e.reshape(-1, 3)
    for j in range(n):
        flat[even[j // 3], j % 3] = 1.0
        a[:, j] = -d_eo(d_oe(e)).reshape(-1, 3)[even].ravel()
        flat[even[j // 3], j % 3] = 0.0
    return a


@pytest.mark.parametrize("reunitarize", [True, False])
def test_lowest_eigenvalues_of_inst(reunitarize):
    u, info = read_gauge(fixture_path("lat.sample.inst"), reunitarize=reunitarize)
    assert info["format"] == "milc-1996" and tuple(info["dims"]) == (4, 4, 4, 4)
    links = hisq_links(u, eps=0.0, time_bc="antiperiodic")
    a = even_matrix(StaggeredDslash(u.geom, links.fat, links.long))
    assert a.shape == (384, 384)
    assert np.abs(a - a.conj().T).max() < 1e-13          # -D_eo D_oe = D_oe^dag D_oe: Hermitian, >= 0
    w = np.linalg.eigvalsh(a)
    assert w[0] > 0
    ref = np.concatenate([[v] * k for v, k in MILC])
    low = w[:len(ref)]
    # the printed digits, multiplicities included (MILC prints %g: 6 significant digits)
    assert [f"{x:g}" for x in low] == [f"{x:g}" for x in ref]
    assert np.abs(low / ref - 1).max() < 3e-6             # measured 2.3e-6: 2.033702 printed as 2.0337
    # each degenerate group is degenerate here too, and the next eigenvalue lies above the last group
    start = 0
    for v, k in MILC:
        grp = low[start:start + k]
        assert grp.max() - grp.min() < 1e-9, (v, grp)
        start += k
    assert w[len(ref)] > 2.44517 + 1e-3                   # 2.471377: (x2) for 2.44517 is complete
