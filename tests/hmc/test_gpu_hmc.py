"""A pure-gauge HMC trajectory on CuPy equals the NumPy one to rounding (run on the device: pytest -m gpu)."""
import numpy as np
import pytest

from force.gauge_action import SymanzikAction
from hmc.integrators import Level, build_schedule
from hmc.monomials import GaugeMonomial
from hmc.trajectory import hmc_trajectory
from lattice import CounterRNG, GaugeField, Geometry, get_backend

pytestmark = pytest.mark.gpu


def test_trajectory_cpu_equals_gpu():
    out = []
    for name in ("numpy", "cupy"):
        geom = Geometry((4, 4, 4, 8), get_backend(name))
        rng = CounterRNG(12)
        u = GaugeField.random(geom, rng)
        mon = [GaugeMonomial(SymanzikAction(7.4, 0.89, 3, "hisq"))]
        s = build_schedule([Level("omelyan", 10, ["gauge"])], 0.5)
        v, res = hmc_trajectory(u, rng, mon, s, metropolis=False)
        out.append((geom.backend.to_numpy(v.links), res.start.total, res.end.total))
    (lc, s0c, s1c), (lg, s0g, s1g) = out
    assert np.abs(lc - lg).max() < 1e-11
    assert abs(s0c - s0g) < 1e-9 and abs(s1c - s1g) < 1e-9
