#!/bin/bash
# Session 18's changes written after its device time (issue 19), and the whole suite on lat::job's order: the
# refinement's norms in one reduction (solvers.operator.norm2_many), outer_acc in lat::job's order, MILC's plaquette
# by the action-density kernel (force.gauge_action.plaquette_whole). 1) the whole GPU suite under MPS; 2) the
# plaquette at 32^4, the kernel against the array twin (time, difference); 3) the 32^4 production trajectory (the
# median of trajectories 2-6; session 18 measured 13.74 s before these changes). ~520 s. From the repository root.
cd "$(dirname "$0")/../.." || exit 1
export PYTHONPATH=. PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
SUITE_T=${SUITE_T:-330} SUITE_TAIL=${SUITE_TAIL:-30} bash tools/device/gpu_suite.sh
timeout 90 python3 - <<'PY'
import time

import numpy as np

import force.gauge_action  # noqa: F401  (registers the one-GPU plaquette)
from hmc.momenta import random_momenta
from lattice import CounterRNG, GaugeField, Geometry, get_backend, plaquette, su3
from lattice.gauge import plaquette_array

geom = Geometry((32,) * 4, get_backend("cupy"))
u = GaugeField(geom, su3.expm_su3(0.3 * random_momenta(geom, CounterRNG(7))) @ GaugeField.unit(geom).links)


def timed(fn, n=5):
    fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)      # each returns host floats: the device has finished
    return float(np.median(ts)), out


(tk, k), (ta, a) = timed(lambda: plaquette(u)), timed(lambda: plaquette_array(u))
print(f"RESULT plaquette 32^4: kernel {tk * 1e3:.2f} ms, array twin {ta * 1e3:.2f} ms; "
      f"difference {max(abs(x - y) for x, y in zip(k, a)):.1e}", flush=True)
PY
TRAJ_T=${TRAJ_T:-200} TRAJ_N=${TRAJ_N:-6} bash tools/device/traj32.sh
