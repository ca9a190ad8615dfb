"""Coulomb and Landau gauge fixing by MILC's over-relaxed SU(2) subgroup iteration (docs/gauge-fixing.md).

The iteration maximizes the gauge-fixing functional

    F[U] = sum_x sum_{mu != gauge_dir} ReTr U_mu(x) / (3 ndir V)        (1 when every link is the unit matrix)

over gauge transformations (Coulomb gauge: ``gauge_dir`` = 3, the time direction left out; Landau: ``None``, all
four directions). One step (MILC's ``gaugefixstep``, generic/gaugefix2.c) updates the odd sites, then the even ones;
on the sites of one parity it does three SU(2) hits, on the subgroups (0,1), (1,2), (2,0), each recomputed from the
links as the previous hit left them. At a site x the hit on the subgroup (p,q) is built from

    W(x) = sum_{mu != gauge_dir} [U_mu(x - mu) - U_mu(x)],   S(x) = sum_{mu != gauge_dir} [U_mu(x) + U_mu(x - mu)]
    a0 = Re(S_pp + S_qq),  a1 = Im(W_qp + W_pq),  a2 = Re(W_pq - W_qp),  a3 = Im(W_pp - W_qq)

(the locally optimal SU(2) element is proportional to a0 + i sum_j a_j sigma_j), over-relaxed by MILC's boost
x = (omega a0^2 + |a|^2) / (a0^2 + |a|^2), r = sqrt(a0^2 + x^2 |a|^2), a0 -> a0/r, a_j -> x a_j/r, and applied as
the gauge transformation g(x) = [[a0 + i a3, a2 + i a1], [-a2 + i a1, a0 - i a3]] on rows/columns p, q (identity on
the other parity): U_mu(x) -> g(x) U_mu(x) in every direction, U_mu(x - mu) -> U_mu(x - mu) g(x)^dag.

The action MILC prints is the sum over the two parities of F/2 measured right after that parity's hits (each link
touches exactly one site of each parity). The iteration stops after step k >= 1 when that action changed by less
than ``tol`` from step k-1; the links are re-unitarized (``lattice.su3.reunitarize``, MILC's ``reunit_su3``) after
every 20th step and at the end. Everything is array code on ``Geometry.shift`` and ``Geometry.sum``: one code path
for NumPy, CuPy and distributed lattices.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import su3
from .gauge import GaugeField

SUBGROUPS = ((0, 1), (1, 2), (2, 0))
REUNITARIZE_EVERY = 20        # MILC's REUNIT_INTERVAL


class GaugeFixError(ValueError):
    pass


@dataclass
class GaugeFixResult:
    """MILC's report: ``step`` is its loop index at the end (the step count minus one when it converged),
    ``action`` the last step's average, ``delta`` its change from the step before (0 after one step)."""

    step: int
    action: float
    delta: float
    converged: bool
    history: list = field(default_factory=list)     # the action after each step

    def milc_line(self) -> str:
        return f"GFIX: Ended at step {self.step}. Av gf action {self.action:.8e}, delta {self.delta:.3e}"


def fixed_directions(gauge_dir: int | None) -> tuple:
    """The directions of the functional: all but ``gauge_dir`` (Coulomb), or all four for ``None`` (Landau)."""
    if gauge_dir is not None and gauge_dir not in range(4):
        raise GaugeFixError(f"gauge_dir {gauge_dir!r} is not a direction: give 0..3 (Coulomb gauge on the other "
                            "three; 3 for time slices) or None (Landau gauge)")
    return tuple(mu for mu in range(4) if mu != gauge_dir)


def gauge_fix_functional(u: GaugeField, gauge_dir: int | None = 3) -> float:
    """F[U] = sum_x sum_{mu in dirs} ReTr U_mu(x) / (3 ndir V): 1 for unit links."""
    dirs = fixed_directions(gauge_dir)
    geom = u.geom
    return sum(geom.sum(su3.retrace(u.links[mu])) for mu in dirs) / (3.0 * len(dirs) * geom.volume)


def _su2_hit(u: GaugeField, dirs, p: int, q: int, on, omega: float):
    """The over-relaxed SU(2) transformation of the subgroup (p, q) at the sites where ``on`` holds (identity
    elsewhere), as a site field of 3x3 matrices (module docstring)."""
    xp, geom, links = u.xp, u.geom, u.links
    down = [geom.shift(links[mu], mu, -1) for mu in dirs]
    w = sum(down) - sum(links[mu] for mu in dirs)
    s = sum(down) + sum(links[mu] for mu in dirs)
    a0 = (s[..., p, p] + s[..., q, q]).real
    a1 = w[..., q, p].imag + w[..., p, q].imag
    a2 = w[..., p, q].real - w[..., q, p].real
    a3 = w[..., p, p].imag - w[..., q, q].imag
    asq, a0sq = a1 * a1 + a2 * a2 + a3 * a3, a0 * a0
    x = (omega * a0sq + asq) / (a0sq + asq)
    r = xp.sqrt(a0sq + x * x * asq)
    a0, xr = a0 / r, x / r
    a1, a2, a3 = a1 * xr, a2 * xr, a3 * xr
    one = xp.ones_like(a0)
    g = su3.identity_like(geom.shape, xp)
    g[..., p, p] = xp.where(on, a0 + 1j * a3, one)
    g[..., p, q] = xp.where(on, a2 + 1j * a1, 0.0)
    g[..., q, p] = xp.where(on, -a2 + 1j * a1, 0.0)
    g[..., q, q] = xp.where(on, a0 - 1j * a3, one)
    return g


def gauge_fix_step(u: GaugeField, gauge_dir: int | None = 3, omega: float = 1.8, g=None):
    """One step of MILC's ``gaugefixstep``: odd sites, then even, three SU(2) hits each. Returns (links, the
    action MILC averages, the accumulated transformation ``g`` times the one applied here, or None)."""
    dirs = fixed_directions(gauge_dir)
    parity = u.geom.parity()
    action = 0.0
    for par in (1, 0):                  # MILC's loop runs from ODD (0x01) to EVEN (0x02)
        on = parity == par
        for p, q in SUBGROUPS:
            h = _su2_hit(u, dirs, p, q, on, omega)
            u = u.gauge_transform(h)
            if g is not None:
                g = h @ g
        action += gauge_fix_functional(u, gauge_dir) / 2.0
    return u, action, g


def gauge_fix(u: GaugeField, gauge_dir: int | None = 3, omega: float = 1.8, max_steps: int = 500,
              tol: float = 2e-6, track: bool = False):
    """Fix ``u`` to Coulomb (``gauge_dir``: the direction left out) or Landau (None) gauge by MILC's iteration
    (``gaugefix``, generic/gaugefix2.c): at most ``max_steps`` steps, stopping after step k >= 1 once the action
    changes by less than ``tol``. Returns (the fixed GaugeField, GaugeFixResult, and with ``track`` the gauge
    transformation g with U_fixed = g(x) U(x) g(x+mu)^dag up to the re-unitarizations, else None). ``u`` is left
    unchanged."""
    if not (isinstance(max_steps, int) and max_steps >= 1):
        raise GaugeFixError(f"max_steps {max_steps!r}: give a positive number of gauge-fixing steps")
    if not 0.0 < omega < 2.0:
        raise GaugeFixError(f"over-relaxation parameter {omega!r}: give a number in (0, 2) (MILC uses 1.8)")
    fixed_directions(gauge_dir)
    g = su3.identity_like(u.geom.shape, u.xp) if track else None
    old = current = delta = 0.0
    history, step, converged = [], max_steps, False
    for it in range(max_steps):
        u, current, g = gauge_fix_step(u, gauge_dir, omega, g)
        history.append(current)
        if it != 0:
            delta = current - old
            if abs(delta) < tol:
                step, converged = it, True
                break
        old = current
        if it % REUNITARIZE_EVERY == REUNITARIZE_EVERY - 1:
            u = u.copy().reunitarize()
    if step % REUNITARIZE_EVERY != 0:
        u = u.copy().reunitarize()
    return u, GaugeFixResult(step, current, delta, converged, history), g


def coulomb_divergence(u: GaugeField, gauge_dir: int | None = 3) -> float:
    """max over sites of |sum_{mu != gauge_dir} [A_mu(x) - A_mu(x - mu)]|, A_mu the traceless antihermitian part
    of U_mu: zero at a stationary point of the functional (the lattice Coulomb / Landau condition)."""
    dirs = fixed_directions(gauge_dir)
    geom, xp = u.geom, u.xp
    div = sum(su3.traceless_antihermitian(u.links[mu]) - geom.shift(su3.traceless_antihermitian(u.links[mu]), mu, -1)
              for mu in dirs)
    return float(geom.grid.max(float(xp.abs(div).max())))


__all__ = ["GaugeFixError", "GaugeFixResult", "coulomb_divergence", "fixed_directions", "gauge_fix",
           "gauge_fix_functional", "gauge_fix_step"]
