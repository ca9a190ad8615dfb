"""The chain rule of the HISQ fat link on one GPU in five staged kernels over all directions at once (issue 19;
kernel file force/kernels/hisq_staged_vjp.cu, the forward stages 1 and 2 those of force/kernels/hisq_staged.cu
through :func:`force.hisq_staged.forward`; NumPy twin: :func:`force.smearing_derivative.fat_link_vjp`).

:func:`force.hisq_cuda.fat_link_vjp` runs the reverse pass of the twin direction by direction, 24 launches per mu,
each ``staple_vjp`` read-modify-writing D_U and up to three outputs. Here the same reverse pass is split into
stages, each one launch over all (mu, nu) pairs (p = 3 mu + j, nu the j-th direction != mu), every output matrix
owned by one thread that sums every term landing on it (no atomics, no read-modify-write between threads):

1. ``staged_a``     A_p = S_nu[U_mu]_mu                                                      (forward, kept)
2. ``staged_inner`` inner_p = c3 U_mu + cL A_p + sum_{rho != mu,nu} S_rho[c5 U_mu + c7 A_{mu,sigma}]_mu  (kept)
3. ``svjp_d_inner`` D_inner_p = S_nu^T[D_F mu]
4. ``svjp_d_a``     per (mu, x), with D_arg(nu, rho) = S_rho^T[D_inner_{mu,nu}]:
                    D_a_{mu,sigma} = cL D_inner_{mu,sigma} + c7 [D_arg(nu, rho) + D_arg(rho, nu)] ({nu, rho, sigma}
                    the three directions != mu), and D_U_mu = (c1 - 6 cL) D_F mu + c3 sum D_inner + c5 sum D_arg
5. ``svjp_links``   per output link (lam, x): D_U_lam += sum_nu S_nu^T[D_a_{lam,nu}] plus, for each mu != lam, the
                    derivatives by the staple link U_lam(x) of the three kinds of staples in direction lam that the
                    mu links' level holds: S_lam[inner_{mu,lam}] (seen by D_F mu), S_lam[U_mu] (by D_a_{mu,lam}) and
                    S_lam[c5 U_mu + c7 A_{mu,sigma}] (by D_inner_{mu,nu}, nu the two directions != mu, lam)

with S_nu[X]_mu and its adjoints as in :mod:`force.smearing_derivative` (the staple-link term of each staple read
at x, x + lam, x - mu, x - mu + lam, the staple links U_lam(x + mu), U_lam(x - mu)). sigma is the fourth direction.

The floor model (M = 144 bytes, one complex128 3x3 matrix; each matrix read once from memory, the neighbours'
re-reads from cache), bytes per site: stage 1 reads U and writes A: 16 M; 2 reads U, A and writes inner: 28 M;
3 reads U, D_F and writes D_inner: 20 M; 4 reads U, D_F, D_inner and writes D_a, D_U: 36 M; 5 reads U, A, inner,
D_F, D_inner, D_a, D_U and writes D_U: 64 M. In all 164 M = 23616 bytes a site (:data:`BYTES_PER_SITE`), 24.8 GB
at 32^4; the intermediates take 48 M a site of device memory (7.2 GiB at 32^4). Where a staged build of the same
links kept A and inner (``kept``, :class:`force.hisq_staged.Kept`: the force's case), stages 1 and 2 are not run:
120 M a site (docs/perf-notes.md "Kept forward intermediates"). Every field is element-major
(:func:`force.hisq_staged.element_major`, docs/perf-notes.md "Element-major fields"): D_F, and U unless kept, are
transposed on entry (16 M a site more than the model), D_U is written site-major by ``svjp_links_h``. Stage 5 runs
as two launches, ``svjp_links_g`` (the g sums) and ``svjp_links_h`` (the h sums), one accumulator each (fewer
registers a thread; D_U goes through memory once more between them, 8 M a site).

Registered ahead of the per-direction kernels (priority 1) for the whole lattice on one GPU, behind the run
configuration's ``hisq_staged_vjp`` (HMC_HISQ_STAGED_VJP, default on; 0: the per-direction kernels) and the
``hisq_kernels`` switch; :func:`set_enabled` overrides it (tests, timings). One thread per output matrix, as for the
forward kernels (the register-lean forms lost on the H200: runs/rhmc/README.md, "Kernel forms").
"""
from __future__ import annotations

import numpy as np

from comms.config import RunConfig
from lattice.placement import Placement, holds_whole_lattice, implements, set_switch, switch_on

from . import hisq_cuda, hisq_staged

#: the run-configuration switch of the staged chain rule
SWITCH = "hisq_staged_vjp"
KERNEL_FILE = "hisq_staged_vjp.cu"
MATRIX = 9 * 16
#: the floor model of the module docstring: matrices moved per site by each stage, and the bytes in all
MATRICES_PER_STAGE = {"staged_a": 16, "staged_inner": 28, "svjp_d_inner": 20, "svjp_d_a": 36, "svjp_links": 64}
BYTES_PER_SITE = MATRIX * sum(MATRICES_PER_STAGE.values())


def set_enabled(on: bool | None) -> bool | None:
    """The staged kernels on or off whatever the configuration says (None: as configured); returns the previous
    override."""
    return set_switch(SWITCH, on)


def enabled(config: RunConfig | None = None) -> bool:
    """Whether the staged kernels may serve: their own switch and the ``hisq_kernels`` one."""
    return switch_on(SWITCH, config) and hisq_cuda.enabled(config)


def _launch(geom, name, matrices, args):
    hisq_staged.launch(geom, KERNEL_FILE, name, matrices, args)


def fat_link_vjp(geom, links, c, d_fat, kept: dict | None = None):
    """D_U through F[U; c] (:func:`force.smearing_derivative.fat_link_vjp`) for the whole lattice on one GPU: the
    five launches of the module docstring. ``links``, ``d_fat``: (4, nt, nz, ny, nx, 3, 3) device arrays.
    ``kept``: the intermediates a staged build left (``{c: force.hisq_staged.Kept}``,
    :func:`force.hisq_staged.fat_link`); where one :meth:`~force.hisq_staged.Kept.serves` these links and ``c``, stages 1 and 2 are not run again (the
    same A and inner, bit for bit: 44 of the 164 matrices a site of the model)."""
    cp = geom.xp
    k = None if kept is None else kept.get(c)
    if k is not None and k.serves(links, c):
        u, a, inner = k.u, k.a, k.inner
    else:
        u = hisq_staged.element_major(cp, links)
        a, inner = hisq_staged.forward(geom, u, c)
    d_f = hisq_staged.element_major(cp, d_fat)
    d_inner, d_a = cp.empty_like(a), cp.empty_like(a)
    d_u = cp.empty_like(u)
    out = cp.empty(links.shape, dtype=links.dtype)
    f64 = np.float64
    c1, c3, c5, c7, cl = (f64(v) for v in (c.one_link, c.three_staple, c.five_staple, c.seven_staple, c.lepage))
    vol = geom.local_volume
    _launch(geom, "svjp_d_inner", 12 * vol, (u, d_f, d_inner))
    _launch(geom, "svjp_d_a", 4 * vol, (u, d_f, d_inner, d_a, d_u, c1, c3, c5, c7, cl))
    _launch(geom, "svjp_links_g", 4 * vol, (u, a, inner, d_f, d_inner, d_a, d_u, c5, c7))
    _launch(geom, "svjp_links_h", 4 * vol, (u, a, inner, d_f, d_inner, d_a, d_u, out, c5, c7))
    return out


def _serves(geom, c, **_) -> bool:
    """The whole lattice in the local array, 5- or 7-staples (as the per-direction kernels), both switches on."""
    return holds_whole_lattice(geom) and (c.five_staple != 0.0 or c.seven_staple != 0.0) and enabled(geom.config)


@implements("hisq.fat_link_vjp", Placement.WHOLE, Placement.DISTRIBUTED, switch=SWITCH, fits=_serves, priority=1)
def _fat_link_vjp_staged(geom, links, c, d_fat, kept=None):
    return fat_link_vjp(geom, links, c, d_fat, kept)
