"""The process grid and global reductions.

A single process needs no MPI library: mpi4py is imported only when the job has more than one rank (detected from
the launcher's environment) or when it is asked for explicitly.
"""
from __future__ import annotations

import os

import numpy as np


class CommsError(RuntimeError):
    pass


_LAUNCHER_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS")


def launched_size() -> int:
    """Rank count that the MPI launcher announced in the environment (1 when not under mpiexec)."""
    for var in _LAUNCHER_SIZE_VARS[:4]:
        if var in os.environ:
            return int(os.environ[var])
    return 1


class _SingleComm:
    """The part of an MPI communicator this project uses, for one process without MPI."""

    rank = 0
    size = 1

    def allreduce(self, x, op=None):
        return x

    def bcast(self, x, root=0):
        return x

    def Barrier(self):
        pass

    def Abort(self, code=1):
        os._exit(code)


_world = None


def world():
    """COMM_WORLD from mpi4py when running under an MPI launcher, else a single-process stand-in."""
    global _world
    if _world is None:
        if launched_size() > 1 or os.environ.get("HMC_FORCE_MPI") == "1":
            from mpi4py import MPI

            _world = MPI.COMM_WORLD
        else:
            _world = _SingleComm()
    return _world


class ProcessGrid:
    """A 4D Cartesian grid of ranks (x, y, z, t). This slice runs one rank; the domain-decomposition issue
    adds neighbours, halos and transports."""

    def __init__(self, dims=(1, 1, 1, 1), comm=None):
        self.comm = comm if comm is not None else world()
        self.dims = tuple(int(d) for d in dims)
        if len(self.dims) != 4 or any(d < 1 for d in self.dims):
            raise CommsError(f"process grid {self.dims} is not four positive integers: use --grid PX PY PZ PT")
        if int(np.prod(self.dims)) != self.comm.size:
            raise CommsError(f"process grid {'x'.join(map(str, self.dims))} needs {int(np.prod(self.dims))} ranks "
                             f"but the job has {self.comm.size}: change --grid or the mpiexec -n count")
        self.rank = self.comm.rank
        self.coords = self._coords(self.rank)

    def _coords(self, rank):
        c = []
        for d in self.dims:
            c.append(rank % d)
            rank //= d
        return tuple(c)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def sum(self, value):
        """Global sum of a Python or NumPy scalar/array (same value on every rank)."""
        if self.comm.size == 1:
            return value
        from mpi4py import MPI

        return self.comm.allreduce(value, op=MPI.SUM)

    def check_divides(self, lattice):
        for mu, (n, p) in enumerate(zip(lattice, self.dims)):
            if n % p:
                raise CommsError(f"lattice extent {n} in direction {'xyzt'[mu]} is not divisible by the {p} ranks "
                                 f"of the process grid: choose a --grid that divides {tuple(lattice)}")
