"""The staple-sharing gauge-force kernels (force/kernels/gauge_force.cu: gauge_force_staples + gauge_force_symanzik,
gauge_force_plaquette; driver force.gauge_force_cuda.StapleForceKernel) compiled for the host (tests/force/cuda_host.py)
equal the NumPy twin GaugeAction.force_reference to 1e-13 on random SU(3) links: the production Symanzik action
(runs/hisq211_16.toml: beta 5.8, u0 0.85535, nf 4, HISQ quark loops) and Wilson, whole lattice and halo-padded, each
loop shape alone; and force_kernel gives every other action the path-table kernel."""
from __future__ import annotations

import numpy as np
import pytest

from tests.force.cuda_host import FakeCuPy, forced_partition, needs_gxx, rel, smooth_links

TOL = 1e-13
DIMS = [(4, 4, 4, 4), (4, 4, 4, 6)]


def production():
    from force.gauge_action import SymanzikAction

    return SymanzikAction(5.8, 0.85535, 4, "hisq")


def actions():
    from force.gauge_action import WilsonAction

    return {"wilson": WilsonAction(6.0), "symanzik": production()}


def host_backend():
    from lattice.backend import Backend

    return Backend("cupy", FakeCuPy())


def random_su3(geom, seed=11):
    """Haar-like random SU(3) links (far from the unit field, unlike smooth_links): NumPy."""
    from lattice import CounterRNG, GaugeField

    return np.ascontiguousarray(GaugeField.random(geom, CounterRNG(seed)).links)


def test_production_coefficients_have_every_shape():
    """The production action has rectangles and parallelograms (c_pg != 0 for u0 != 1): the shared kernel serves
    all three shapes, with the padding its staples need."""
    from force.gauge_force_cuda import halo_depth, staple_coefficients

    c = staple_coefficients(production().shapes)
    assert c[0] == 1.0 and c[1] < 0 and c[2] != 0.0
    assert halo_depth(production().shapes) == 2 and halo_depth(actions()["wilson"].shapes) == 1


@needs_gxx
@pytest.mark.parametrize("dims", DIMS, ids=lambda d: "x".join(map(str, d)))
@pytest.mark.parametrize("name", ["wilson", "symanzik"])
def test_whole_lattice_kernels_equal_the_twin(name, dims):
    """Both force kernels (staple-sharing and path table) against the twin on the whole periodic lattice."""
    from force.gauge_force_cuda import GaugeForceKernel, StapleForceKernel
    from lattice import GaugeField, Geometry, get_backend

    act = actions()[name]
    cpu = Geometry(dims, get_backend("numpy"))
    links = random_su3(cpu)
    ref = act.force_reference(GaugeField(cpu, links))
    be = host_backend()
    assert rel(StapleForceKernel(be, act.shapes)(links, act.beta, dims), ref) <= TOL
    assert rel(GaugeForceKernel(be, act.shapes)(links, act.beta, dims), ref) <= TOL


@needs_gxx
def test_site_order_does_not_change_the_sums():
    """The kernels' thread order (tiled_site: tiles of (nx, ty, tz, tt), 32 sites x their staples or directions)
    covers every site once and leaves each sum as it was: every tile, lexicographic (1, 1, 1) included, gives the
    same bits; site_tiles reduces a tile to what divides the region."""
    from force.gauge_force_cuda import StapleForceKernel, site_tiles

    dims = (4, 6, 4, 8)
    cpu_links = random_su3(numpy_geometry(dims), 7)
    kernel = StapleForceKernel(host_backend(), production().shapes)
    forces = []
    for tile in [(1, 1, 1), (2, 2, 4), (6, 4, 8), (8, 8, 8)]:
        kernel.tile = tile
        forces.append(kernel(cpu_links, 5.8, dims))
    assert all(np.array_equal(f, forces[0]) for f in forces[1:])
    assert tuple(int(v) for v in site_tiles((4, 6, 34, 8), (8, 8, 8))) == (2, 2, 8)


def numpy_geometry(dims):
    from lattice import Geometry, get_backend

    return Geometry(dims, get_backend("numpy"))


@needs_gxx
@pytest.mark.parametrize("partition", ["t", "xyzt"])
@pytest.mark.parametrize("name", ["wilson", "symanzik"])
def test_padded_kernels_equal_the_twin(monkeypatch, name, partition):
    """Through GaugeAction.force on a forced partition: the links padded by halo_depth, the staples built on the
    interior and one layer around it on the padded dimensions; the path-table kernel on the same padded links."""
    from force.gauge_force_cuda import GaugeForceKernel, StapleForceKernel
    from lattice import GaugeField, Geometry, get_backend

    act = actions()[name]
    with forced_partition(monkeypatch, partition) as grid:
        cpu = Geometry((4, 4, 4, 6), get_backend("numpy"), grid)
        host = Geometry((4, 4, 4, 6), host_backend(), grid)
        links = random_su3(cpu, 5)
        got = act.force(GaugeField(host, links))
        padded, dims, box, offset = act._padded_links(GaugeField(host, links))
        walked = GaugeForceKernel(host.backend, act.shapes)(padded, act.beta, dims, box, offset)
        ref = act.force_reference(GaugeField(cpu, links))
    assert isinstance(act._kernels["force"], StapleForceKernel)
    assert rel(got, ref) <= TOL and rel(walked, ref) <= TOL


@needs_gxx
@pytest.mark.parametrize("shape", ["rectangle", "parallelogram"])
def test_each_shape_alone(shape):
    """One shape at a time (a loop table in another order), so a wrong term cannot hide behind the others."""
    from force import loops
    from force.gauge_action import GaugeAction
    from force.gauge_force_cuda import StapleForceKernel, staple_coefficients
    from lattice import GaugeField, Geometry, get_backend

    act = GaugeAction(5.0, {shape: (-0.7, loops.generate(loops.SHAPES[shape])[::-1])})
    assert staple_coefficients(act.shapes) == tuple(-0.7 if k == shape else 0.0
                                                    for k in ("plaquette", "rectangle", "parallelogram"))
    dims = (4, 4, 4, 6)
    cpu = Geometry(dims, get_backend("numpy"))
    links = smooth_links(cpu)
    got = StapleForceKernel(host_backend(), act.shapes)(links, act.beta, dims)
    assert rel(got, act.force_reference(GaugeField(cpu, links))) <= TOL


def other_shapes():
    """Actions outside MILC's loop family: a partial table, a doubled loop, a shape of another name."""
    from force import loops

    t = loops.loop_table()
    return [{"rectangle": (1.0, t["rectangle"][:6])},
            {"plaquette": (1.0, t["plaquette"] + t["plaquette"][:1])},
            {"plaquette": (1.0, t["plaquette"]), "chair": (0.1, t["parallelogram"])}]


def test_only_full_loop_tables_get_the_staple_kernel():
    """staple_coefficients: None outside the family, and the staple kernel refuses such an action; plaquettes with
    parallelograms walk one step out, but their staples one layer around the interior need a padding of 2."""
    from force import loops
    from force.gauge_force_cuda import StapleForceKernel, halo_depth, staple_coefficients

    for shapes in other_shapes():
        assert staple_coefficients(shapes) is None
        with pytest.raises(ValueError, match="force_kernel"):
            StapleForceKernel(host_backend(), shapes)
    t = loops.loop_table()
    assert halo_depth({"plaquette": (1.0, t["plaquette"]), "parallelogram": (0.1, t["parallelogram"])}) == 2


@needs_gxx
def test_force_kernel_dispatch():
    """GaugeAction.force compiles the staple kernel for Wilson and Symanzik, the path-table kernel otherwise."""
    from force.gauge_force_cuda import GaugeForceKernel, StapleForceKernel, force_kernel

    be = host_backend()
    assert all(isinstance(force_kernel(be, s), GaugeForceKernel) for s in other_shapes())
    assert all(isinstance(a._cuda_kernel(be, "force"), StapleForceKernel) for a in actions().values())


def test_staple_region_needs_a_padding_of_two():
    from force.gauge_force_cuda import _box_args, _staple_region

    ext, org = _staple_region(_box_args((4, 4, 2, 4), (4, 4, 6, 8), (0, 0, 2, 2)))
    assert [int(v) for v in ext] == [4, 4, 4, 6] and [int(v) for v in org] == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="padding of 2"):
        _staple_region(_box_args((4, 4, 2, 4), (4, 4, 4, 4), (0, 0, 1, 0)))


def test_flop_counts():
    """force_flops_per_site (bench/rhmc_floors.py's gauge-force flops), by hand: the production action's staple
    kernels (24 staples x 2 products; per link 6 + 2 weighted sums, 12 + 6 x (4 + 1) products added, 2 + 6
    products, U Sigma and TA), Wilson's registers (6 staples x 2 products, 6 sums, U Sigma, TA) and the walk of 6
    rectangles (36 rotations a site of 5 products and one sum)."""
    from force import loops
    from force.gauge_force_cuda import force_flops_per_site, scratch_bytes_per_site

    link = 8 * 36 + 42 * 216 + 8 * 198 + 12 * 36 + 198 + 54
    assert force_flops_per_site(production().shapes) == 48 * 198 + 4 * link == 56016
    assert force_flops_per_site(actions()["wilson"].shapes) == 4 * (6 * (2 * 198 + 36) + 198 + 54)
    assert force_flops_per_site({"rectangle": (1.0, loops.generate(loops.RECTANGLE)[:6])}) == 36 * (5 * 198 + 36)
    assert scratch_bytes_per_site(production().shapes) == 2 * 24 * 144
    assert scratch_bytes_per_site(actions()["wilson"].shapes) == 0
