"""Geometry: the global lattice, this rank's part of it, and neighbour shifts.

Arrays of site data have the site axes first, in the order (t, z, y, x), so that in memory x runs fastest as in
MILC's files: global index = x + nx*(y + ny*(z + nz*t)). Direction mu = 0, 1, 2, 3 is x, y, z, t and lives on
array axis 3 - mu.

Distribution: every neighbour access of the physics code goes through :meth:`Geometry.shift`. On a partitioned
dimension a shift by k is the local roll with its |k| wrapped slabs replaced by the neighbour's, received through
the lattice's stencil (comms.stencil, driving the halo engine of comms.halo): exact data movement, so every result is bitwise the one of a single process.
:meth:`Geometry.sum` is the correctly rounded sum (comms.reduce), the same for every decomposition.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from comms import ProcessGrid
from comms.config import RunConfig
from comms.stencil import Stencil, device_engine, staging  # noqa: F401  (device_engine: for the GPU hop)

from .backend import Backend, get_backend
from .placement import Placement, placement_of

DIRS = "xyzt"
#: device arrays of at least this many elements are summed on the device (lattice.exact_sum_cuda), smaller ones on
#: the host: the same correctly rounded sum either way
DEVICE_SUM_MIN = 4096


class GeometryError(ValueError):
    pass


def site_axis(mu: int) -> int:
    return 3 - mu


class SiteLattice:
    """What any lattice of sites offers, from ``dims``, ``local_dims``, ``offset``, ``backend`` and ``grid``:
    array shape, volumes, global coordinates and site indices, and neighbour shifts (a halo exchange on a
    partitioned dimension). Shared by :class:`Geometry` and the coarse lattices of the multigrid."""

    @property
    def xp(self):
        return self.backend.xp

    @property
    def volume(self) -> int:
        return int(np.prod(self.dims))

    @property
    def local_volume(self) -> int:
        return int(np.prod(self.local_dims))

    @property
    def shape(self) -> tuple:
        """Local site-array shape (nt, nz, ny, nx)."""
        nx, ny, nz, nt = self.local_dims
        return (nt, nz, ny, nx)

    def coordinates(self):
        """Global coordinates x, y, z, t of the local sites, each an integer array of ``shape``."""
        xp = self.xp
        t, z, y, x = xp.meshgrid(*[xp.arange(n) for n in self.shape], indexing="ij")
        ox, oy, oz, ot = self.offset
        return x + ox, y + oy, z + oz, t + ot

    def site_ids(self):
        """Global MILC index x + nx(y + ny(z + nz t)) of every local site, shape ``shape``."""
        x, y, z, t = self.coordinates()
        nx, ny, nz, _ = self.dims
        return (x + nx * (y + ny * (z + nz * t))).astype(self.xp.int64)

    def shift(self, f, mu: int, step: int = 1):
        """The field at x + step*mu_hat, at x: ``shift(f, mu, +1)[x] = f[x + mu]``."""
        if not self.grid.partitioned[mu]:
            return self.xp.roll(f, -step, axis=site_axis(mu))
        return self.shift_start(f, mu, step).finish()

    def shift_start(self, f, mu: int, step: int = 1) -> "ShiftHandle":
        """Post the halo exchange of ``shift(f, mu, step)``; ``.finish()`` returns the shifted field. Work done
        between the two overlaps the exchange. At most two may be outstanding (double buffering)."""
        return ShiftHandle(self, f, mu, step)

    def halo(self, f, depth: int = 1, dims=None) -> dict:
        """The neighbours' boundary slabs of ``f``, ``depth`` deep, over the partitioned dimensions (or ``dims``):
        {(mu, 0): the last ``depth`` slabs of the backward neighbour, (mu, 1): the first ``depth`` slabs of the
        forward neighbour}, in one exchange."""
        return self.halo_start(f, depth, dims).finish()

    def halo_start(self, f, depth: int = 1, dims=None) -> "HaloHandle":
        return HaloHandle(self, f, depth, dims)

    def stencil(self, displacements, depth: int | None = None, padded: bool = False) -> Stencil:
        """The :class:`comms.stencil.Stencil` of this lattice for ``displacements`` ((mu, step) pairs) at ``depth``,
        built once per process-grid layout and kept (its buffers with it); every halo of the lattice goes through
        one (docs/architecture.md, 'Stencil')."""
        part = self.grid.partitioned
        key = (tuple(displacements), depth, padded, part)
        cache = self.__dict__.setdefault("_stencils", {})
        st = cache.get(key)
        if st is None:
            st = cache[key] = Stencil(self, displacements, depth, padded=padded, staging=lambda: _staging(self))
        return st


@dataclass
class Geometry(SiteLattice):
    """The lattice ``dims`` on ``grid`` (default: ``ProcessGrid(lattice=dims, config=config)``) with arrays of
    ``backend`` (default: the configuration's). ``config``: the run configuration (:class:`comms.config.RunConfig`)
    for a grid and backend built here (default: from the environment, now); with a grid given, the grid's own
    configuration governs. ``geom.config`` is the one every layer above reads its settings from."""

    dims: tuple            # global extents (nx, ny, nz, nt)
    backend: Backend | None = None
    grid: ProcessGrid | None = None
    config: RunConfig | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self.dims = tuple(int(n) for n in self.dims)
        if len(self.dims) != 4:
            raise GeometryError(f"lattice {self.dims} must have four extents nx ny nz nt")
        for mu, n in enumerate(self.dims):
            if n < 2 or n % 2:
                raise GeometryError(f"lattice extent {n} in direction {DIRS[mu]} must be even and at least 2 "
                                    "(staggered fermions need an even-odd split)")
        if self.grid is None:
            self.grid = ProcessGrid(lattice=self.dims, config=self.config)
        self.config = self.grid.config
        if self.backend is None:
            self.backend = get_backend(None, self.config)
        self.grid.bind(self.dims)
        self.local_dims = tuple(n // p for n, p in zip(self.dims, self.grid.dims))
        self.offset = tuple(c * n for c, n in zip(self.grid.coords, self.local_dims))



    @property
    def placement(self) -> Placement:
        """Where this lattice lives and so which kernels serve it (:func:`lattice.placement.placement_of`)."""
        return placement_of(self)

    def kept(self, name, make):
        """The site field ``make()`` known by ``name`` (hashable: what it is, e.g. ("phases", "naik", bc)), made
        once per backend for this local box: for fields that are a function of the global extents, the local shape
        and its offset alone (the staggered phases, eps(x)), which the force asks for at every evaluation.
        Read-only where the array library has the flag (NumPy): callers multiply by it, never write into it."""
        key = ("kept site field", name, tuple(self.dims), tuple(self.shape), tuple(self.offset))

        def build():
            a = make()
            if isinstance(a, np.ndarray):
                a.flags.writeable = False
            return a
        return self.backend.kernel(key, build)

    def parity(self):
        """0 on even sites (x+y+z+t even), 1 on odd ones."""
        x, y, z, t = self.coordinates()
        return (x + y + z + t) % 2


    def padded(self, f, depth: int):
        """The local site array ``f`` (site axes first) extended by ``depth`` sites on both sides of every
        partitioned dimension: ``padded(f, d)[i] = f_global[(offset + i - pad) mod dims]`` with pad = d on
        partitioned dimensions and 0 elsewhere (unpartitioned dimensions are not padded: periodic wrap stays
        valid there, as the kernels that read the result do it).

        A padded :class:`comms.stencil.Stencil`: one halo exchange per partitioned dimension, in turn, each sending
        slabs of the array padded so far:
        the slabs exchanged along mu already carry the pads of the dimensions before it, so the edge and corner
        regions (x + a mu + b nu with mu and nu partitioned) arrive too. Pure data movement: bitwise the global
        field. NumPy or CuPy (with a GPU engine the faces move device to device, as in :meth:`halo`). Returns
        ``f`` itself when no dimension is partitioned. Collective over the grid."""
        dims = [mu for mu in range(4) if self.grid.partitioned[mu]]
        for mu in dims:      # all ranks have the same local extents: they fail together, before any exchange
            n = self.local_dims[mu]
            if not 1 <= depth <= n:
                raise GeometryError(f"padding depth {depth} is not in 1..{n}, the local extent in direction "
                                    f"{DIRS[mu]}")
        if tuple(f.shape[:4]) != self.shape:
            raise GeometryError(f"padded: site axes {tuple(f.shape[:4])} are not the local shape {self.shape}")
        if not dims:
            return f
        st = self.stencil(tuple((mu, s) for mu in dims for s in (depth, -depth)), depth, padded=True)
        box = self.xp.empty(st.box + tuple(f.shape[4:]), dtype=f.dtype)      # the result: filled in place
        return st.complete(st.begin(f, box))

    def sum(self, a):
        """Global sum of a local array (a Python float or complex): the correctly rounded sum of every element,
        bitwise the same for every decomposition and rank count. A large float64 or complex128 device array is
        summed on the device into exact records (lattice.exact_sum_cuda), the rest on the host (comms.reduce)."""
        if (self.backend.is_gpu and not isinstance(a, np.ndarray) and a.size >= DEVICE_SUM_MIN
                and np.dtype(a.dtype) in (np.float64, np.complex128)):
            from .exact_sum_cuda import device_parts

            return self.grid.sum_exact_parts(device_parts(self.backend, a))
        a = self.backend.to_numpy(a)
        if a.dtype.kind in "biu":
            return float(self.grid.sum(int(a.sum())))
        return self.grid.sum_exact(a)

    # distributed arrays -----------------------------------------------------------------------------------
    def local_part(self, a):
        """This rank's block of a global site array (site axes (nt, nz, ny, nx) first)."""
        (ox, oy, oz, ot), (lx, ly, lz, lt) = self.offset, self.local_dims
        return a[ot:ot + lt, oz:oz + lz, oy:oy + ly, ox:ox + lx]

    def gather(self, a, root: int = 0):
        """The global site array (site axes first) assembled on ``root`` from every rank's block; None on the other
        ranks. Collective."""
        a = self.backend.to_numpy(a)
        blocks = self.grid.gather_blocks(a, root)
        if blocks is None:
            return None
        nx, ny, nz, nt = self.dims
        out = np.empty((nt, nz, ny, nx) + a.shape[4:], dtype=a.dtype)
        lx, ly, lz, lt = self.local_dims
        for (cx, cy, cz, ct), blk in blocks:
            out[ct * lt:(ct + 1) * lt, cz * lz:(cz + 1) * lz, cy * ly:(cy + 1) * ly, cx * lx:(cx + 1) * lx] = blk
        return out


def _slab(axis: int, start: int, stop: int) -> tuple:
    return (slice(None),) * axis + (slice(start, stop),)


def _staging(geom):
    """How faces travel (:func:`comms.stencil.staging`): "device", "host" or "numpy"; read by every exchange of
    the lattice's stencils."""
    return staging(geom.backend.is_gpu, geom.grid.halo)


class ShiftHandle:
    """A shift in flight (:meth:`SiteLattice.shift_start`): a client of the lattice's stencil for the one
    displacement (mu, step); ``f`` is read again by :meth:`finish` (the local roll), so it must not be written
    before then."""

    def __init__(self, geom: SiteLattice, f, mu: int, step: int):
        self.geom, self.mu, self.step = geom, mu, int(step)
        axis = site_axis(mu)
        n = f.shape[axis]
        sign, k = (1 if step > 0 else -1), abs(int(step))
        while k > n:                        # farther than the neighbour's block: whole blocks hop first
            f = ShiftHandle(geom, f, mu, sign * n).finish()
            k -= n
        self.f, self.axis, self.n, self.sign, self.k = f, axis, n, sign, k
        self.pending = None
        if k == 0:
            return
        self.stencil = geom.stencil(((mu, sign * k),))
        self.pending = self.stencil.begin(f)

    def finish(self):
        xp, f, a, n, k = self.geom.xp, self.f, self.axis, self.n, self.k
        if self.pending is None:
            return xp.roll(f, -self.sign * k, axis=a)
        # the local roll with its k wrapped slabs taken from the ghost: one copy of each part, nothing copied twice
        if self.sign > 0:
            ghost = self.stencil.complete(self.pending)[(self.mu, 1)]
            return xp.concatenate((f[_slab(a, k, n)], ghost), axis=a)
        ghost = self.stencil.complete(self.pending)[(self.mu, 0)]
        return xp.concatenate((ghost, f[_slab(a, 0, n - k)]), axis=a)


class HaloHandle:
    """A full halo exchange in flight (:meth:`SiteLattice.halo_start`): a client of the lattice's stencil for the
    displacements +-depth along ``dims``."""

    def __init__(self, geom: SiteLattice, f, depth: int, dims=None):
        dims = [mu for mu in range(4) if geom.grid.partitioned[mu]] if dims is None else list(dims)
        for mu in dims:
            n = f.shape[site_axis(mu)]
            if not 1 <= depth <= n:
                raise GeometryError(f"halo depth {depth} is not in 1..{n}, the local extent in direction {DIRS[mu]}")
        self.stencil = geom.stencil(tuple((mu, s) for mu in dims for s in (depth, -depth)), depth)
        self.pending = self.stencil.begin(f)

    def finish(self, out: dict | None = None) -> dict:
        """{(mu, side): face} as :meth:`SiteLattice.halo`, each a new array or, where ``out`` (optional) holds one
        for its key, that array filled in place."""
        res = {}
        for key, face in self.stencil.complete(self.pending).items():
            dest = None if out is None else out.get(key)
            if dest is None:
                res[key] = face.copy()      # the stencil's ghost buffer is reused by its next exchange
            else:
                dest[...] = face
                res[key] = dest
        return res
