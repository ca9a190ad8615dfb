"""The gauge force as one hand-written CUDA kernel, driven by a table of paths (NumPy twin:
:meth:`force.gauge_action.GaugeAction.force`).

One thread per (site, direction mu) walks every loop through its link U_mu(x), each rotated to start with the
step +mu at x: R = U_mu(x) M_2 ... M_L (a backward step of the original loop becomes a forward step of its
reverse, which has the same ReTr). It sums c_i R over the loops and writes Pdot_mu(x) = -(beta/3) TA(sum), the
formula of the NumPy twin, without the intermediate fields: links are read through the cache, the momentum is
written once.

On a partitioned lattice the kernels read halo-padded links (``Geometry.padded`` of depth :func:`halo_depth`: one
exchange per partitioned dimension, edges and corners included) and walk in padded coordinates: the interior
sites sit at an offset (the depth on a padded dimension, 0 elsewhere) in the box, and only the unpadded dimensions
wrap periodically. One thread per interior (site, mu); the single-rank lattice is the box without padding.
"""
from __future__ import annotations

import numpy as np

from . import loops as _loops

_SOURCE = r"""
struct M3 { double2 e[9]; };

__device__ __forceinline__ double2 cmul(double2 a, double2 b) {
    return make_double2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}
__device__ __forceinline__ double2 cmulc(double2 a, double2 b) {  // a * conj(b)
    return make_double2(a.x * b.x + a.y * b.y, a.y * b.x - a.x * b.y);
}
__device__ __forceinline__ void load(M3 &m, const double2 *__restrict__ p) {
    #pragma unroll
    for (int i = 0; i < 9; ++i) m.e[i] = __ldg(p + i);
}
// c = a * b  or  c = a * b^dag
__device__ __forceinline__ void mul(M3 &c, const M3 &a, const M3 &b, bool dag) {
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int k = 0; k < 3; ++k) {
            double2 s = make_double2(0.0, 0.0);
            #pragma unroll
            for (int j = 0; j < 3; ++j) {
                double2 t = dag ? cmulc(a.e[3 * i + j], b.e[3 * k + j]) : cmul(a.e[3 * i + j], b.e[3 * j + k]);
                s.x += t.x; s.y += t.y;
            }
            c.e[3 * i + k] = s;
        }
}

// U holds links on a (possibly padded) box of extents (px, py, pz, pt), n[] in the kernels; the lattice's
// (interior) sites, extents (nx, ny, nz, nt), sit at (ox, oy, oz, ot) + x in it. Walks wrap modulo the box: on an
// unpadded dimension (offset 0, box = interior) that is the periodic wrap; on a padded one the walk stays inside the
// box (depth >= the loops' excursion) and never wraps.
__device__ __forceinline__ long box_index(const int *x, int px, int py, int pz) {
    return x[0] + (long)px * (x[1] + (long)py * (x[2] + (long)pz * x[3]));
}
// the box coordinates of interior site number `site` (x fastest)
__device__ __forceinline__ void box_coords(long site, int *x, int nx, int ny, int nz, int ox, int oy, int oz, int ot) {
    long r = site;
    x[0] = r % nx + ox; r /= nx; x[1] = r % ny + oy; r /= ny; x[2] = r % nz + oz; x[3] = r / nz + ot;
}

// sum over loops starting at each site of c_i (3 - ReTr W): the action density (times 3/beta), one thread per
// interior site
extern "C" __global__ void gauge_action_density(const double2 *__restrict__ U, double *__restrict__ out,
                                                const int *__restrict__ steps, const int *__restrict__ path_start,
                                                const double *__restrict__ coef, int npaths,
                                                int nx, int ny, int nz, int nt, int px, int py, int pz, int pt,
                                                int ox, int oy, int oz, int ot) {
    const long vol = (long)nx * ny * nz * nt, pvol = (long)px * py * pz * pt;
    const int n[4] = {px, py, pz, pt};
    long site = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (site >= vol) return;
    int x0[4];
    box_coords(site, x0, nx, ny, nz, ox, oy, oz, ot);
    M3 acc, link, tmp;
    double total = 0.0;
    for (int p = 0; p < npaths; ++p) {
        int x[4] = {x0[0], x0[1], x0[2], x0[3]};
        bool started = false;
        for (int k = path_start[p]; k < path_start[p + 1]; ++k) {
            const int s = steps[k];
            const int nu = (s > 0 ? s : -s) - 1;
            if (s < 0) x[nu] = (x[nu] + n[nu] - 1) % n[nu];
            load(link, U + (nu * pvol + box_index(x, px, py, pz)) * 9);
            if (!started) {
                if (s > 0) { acc = link; }
                else {
                    #pragma unroll
                    for (int i = 0; i < 3; ++i)
                        #pragma unroll
                        for (int j = 0; j < 3; ++j)
                            acc.e[3 * i + j] = make_double2(link.e[3 * j + i].x, -link.e[3 * j + i].y);
                }
                started = true;
            } else {
                mul(tmp, acc, link, s < 0);
                acc = tmp;
            }
            if (s > 0) x[nu] = (x[nu] + 1) % n[nu];
        }
        total += coef[p] * (3.0 - (acc.e[0].x + acc.e[4].x + acc.e[8].x));
    }
    out[site] = total;
}

// one thread per (interior site, mu); F has the interior extents
extern "C" __global__ void gauge_force(const double2 *__restrict__ U, double2 *__restrict__ F,
                                       const int *__restrict__ steps, const int *__restrict__ path_start,
                                       const double *__restrict__ coef, const int *__restrict__ mu_start,
                                       int nx, int ny, int nz, int nt, int px, int py, int pz, int pt,
                                       int ox, int oy, int oz, int ot, double scale) {
    const long vol = (long)nx * ny * nz * nt, pvol = (long)px * py * pz * pt;
    const int n[4] = {px, py, pz, pt};
    long gid = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (gid >= 4 * vol) return;
    const int mu = gid / vol;
    const long site = gid - mu * vol;
    int x0[4];
    box_coords(site, x0, nx, ny, nz, ox, oy, oz, ot);

    M3 first, acc, link, tmp;
    load(first, U + (mu * pvol + box_index(x0, px, py, pz)) * 9);
    double2 sum[9];
    #pragma unroll
    for (int i = 0; i < 9; ++i) sum[i] = make_double2(0.0, 0.0);

    for (int p = mu_start[mu]; p < mu_start[mu + 1]; ++p) {
        int x[4] = {x0[0], x0[1], x0[2], x0[3]};
        x[mu] = (x[mu] + 1) % n[mu];
        acc = first;
        for (int k = path_start[p] + 1; k < path_start[p + 1]; ++k) {
            const int s = steps[k];
            const int nu = (s > 0 ? s : -s) - 1;
            if (s < 0) x[nu] = (x[nu] + n[nu] - 1) % n[nu];
            load(link, U + (nu * pvol + box_index(x, px, py, pz)) * 9);
            mul(tmp, acc, link, s < 0);
            acc = tmp;
            if (s > 0) x[nu] = (x[nu] + 1) % n[nu];
        }
        const double c = coef[p];
        #pragma unroll
        for (int i = 0; i < 9; ++i) { sum[i].x += c * acc.e[i].x; sum[i].y += c * acc.e[i].y; }
    }
    // TA(A) = (A - A^dag)/2 - Tr(A - A^dag)/6, times scale
    double2 out[9];
    #pragma unroll
    for (int i = 0; i < 3; ++i)
        #pragma unroll
        for (int j = 0; j < 3; ++j) {
            double2 a = sum[3 * i + j], b = sum[3 * j + i];
            out[3 * i + j] = make_double2(0.5 * (a.x - b.x), 0.5 * (a.y + b.y));
        }
    double tr = (out[0].y + out[4].y + out[8].y) / 3.0;
    out[0].y -= tr; out[4].y -= tr; out[8].y -= tr;
    double2 *o = F + (mu * vol + site) * 9;
    #pragma unroll
    for (int i = 0; i < 9; ++i) o[i] = make_double2(scale * out[i].x, scale * out[i].y);
}
"""


def force_paths(shapes: dict) -> list:
    """For each mu, the (coefficient, path) pairs of every loop through the link (x, mu), rotated to start with +mu.

    ``shapes`` is ``GaugeAction.shapes``: {name: (c, loops)}. A loop stepping backward along mu contributes its
    reverse (same ReTr) rotated to that step.
    """
    table = [[] for _ in range(4)]
    for c, paths in shapes.values():
        if c == 0.0:
            continue
        for p in paths:
            for q in (tuple(p), _loops.reverse(p)):
                for k, s in enumerate(q):
                    if s > 0:
                        table[s - 1].append((c, q[k:] + q[:k]))
    return table


def excursion(paths) -> int:
    """The farthest any walk of ``paths`` goes from its starting site x along one axis: max |y - x|_inf over the
    sites y it passes through. Every link it reads sits at one of them (a forward step reads U at the site it
    leaves, a backward one at the site it reaches), so this is enough halo depth for the kernels on a padded
    lattice."""
    far = 0
    for p in paths:
        pos = [0, 0, 0, 0]
        for s in p:
            pos[_loops.direction(s)] += 1 if s > 0 else -1
            far = max(far, max(abs(v) for v in pos))
    return far


def halo_depth(shapes: dict) -> int:
    """The padding the force and action kernels need for the loops of ``shapes`` (GaugeAction.shapes): the largest
    excursion of the loops from each site they start at (action density) and of the loops rotated to each of
    their forward links (force). 1 for the plaquette, 2 with Symanzik's rectangles and parallelograms."""
    loops = [p for c, paths in shapes.values() if c != 0.0 for p in paths]
    rotated = [q for table in force_paths(shapes) for _, q in table]
    return max(excursion(loops), excursion(rotated), 1)


def _module(backend):
    cp = backend.xp
    return backend.kernel(("gauge_force_module",), lambda: cp.RawModule(code=_SOURCE, options=("--std=c++14",)))


def _box_args(dims, padded_dims, offset) -> tuple:
    """The kernels' extents: interior (nx..nt), box of the links (px..pt; the interior when None) and the interior's
    origin in the box, as int32."""
    padded_dims = tuple(dims) if padded_dims is None else tuple(padded_dims)
    offset = (0, 0, 0, 0) if offset is None else tuple(offset)
    for n, p, o in zip(dims, padded_dims, offset):
        if not (o >= 0 and p == n + 2 * o):
            raise ValueError(f"box {padded_dims} with the interior {dims} at {offset}: each dimension must be padded "
                             "by its offset on both sides (Geometry.padded), or not at all")
    return tuple(np.int32(v) for v in tuple(dims) + padded_dims + offset)


class GaugeActionKernel:
    """sum_i c_i sum_loops (3 - ReTr W(x)) at every site, one thread per site (twin:
    ``GaugeAction._weighted_deficit``). On padded links (``Geometry.padded`` of depth >= ``halo_depth``) the
    result covers the interior sites."""

    def __init__(self, backend, shapes: dict):
        cp = backend.xp
        steps, path_start, coef = [], [0], []
        for c, paths in shapes.values():
            if c == 0.0:
                continue
            for p in paths:
                steps += list(p)
                path_start.append(len(steps))
                coef.append(c)
        self.npaths = len(coef)
        self.steps = cp.asarray(np.array(steps, dtype=np.int32))
        self.path_start = cp.asarray(np.array(path_start, dtype=np.int32))
        self.coef = cp.asarray(np.array(coef, dtype=np.float64))
        self.kernel = _module(backend).get_function("gauge_action_density")
        self.cp = cp

    def __call__(self, links, dims, padded_dims=None, offset=None):
        """``links`` (4, pt, pz, py, px, 3, 3) on the box ``padded_dims`` (default ``dims``), the interior of extents
        ``dims`` at ``offset`` in it; returns the density on the interior, shape (nt, nz, ny, nx)."""
        nx, ny, nz, nt = dims
        box = _box_args(dims, padded_dims, offset)
        out = self.cp.empty((nt, nz, ny, nx), dtype=self.cp.float64)
        n = out.size
        block = 128
        self.kernel(((n + block - 1) // block,), (block,),
                    (links, out, self.steps, self.path_start, self.coef, np.int32(self.npaths)) + box)
        return out


class GaugeForceKernel:
    """The compiled kernel and the device copy of one action's path table."""

    def __init__(self, backend, shapes: dict):
        cp = backend.xp
        table = force_paths(shapes)
        steps, path_start, coef, mu_start = [], [0], [], [0]
        for mu in range(4):
            for c, q in table[mu]:
                steps += list(q)
                path_start.append(len(steps))
                coef.append(c)
            mu_start.append(len(coef))
        self.steps = cp.asarray(np.array(steps, dtype=np.int32))
        self.path_start = cp.asarray(np.array(path_start, dtype=np.int32))
        self.coef = cp.asarray(np.array(coef, dtype=np.float64))
        self.mu_start = cp.asarray(np.array(mu_start, dtype=np.int32))
        self.kernel = _module(backend).get_function("gauge_force")
        self.cp = cp

    def __call__(self, links, beta: float, dims, padded_dims=None, offset=None):
        """The force on the interior sites, shape (4, nt, nz, ny, nx, 3, 3), from ``links`` on the box
        ``padded_dims`` (default ``dims``: the whole lattice, periodic) with the interior at ``offset``."""
        cp = self.cp
        nx, ny, nz, nt = dims
        box = _box_args(dims, padded_dims, offset)
        out = cp.empty((4, nt, nz, ny, nx, 3, 3), dtype=cp.complex128)
        n = 4 * nx * ny * nz * nt
        block = 128
        self.kernel(((n + block - 1) // block,), (block,),
                    (links, out, self.steps, self.path_start, self.coef, self.mu_start) + box
                    + (np.float64(-beta / 3.0),))
        return out
