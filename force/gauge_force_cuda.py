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

Actions of MILC's loop family (plaquettes, 1x2 rectangles, 1x1x1 parallelograms, any coefficients: Wilson and the
Symanzik actions) get :class:`StapleForceKernel` instead (:func:`force_kernel` chooses): the 24 plaquette staples of
every site built once into a scratch buffer and shared by the rectangles and parallelograms of the links around it
(exact for unitary links; the design and its formulas are in the kernel file's header comment), or for plaquettes
alone the six staples of each link in registers. Kernel file: force/kernels/gauge_force.cu.
"""
from __future__ import annotations

import math

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
    return max(excursion(loops), excursion(rotated), staple_depth(shapes))


#: the shapes :class:`StapleForceKernel` serves, by name (force.loops.SHAPES)
STAPLE_SHAPES = ("plaquette", "rectangle", "parallelogram")


def staple_coefficients(shapes: dict):
    """(c_pl, c_rt, c_pg) when ``shapes`` (GaugeAction.shapes) is MILC's loop family: shapes named in
    :data:`STAPLE_SHAPES`, each with exactly its full loop table (``force.loops.generate``, in any order; an absent
    shape has coefficient 0). None for any other action (the path-table kernel serves it)."""
    coef = dict.fromkeys(STAPLE_SHAPES, 0.0)
    for name, (c, paths) in shapes.items():
        if name not in coef:
            return None
        want = sorted(_loops.canonical(p) for p in _loops.generate(_loops.SHAPES[name]))
        if sorted(_loops.canonical(p) for p in paths) != want:
            return None
        coef[name] = float(c)
    return tuple(coef[k] for k in STAPLE_SHAPES)


def staple_depth(shapes: dict) -> int:
    """The padding :class:`StapleForceKernel` needs: 2 when it builds staples one site beyond the interior (any
    rectangle or parallelogram term), else 1 (plaquettes in registers, or the path-table kernel)."""
    c = staple_coefficients(shapes)
    return 2 if c is not None and (c[1] != 0.0 or c[2] != 0.0) else 1


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


SU3_PRODUCT = 198                 # flops of a complex 3x3 x 3x3 product: 27 multiplications (6), 18 additions (2)
PRODUCT_ADDED = SU3_PRODUCT + 18  # a product added into a 3x3 sum
WEIGHTED_SUM = 36                 # adding c R to a complex 3x3 sum
TA_SCALED = 54                    # (A - A^dag)/2 (36), minus a third of its trace (6), times the scale (18)
STAPLES_PER_SITE = 24             # the plaquette staples S^b_mu of a site: 4 mu x 6 signed b
MATRIX_BYTES = 9 * 16


def force_flops_per_site(shapes: dict) -> int:
    """Flops a site of the force kernel :func:`force_kernel` gives ``shapes``, as it does them (the count is
    explained in bench/rhmc_floors.py's docstring): the staple-sharing kernels' products and sums, or the walk's
    L - 1 products and one weighted sum per loop through each link."""
    coef = staple_coefficients(shapes)
    if coef is None:
        table = force_paths(shapes)
        return sum((len(q) - 1) * SU3_PRODUCT + WEIGHTED_SUM for mu in range(4) for _, q in table[mu])
    _, c_rt, c_pg = coef
    final = SU3_PRODUCT + TA_SCALED
    if c_rt == 0.0 and c_pg == 0.0:
        return 4 * (6 * (2 * SU3_PRODUCT + WEIGHTED_SUM) + final)
    link = 6 * WEIGHTED_SUM + final
    if c_rt != 0.0:
        link += 12 * PRODUCT_ADDED + 2 * (SU3_PRODUCT + WEIGHTED_SUM)
    side = (SU3_PRODUCT if c_rt != 0.0 else 0) + (4 * PRODUCT_ADDED if c_pg != 0.0 else 0)
    link += 6 * (side + 2 * WEIGHTED_SUM + PRODUCT_ADDED)
    return STAPLES_PER_SITE * 2 * SU3_PRODUCT + 4 * link


def scratch_bytes_per_site(shapes: dict) -> int:
    """The fewest bytes a site the force kernel moves through its staple scratch: the 24 staples written once and
    read once (0 for the kernels without scratch)."""
    return 2 * STAPLES_PER_SITE * MATRIX_BYTES if staple_depth(shapes) == 2 else 0


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


#: the plaquettes whose (3 - ReTr) the action-density kernel sums for force.gauge_action.plaquette_whole: the
#: three spatial planes and the three temporal ones, each loop U_mu(x) U_nu(x + mu) U_mu(x + nu)^dag U_nu(x)^dag
#: (steps +-(d + 1))
PLAQUETTE_PLANES = {"spatial": [(mu, nu) for mu in range(3) for nu in range(mu + 1, 3)],
                    "temporal": [(mu, 3) for mu in range(3)]}


def plaquette_kernels(backend) -> dict:
    """{"spatial": kernel, "temporal": kernel}: :class:`GaugeActionKernel` over each class of planes, built once."""
    def build():
        return {name: GaugeActionKernel(backend, {name: (1.0, [(mu + 1, nu + 1, -(mu + 1), -(nu + 1))
                                                             for mu, nu in planes])})
                for name, planes in PLAQUETTE_PLANES.items()}
    return backend.kernel(("gauge_force_cuda", "plaquette"), build)


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


class StapleForceKernel:
    """The force of MILC's loop family (:func:`staple_coefficients`) with staples shared between links
    (force/kernels/gauge_force.cu, header comment): ``gauge_force_staples`` writes the 24 plaquette staples of every
    site of the interior and one layer around it, then ``gauge_force_symanzik`` sums plaquettes, rectangles and
    parallelograms per link, all four directions in one launch; plaquettes alone are one kernel,
    ``gauge_force_plaquette``. Same call as :class:`GaugeForceKernel`.

    Gluing two staples along a link walked there and back uses U U^dag = 1: for links off U(3) by eps the result
    differs from the walk's by about 0.1 eps relative (measured on 4^4), so it needs unitary links, which every
    caller has (SU(3) updates; lattice files re-unitarized on reading, hmc.run)."""

    def __init__(self, backend, shapes: dict):
        coef = staple_coefficients(shapes)
        if coef is None:
            raise ValueError("StapleForceKernel serves plaquette, rectangle and parallelogram shapes with their full "
                             "loop tables only: use force_kernel(), which gives other actions GaugeForceKernel")
        self.c_pl, self.c_rt, self.c_pg = coef
        self.shared = self.c_rt != 0.0 or self.c_pg != 0.0
        names = ("gauge_force_staples", "gauge_force_symanzik") if self.shared else ("gauge_force_plaquette",)
        self.kernels = [cuda_source.function(backend, "force", "gauge_force.cu", k) for k in names]
        self.cp = backend.xp
        self.tile = None                 # SITE_TILE; a benchmark sets another (bench.gauge's --site-tile)

    def __call__(self, links, beta: float, dims, padded_dims=None, offset=None):
        """The force on the interior sites, shape (4, nt, nz, ny, nx, 3, 3), from ``links`` on the box
        ``padded_dims`` (default ``dims``) with the interior at ``offset``: padded by at least 2 on a padded
        dimension when rectangles or parallelograms are present."""
        cp = self.cp
        nx, ny, nz, nt = dims
        box = _box_args(dims, padded_dims, offset)
        out = cp.empty((4, nt, nz, ny, nx, 3, 3), dtype=cp.complex128)
        block, n = 128, 4 * nx * ny * nz * nt
        scale = np.float64(-beta / 3.0)
        if not self.shared:
            self.kernels[0](((n + block - 1) // block,), (block,), (links, out, np.float64(self.c_pl)) + box + (scale,))
            return out
        region, origin = _staple_region(box)
        pvol = int(np.prod([int(v) for v in box[4:8]]))
        staples = cp.empty(24 * 9 * pvol, dtype=cp.complex128)
        chunks = -(-int(np.prod([int(v) for v in region])) // LANES)      # 32 sites x 24 staples = 6 blocks
        self.kernels[0]((chunks * STAPLES_PER_SITE * LANES // block,), (block,),
                        (links, staples) + region + box[4:8] + origin + site_tiles(region, self.tile))
        self.kernels[1]((-(-n // (4 * LANES)),), (4 * LANES,),           # 32 sites x 4 directions a block
                        (links, staples, out, np.float64(self.c_pl), np.float64(self.c_rt), np.float64(self.c_pg))
                        + box + (scale,) + site_tiles(box[0:4], self.tile))
        return out


LANES = cuda_source.JOB_LANES   # the staple-sharing kernels take lat::job's order
#: the site tiles (ty, tz, tt) of that order (x whole): on the H200 at 32^4 the pair took 9.05 ms with these, 9.80
#: lexicographic (1, 1, 1) and 12.5 ms in the order before, one direction after another (runs/rhmc/README.md
#: "Session 18", `hmc bench gauge --site-tiles`)
SITE_TILE = (8, 8, 8)


def site_tiles(extents, tile=None) -> tuple:
    """The tile extents (ty, tz, tt) of the kernels' site order on a region of ``extents`` (nx, ny, nz, nt):
    each of ``tile`` (default :data:`SITE_TILE`) reduced to its greatest common divisor with the extent, so that
    the tiles cover the region (1: lexicographic along that axis), as int32."""
    return tuple(np.int32(math.gcd(int(n), int(t))) for n, t in zip(extents[1:4], tile or SITE_TILE))


def _staple_region(box) -> tuple:
    """(extents, origin in the box) of the sites whose staples the symanzik kernel reads: the interior, and one
    layer on each side of a padded dimension (which needs a padding of 2: the staples there read links 2 out)."""
    dims, padded, offset = box[0:4], box[4:8], box[8:12]
    extents, origin = [], []
    for n, p, o in zip(dims, padded, offset):
        if p == n:
            extents.append(n)
            origin.append(0)
        elif o >= 2:
            extents.append(n + 2)
            origin.append(o - 1)
        else:
            raise ValueError(f"links padded by {int(o)}: the staple-sharing force needs a padding of 2 "
                             "(Geometry.padded with GaugeAction.halo_depth)")
    return tuple(np.int32(v) for v in extents), tuple(np.int32(v) for v in origin)


def force_kernel(backend, shapes: dict):
    """The force kernel for an action's ``shapes``: :class:`StapleForceKernel` for MILC's loop family (Wilson,
    Symanzik), else the path-table :class:`GaugeForceKernel`."""
    return (StapleForceKernel if staple_coefficients(shapes) is not None else GaugeForceKernel)(backend, shapes)
