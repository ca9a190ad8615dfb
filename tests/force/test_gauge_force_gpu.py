"""The CUDA gauge-force kernel equals its NumPy twin (run on the device: pytest -m gpu)."""
import numpy as np
import pytest

from force.gauge_action import SymanzikAction, WilsonAction
from lattice import CounterRNG, GaugeField, Geometry, get_backend, su3
from tests.conftest import FIXTURES

pytestmark = pytest.mark.gpu


def smooth(geom, seed):
    rng = CounterRNG(seed)
    w = rng.gaussian("s", geom.site_ids(), 32).reshape(geom.shape + (4, 8))
    p = geom.xp.moveaxis(su3.algebra_from_coefficients(0.4 * w), -3, 0)
    return GaugeField(geom, geom.xp.ascontiguousarray(su3.expm_su3(p)))


@pytest.mark.parametrize("action", [WilsonAction(6.0), SymanzikAction(7.4, 0.89, 3, "hisq")], ids=["wilson", "symanzik"])
@pytest.mark.parametrize("dims", [(4, 4, 4, 4), (6, 4, 8, 10)])
def test_kernel_equals_numpy_twin(action, dims):
    cpu = Geometry(dims, get_backend("numpy"))
    gpu = Geometry(dims, get_backend("cupy"))
    ref = action.force(smooth(cpu, 4))
    ug = smooth(gpu, 4)
    got = gpu.backend.to_numpy(action.force(ug))
    assert np.abs(got - ref).max() <= 1e-13 * np.abs(ref).max()
    # and the CuPy run of the array-operation twin agrees too
    twin = gpu.backend.to_numpy(action.force_reference(ug))
    assert np.abs(twin - ref).max() <= 1e-13 * np.abs(ref).max()


@pytest.mark.parametrize("kernel", ["staples", "paths"])
@pytest.mark.parametrize("action", [WilsonAction(6.0), SymanzikAction(5.8, 0.85535, 4, "hisq")],
                         ids=["wilson", "symanzik_production"])
def test_both_force_kernels_equal_numpy_twin(action, kernel):
    """The staple-sharing kernels (what action.force runs for these actions) and the path-table kernel (every other
    action's), each called directly, on a lattice of uneven extents."""
    from force.gauge_force_cuda import GaugeForceKernel, StapleForceKernel

    dims = (6, 4, 8, 10)
    ref = action.force(smooth(Geometry(dims, get_backend("numpy")), 6))
    gpu = Geometry(dims, get_backend("cupy"))
    cls = StapleForceKernel if kernel == "staples" else GaugeForceKernel
    got = gpu.backend.to_numpy(cls(gpu.backend, action.shapes)(smooth(gpu, 6).links, action.beta, dims))
    assert np.abs(got - ref).max() <= 1e-13 * np.abs(ref).max()


def test_kernel_on_milc_lattice():
    path = FIXTURES / "lat.sample.l6666.hisq"
    if not path.exists():
        pytest.skip(f"MILC fixture {path} is absent")
    from lattice.io import read_gauge

    action = SymanzikAction(7.4, 0.89, 3, "hisq")
    uc, _ = read_gauge(str(path), backend="numpy", reunitarize=True)
    ug, _ = read_gauge(str(path), backend="cupy", reunitarize=True)
    ref = action.force(uc)
    got = ug.geom.backend.to_numpy(action.force(ug))
    assert np.abs(got - ref).max() <= 1e-13 * np.abs(ref).max()
    assert abs(action.action(uc) - action.action(ug)) <= 1e-12 * abs(action.action(uc))


@pytest.mark.parametrize("action", [WilsonAction(6.0), SymanzikAction(6.7, 0.89, 4, "hisq")], ids=["wilson", "symanzik"])
def test_action_kernel_equals_twin(action):
    cpu = Geometry((4, 6, 4, 8), get_backend("numpy"))
    gpu = Geometry((4, 6, 4, 8), get_backend("cupy"))
    ref = action.action(smooth(cpu, 2))
    ug = smooth(gpu, 2)
    assert abs(action.action(ug) - ref) <= 1e-13 * abs(ref)
    twin = float(action.weighted_deficit_reference(ug).sum()) * action.beta / 3.0
    assert abs(twin - ref) <= 1e-13 * abs(ref)


def test_loop_traces_on_the_gpu_equal_the_array_path():
    """MILC's G_LOOP averages: on the GPU each loop is the action-density kernel on that one loop (3 - <3 - ReTr W>),
    on the CPU the array path (<ReTr W>); equal to 1e-14, loop for loop, for the production Symanzik action."""
    action = SymanzikAction(5.8, 0.85535, 4, "hisq")
    dims = (6, 4, 8, 10)
    ref = action.loop_traces(smooth(Geometry(dims, get_backend("numpy")), 8))
    got = action.loop_traces(smooth(Geometry(dims, get_backend("cupy")), 8))
    assert list(got) == list(ref) and [len(v) for v in got.values()] == [len(v) for v in ref.values()]
    for k in ref:
        assert np.allclose(got[k], ref[k], rtol=0, atol=1e-14), k
        assert min(ref[k]) < 2.99                           # not the unit field
