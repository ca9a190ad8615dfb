"""Worker of tests/solvers/test_half_links.py under mpiexec: ``python half_links_mpi_worker.py MODE OUT GRID``.

On the process grid GRID (e.g. 1x1x1x2) with the shm transport, the single-precision HISQ operator with half links
(``dslash_half_links`` = MODE) applied to a field and a mixed CG solve (exact sums), gathered on rank 0 and compared
bit for bit with the same on the whole lattice in one process; rank 0 writes OUT/half.json."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

DIMS = (4, 4, 4, 8)


def _local_links(geom, links):
    return tuple(np.ascontiguousarray(np.moveaxis(geom.local_part(np.moveaxis(a, 0, 4)), 4, 0)) for a in links)


def _apply_and_solve(geom, links, psi, b):
    from solvers import StaggeredDslash, mixed_cg

    d = StaggeredDslash(geom, *links)
    d32 = d.converted(np.complex64)
    x, st = mixed_cg(1e-8, 2000)(d.even_odd(0.4).normal).solve(b)
    return d32.half_links, d32(psi), x, st


def main(mode, out, grid_text):
    import os

    os.environ["HMC_DSLASH_HALF_LINKS"] = mode       # the grids' configuration (a geometry takes its grid's)
    from comms import ProcessGrid, world
    from lattice import Geometry, get_backend
    from solvers import project, set_reductions
    from tests.conftest import write_worker_report
    from tests.force.cuda_host import single_rank_geometry

    from solver_testlib import random_field, random_links

    comm = world()
    single = single_rank_geometry(DIMS)
    links = random_links(single, 5)
    psi = random_field(single, np.random.default_rng(1), np.complex64)
    b = project(random_field(single, np.random.default_rng(2)), single, 0)
    grid = ProcessGrid(tuple(int(v) for v in grid_text.split("x")), transport="shm")
    geom = Geometry(DIMS, get_backend("numpy"), grid)
    set_reductions("exact")
    fails = []
    form, hop, x, st = _apply_and_solve(geom, _local_links(geom, links), geom.local_part(psi), geom.local_part(b))
    hop, x = geom.gather(hop), geom.gather(x)
    rep = {"ranks": comm.size, "mode": form, "iters": st.iters}
    if form != mode:
        fails.append(f"the operator's links are {form!r}, not {mode!r}")
    if comm.rank == 0:
        form1, hop1, x1, st1 = _apply_and_solve(single, links, psi, b)
        rep["hop_equal"] = bool(np.array_equal(hop, hop1))
        rep["solution_equal"] = bool(np.array_equal(x, x1)) and st.iters == st1.iters
        rep["true_residual"] = float(st1.true_residual)
        if not rep["hop_equal"]:
            fails.append("the gathered hop differs from the one-process hop")
        if not rep["solution_equal"]:
            fails.append(f"the gathered solution differs ({st.iters} against {st1.iters} iterations)")
    grid.close()
    write_worker_report(comm, out, "half.json", rep, fails)


if __name__ == "__main__":
    main(*sys.argv[1:4])
