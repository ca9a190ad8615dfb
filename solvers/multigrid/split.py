"""Split-grid multi-right-hand-side solves: several sources solved at once, each on a sub-grid of the process grid.

The process grid (PX, PY, PZ, PT) is split by ``split`` (sx, sy, sz, st), each dividing its extent, into
S = sx sy sz st sub-grids of (PX/sx, ..., PT/st) ranks (``comms.ProcessGrid.push``, docs/halo-protocol.md "split grid": the
halo state is reset in lock-step). Every sub-grid holds the whole lattice, so the links and the sources are
replicated first (gathered once, broadcast); sub-grid c solves the sources c, c + S, c + 2S, ... with an inverse
of its own (``make_inverse(D)``: e.g. ``lambda D: multigrid(tol)(D.matrix(m))``), gathers its solutions to its
first rank, and after ``pop`` every rank takes its block of every solution. Fewer ranks per solve means larger
local volumes and fewer, larger messages: the coarse levels' latency is shared out (QUDA's and Grid's split-grid
solves).

The solutions are those of single solves on the whole grid to the solver's tolerance (reductions are summed over
fewer ranks, so rounding differs).
"""
from __future__ import annotations

import numpy as np

from comms.grid import grid_index
from lattice import Geometry

from ..staggered import StaggeredDslash
from .lattice import MultigridError


def _everywhere(geom, a):
    """The global site array of the local blocks ``a`` (site axes first) on every rank, NumPy. Collective."""
    g = geom.gather(a)
    comm = geom.grid.active_comm
    return g if comm.size == 1 else comm.bcast(g, root=0)


def _links_everywhere(geom, links):
    if links is None:
        return None
    return _everywhere(geom, geom.xp.moveaxis(links, 0, 4))          # (nt, nz, ny, nx, 4, 3, 3)


def _local_links(sub, g):
    if g is None:
        return None
    return sub.xp.asarray(np.ascontiguousarray(np.moveaxis(sub.local_part(g), 4, 0)))


def check_split(grid, split) -> tuple:
    try:
        split = tuple(int(s) for s in split)
    except (TypeError, ValueError):
        raise MultigridError(f"split {split!r} must be four integers (sx sy sz st)") from None
    dims = grid.dims
    if len(split) != 4 or any(s < 1 for s in split) or any(d % s for d, s in zip(dims, split)):
        raise MultigridError(f"split {split} does not divide the process grid {tuple(dims)}: each entry must be a "
                             "positive divisor of the ranks in its direction")
    return split


def split_grid_solve(geom, fat, long, sources, split, make_inverse):
    """Solve M x_i = b_i for every source (this rank's blocks on ``geom``) on sub-grids; returns (solutions as this
    rank's blocks on ``geom``, per-source dicts with the solving sub-grid and the solver's statistics).

    ``fat``, ``long``: the operator's links on ``geom`` (as given to :class:`solvers.StaggeredDslash`);
    ``make_inverse(D)``: an object with ``solve(b) -> (x, stats)`` for the StaggeredDslash D of a sub-grid."""
    grid = geom.grid
    split = check_split(grid, split)
    nsub = int(np.prod(split))
    be, xp = geom.backend, geom.xp
    sub_dims = tuple(d // s for d, s in zip(grid.dims, split))
    color = grid_index(tuple(c // sd for c, sd in zip(grid.coords, sub_dims)), split)
    fat_g, long_g = _links_everywhere(geom, fat), _links_everywhere(geom, long)
    src_g = [_everywhere(geom, b) for b in sources]
    mine = []
    grid.push(split)
    try:
        sub = Geometry(geom.dims, backend=be, grid=grid)
        D = StaggeredDslash(sub, _local_links(sub, fat_g), _local_links(sub, long_g))
        inv = None
        for i in range(color, len(sources), nsub):
            inv = make_inverse(D) if inv is None else inv
            x, st = inv.solve(xp.asarray(np.ascontiguousarray(sub.local_part(src_g[i]))))
            xg = sub.gather(x)
            if xg is not None:
                mine.append((i, xg, {"subgrid": color, "ranks": sub.grid.active_comm.size,
                                     "grid": list(sub_dims), "iters": int(st.iters),
                                     "true_residual": float(st.true_residual or 0.0), "time_s": float(st.time)}))
    finally:
        grid.pop()
    comm = grid.active_comm
    parts = comm.allgather(mine) if comm.size > 1 else [mine]
    found = {i: (x, info) for part in parts for i, x, info in part}
    xs = [xp.asarray(np.ascontiguousarray(geom.local_part(found[i][0]))) for i in range(len(sources))]
    return xs, [found[i][1] for i in range(len(sources))]
