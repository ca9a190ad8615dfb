"""What every comms module shares: the error types, the direction letters and link names, the MPI module, the world
communicator (or a one-process stand-in) and the registry of live windows and mappings (the teardown leak check).
It imports only the run configuration (comms/config.py), so the process grid, the halo engines and every transport
can import it without importing each other.

A single process needs no MPI library: mpi4py is imported only when the job has more than one rank (detected from
the launcher's environment, :func:`comms.config.launcher`), when a dimension is partitioned with one rank, or when it
is asked for explicitly (HMC_FORCE_MPI=1).
"""
from __future__ import annotations

import os

from .config import launcher, set_mpi_defaults

DIRS = "xyzt"


class CommsError(RuntimeError):
    """A user-facing communication error (bad grid, bad transport request, protocol timeout)."""


class CommsTimeout(CommsError):
    """A host-side wait passed its deadline (HMC_COMMS_TIMEOUT). Raised on the rank that waited, not on all."""


def link_name(dim: int, dir_: int) -> str:
    return f"{DIRS[dim]}{'-+'[dir_]}"


def launched_size() -> int:
    """Rank count that the MPI launcher announced in the environment (1 when not under mpiexec)."""
    return launcher().size


def mpi():
    """The mpi4py MPI module (initializing MPI on first use, after :func:`comms.config.set_mpi_defaults`). Without
    an MPI library for mpi4py to load (a plain ``pip install``: mpi4py installs without one) a one-line
    :class:`CommsError` says where to get one."""
    set_mpi_defaults()
    try:
        from mpi4py import MPI
    except RuntimeError as e:
        if "cannot load MPI library" not in str(e):
            raise
        raise CommsError("no MPI library for mpi4py to load (libmpi not found): install the mpi extra "
                         "(pip install 'hisq-hmc[mpi]', Open MPI) or a system MPI") from None

    return MPI


class _SingleComm:
    """The part of an MPI communicator this project uses, for one process without MPI."""

    rank = 0
    size = 1

    def allreduce(self, x, op=None):
        return x

    def allgather(self, x):
        return [x]

    def bcast(self, x, root=0):
        return x

    def gather(self, x, root=0):
        return [x]

    def Barrier(self):
        pass

    def Abort(self, code=1):
        os._exit(code)


_world = None


def world():
    """COMM_WORLD from mpi4py when running under an MPI launcher, else a single-process stand-in."""
    global _world
    if _world is None:
        launch = launcher()
        if launch.size > 1 or launch.force_mpi:
            _world = mpi().COMM_WORLD
        else:
            _world = _SingleComm()
    return _world


def is_mpi_comm(comm) -> bool:
    return not isinstance(comm, _SingleComm)


_LIVE: dict = {}                 # live engines, windows and peer mappings, for the teardown leak check


def leaked(owner=None) -> list:
    """Live engines, windows and peer mappings (of the ProcessGrid with id ``owner``, or of all)."""
    return sorted(text for o, text in _LIVE.values() if owner is None or o == owner)
