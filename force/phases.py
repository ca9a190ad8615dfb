"""MILC's staggered (Kogut-Susskind) phases and the time boundary condition (docs/conventions.md 1.2).

MILC's own convention (``generic_ks/rephase.c: phaseset``), which orders t first:

    eta_t(x) = 1,  eta_x(x) = (-1)^t,  eta_y(x) = (-1)^(t+x),  eta_z(x) = (-1)^(t+x+y).

With antiperiodic time boundary conditions every t-link on the slice t = nt-1 carries an extra -1 (``eta_t = -1``
there); space is periodic. ``time_bc="periodic"`` removes that sign (``time_bc periodic`` in ``ks_spectrum``).

The arrays returned here are real (+-1) site fields of shape (4,) + geom.shape, computed from the *global*
coordinates, so each rank of a decomposed lattice gets its own part without any communication. Multiply a link
field (4, nt, nz, ny, nx, 3, 3) by them with :func:`apply_phases`.

* :func:`staggered_phases`: eta_mu(x), BC sign included: the factor of a one-link (fat) term.
* :func:`naik_phases`: eta_mu(x) eta_mu(x+mu) eta_mu(x+2mu), BC signs included: the factor of the three-link Naik
  term, whose path can cross the t boundary (docs/conventions.md 6, pitfall 1).
"""
from __future__ import annotations

TIME_BCS = ("antiperiodic", "periodic")


def check_time_bc(time_bc: str) -> str:
    if time_bc not in TIME_BCS:
        raise ValueError(f"time_bc {time_bc!r}: use one of {', '.join(TIME_BCS)}")
    return time_bc


def _eta_at(xp, mu: int, x, y, z, t, dims, time_bc: str):
    """eta_mu at the (global, possibly out-of-range) coordinates x, y, z, t, wrapped periodically; the BC sign is
    that of the t-link leaving the wrapped site."""
    nx, ny, nz, nt = dims
    x, y, z, t = x % nx, y % ny, z % nz, t % nt
    if mu == 0:
        e = 1 - 2 * (t % 2)
    elif mu == 1:
        e = 1 - 2 * ((t + x) % 2)
    elif mu == 2:
        e = 1 - 2 * ((t + x + y) % 2)
    else:
        e = xp.ones_like(t)
        if time_bc == "antiperiodic":
            e = xp.where(t == nt - 1, -1, 1)
    return e.astype(xp.float64)


def staggered_phases(geom, time_bc: str = "antiperiodic"):
    """eta_mu(x) for mu = 0..3 (x, y, z, t), BC sign included: a float array (4,) + geom.shape of +-1 (made once:
    :meth:`lattice.geometry.Geometry.kept`)."""
    check_time_bc(time_bc)
    return geom.kept(("phases", "eta", time_bc), lambda: _staggered_phases(geom, time_bc))


def _staggered_phases(geom, time_bc):
    xp = geom.xp
    c = geom.coordinates()
    return xp.stack([_eta_at(xp, mu, *c, geom.dims, time_bc) for mu in range(4)])


def naik_phases(geom, time_bc: str = "antiperiodic"):
    """eta_mu(x) eta_mu(x+mu) eta_mu(x+2mu), BC signs included: the sign of the Naik path x -> x+3mu (made once:
    :meth:`lattice.geometry.Geometry.kept`)."""
    check_time_bc(time_bc)
    return geom.kept(("phases", "naik", time_bc), lambda: _naik_phases(geom, time_bc))


def _naik_phases(geom, time_bc):
    xp = geom.xp
    x, y, z, t = geom.coordinates()
    out = []
    for mu in range(4):
        e = None
        for k in range(3):
            c = [x, y, z, t]
            c[mu] = c[mu] + k
            f = _eta_at(xp, mu, *c, geom.dims, time_bc)
            e = f if e is None else e * f
        out.append(e)
    return xp.stack(out)


def apply_phases(links, eta):
    """links[mu](x) * eta[mu](x) for a link field (4, ..., 3, 3) and a phase field (4, ...): a new array. Applying the
    same phases twice gives the links back (eta = +-1), so this also removes them."""
    return links * eta[..., None, None]
