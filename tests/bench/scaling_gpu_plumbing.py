"""Run the scaling worker's GPU operations (bench.scaling.ops: op_halo_gpu, op_dslash_gpu, op_cg_gpu, the
device-event timing and phase split) on the CPU, under mpiexec: CuPy is the stand-in of tests/bench/fake_cupy (host
clocks), the hop is the NumPy twin of solvers.staggered_dist_cuda.DistHop (its real pack / exchange / ghost layout
through the CPU transport), DslashRunner is a NumPy stand-in with its interface, and the CG is the production solver (host-driven here). Rank 0 prints
one JSON line.

    mpiexec -n 2 python tests/bench/scaling_gpu_plumbing.py shm
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fake_cupy"))
sys.path.insert(1, os.path.dirname(os.path.dirname(HERE)))

import cupy  # noqa: E402 - the stand-in
import numpy as np  # noqa: E402

import bench.dslash_dist_cuda as runners  # noqa: E402
import solvers.staggered_dist_cuda as sdc  # noqa: E402
from bench.scaling import ops as W  # noqa: E402
from bench.scaling.worker_context import Context  # noqa: E402
from comms import ProcessGrid, world  # noqa: E402
from lattice import Geometry, get_backend  # noqa: E402
from solvers import StaggeredDslash  # noqa: E402


class Runner:
    """DslashRunner's interface: the full D (two hops) into ``out`` through ``self.hop``."""

    def __init__(self, d, psi, graph=False):
        self.d, self.hop, self.graph = d, d._hop_impl, graph
        self.psi, self.out = np.ascontiguousarray(psi), np.zeros_like(psi)
        self.stream = cupy.cuda.Stream()

    def run(self):
        s = self.d._sign
        self.hop(self.psi, 0, self.out, 0.0, None, s)
        self.hop(self.psi, 1, self.out, 0.0, None, s)
        return self.out


def main():
    runners.DslashRunner = Runner
    runners.close_graph_mode = lambda geom: None
    n = world().size
    grid = ProcessGrid((1, 1, 1, n), transport=sys.argv[1] if len(sys.argv) > 1 and n > 1 else None)
    geom = Geometry((4, 4, 4, 8), get_backend("numpy"), grid=grid)
    spec = {"min_time": 0.0, "repeats": 2, "mass": 0.1, "cg_iters": 3, "halo_sizes": [], "graph": False,
            "transport": sys.argv[1] if len(sys.argv) > 1 else "mpi"}
    ctx = Context(spec, geom)
    fat, long = W._links(ctx)
    d = StaggeredDslash(geom, fat, long)
    if n > 1:
        d._hop_impl = sdc.DistHop(d, twin=True)
        d._hop_impl.cp = cupy                  # what PhaseProfile's events use (set by the CUDA build)
    res = {"ops": {}, "answers": {}}
    W.op_halo_gpu(ctx, res, d)
    W.op_dslash_gpu(ctx, res, d)
    W.op_cg_gpu(ctx, res, d)
    if ctx.rank == 0:
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
