"""Link fields on halo-padded boxes: what the single-GPU kernels need to run on a partitioned lattice.

The CUDA kernels of the gauge force (force/gauge_force_cuda.py) and of the HISQ smearing (force/hisq_cuda.py) walk
paths with periodic wrap inside the local array, so by themselves they serve only an unpartitioned lattice. On a
partitioned one the links are first padded (:meth:`lattice.Geometry.padded`: one halo exchange per partitioned
dimension, edges and corners included) by the farthest a path reads, and the same kernels run on the box, in padded
coordinates, for the interior sites. :func:`pad_links` makes the box, :class:`PaddedLinks` says where the interior
lies in it; :func:`lattice.placement.pads_on_gpu` is the rule for when the padded kernels serve a geometry.
"""
from __future__ import annotations

import numpy as np


class PaddedLinks:
    """Links (4, pt, pz, py, px, 3, 3) on a box holding the local lattice (extents ``dims``, x first) at ``offset``:
    the halo-padded array of :func:`pad_links` (offset = the depth on partitioned dimensions, 0 elsewhere), or the
    lattice itself (:meth:`whole`: offset 0, the single-GPU case). ``box``: the box extents, x first."""

    def __init__(self, links, dims, offset):
        self.links = links
        self.dims = tuple(int(n) for n in dims)
        self.offset = tuple(int(o) for o in offset)
        self.box = tuple(n + 2 * o for n, o in zip(self.dims, self.offset))
        if tuple(links.shape[1:5]) != self.box[::-1]:
            raise ValueError(f"links of site shape {tuple(links.shape[1:5])} on the box {self.box[::-1]}")

    @classmethod
    def whole(cls, links, dims):
        return cls(links, dims, (0, 0, 0, 0))

    @property
    def padded(self) -> bool:
        return any(self.offset)

    def region(self, grow: int = 0) -> tuple:
        """(number of sites, kernel arguments) of the interior grown by ``grow`` sites on each side of every padded
        dimension (at most its padding); the arguments: region extents, box extents, the region's origin in the
        box (int32)."""
        g = [min(grow, o) for o in self.offset]
        ext = tuple(n + 2 * k for n, k in zip(self.dims, g))
        org = tuple(o - k for o, k in zip(self.offset, g))
        return int(np.prod(ext)), tuple(np.int32(v) for v in ext + self.box + org)

    def interior(self, f):
        """The interior sites of a (4, box..., 3, 3) field, C-contiguous (``f`` itself when nothing is padded)."""
        if not self.padded:
            return f
        (nx, ny, nz, nt), (ox, oy, oz, ot) = self.dims, self.offset
        part = f[:, ot:ot + nt, oz:oz + nz, oy:oy + ny, ox:ox + nx]
        return part.copy(order="C")


def pad_links(geom, links, depth: int) -> PaddedLinks:
    """The links (4, nt, nz, ny, nx, 3, 3) padded by ``depth`` on every partitioned dimension
    (:meth:`lattice.Geometry.padded`, the direction axis moved behind the site axes for it and back to the front,
    C-contiguous, for the kernels). Collective."""
    xp = geom.xp
    padded = geom.padded(xp.moveaxis(links, 0, 4), depth)
    box = xp.ascontiguousarray(xp.moveaxis(padded, 4, 0))
    return PaddedLinks(box, geom.local_dims, pad_offset(geom, depth))


def pad_offset(geom, depth: int) -> tuple:
    """Where the local lattice starts in a box padded by ``depth`` (:meth:`lattice.Geometry.padded`): the depth on
    partitioned dimensions, 0 elsewhere (x first)."""
    return tuple(depth if geom.grid.partitioned[mu] else 0 for mu in range(4))


def padded_face_bytes(geom, depth: int, site_bytes: int) -> int:
    """The largest face one exchange of :meth:`lattice.Geometry.padded` at ``depth`` sends, in bytes, for fields
    of ``site_bytes`` a site: along each partitioned dimension mu in increasing order, ``depth`` slabs of the box
    padded so far (the earlier partitioned dimensions carry their pads, the later ones only their interior;
    comms/stencil.py). 0 when nothing is partitioned."""
    ext, largest = list(geom.local_dims), 0
    for mu in range(4):
        if geom.grid.partitioned[mu]:
            slab = int(np.prod([ext[nu] for nu in range(4) if nu != mu]))
            largest = max(largest, depth * slab * int(site_bytes))
            ext[mu] += 2 * depth
    return largest
