"""The staged HISQ fat link on one GPU: F[U; c] (:func:`force.smearing.fat_link`, its NumPy twin) for all four
directions in three launches, the whole lattice on the GPU (unpadded links, periodic wrap); kernels in
force/kernels/hisq_staged.cu.

:func:`force.hisq_cuda.fat_link` evaluates the Horner form of the twin direction by direction, one ``staple_fwd``
launch per staple operator (12 per direction, 48 a level), each a full-lattice pass that reads U_nu, one or two
intermediates and the running sum and writes one field. Here each stage runs over every direction at once (pair
p = 3 mu + j, nu = the j-th direction != mu):

1. ``staged_a``: A_p = S_nu[U_mu]_mu for the 12 pairs;
2. ``staged_inner``: inner_p = c3 U_mu + cL A_p + sum_{rho != mu, nu} S_rho[c5 U_mu + c7 A_{mu,sigma}]_mu, the
   5/7-staple arguments formed in registers at the two neighbours each staple reads;
3. ``staged_fat``: F_mu = (c1 - 6 cL) U_mu + sum_{nu != mu} S_nu[inner_{mu,nu}]_mu,

with S_nu[A]_mu(x) = U_nu(x) A(x+nu) U_nu(x+mu)^dag + U_nu(x-nu)^dag A(x-nu) U_nu(x-nu+mu), summed in the order of
the twin (docs/conventions.md 1.3; the Horner form is derived in :mod:`force.smearing`).

Byte model, per site and build, M = 144 B (a complex128 3x3 matrix), each field read from memory once (its reuse by
the neighbouring threads from the caches):

=============  ======================  ==========  ======
stage          reads                   writes      total
=============  ======================  ==========  ======
staged_a       U (4 M)                 A (12 M)    16 M
staged_inner   U (4 M), A (12 M)       inner (12M) 28 M
staged_fat     U (4 M), inner (12 M)   F (4 M)     20 M
=============  ======================  ==========  ======

64 M = 9216 B a site (9.7 GB at 32^4, 2.4 ms at 4 TB/s) against ~216 M a level for the 48 launches of
:func:`force.hisq_cuda.fat_link` (runs/rhmc/README.md, "Link smearing and the fermion-force chain rule"). The
intermediates A and inner take 2 x 12 link fields (3.6 GB at 32^4).

Layout (:func:`element_major`): the kernels read U, A and inner element-major, element i of the matrix at site x
at ``[i, x]`` of its field ((4, 9, V) and (12, 9, V)): the 32 threads of a warp, at consecutive sites, then read 512
contiguous bytes a load instead of 16 bytes from each of 32 matrices 144 bytes apart (the links' site-major
layout, (..., 3, 3)), which cost a cache wavefront per thread (docs/perf-notes.md "Element-major fields"). U is
transposed once a build (8 M a site more than the table); F is written site-major by ``staged_fat``.

One thread per output matrix (tools/kernel_resources.py lists the registers and spills), taken in the order of
``lat::job``: 32 sites times the launch's fields, the sites in tiles (:func:`launch`; docs/perf-notes.md, session
18). Register-lean forms (three threads a matrix, launch bounds) were slower on the H200 and are gone
(runs/rhmc/README.md, "Kernel forms"; docs/perf-notes.md).

Selection: registered ahead of :func:`force.hisq_cuda.fat_link` for the unpadded placements (``priority=1``,
:func:`lattice.placement.implements`), on where the run configuration's ``hisq_staged`` (HMC_HISQ_STAGED, or the
override :func:`set_enabled`) and ``hisq_kernels`` are both on (default on; HMC_HISQ_STAGED=0: the per-direction
kernels; A/B timing: ``hmc bench smear``). Equal to the twin to rounding (tests/force/test_hisq_staged_host.py,
host-compiled; tests/force/test_hisq_staged_gpu.py on the device).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lattice import cuda_source
from lattice.placement import Placement, holds_whole_lattice, implements, set_switch, switch_on

from . import hisq_cuda

#: the run-configuration switch of the staged kernels (lattice.placement consults it)
SWITCH = "hisq_staged"
BLOCK = 128
LANES = cuda_source.JOB_LANES   # the threads take lat::job's order (launch)
#: the (link, staple) direction pairs of the intermediates: p = 3 mu + j
PAIRS = 12
#: the bytes a build moves per site in the model of the module docstring: 64 matrices of 144 B
BYTES_PER_SITE = 64 * 144


def set_enabled(on: bool | None) -> bool | None:
    """The staged kernels on (True) or off (False) whatever the configuration says, or None: as configured again;
    returns the previous override."""
    return set_switch(SWITCH, on)


def enabled(config=None) -> bool:
    """Whether the staged kernels may serve a caller with ``config``: ``hisq_staged`` and ``hisq_kernels`` on."""
    return switch_on(SWITCH, config) and hisq_cuda.enabled(config)


def kernel(backend, file, name):
    """The kernel ``name`` of the staged kernel file ``file`` (force/kernels/)."""
    return cuda_source.function(backend, "force", file, name)


def launch(geom, file, name, matrices, args):
    """Kernel ``name`` of the staged kernel file ``file``, one thread per output matrix over ``matrices`` of them
    (a whole number of fields of the local volume), the local extents appended to ``args``. The threads take their
    matrices in the order of ``lat::job`` (lattice/kernels/hmc_common.cuh: 32 sites x the fields, the sites in
    tiles), which needs fields x 32 x ceil(V / 32) of them."""
    dims = tuple(np.int32(n) for n in geom.local_dims)
    vol = int(geom.local_volume)
    fields = int(matrices) // vol
    if fields * vol != int(matrices):
        raise ValueError(f"{name}: {matrices} output matrices are not a whole number of fields of {vol} sites")
    kernel(geom.backend, file, name)(_grid(fields * LANES * -(-vol // LANES)), (BLOCK,), tuple(args) + dims)


def _launch(geom, name, matrices, args):
    launch(geom, "hisq_staged.cu", name, matrices, args)


def _grid(n):
    return ((int(n) + BLOCK - 1) // BLOCK,)


def element_major(xp, fields):
    """The element-major copy (n, 9, V) of ``fields`` (n, nt, nz, ny, nx, 3, 3): element i of the matrix at site x
    at ``[., i, x]`` (module docstring, "Layout")."""
    n = fields.shape[0]
    return xp.ascontiguousarray(fields.reshape(n, -1, 9).transpose(0, 2, 1))


def forward(geom, u, c):
    """The intermediates (A, inner) of stages 1 and 2 (module docstring), each (12, 9, V) element-major, of the
    element-major links ``u`` (:func:`element_major`); the chain rule (force/hisq_staged_vjp.py) uses them."""
    cp = geom.xp
    vol = geom.local_volume
    f64 = np.float64
    a = cp.empty((PAIRS, 9, vol), dtype=u.dtype)
    inner = cp.empty_like(a)
    _launch(geom, "staged_a", PAIRS * vol, (u, a))
    _launch(geom, "staged_inner", PAIRS * vol,
            (u, a, inner, f64(c.three_staple), f64(c.five_staple), f64(c.seven_staple), f64(c.lepage)))
    return a, inner


@dataclass(frozen=True)
class Kept:
    """The intermediates (A, inner) of one staged build of F[links; c], kept for the chain rule of the same links
    (:func:`force.hisq_staged_vjp.fat_link_vjp`, which otherwise recomputes them with the same kernels: bitwise the
    same). ``links``: the very array the build read; :meth:`serves` holds only for it (and ``c``), so a kept set is
    used where the caller's links are that object, as the force's links are those just smeared
    (:class:`force.hisq_links.FermionLinks` keeps them: docs/perf-notes.md "Kept forward intermediates"). ``u``,
    ``a``, ``inner``: the element-major links and intermediates (:func:`element_major`)."""

    links: object
    c: object
    u: object
    a: object
    inner: object

    def serves(self, links, c) -> bool:
        return self.links is links and self.c == c


def fat_link(geom, links, c, keep: dict | None = None):
    """F[U; c] for the whole lattice on one GPU in three launches (module docstring); ``links`` (4, nt, nz, ny, nx,
    3, 3), unphased, as :func:`force.smearing.fat_link` takes them. ``keep``: a dict that receives the build's
    intermediates, ``keep[c] = Kept(...)`` (:class:`Kept`: 28 link matrices a site, 4.2 GB at 32^4)."""
    cp = geom.xp
    u = element_major(cp, links)
    a, inner = forward(geom, u, c)
    out = cp.empty(links.shape, dtype=links.dtype)
    _launch(geom, "staged_fat", 4 * geom.local_volume, (u, inner, out, np.float64(c.one_link - 6.0 * c.lepage)))
    if keep is not None:
        keep[c] = Kept(links, c, u, a, inner)
    return out


def _serves(geom, c) -> bool:
    """The unpadded kernels' rule (the local array is the whole lattice) with 5- or 7-staples (as for
    :func:`force.hisq_cuda.fat_link`)."""
    return holds_whole_lattice(geom) and (c.five_staple != 0.0 or c.seven_staple != 0.0)


@implements("hisq.fat_link", Placement.WHOLE, Placement.DISTRIBUTED, switch=(SWITCH, hisq_cuda.SWITCH), fits=_serves,
            priority=1)
def _fat_link_staged(geom, links, c, keep=None):
    return fat_link(geom, links, c, keep)
