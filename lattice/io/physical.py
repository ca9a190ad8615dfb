"""Non-physical gauge fields refused at the door: what ``read_gauge(check_links=True)`` (``hmc init``, ``measure``,
``solve``, ``spectrum``) does with the links as stored, before anything is computed from them.

* NaN or inf anywhere: refused (nothing can repair it).
* A link farther from U(3) than the stored precision allows, max_ij |(U^dag U - 1)_ij| > UNITARITY_TOLERANCE[bits]:
  refused, or, with ``force_reunitarize`` (``--force-reunitarize``), projected onto SU(3) by MILC's ``reunit_su3``
  (:func:`lattice.su3.reunitarize`) deliberately. A zero link, or one whose first two rows are parallel, cannot be
  projected and stays refused.

Tolerances (docs/faults.md): a single-precision MILC file is unitary to the rounding of float32 after MILC's own
double-precision reunitarization and the trajectory's arithmetic; MILC's sample files deviate by 9e-8 to 5e-7, so
32-bit files get 1e-5 (20x margin over the worst sample). Double-precision files written after a reunitarization
deviate by ~1e-15, and a run with ``reunitarize = false`` drifts by ~1e-13 per trajectory: 64-bit files get 1e-6.
"""
from __future__ import annotations

import numpy as np

from .common import fail

UNITARITY_TOLERANCE = {32: 1e-5, 64: 1e-6}
PROJECTED_TOLERANCE = 1e-12           # what a projected link must reach (reunit_su3 in double gives ~1e-15)


def unitarity_deviation(a: np.ndarray) -> np.ndarray:
    """max_ij |(U^dag U - 1)_ij| of every 3x3 matrix of ``a`` (shape a.shape[:-2]); one time slice at a time, so
    the temporaries stay a slice's size."""
    out = np.empty(a.shape[:-2])
    eye = np.eye(3)
    for t in range(a.shape[0]):
        u = a[t]
        out[t] = np.abs(np.conj(np.swapaxes(u, -1, -2)) @ u - eye).max(axis=(-2, -1))
    return out


def _where(index) -> str:
    t, z, y, x, mu = (int(i) for i in index[:5])
    return f"site (x, y, z, t) = ({x}, {y}, {z}, {t}), direction {'xyzt'[mu]}"


def check_links(path, a: np.ndarray, bits: int, force_reunitarize: bool = False) -> tuple[np.ndarray, int]:
    """(links, number of links projected) for the site-major links ``a`` (nt, nz, ny, nx, 4, 3, 3) stored with
    ``bits``-bit reals; raises GaugeFileError (one line: how many, the worst, where, the fix) as the module says."""
    finite = np.isfinite(a).all(axis=(-2, -1))
    if not finite.all():
        first = np.argwhere(~finite)[0]
        raise fail(path, f"{int((~finite).sum())} of {finite.size} links hold NaN or inf (the first at "
                         f"{_where(first)})", "the configuration is damaged and cannot be repaired: use another copy")
    tol = UNITARITY_TOLERANCE[bits]
    dev = unitarity_deviation(a)
    bad = dev > tol
    if not bad.any():
        return a, 0
    worst = np.unravel_index(int(np.argmax(dev)), dev.shape)
    zero = ~np.any(a != 0, axis=(-2, -1))
    if not force_reunitarize:
        what = (f"{int(zero.sum())} zero (not invertible) links, the first at {_where(np.argwhere(zero)[0])}; "
                if zero.any() else "")
        raise fail(path, f"{what}{int(bad.sum())} of {bad.size} links are not unitary: max |U^dag U - 1| = "
                         f"{dev[worst]:.3e} at {_where(worst)}, above the tolerance {tol:g} of {bits}-bit stored "
                         "links", "the file is damaged or not a gauge configuration: use another copy, or pass "
                         "--force-reunitarize to project the links onto SU(3) deliberately")
    from ..su3 import reunitarize

    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(bad[..., None, None], reunitarize(a), a)
        left = bad & (~np.isfinite(out).all(axis=(-2, -1)) | (unitarity_deviation(out) > PROJECTED_TOLERANCE))
    if left.any():
        raise fail(path, f"{int(left.sum())} links cannot be projected onto SU(3) (the first at "
                         f"{_where(np.argwhere(left)[0])}): a zero row or two parallel rows",
                   "the configuration is damaged beyond repair: use another copy")
    return out, int(bad.sum())
