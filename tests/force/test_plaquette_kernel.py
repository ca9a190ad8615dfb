"""MILC's plaquette on one GPU (force.gauge_action.plaquette_whole: the action-density kernel over the spatial and
the temporal planes, compiled for the host here: tests/force/cuda_host.py) equals the array twin
lattice.gauge.plaquette_array to rounding, and lattice.plaquette dispatches to it on a one-GPU geometry."""
import numpy as np
import pytest

from force import gauge_action
from lattice import CounterRNG, GaugeField, Geometry, get_backend, plaquette, su3
from lattice.backend import Backend
from lattice.gauge import plaquette_array
from lattice.placement import lookup
from tests.force.cuda_host import FakeCuPy, needs_gxx

DIMS = (4, 6, 4, 8)


def fields():
    cpu = Geometry(DIMS, get_backend("numpy"))
    hot = GaugeField.random(cpu, CounterRNG(4)).links
    rng = CounterRNG(5)
    w = rng.gaussian("s", cpu.site_ids(), 32).reshape(cpu.shape + (4, 8))
    smooth = su3.expm_su3(np.moveaxis(su3.algebra_from_coefficients(0.3 * w), -3, 0))
    return cpu, {"hot": hot, "smooth": np.ascontiguousarray(smooth), "unit": GaugeField.unit(cpu).links}


@needs_gxx
def test_kernel_equals_the_twin():
    cpu, links = fields()
    host = Geometry(DIMS, Backend("cupy", FakeCuPy()))
    assert lookup("gauge.plaquette", host) is gauge_action.plaquette_whole
    for name, u in links.items():
        ref = plaquette_array(GaugeField(cpu, u))
        got = plaquette(GaugeField(host, np.ascontiguousarray(u)))
        assert got == pytest.approx(ref, rel=0, abs=4e-15), name
        assert -1.5 <= min(got) and max(got) <= 3.0
    assert plaquette(GaugeField(host, links["unit"])) == (3.0, 3.0)


@pytest.mark.gpu
def test_gpu_kernel_equals_the_twin():
    """The same on the device (CuPy): lattice.plaquette on a one-GPU geometry is the kernel's, to rounding."""
    cpu, links = fields()
    gpu = Geometry(DIMS, get_backend("cupy"))
    assert lookup("gauge.plaquette", gpu) is gauge_action.plaquette_whole
    for name, u in links.items():
        got = plaquette(GaugeField(gpu, gpu.backend.asarray(u)))
        assert got == pytest.approx(plaquette_array(GaugeField(cpu, u)), rel=0, abs=4e-15), name


def test_numpy_takes_the_twin():
    cpu, links = fields()
    assert lookup("gauge.plaquette", cpu) is plaquette_array
    assert plaquette(GaugeField(cpu, links["hot"])) == plaquette_array(GaugeField(cpu, links["hot"]))
