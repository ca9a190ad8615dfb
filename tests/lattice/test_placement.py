"""The execution policy (lattice.placement): where a geometry's lattice lives, and which registered implementation
serves each kernel there, decided on the CPU with stand-in geometries (nothing is launched)."""
from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import pytest

from comms.config import RunConfig
from lattice import placement as pl
from lattice.backend import Backend
from lattice.placement import Placement


class _Geom(NS):
    __eq__ = object.__eq__          # by identity, so that the cases can key dicts
    __hash__ = object.__hash__


def fake_geom(gpu=True, ranks=1, parts=(False,) * 4, local=(4, 4, 4, 4), config=None):
    """A stand-in geometry: what the policy reads (backend, grid's partition and communicator, local extents,
    configuration)."""
    backend = Backend("cupy", NS()) if gpu else Backend("numpy", np)
    grid = NS(partitioned=tuple(parts), comm=NS(size=ranks))
    return _Geom(backend=backend, grid=grid, local_dims=tuple(local), config=config or RunConfig())


WHOLE = fake_geom()
SUBGRID = fake_geom(ranks=2)
DIST = fake_geom(ranks=2, parts=(False, False, False, True))
THIN = fake_geom(ranks=2, parts=(True, False, False, False), local=(1, 4, 4, 4))
CPU = fake_geom(gpu=False, ranks=2, parts=(False, False, False, True))


def test_placement_of_each_case():
    assert [pl.placement_of(g) for g in (CPU, WHOLE, SUBGRID, DIST, THIN)] == [
        Placement.ARRAY, Placement.WHOLE, Placement.DISTRIBUTED, Placement.DISTRIBUTED, Placement.DISTRIBUTED]
    forced = fake_geom(parts=(False, False, True, True))          # one rank, partitioned by force
    assert pl.placement_of(forced) is Placement.DISTRIBUTED


def test_a_one_rank_sub_grid_is_distributed_and_holds_the_whole_lattice():
    """The one rule: WHOLE only for a one-rank run with nothing partitioned; a one-rank sub-grid of a split grid is
    DISTRIBUTED (its rank is part of a distributed run), and its local array is still the whole lattice."""
    assert [p.value for p in Placement] == ["array", "whole", "distributed", "padded"]
    assert pl.holds_whole_lattice(SUBGRID) and pl.holds_whole_lattice(WHOLE)
    assert not pl.holds_whole_lattice(DIST) and not pl.holds_whole_lattice(THIN)


def test_real_geometry_carries_its_placement():
    """A real grid and geometry: what the policy reads exists there (a GPU backend stood in by name only)."""
    from comms import ProcessGrid
    from lattice import Geometry, get_backend

    assert Geometry((4, 4, 4, 4), get_backend("numpy")).placement is Placement.ARRAY
    gpu = Backend("cupy", np)
    assert Geometry((4, 4, 4, 4), gpu, ProcessGrid((1, 1, 1, 1), partitioned=(False,) * 4)).placement \
        is Placement.WHOLE
    grid = ProcessGrid((1, 1, 1, 1), partitioned="t")
    try:
        assert Geometry((4, 4, 4, 4), gpu, grid).placement is Placement.DISTRIBUTED
    finally:
        grid.close()


def test_padding_rule():
    assert pl.pads_on_gpu(DIST, 3) and not pl.pads_on_gpu(DIST, 5)
    assert pl.pads_on_gpu(THIN, 1) and not pl.pads_on_gpu(THIN, 2)
    assert not pl.pads_on_gpu(WHOLE, 1) and not pl.pads_on_gpu(SUBGRID, 1) and not pl.pads_on_gpu(CPU, 1)


def _chosen(name, geom, config=None, **ctx):
    return pl.choose(name, geom, config, **ctx).fn.__name__


def test_gauge_action_kernels():
    """The single-rank kernel only for one rank with nothing partitioned; padded kernels by the loops' excursion
    (2 for Symanzik, 1 for the plaquette); the array twins elsewhere."""
    from force.gauge_action import SymanzikAction, WilsonAction

    sym, wil = SymanzikAction(7.4, 0.89, 3, "hisq"), WilsonAction(6.0)
    assert (sym.halo_depth, wil.halo_depth) == (2, 1)
    want = {WHOLE: "_force_whole", SUBGRID: "_force_array", DIST: "_force_padded", CPU: "_force_array"}
    for geom, fn in want.items():
        assert _chosen("gauge.force", geom, action=sym) == fn
        assert _chosen("gauge.deficit", geom, action=sym) == fn.replace("force", "deficit")
    assert _chosen("gauge.force", THIN, action=sym) == "_force_array"
    assert _chosen("gauge.force", THIN, action=wil) == "_force_padded"


def test_hisq_smearing_kernels():
    from force import hisq_force, smearing as sm, smearing_derivative  # noqa: F401  (register the array twins)

    three = sm.PathCoefficients(one_link=1.0, three_staple=0.5)
    cases = [("hisq.fat_link", dict(c=sm.FAT7), {WHOLE: "_fat_link_staged", SUBGRID: "_fat_link_staged",
                                                 DIST: "_fat_link_padded", THIN: "_fat_link_padded",
                                                 CPU: "_fat_link_array"}),
             ("hisq.fat_link", dict(c=sm.HISQ_LEVEL2), {DIST: "_fat_link_padded", THIN: "_fat_link_array"}),
             ("hisq.fat_link", dict(c=three), dict.fromkeys((WHOLE, SUBGRID, DIST, CPU), "_fat_link_array")),
             ("hisq.naik_link", {}, {WHOLE: "_naik_link_unpadded", SUBGRID: "_naik_link_unpadded",
                                     DIST: "_naik_link_padded", THIN: "_naik_link_array", CPU: "_naik_link_array"}),
             ("hisq.smear", dict(c=sm.HISQ_LEVEL2), {WHOLE: "_smear_apart", DIST: "_smear_padded",
                                                     THIN: "_smear_apart", CPU: "_smear_apart"}),
             ("hisq.fat_link_vjp", dict(c=sm.FAT7), {WHOLE: "_fat_link_vjp_staged", DIST: "_fat_link_vjp_padded",
                                                     THIN: "_fat_link_vjp_array", CPU: "_fat_link_vjp_array"}),
             ("hisq.naik_link_vjp", {}, {SUBGRID: "_naik_link_vjp_unpadded", DIST: "_naik_link_vjp_padded",
                                         CPU: "_naik_link_vjp_array"}),
             ("hisq.outer_products", dict(coeffs=np.ones(2)), {WHOLE: "_outer_products", DIST: "_outer_products",
                                                               THIN: "_add_outer_products_array",
                                                               CPU: "_add_outer_products_array"}),
             ("hisq.outer_products", dict(coeffs=np.ones(2) * 1j), {WHOLE: "_add_outer_products_array"})]
    for name, ctx, want in cases:
        got = {geom: _chosen(name, geom, **ctx) for geom in want}
        assert got == want, name


def test_hisq_switch_from_the_configuration_and_the_override():
    from force import hisq_cuda, smearing as sm

    off = fake_geom(config=RunConfig(hisq_kernels=False))
    assert _chosen("hisq.fat_link", off, c=sm.FAT7) == "_fat_link_array"
    old = hisq_cuda.set_enabled(False)
    try:
        assert _chosen("hisq.fat_link", WHOLE, c=sm.FAT7) == "_fat_link_array"
        assert _chosen("hisq.u3_unitarize", Placement.WHOLE) == "_u3_unitarize_array"
    finally:
        hisq_cuda.set_enabled(old)
    assert hisq_cuda.set_enabled(True) is None
    try:
        assert _chosen("hisq.fat_link", off, c=sm.FAT7) == "_fat_link_staged"
    finally:
        hisq_cuda.set_enabled(None)


def test_site_local_kernels_follow_the_array():
    import force.hisq_force  # noqa: F401  (registers hisq.ta_product)
    import force.unitarize_derivative  # noqa: F401

    assert pl.local_placement(np.zeros((2, 3, 3))) is Placement.ARRAY
    for name, gpu in (("hisq.u3_unitarize", "_u3_unitarize_gpu"), ("hisq.u3_unitarize_vjp", "_u3_unitarize_vjp_gpu"),
                      ("hisq.ta_product", "_momentum_derivative")):
        assert _chosen(name, pl.local_placement(np.zeros((2, 3, 3)))).endswith("_array")
        assert _chosen(name, Placement.WHOLE, RunConfig()) == gpu
        assert _chosen(name, Placement.WHOLE, RunConfig(hisq_kernels=False)).endswith("_array")


def test_without_skips_a_placement():
    from force import smearing as sm

    with pl.without(Placement.PADDED):
        assert _chosen("hisq.fat_link", DIST, c=sm.FAT7) == "_fat_link_array"
    assert _chosen("hisq.fat_link", DIST, c=sm.FAT7) == "_fat_link_padded"
    with pytest.raises(ValueError, match="array implementation cannot be excluded"):
        with pl.without(Placement.ARRAY):
            pass


def test_registry_refuses_bad_registrations(monkeypatch):
    monkeypatch.setattr(pl, "_REGISTRY", dict(pl._REGISTRY))      # the test's registrations go with it
    with pytest.raises(ValueError, match="already has an implementation on array"):
        pl.implements("hisq.fat_link", Placement.ARRAY)(lambda: None)
    with pytest.raises(ValueError, match="PADDED implementation, and only one, takes depth="):
        pl.implements("test.x", Placement.PADDED)(lambda: None)
    with pytest.raises(ValueError, match="name at least one Placement"):
        pl.implements("test.x")
    with pytest.raises(KeyError, match="no kernel named 'test.nothing'"):
        pl.lookup("test.nothing", WHOLE)
    pl.implements("test.gpu_only", Placement.WHOLE)(lambda: None)
    with pytest.raises(KeyError, match="has no array implementation"):
        pl.lookup("test.gpu_only", CPU)


def test_staggered_hop_kernels():
    """The whole-lattice kernel for one rank with nothing partitioned (even local x), the distributed hop on a
    partitioned grid or a one-rank sub-grid of a split grid (even local extents, partitioned ones >= the face
    depth), else the array body."""
    import solvers  # noqa: F401  (registers the hop kernels)

    naik, plain = NS(naik=True), NS(naik=False)
    odd_x = fake_geom(local=(3, 4, 4, 4))
    shallow = fake_geom(ranks=2, parts=(False, False, False, True), local=(4, 4, 4, 2))
    want = [(WHOLE, naik, "whole_lattice_hop"), (odd_x, naik, "_array_hop"), (SUBGRID, naik, "make_hop"),
            (DIST, naik, "make_hop"), (shallow, naik, "_array_hop"), (shallow, plain, "make_hop"),
            (CPU, naik, "_array_hop")]
    assert [_chosen("staggered.hop", g, dslash=d) for g, d, _ in want] == [fn for _, _, fn in want]


def test_fused_solver_blas():
    """The fused solver kernels on every GPU placement with an even local x and a C-contiguous source (or none);
    else the NumPy path."""
    import solvers  # noqa: F401  (registers the fused kernels)

    strided, contiguous = np.zeros((4, 4, 4, 8, 3))[..., ::2, :], np.zeros((4, 4, 4, 4, 3))
    odd_x = fake_geom(local=(3, 4, 4, 4))
    want = [(WHOLE, None, "fused_cuda_blas"), (SUBGRID, contiguous, "fused_cuda_blas"), (DIST, None, "fused_cuda_blas"),
            (WHOLE, strided, "_numpy_path"), (odd_x, None, "_numpy_path"), (CPU, contiguous, "_numpy_path")]
    assert [_chosen("solvers.fused_blas", g, source=s) for g, s, _ in want] == [fn for _, _, fn in want]


def test_priority_orders_implementations_on_one_placement(monkeypatch):
    """Two implementations on one placement: the higher priority first where its switches (all of a tuple) are
    on, the other where they are not; equal priorities are refused."""
    monkeypatch.setattr(pl, "_REGISTRY", dict(pl._REGISTRY))
    pl.implements("test.ranked", Placement.ARRAY)(lambda: None)
    pl.implements("test.ranked", Placement.WHOLE)(lambda: None)
    pl.implements("test.ranked", Placement.WHOLE, switch=("hisq_staged", "hisq_kernels"), priority=1)(
        lambda: "new")
    assert pl.choose("test.ranked", Placement.WHOLE, RunConfig(hisq_staged=True)).priority == 1
    assert pl.choose("test.ranked", Placement.WHOLE, RunConfig(hisq_staged=False)).priority == 0
    assert pl.choose("test.ranked", Placement.WHOLE, RunConfig(hisq_staged=True, hisq_kernels=False)).priority == 0
    with pytest.raises(ValueError, match="already has an implementation on whole"):
        pl.implements("test.ranked", Placement.WHOLE, priority=1)(lambda: None)
