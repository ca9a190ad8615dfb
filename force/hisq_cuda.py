"""CUDA kernels for the HISQ link smearing and its chain rule on one GPU (NumPy twins: :mod:`force.smearing`,
:mod:`force.smearing_derivative`, :mod:`force.unitarize`, :mod:`force.unitarize_derivative`).

The array code of the twins builds every staple from ``Geometry.shift`` copies and batched (..., 3, 3) matmuls:
on a GPU that is ~10 kernel launches, a few temporaries and cuBLAS batched GEMMs of 3x3 matrices per staple. Here
one thread per site does the whole staple in registers, with the neighbours found by index arithmetic (periodic
in every direction, so only for a lattice that is not partitioned over ranks: :func:`active`); the kernel file is
force/kernels/hisq.cu:

* ``staple_fwd``:  out(x) = b1 B1(x) + b2 B2(x) + S_nu[a1 A1 + a2 A2]_mu(x), with
  S_nu[A]_mu(x) = U_nu(x) A(x+nu) U_nu(x+mu)^dag + U_nu(x-nu)^dag A(x-nu) U_nu(x-nu+mu), so that every Horner
  step of :func:`force.smearing.fat_link` (arg = c5 U + c7 A_sigma, inner = c3 U + cL A_nu + sum S[arg]) is one
  launch and the linear combinations are never stored;
* ``staple_vjp``:  the adjoint of T = S_nu[A]_mu (:class:`force.smearing_derivative.StapleAdjoint`) given D_T:
  D_A(x) = U_nu(x-nu+mu)^dag D_T(x-nu) U_nu(x-nu) + U_nu(x+mu) D_T(x+nu) U_nu(x)^dag is written to up to three
  outputs with their own coefficients (accumulated or not), and the staple-link derivative, gathered at the site
  that owns it (no atomics),
  D_U_nu(x) += A(x+nu) U_nu(x+mu)^dag D_T(x) + [A(x) U_nu(x+mu) D_T(x+nu)]^dag
             + [D_T(x-mu) U_nu(x-mu) A(x-mu+nu)]^dag + D_T(x-mu+nu) U_nu(x-mu)^dag A(x-mu),
  is added to the link-derivative field in place;
* ``naik_fwd`` / ``naik_vjp``: L_mu(x) = c W_mu(x) W_mu(x+mu) W_mu(x+2mu) and its adjoint
  D_W mu(x) += c [W(x+mu) W(x+2mu) D(x) + W(x+mu) D(x-mu) W(x-mu) + D(x-2mu) W(x-2mu) W(x-mu)] (all along mu);
* ``u3_unitarize``: MILC's analytic U(3) projection W = V (V^dag V)^(-1/2) per link (:func:`force.unitarize.
  u3_unitarize`: trigonometric eigenvalues, Q^(-1/2) = f0 + f1 Q + f2 Q^2, the SVD-fallback test); the few
  fallback links are then redone by the twin's masked SVD;
* ``u3_vjp``: the derivative of the projection (:func:`force.unitarize_derivative.u3_unitarize_vjp`) per link
  from the eigen-decomposition of V^dag V by complex Jacobi rotations in registers (``eig_herm3``; cuSOLVER's
  batched ``eigh`` is slower and refuses 32^4's 4M matrices), with MILC's force filter;
* ``ta_product``: Pdot = TA(U D_U);
* ``outer_acc``: the outer products of the RHMC force, F_mu(x) += sum_l c_l z_l(x+mu) z_l(x)^dag and the same
  with z_l(x+3mu) (:func:`force.hisq_force.add_outer_products`).

On a partitioned lattice the forward smearing (``staple_fwd``, ``naik_fwd``: :func:`fat_link`, :func:`naik_link`)
runs on halo-padded links (:func:`pad`: ``Geometry.padded`` of depth :func:`fat_depth` / :func:`naik_depth`, the
largest distance from x at which a path of the level reads a link): the threads cover the interior sites, or the
interior grown by one site where an intermediate (A_nu, inner_nu) is read, in padded coordinates, and only the
unpadded dimensions wrap (:func:`padded_active`). So does the chain rule: :func:`fat_link_vjp` and
:func:`naik_link_vjp` take the links and the incoming derivative padded alike (depth :data:`VJP_DEPTH`, the farthest
its recomputed intermediates and three adjoint stages read, each stage on the interior grown by what the next one
reads), and :func:`outer_acc` pads the colour vectors by :data:`OUTER_DEPTH`.

Each kernel equals its twin to rounding (tests/force/test_hisq_gpu.py). The run configuration's ``hisq_kernels``
(HMC_HISQ_KERNELS=0; or the override :func:`set_enabled`) switches them off (the twins then run on CuPy), e.g. to
time the difference.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from comms.config import RunConfig
from lattice import cuda_source
from lattice.backend import backend_of
from lattice.padded import PaddedLinks, pad_links, pad_offset, padded_face_bytes
from lattice.placement import Placement, holds_whole_lattice, implements, pads_on_gpu, placement_of, set_switch, \
    switch_on

#: the run-configuration switch of every kernel here (lattice.placement consults it)
SWITCH = "hisq_kernels"


def set_enabled(on: bool | None) -> bool | None:
    """The kernels on (True) or off (False: the array-code twins on the GPU as well) whatever the configuration
    says, or None: as configured again (tests and timings); returns the previous override, to restore it with."""
    return set_switch(SWITCH, on)


def enabled(config: RunConfig | None = None) -> bool:
    """Whether the kernels may serve a caller with ``config`` (its geometry's; default: the environment's): the
    override of :func:`set_enabled`, else the configuration's ``hisq_kernels``."""
    return switch_on(SWITCH, config)

BLOCK = 128
LANES = cuda_source.JOB_LANES   # outer_acc takes lat::job's order (lattice/kernels/hmc_common.cuh)


def active(geom) -> bool:
    """Whether the kernels serve ``geom`` unpadded: the local array is the whole lattice on a GPU (WHOLE, or a
    one-rank sub-grid of a split grid: the kernels wrap periodically inside it), and :func:`enabled` for its
    configuration."""
    return placement_of(geom) is not Placement.ARRAY and holds_whole_lattice(geom) and enabled(geom.config)


def padded_active(geom, depth: int) -> bool:
    """Whether the forward kernels serve ``geom`` on halo-padded links (:func:`pad`): :func:`enabled` for its
    configuration and the rule of :func:`lattice.placement.pads_on_gpu`."""
    return pads_on_gpu(geom, depth) and enabled(geom.config)


def read_depth(paths) -> int:
    """The farthest from x, along one axis, at which a walk of ``paths`` (signed steps, :mod:`force.loops`) reads a
    link or passes: max |y - x|_inf over its sites before the last step, and the end too when the last step is
    backward (a forward step reads U at the site it leaves, a backward one at the site it reaches). The Horner
    intermediates of :func:`fat_link` are evaluated at such sites, so this is the halo depth the padded kernels
    need (compare :func:`force.gauge_force_cuda.excursion`, which counts the end of the walk as well)."""
    far = 0
    for p in paths:
        pos = [0, 0, 0, 0]
        for k, s in enumerate(p):
            far = max(far, max(abs(v) for v in pos))
            pos[abs(s) - 1] += 1 if s > 0 else -1
            if k == len(p) - 1 and s < 0:
                far = max(far, max(abs(v) for v in pos))
    return far


def fat_paths(c) -> list:
    """The paths F[U; c] sums (:mod:`force.smearing`), for every mu, those with a non-zero coefficient: the link,
    the 3-, 5- and 7-staples (S_nu nested over distinct unsigned directions, both orientations) and the Lepage
    terms S_nu[S_nu[U]] (retraced ones included, as the Horner form evaluates them)."""
    def wrap(p, s):
        return (s,) + p + (-s,)

    out = []
    for mu in range(4):
        link = (mu + 1,)
        out.append(link)
        others = [d for d in range(4) if d != mu]
        signed = {d: (d + 1, -(d + 1)) for d in others}
        for nu in others:
            for s1 in signed[nu]:
                three = wrap(link, s1)
                if c.three_staple != 0.0:
                    out.append(three)
                if c.lepage != 0.0:
                    out += [wrap(three, s2) for s2 in signed[nu]]
                for rho in others:
                    if rho == nu:
                        continue
                    for s2 in signed[rho]:
                        five = wrap(three, s2)
                        if c.five_staple != 0.0:
                            out.append(five)
                        if c.seven_staple != 0.0:
                            (sigma,) = [d for d in others if d not in (nu, rho)]
                            out += [wrap(five, s3) for s3 in signed[sigma]]
    return out


@lru_cache(maxsize=None)
def fat_depth(c) -> int:
    """The halo depth of :func:`fat_link` on padded links: 1 for fat7, 2 with a Lepage term (S_nu S_nu reaches
    x + 2 nu)."""
    return max(read_depth(fat_paths(c)), 1)


def naik_depth() -> int:
    """The halo depth of :func:`naik_link`: W_mu(x) W_mu(x+mu) W_mu(x+2mu) reads up to x + 2 mu."""
    return read_depth([(mu + 1,) * 3 for mu in range(4)])


def pad(geom, links, depth: int) -> PaddedLinks:
    """:func:`lattice.padded.pad_links` (kept as this module's name: tests count its calls)."""
    return pad_links(geom, links, depth)


def pad_alike(geom, depth: int, *fields) -> list:
    """``fields`` (link-shaped (k, nt, nz, ny, nx, 3, 3), one dtype) halo-padded alike by ONE :func:`pad`: stacked
    along the first axis, padded (one halo exchange per partitioned dimension for all of them, not one set each:
    the chain rule's links and incoming derivative), the box split again into C-contiguous views. Pure data
    movement: the same boxes as padding each alone."""
    if len({f.dtype for f in fields}) != 1:
        raise ValueError(f"pad_alike: fields of one dtype, not {sorted(str(f.dtype) for f in fields)}")
    box = pad(geom, geom.xp.concatenate(fields, axis=0), depth)
    out, start = [], 0
    for f in fields:
        out.append(PaddedLinks(box.links[start:start + f.shape[0]], box.dims, box.offset))
        start += f.shape[0]
    return out


def _fn(backend, name):
    return cuda_source.function(backend, "force", "hisq.cu", name)


def _grid(n):
    return ((int(n) + BLOCK - 1) // BLOCK,)


def _dims(geom):
    return tuple(np.int32(n) for n in geom.local_dims)


def _contig(cp, a):
    return a if a.flags.c_contiguous else cp.ascontiguousarray(a)


class Staples:
    """The staple kernels for one link field ``links`` (4, nt, nz, ny, nx, 3, 3) of a :func:`active` geometry, or
    for the padded links of a :class:`lattice.padded.PaddedLinks` (``box``; ``links`` is then ``box.links``)."""

    def __init__(self, geom, links, box=None):
        self.geom = geom
        self.cp = geom.xp
        self.links = _contig(self.cp, links)
        self.box = PaddedLinks.whole(self.links, geom.local_dims) if box is None else box
        self.vol = geom.local_volume
        self.dims = _dims(geom)
        self._fwd = _fn(geom.backend, "staple_fwd")
        self._vjp = _fn(geom.backend, "staple_vjp")

    def forward(self, out, nu, mu, a1, c1=1.0, a2=None, c2=0.0, b1=None, k1=0.0, b2=None, k2=0.0, grow=0):
        """out = k1 b1 + k2 b2 + S_nu[c1 a1 + c2 a2]_mu (absent terms skipped); one-direction fields on the box,
        at the interior sites grown by ``grow`` on the padded dimensions (:meth:`lattice.padded.PaddedLinks.region`)."""
        u = self.links
        f64, i32 = np.float64, np.int32
        n, ext = self.box.region(grow)
        self._fwd(_grid(n), (BLOCK,),
                  (u, a1, f64(c1), u if a2 is None else a2, f64(c2), i32(a2 is not None),
                   u if b1 is None else b1, f64(k1), i32(b1 is not None),
                   u if b2 is None else b2, f64(k2), i32(b2 is not None),
                   out, i32(nu), i32(mu)) + ext)
        return out

    def vjp(self, d_links, d_t, nu, mu, a1, c1=1.0, a2=None, c2=0.0, outs=(), grow=0):
        """The adjoint of T = S_nu[c1 a1 + c2 a2]_mu given D_T = ``d_t``: for (o, k, acc) in ``outs`` (1 to 3),
        o = (o if acc else 0) + k D_A; the staple-link derivative is added to ``d_links[nu]``. Every field on the
        box, at the interior sites grown by ``grow`` (as :meth:`forward`)."""
        u = self.links
        f64, i32 = np.float64, np.int32
        outs = list(outs)
        if not 1 <= len(outs) <= 3:
            raise ValueError("staple_vjp takes one to three outputs")
        flat = []
        for j in range(3):
            if j < len(outs):
                o, k, acc = outs[j]
                flat += [o, f64(k), i32(bool(acc))]
            else:
                flat += [outs[0][0], f64(0.0), i32(1)]
            if j > 0:
                flat.append(i32(j < len(outs)))
        n, ext = self.box.region(grow)
        self._vjp(_grid(n), (BLOCK,),
                  (u, a1, f64(c1), u if a2 is None else a2, f64(c2), i32(a2 is not None), d_t, d_links,
                   *flat, i32(nu), i32(mu)) + ext)


def _others(mu):
    return [d for d in range(4) if d != mu]


def _sigma(mu, nu, rho):
    (s,) = [d for d in range(4) if d not in (mu, nu, rho)]
    return s


def _inner_staples(st, u, mu, c, a, dest, grow=0):
    """The forward intermediates of F[U; c] for direction mu, as MILC's fat7 builds them: A_nu = S_nu[U]_mu for the
    three nu != mu (into ``a``), then for each nu in turn (index j) inner_nu = c3 U + cl A_nu + sum_{rho != nu}
    S_rho[c5 U + c7 A_sigma]_mu (sigma the fourth direction) into ``dest(j)``, yielding (j, nu, inner_nu) after each,
    so that a caller may consume an inner before the next one overwrites a shared buffer. ``grow``: the region of
    :meth:`Staples.forward`."""
    others = _others(mu)
    c3, c5, c7, cl = c.three_staple, c.five_staple, c.seven_staple, c.lepage
    for i, nu in enumerate(others):
        st.forward(a[i], nu, mu, u, grow=grow)
    for j, nu in enumerate(others):
        inner = dest(j)
        first = True
        for rho in others:
            if rho == nu:
                continue
            s = others.index(_sigma(mu, nu, rho))
            if first:
                st.forward(inner, rho, mu, u, c5, a[s], c7, b1=u, k1=c3, b2=a[j], k2=cl, grow=grow)
                first = False
            else:
                st.forward(inner, rho, mu, u, c5, a[s], c7, b1=inner, k1=1.0, grow=grow)
        yield j, nu, inner


def fat_link(geom, links, c, box=None):
    """F[U; c] (:func:`force.smearing.fat_link`) with the staple kernel: 12 launches per direction. Needs a
    non-zero 5- or 7-staple coefficient (every table of the project has one).

    ``box``: the links halo-padded (:func:`pad`, depth >= :func:`fat_depth`; ``links`` is then unused) on a
    partitioned lattice. A_nu and inner_nu are formed on the interior grown by one site (where the next level
    reads them: inner at x +- nu, A at x +- nu +- rho), the result on the interior; A starts at zero, so the few
    values read outside its region (at the rim, feeding only unused rim values) are defined. Without ``box`` the
    whole lattice is the region: the single-GPU launches as before."""
    cp = geom.xp
    st = Staples(geom, links, None) if box is None else Staples(geom, box.links, box)
    u_all = st.links
    out = cp.empty_like(u_all)
    a = (cp.zeros if st.box.padded else cp.empty)((3,) + u_all.shape[1:], dtype=u_all.dtype)
    inner = cp.empty_like(a[0])
    for mu in range(4):
        u = u_all[mu]
        for j, nu, _ in _inner_staples(st, u, mu, c, a, lambda j: inner, grow=1):
            if j == 0:
                st.forward(out[mu], nu, mu, inner, 1.0, b1=u, k1=c.one_link - 6.0 * c.lepage)
            else:
                st.forward(out[mu], nu, mu, inner, 1.0, b1=out[mu], k1=1.0)
    return st.box.interior(out)


#: The halo depth of the links (and of D_F) for :func:`fat_link_vjp` on padded links, and the regions (the interior
#: grown by that many sites on every padded dimension) of its stages: the recomputed forward intermediates A_nu and
#: inner_nu, the adjoint stages D_inner = S_nu^T D_F and D_arg = S_rho^T D_inner, and the last one, S_nu^T D_a, on
#: the interior. Every read of a stage leaves its site by one step per direction, and the last stage reaches the
#: values at the rim of a grown region only through steps in distinct directions (x + sigma, then + rho), which
#: stay inside the region grown by one: so depth 2 (what fat7's staples read: A_nu at x + rho reads U at x + rho
#: + nu) holds for fat7 and for the Lepage terms. tests/force/test_hisq_force_padded.py checks it against the array
#: path with every dimension partitioned, and that smaller regions give wrong results.
VJP_DEPTH = 2
_VJP_GROW = {"forward": 1, "d_inner": 1, "d_arg": 1, "d_a": 0}


def fat_link_vjp(geom, links, c, d_fat, box=None, d_box=None):
    """D_U through F[U; c] (:func:`force.smearing_derivative.fat_link_vjp`): the forward intermediates A_nu and
    inner_nu are recomputed per direction, the 5/7-staple arguments c5 U + c7 A_sigma are formed inside the
    kernels. 24 launches per direction.

    ``box``, ``d_box``: the links and D_F halo-padded alike (:func:`pad_alike`, depth >= :data:`VJP_DEPTH`; ``links``
    and ``d_fat`` are then unused) on a partitioned lattice: every stage runs on the interior grown as the note on
    :data:`VJP_DEPTH` says, the intermediates start at zero (the rim values past a stage's region feed only rim
    values no later stage reads), and D_U is returned on the interior."""
    cp = geom.xp
    if box is None:
        st = Staples(geom, links)
        d_fat = _contig(cp, d_fat)
        grow = dict.fromkeys(_VJP_GROW, 0)
    else:
        if d_box.box != box.box:
            raise ValueError(f"fat_link_vjp: D_F padded to the box {d_box.box}, the links to {box.box}")
        st = Staples(geom, box.links, box)
        d_fat = d_box.links
        grow = _VJP_GROW
    u_all = st.links
    out = cp.zeros_like(u_all)
    c1, c3, c5, c7, cl = c.one_link, c.three_staple, c.five_staple, c.seven_staple, c.lepage
    a = (cp.zeros if st.box.padded else cp.empty)((3,) + u_all.shape[1:], dtype=u_all.dtype)
    inners = cp.zeros_like(a) if st.box.padded else cp.empty_like(a)
    d_a = cp.empty_like(a)
    d_inner = cp.zeros_like(a[0]) if st.box.padded else cp.empty_like(a[0])
    for mu in range(4):
        u = u_all[mu]
        others = _others(mu)
        for _ in _inner_staples(st, u, mu, c, a, lambda j: inners[j], grow=grow["forward"]):
            pass                                       # every inner_nu kept for the backward pass
        d_f = d_fat[mu]
        out[mu] += (c1 - 6.0 * cl) * d_f
        d_a.fill(0)
        for j, nu in enumerate(others):
            st.vjp(out, d_f, nu, mu, inners[j], outs=[(d_inner, 1.0, False), (out[mu], c3, True),
                                                      (d_a[j], cl, True)], grow=grow["d_inner"])
            for rho in others:
                if rho == nu:
                    continue
                s = others.index(_sigma(mu, nu, rho))
                st.vjp(out, d_inner, rho, mu, u, c5, a[s], c7, outs=[(out[mu], c5, True), (d_a[s], c7, True)],
                       grow=grow["d_arg"])
        for j, nu in enumerate(others):
            st.vjp(out, d_a[j], nu, mu, u, outs=[(out[mu], 1.0, True)], grow=grow["d_a"])
    return st.box.interior(out)


def naik_link(geom, links, coeff, box=None):
    """coeff W_mu(x) W_mu(x+mu) W_mu(x+2mu) (:func:`force.smearing.naik_link`), one launch; on the padded links of
    ``box`` (:func:`pad`, depth >= :func:`naik_depth`; ``links`` unused) on a partitioned lattice."""
    cp = geom.xp
    if box is None:
        box = PaddedLinks.whole(_contig(cp, links), geom.local_dims)
    w = box.links
    out = cp.empty_like(w)
    n, ext = box.region(0)
    _fn(geom.backend, "naik_fwd")(_grid(4 * n), (BLOCK,), (w, out, np.float64(coeff), np.int32(0)) + ext)
    return box.interior(out)


def naik_link_vjp(geom, links, coeff, d_long, out=None, box=None, d_box=None):
    """D_W through the Naik term (:func:`force.smearing_derivative.naik_link_vjp`); added to ``out`` if given.
    ``box``, ``d_box``: W and D_L halo-padded alike (depth >= :func:`naik_depth`; ``links``, ``d_long`` unused) on a
    partitioned lattice; the result on the interior."""
    cp = geom.xp
    if box is None:
        box = PaddedLinks.whole(_contig(cp, links), geom.local_dims)
        d = _contig(cp, d_long)
    else:
        if d_box.box != box.box:
            raise ValueError(f"naik_link_vjp: D_L padded to the box {d_box.box}, the links to {box.box}")
        d = d_box.links
    w = box.links
    acc = out is not None and not box.padded
    dest = out if acc else cp.empty_like(w)
    n, ext = box.region(0)
    _fn(geom.backend, "naik_vjp")(_grid(4 * n), (BLOCK,), (w, d, dest, np.float64(coeff), np.int32(acc)) + ext)
    if not box.padded:
        return dest
    res = box.interior(dest)
    if out is None:
        return res
    out += res
    return out


def ta_product(backend, u, d, scale=1.0):
    """scale TA(U D) per matrix (:func:`force.hisq_force.momentum_derivative`)."""
    cp = backend.xp
    u, d = _contig(cp, u), _contig(cp, d)
    out = cp.empty_like(u)
    n = u.size // 9
    _fn(backend, "ta_product")(_grid(n), (BLOCK,), (u, d, out, np.float64(scale), np.int64(n)))
    return out


def u3_unitarize(backend, v, allow_svd, rel_err, abs_err, analytic_eps):
    """(W, svd mask, gmin per matrix) of the analytic projection; W is not set where the mask is True."""
    cp = backend.xp
    v = _contig(cp, v)
    n = v.size // 9
    w = cp.empty_like(v)
    svd = cp.empty(v.shape[:-2], dtype=cp.uint8)
    gmin = cp.empty(v.shape[:-2], dtype=cp.float64)
    _fn(backend, "u3_unitarize")(_grid(n), (BLOCK,),
                                 (v, w, svd, gmin, np.int32(bool(allow_svd)), np.float64(rel_err),
                                  np.float64(abs_err), np.float64(analytic_eps), np.int64(n)))
    return w, svd.astype(bool), gmin


def u3_vjp(backend, v, d_w, force_filter):
    """(D_V, filter mask, smallest eigenvalue of V^dag V per matrix), the eigen-decomposition done in the kernel."""
    cp = backend.xp
    v, d_w = _contig(cp, v), _contig(cp, d_w)
    n = v.size // 9
    d_v = cp.empty_like(v)
    mask = cp.empty(v.shape[:-2], dtype=cp.uint8)
    gmin = cp.empty(v.shape[:-2], dtype=cp.float64)
    _fn(backend, "u3_vjp")(_grid(n), (BLOCK,),
                           (v, d_w, d_v, mask, gmin, np.float64(force_filter or 0.0), np.int64(n)))
    return d_v, mask.astype(bool), gmin


def eig_herm(backend, a):
    """(g, E) with A = E diag(g) E^dag for Hermitian 3x3 matrices (unsorted; the Jacobi solver of ``u3_vjp``)."""
    cp = backend.xp
    a = _contig(cp, a)
    n = a.size // 9
    g = cp.empty(a.shape[:-2] + (3,), dtype=cp.float64)
    e = cp.empty_like(a)
    _fn(backend, "eig_herm")(_grid(n), (BLOCK,), (a, g, e, np.int64(n)))
    return g, e


#: The halo depth of the colour vectors for :func:`outer_acc` on a partitioned lattice (z(x + 3 mu)).
OUTER_DEPTH = 3


def outer_acc(geom, zs, coeffs, f_acc, l_acc):
    """f_acc_mu(x) += sum_l c_l z_l(x+mu) z_l(x)^dag, l_acc with z_l(x+3mu), in place (one launch). On a
    partitioned lattice (:func:`padded_active` with :data:`OUTER_DEPTH`) the vectors are halo-padded first (one
    exchange per partitioned dimension for all of them) and the threads cover the interior of the box."""
    cp = geom.xp
    shape = tuple(geom.shape) + (3,)
    wrong = next((tuple(z.shape) for z in zs if tuple(z.shape) != shape), None)
    if wrong is not None:
        raise ValueError(f"outer_acc takes colour-vector fields of shape {shape}, not {wrong}")
    c = cp.asarray(np.asarray(coeffs, dtype=np.float64))
    if not (f_acc.flags.c_contiguous and l_acc.flags.c_contiguous):
        raise ValueError("outer_acc accumulates in place: give C-contiguous f_acc and l_acc")
    if active(geom):
        z = cp.ascontiguousarray(cp.stack(list(zs)))
        offset = (0, 0, 0, 0)
    else:
        z = cp.ascontiguousarray(cp.moveaxis(geom.padded(cp.stack(list(zs), axis=-1), OUTER_DEPTH), -1, 0))
        offset = pad_offset(geom, OUTER_DEPTH)
    n, ext = PaddedLinks(z, geom.local_dims, offset).region(0)
    threads = 4 * LANES * -(-int(n) // LANES)          # lat::job's order: 32 sites x the 4 directions
    _fn(geom.backend, "outer_acc")(_grid(threads), (BLOCK,), (z, c, f_acc, l_acc, np.int32(len(zs))) + ext)


def force_halo_bytes(geom, n_vectors: int) -> int:
    """The largest face (bytes) of the padded exchanges of one HISQ link build and force on ``geom``: the smearing's
    links (4 matrices a site at the depth of both levels; fat_depth is at most 2), the chain rule's links with their
    incoming derivative (8 matrices at :data:`VJP_DEPTH` and at the Naik depth) and :func:`outer_acc`'s
    ``n_vectors`` colour vectors (the largest number of poles of one pseudofermion's MD function) at
    :data:`OUTER_DEPTH`; complex128 throughout."""
    matrix, vector = 9 * 16, 3 * 16
    needs = [(max(2, naik_depth()), 4 * matrix), (VJP_DEPTH, 8 * matrix), (naik_depth(), 8 * matrix),
             (OUTER_DEPTH, int(n_vectors) * vector)]
    return max(padded_face_bytes(geom, depth, site) for depth, site in needs)


def reserve_force_halos(geom, n_vectors: int) -> None:
    """Grow the halo engine's buffers now to :func:`force_halo_bytes` (collective), on a geometry whose force runs
    on padded links: a growth later moves the engine's segment, whose addresses the solvers' CUDA graphs bake in,
    so every solve after it would capture its graphs again (on 2 ranks: the heat-bath solves of the second
    trajectory, issue 17)."""
    if pads_on_gpu(geom, 1):
        geom.grid.halo.reserve(force_halo_bytes(geom, n_vectors))


# --- the implementations lattice.placement chooses from (the array twins register in force.smearing,
# force.smearing_derivative and force.hisq_force) ------------------------------------------------------------
# the unpadded kernels serve a GPU whose local array is the whole lattice: WHOLE, and a DISTRIBUTED one-rank sub-grid
_UNPADDED = (Placement.WHOLE, Placement.DISTRIBUTED)


def _whole(fits=None):
    """The ``fits`` of an unpadded kernel: :func:`lattice.placement.holds_whole_lattice`, and ``fits``."""
    return lambda geom, **ctx: holds_whole_lattice(geom) and (fits is None or fits(geom, **ctx))


def _long_staples(geom, c) -> bool:
    """The fat-link kernels take over only with 5- or 7-staples (the array code is as fast for the rest)."""
    return c.five_staple != 0.0 or c.seven_staple != 0.0


@implements("hisq.fat_link", *_UNPADDED, switch=SWITCH, fits=_whole(_long_staples))
def _fat_link_unpadded(geom, links, c, keep=None):
    return fat_link(geom, links, c)


@implements("hisq.fat_link", Placement.PADDED, switch=SWITCH, fits=_long_staples, depth=fat_depth)
def _fat_link_padded(geom, links, c, keep=None):
    return fat_link(geom, None, c, pad(geom, links, fat_depth(c)))


@implements("hisq.naik_link", *_UNPADDED, switch=SWITCH, fits=_whole())
def _naik_link_unpadded(geom, links, coeff):
    return naik_link(geom, links, coeff)


@implements("hisq.naik_link", Placement.PADDED, switch=SWITCH, depth=naik_depth())
def _naik_link_padded(geom, links, coeff):
    return naik_link(geom, None, coeff, pad(geom, links, naik_depth()))


def _smear_depth(c) -> int:
    return max(fat_depth(c), naik_depth())


@implements("hisq.smear", Placement.PADDED, switch=SWITCH, fits=_long_staples, depth=_smear_depth)
def _smear_padded(geom, links, c, keep=None):
    """Both levels from one padding, to the deeper of their depths."""
    box = pad(geom, links, _smear_depth(c))
    return fat_link(geom, None, c, box), naik_link(geom, None, c.naik, box)


@implements("hisq.fat_link_vjp", *_UNPADDED, switch=SWITCH, fits=_whole(_long_staples))
def _fat_link_vjp_unpadded(geom, links, c, d_fat, kept=None):
    return fat_link_vjp(geom, links, c, d_fat)


@implements("hisq.fat_link_vjp", Placement.PADDED, switch=SWITCH, fits=_long_staples, depth=VJP_DEPTH)
def _fat_link_vjp_padded(geom, links, c, d_fat, kept=None):
    box, d_box = pad_alike(geom, VJP_DEPTH, links, d_fat)
    return fat_link_vjp(geom, None, c, None, box=box, d_box=d_box)


@implements("hisq.naik_link_vjp", *_UNPADDED, switch=SWITCH, fits=_whole())
def _naik_link_vjp_unpadded(geom, links, coeff, d_long):
    return naik_link_vjp(geom, links, coeff, d_long)


@implements("hisq.naik_link_vjp", Placement.PADDED, switch=SWITCH, depth=naik_depth())
def _naik_link_vjp_padded(geom, links, coeff, d_long):
    box, d_box = pad_alike(geom, naik_depth(), links, d_long)
    return naik_link_vjp(geom, None, coeff, None, box=box, d_box=d_box)


def _real_coeffs(geom, coeffs) -> bool:
    return not np.iscomplexobj(coeffs)


@implements("hisq.outer_products", *_UNPADDED, switch=SWITCH, fits=_whole(_real_coeffs))
@implements("hisq.outer_products", Placement.PADDED, switch=SWITCH, fits=_real_coeffs, depth=OUTER_DEPTH)
def _outer_products(geom, zs, coeffs, fat_acc, long_acc):
    outer_acc(geom, zs, coeffs, fat_acc, long_acc)


@implements("hisq.ta_product", Placement.WHOLE, switch=SWITCH)
def _momentum_derivative(links, d_u):
    return ta_product(backend_of(links), links, d_u)
