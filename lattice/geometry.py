"""Geometry: the global lattice, this rank's part of it, and neighbour shifts.

Arrays of site data have the site axes first, in the order (t, z, y, x), so that in memory x runs fastest as in
MILC's files: global index = x + nx*(y + ny*(z + nz*t)). Direction mu = 0, 1, 2, 3 is x, y, z, t and lives on
array axis 3 - mu.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from comms import ProcessGrid

from .backend import Backend, get_backend

DIRS = "xyzt"


class GeometryError(ValueError):
    pass


def site_axis(mu: int) -> int:
    return 3 - mu


@dataclass
class Geometry:
    dims: tuple            # global extents (nx, ny, nz, nt)
    backend: Backend = field(default_factory=get_backend)
    grid: ProcessGrid | None = None

    def __post_init__(self):
        self.dims = tuple(int(n) for n in self.dims)
        if len(self.dims) != 4:
            raise GeometryError(f"lattice {self.dims} must have four extents nx ny nz nt")
        for mu, n in enumerate(self.dims):
            if n < 2 or n % 2:
                raise GeometryError(f"lattice extent {n} in direction {DIRS[mu]} must be even and at least 2 "
                                    "(staggered fermions need an even-odd split)")
        if self.grid is None:
            self.grid = ProcessGrid()
        self.grid.check_divides(self.dims)
        self.local_dims = tuple(n // p for n, p in zip(self.dims, self.grid.dims))
        self.offset = tuple(c * n for c, n in zip(self.grid.coords, self.local_dims))

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

    def parity(self):
        """0 on even sites (x+y+z+t even), 1 on odd ones."""
        x, y, z, t = self.coordinates()
        return (x + y + z + t) % 2

    def shift(self, f, mu: int, step: int = 1):
        """The field at x + step*mu_hat, at x: ``shift(f, mu, +1)[x] = f[x + mu]``."""
        return self.xp.roll(f, -step, axis=site_axis(mu))

    def sum(self, a):
        """Global sum of a local array (a Python float or complex)."""
        local = a.sum()
        local = complex(local) if self.xp.iscomplexobj(local) else float(local)
        return self.grid.sum(local)
