"""The process grid, split grids and global reductions (docs/halo-protocol.md, docs/architecture.md "Decomposition and halos").

A single process needs no MPI library (comms/base.py): a one-rank partitioned dimension exchanges with itself
through MPI.COMM_SELF.

Rank mapping is node-aware: the ranks are ordered node by node (MPI.COMM_TYPE_SHARED split), then numbered into
the grid with x fastest, so consecutive grid positions, and therefore neighbours along the first split dimension,
share a node. ``neighbours[dim][dir]`` is the rank (in ``comm``) of the backward (dir 0) and forward (dir 1)
neighbour. ``partitioned[dim]`` says whether ``dim`` exchanges halos: true when it has more than one rank, or when
forced (``partitioned=``, else the run configuration's ``partition``: HMC_PARTITION=t, =zt, ...): a one-rank
partitioned dimension exchanges with itself through the whole pack/exchange/unpack path.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from . import reduce as _reduce
from .base import (DIRS, CommsError, CommsTimeout, _SingleComm, is_mpi_comm, launched_size, leaked, mpi,  # noqa: F401
                   world)
from .config import ConfigError, RunConfig


def _sum_scalars(comm, value):
    """The correctly rounded sum over the ranks of one float or complex per rank, as :meth:`ProcessGrid.sum_exact`
    (the same bits: math.fsum is correctly rounded too, and + 0.0 turns -0.0 into the 0.0 the exact parts give),
    with one Allgather of two doubles instead of an allgather of pickled integers (about 9 us against 90 us on two
    ranks of one host; on one rank no exact parts at all): the solvers' per-iteration reductions take this path."""
    z = complex(value)
    allv = np.array([[z.real, z.imag]])
    if comm.size > 1:
        allv = np.empty((comm.size, 2))
        comm.Allgather(np.array([z.real, z.imag]), allv)
    sums = []
    for col in (allv[:, 0], allv[:, 1]):
        if not np.isfinite(col).all():
            sums.append(float(col.sum()))
            continue
        try:
            sums.append(math.fsum(col) + 0.0)
        except OverflowError:          # a partial sum beyond the float range: the exact parts handle it
            sums.append(_reduce.combine([_reduce.exact_parts(col)]))
    return complex(sums[0], sums[1]) if isinstance(value, complex) else sums[0]

# ------------------------------------------------------------------------------------------------------------
# grid shapes

def _prime_factors(n: int) -> list:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return sorted(out, reverse=True)


def _split(size: int, lattice, even: bool):
    """Prime factors of ``size``, largest first, each to the dimension with the largest local extent (ties: t, z,
    y, x) that it divides (into even pieces when ``even``); None when some factor finds no such dimension."""
    local = [int(n) for n in lattice]
    grid = [1, 1, 1, 1]
    for p in _prime_factors(int(size)):
        fits = [mu for mu in (3, 2, 1, 0) if local[mu] % p == 0 and (not even or (local[mu] // p) % 2 == 0)]
        if not fits:
            return None
        best = max(fits, key=lambda mu: local[mu])      # max keeps the first of equal extents: t, z, y, x
        grid[best] *= p
        local[best] //= p
    return tuple(grid)


def choose_grid(size: int, lattice, even_only: bool = False) -> tuple:
    """A process grid for ``size`` ranks on ``lattice`` (nx, ny, nz, nt): even local extents where the rank count
    allows them (the GPU body kernels and multigrid's 2^4 blocks need them), else any that divide the lattice
    (odd local extents run: the checkerboard follows the global coordinates, e.g. 6^4 over 2 ranks as 6x6x6x3);
    ``even_only`` refuses the second kind."""
    grid = _split(size, lattice, even=True)
    if grid is None and not even_only:
        grid = _split(size, lattice, even=False)
    if grid is None:
        what = "into even local extents" if even_only else "(no dimension's extent divides by its prime factors)"
        raise CommsError(f"cannot split the {'x'.join(map(str, lattice))} lattice over {size} ranks {what}: "
                         "give --grid PX PY PZ PT or use another rank count")
    return grid


def _parse_partition(spec) -> tuple:
    if spec is None:
        return (False,) * 4
    if isinstance(spec, str):
        s = spec.strip().lower()
        if s in ("", "none", "0"):
            return (False,) * 4
        if not set(s) <= set(DIRS + ", "):
            raise CommsError(f"HMC_PARTITION={spec!r}: give the directions to partition as letters, e.g. 't' or "
                             "'zt'")
        return tuple(d in s for d in DIRS)
    spec = tuple(bool(v) for v in spec)
    if len(spec) != 4:
        raise CommsError(f"partitioned={spec} must have four entries (x, y, z, t)")
    return spec


class _Context:
    """One level of the communicator stack: comm, grid shape, coordinates, neighbours, halo engine."""

    def __init__(self, comm, dims, coords, neighbours, order):
        self.comm = comm
        self.dims = dims
        self.coords = coords
        self.neighbours = neighbours
        self.order = order          # order[g] = rank in comm at grid index g (x fastest)
        self.engine = None
        self.partitioned = None     # ProcessGrid.partitioned of this context, made on first use


def grid_index(coords, dims) -> int:
    g = 0
    for c, d in zip(reversed(coords), reversed(dims)):
        g = g * d + c
    return g


def grid_coords(g: int, dims) -> tuple:
    c = []
    for d in dims:
        c.append(g % d)
        g //= d
    return tuple(c)


_OWNERS = itertools.count(1)     # ProcessGrid.owner


class ProcessGrid:
    """A 4D Cartesian grid of ranks (x, y, z, t), with halo exchanges over the partitioned dimensions.

    dims: ranks per dimension; None takes the configuration's ``grid`` (``--grid``, the deck's, HMC_GRID) for grids
    on COMM_WORLD (``comm`` not given); None there too (or all ones on several ranks) chooses a grid from the rank
    count and the lattice (given here or later by :meth:`bind`).
    partitioned: force one-rank dimensions onto the halo path (tuple of 4 bools or letters "zt"; default: the
    configuration's ``partition``). transport: "mpi" | "shm" | "event" | "stream_gated" | None (the configuration's
    ``transport``, else the best every rank can use).
    config: the run configuration (:class:`comms.config.RunConfig`; default: built from the environment now). The
    halo engines and everything built on this grid read their settings from it (``grid.config``).
    """

    def __init__(self, dims=None, comm=None, *, lattice=None, partitioned=None, transport=None, config=None):
        explicit_comm = comm is not None
        # what this grid's engines, windows and mappings are registered under for the teardown leak check: unique
        # for the process's life (an id() is reused once a grid is collected, and a grid collected without close()
        # left its entries behind: they were then reported against a new grid at the same address)
        self.owner = next(_OWNERS)
        self.config = config if config is not None else RunConfig.from_environment()
        self.comm = comm if comm is not None else world()
        self.size = self.comm.size
        self.rank = self.comm.rank
        if dims is None and not explicit_comm:
            dims = self.config.grid
        if dims is not None:
            dims = tuple(int(d) for d in dims)
            if len(dims) != 4 or any(d < 1 for d in dims):
                raise CommsError(f"process grid {dims} is not four positive integers: use --grid PX PY PZ PT")
            if self.size > 1 and dims == (1, 1, 1, 1):
                dims = None          # the default grid of a deck: choose one for the rank count
        self._forced = _parse_partition(partitioned if partitioned is not None else self.config.partition)
        if transport is not None:                # this grid's own transport, checked by the configuration's rule
            try:
                self.config = dataclasses.replace(self.config, transport=transport)
            except ConfigError as e:
                raise CommsError(str(e)) from None
        self.transport_request = self.config.transport
        self._stack = []
        self._ctx = None
        self._protocol = None
        self.node_comm = None
        if dims is None and lattice is not None:
            dims = choose_grid(self.size, lattice)
        if dims is not None:
            self._setup(dims)

    # set-up -------------------------------------------------------------------------------------------------
    def bind(self, lattice) -> "ProcessGrid":
        """Choose the grid now if it was left open, and check that it divides ``lattice``."""
        if self._ctx is None:
            self._setup(choose_grid(self.size, lattice))
        self.check_divides(lattice)
        return self

    def _setup(self, dims):
        dims = tuple(int(d) for d in dims)
        if int(np.prod(dims)) != self.size:
            raise CommsError(f"process grid {'x'.join(map(str, dims))} needs {int(np.prod(dims))} ranks "
                             f"but the job has {self.size}: change --grid or the mpiexec -n count")
        order = list(range(self.size))
        self.node_of = [0] * self.size
        if self.size > 1:
            MPI = mpi()
            self.node_comm = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
            leader = self.node_comm.bcast(self.rank, root=0)
            info = self.comm.allgather((leader, self.node_comm.rank))
            leaders = sorted({l for l, _ in info})
            self.node_of = [leaders.index(l) for l, _ in info]
            order = sorted(range(self.size), key=lambda r: (info[r][0], info[r][1]))
        self._ctx = self._make_context(self.comm, dims, order)

    def _make_context(self, comm, dims, order) -> _Context:
        rank = comm.rank if is_mpi_comm(comm) else 0
        g = order.index(rank)
        coords = grid_coords(g, dims)
        neighbours = []
        for mu in range(4):
            pair = []
            for step in (-1, +1):
                c = list(coords)
                c[mu] = (c[mu] + step) % dims[mu]
                pair.append(order[grid_index(c, dims)])
            neighbours.append(tuple(pair))
        return _Context(comm, dims, coords, tuple(neighbours), order)

    # the current context ------------------------------------------------------------------------------------
    def _need(self):
        if self._ctx is None:
            raise CommsError("the process grid is not chosen yet: bind it to a lattice (Geometry does) or give dims")
        return self._ctx

    @property
    def dims(self):
        return None if self._ctx is None else self._ctx.dims

    @dims.setter
    def dims(self, value):
        if value is not None:
            raise AttributeError("set the grid through the constructor")

    @property
    def coords(self):
        return self._need().coords

    @property
    def neighbours(self):
        return self._need().neighbours

    @property
    def active_comm(self):
        """The communicator of the current context (a sub-grid's while one is pushed)."""
        return self._need().comm

    @property
    def partitioned(self) -> tuple:
        ctx = self._need()
        if ctx.partitioned is None:          # read on every shift (and stencil look-up): made once per context
            ctx.partitioned = tuple(ctx.dims[mu] > 1 or self._forced[mu] for mu in range(4))
        return ctx.partitioned

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def depth(self) -> int:
        """How many communicators are pushed on top of the base grid."""
        return len(self._stack)

    def describe(self) -> str:
        d = self._need().dims
        p = "".join(DIRS[mu] for mu in range(4) if self.partitioned[mu]) or "none"
        return f"grid {'x'.join(map(str, d))} on {self.size} rank(s), partitioned: {p}"

    # reductions ---------------------------------------------------------------------------------------------
    def sum(self, value):
        """Global sum of a Python or NumPy scalar/array (same value on every rank, rounding depends on the rank
        count: use :meth:`sum_exact` for floats that must not depend on the decomposition)."""
        comm = self.active_comm if self._ctx is not None else self.comm
        if comm.size == 1:
            return value
        return comm.allreduce(value, op=mpi().SUM)

    def sum_exact(self, a):
        """Correctly rounded global sum of the local float (or complex) arrays ``a``: bitwise the same for every
        decomposition, rank count and order (comms.reduce). Returns a Python float or complex."""
        comm = self.active_comm if self._ctx is not None else self.comm
        arr = np.asarray(a)
        if arr.size == 1 and arr.dtype.kind in "fc":
            return _sum_scalars(comm, arr.item())
        return self.sum_exact_parts(_reduce.local_parts(a))

    def sum_exact_parts(self, parts):
        """The correctly rounded global sum from every rank's exact parts of its local array
        (comms.reduce.local_parts: (real, imaginary or None)). Collective."""
        comm = self.active_comm if self._ctx is not None else self.comm
        allparts = comm.allgather(parts) if comm.size > 1 else [parts]
        re = _reduce.combine([p[0] for p in allparts])
        if parts[1] is None:
            return re
        return complex(re, _reduce.combine([p[1] for p in allparts]))

    def max(self, value):
        comm = self.active_comm if self._ctx is not None else self.comm
        return value if comm.size == 1 else comm.allreduce(value, op=mpi().MAX)

    def min(self, value):
        comm = self.active_comm if self._ctx is not None else self.comm
        return value if comm.size == 1 else comm.allreduce(value, op=mpi().MIN)

    def chain(self, dim: int, fn):
        """Run ``fn`` along ``dim`` in coordinate order: the rank at coordinate 0 calls fn(None), each next one
        fn(result of the previous); returns the last rank's result there, None elsewhere (e.g. ordered products
        along t, bitwise the same as one process computing them in order)."""
        ctx = self._need()
        n, c = ctx.dims[dim], ctx.coords[dim]
        acc = None
        if c > 0:
            acc = ctx.comm.recv(source=ctx.neighbours[dim][0], tag=900 + dim)
        out = fn(acc)
        if c < n - 1:
            ctx.comm.send(out, dest=ctx.neighbours[dim][1], tag=900 + dim)
            return None
        return out

    def gather_blocks(self, local, root: int = 0):
        """On ``root``: a list, by rank, of (coords, local array) of every rank; None elsewhere."""
        ctx = self._need()
        item = (ctx.coords, np.asarray(local))
        if ctx.comm.size == 1:
            return [item]
        return ctx.comm.gather(item, root=root)

    def barrier(self):
        self.active_comm.Barrier() if self._ctx is not None else self.comm.Barrier()

    def check_divides(self, lattice):
        dims = self._need().dims
        for mu, (n, p) in enumerate(zip(lattice, dims)):
            if n % p:
                raise CommsError(f"lattice extent {n} in direction {DIRS[mu]} is not divisible by the {p} ranks "
                                 f"of the process grid: choose a --grid that divides {tuple(lattice)}")

    # halo exchange ------------------------------------------------------------------------------------------
    @property
    def halo(self):
        """The halo engine of the current context (created collectively on first use): the GPU engine when the
        requested transport has device buffers (and this machine can run it), else the host engine."""
        ctx = self._need()
        if ctx.engine is None:
            from .halo import HaloEngine, ProtocolState, wants_gpu_transport

            if self._protocol is None:
                self._protocol = ProtocolState()
            engine_class = HaloEngine
            if wants_gpu_transport(self.transport_request):      # loaded only then: it imports CuPy
                from .cuda.transports import GpuHaloEngine as engine_class
            ctx.engine = engine_class(self, ctx, self._protocol, self.transport_request)
        return ctx.engine

    def transport_table(self, everywhere: bool = False) -> list:
        """The resolved links of every rank (on rank 0; this rank's only elsewhere unless ``everywhere``):
        dicts with rank, link, peer, transport, reason. Collective."""
        if not any(self.partitioned):
            return []
        rows = self.halo.table_rows()
        comm = self.active_comm
        if comm.size == 1:
            return rows
        if everywhere:
            return [r for part in comm.allgather(rows) for r in part]
        gathered = comm.gather(rows, root=0)
        return [r for part in gathered for r in part] if comm.rank == 0 else rows

    # split grid ---------------------------------------------------------------------------------------------
    def push(self, split, *, reset: bool = True):
        """Split the current grid into sub-grids: ``split[mu]`` sub-grids along mu, each of dims[mu] // split[mu]
        ranks; this rank continues on its sub-grid until :meth:`pop`. Collective over the current grid.
        Halo state is reset in lock-step (docs/halo-protocol.md, split grid); ``reset=False`` is a testing hook that skips it."""
        ctx = self._need()
        split = tuple(int(s) for s in split)
        if len(split) != 4 or any(s < 1 or d % s for s, d in zip(split, ctx.dims)):
            raise CommsError(f"split {split} does not divide the process grid {ctx.dims}")
        sub_dims = tuple(d // s for d, s in zip(ctx.dims, split))
        block = tuple(c // sd for c, sd in zip(ctx.coords, sub_dims))
        color = grid_index(block, split)
        key = grid_index(tuple(c % sd for c, sd in zip(ctx.coords, sub_dims)), sub_dims)
        if ctx.engine is not None:
            ctx.engine.suspend(reset=reset)
        if is_mpi_comm(ctx.comm):
            sub = ctx.comm.Split(color, key)
        else:
            sub = ctx.comm
        self._stack.append(ctx)
        self._ctx = self._make_context(sub, sub_dims, list(range(int(np.prod(sub_dims)))))
        if ctx.engine is not None:
            # create the sub-grid's engine now, collectively, with the protocol state reset (or not)
            if reset:
                self._protocol.reset()
            self.halo
        return self

    def pop(self, *, reset: bool = True):
        """Return to the grid below the current sub-grid (collective over the full grid)."""
        if not self._stack:
            raise CommsError("pop() without a matching push()")
        ctx = self._ctx
        parent = self._stack.pop()
        if ctx.engine is not None:
            ctx.engine.free()
        if is_mpi_comm(ctx.comm) and ctx.comm is not parent.comm:
            ctx.comm.Free()
        self._ctx = parent
        if parent.engine is not None:
            parent.engine.resume(reset=reset)
        elif ctx.engine is not None and reset:
            self._protocol.reset()
        if is_mpi_comm(parent.comm):
            parent.comm.Barrier()
        return self

    def close(self):
        """Free every halo engine (windows and peer mappings) and check that none leaked. Collective."""
        while self._stack:
            self.pop()
        if self._ctx is not None and self._ctx.engine is not None:
            self._ctx.engine.free()
            self._ctx.engine = None
        left = leaked(self.owner)
        if left:
            raise CommsError(f"rank {self.rank}: comms teardown found leaked mappings/windows: {left}")
