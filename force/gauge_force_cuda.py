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
Kernel file: force/kernels/gauge_force.cu.
"""
from __future__ import annotations

import numpy as np

from lattice import cuda_source

from . import loops as _loops

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
        self.kernel = cuda_source.function(backend, "force", "gauge_force.cu", "gauge_action_density")
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
        self.kernel = cuda_source.function(backend, "force", "gauge_force.cu", "gauge_force")
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
