"""The launch-bounds variants of the staged HISQ kernels (run configuration hisq_min_blocks, force.hisq_staged.variant):
the drivers pick the variant's kernels (their own names, the bounds in the compiled text), and on the host build
(tests/force/cuda_host.py, where __launch_bounds__ is empty) they give the unbounded kernels' results to the bit."""
import numpy as np
import pytest

from comms.config import ConfigError, RunConfig
from force import hisq_staged, hisq_staged_vjp, smearing as sm
from lattice import Geometry, cuda_source
from lattice.backend import Backend

from tests.force.cuda_host import FakeCuPy, needs_gxx
from tests.force.test_hisq_cuda_host import DIMS, fields

pytestmark = needs_gxx


def test_variant_names_and_text():
    assert hisq_staged.variant(None) == hisq_staged.variant(RunConfig()) == {"BOUNDS": "", "SUF": ""}
    params = hisq_staged.variant(RunConfig(hisq_min_blocks=3))
    text = cuda_source.source("force", "hisq_staged_vjp.cu", params)
    assert 'extern "C" __global__ void __launch_bounds__(128, 3) svjp_links_b3(' in text
    plain = cuda_source.source("force", "hisq_staged.cu", hisq_staged.variant(None))
    assert "${" not in text and 'void __launch_bounds__' not in plain and 'void staged_inner(' in plain


def test_bounded_kernels_equal_the_unbounded_ones():
    plain = Geometry(DIMS, Backend("cupy", FakeCuPy()), config=RunConfig())
    bounded = Geometry(DIMS, Backend("cupy", FakeCuPy()), config=RunConfig(hisq_min_blocks=3))
    _, v, d = fields(plain, 5)
    want = hisq_staged.fat_link(plain, v, sm.HISQ_LEVEL2), hisq_staged_vjp.fat_link_vjp(plain, v, sm.HISQ_LEVEL2, d)
    got = hisq_staged.fat_link(bounded, v, sm.HISQ_LEVEL2), hisq_staged_vjp.fat_link_vjp(bounded, v, sm.HISQ_LEVEL2, d)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert ("cuda_function", "force", "hisq_staged_vjp.cu", "svjp_links_b3") in bounded.backend.kernels


@pytest.mark.parametrize("blocks", [0, 4])
def test_split_last_stage_equals_the_one_launch(blocks):
    """svjp_links_g then svjp_links_h (hisq_links_split) give svjp_links's sums to the bit."""
    one = Geometry(DIMS, Backend("cupy", FakeCuPy()), config=RunConfig(hisq_min_blocks=blocks))
    split = Geometry(DIMS, Backend("cupy", FakeCuPy()), config=RunConfig(hisq_min_blocks=blocks, hisq_links_split=True))
    _, v, d = fields(one, 6)
    for c in (sm.HISQ_LEVEL2, sm.FAT7):
        assert np.array_equal(hisq_staged_vjp.fat_link_vjp(split, v, c, d), hisq_staged_vjp.fat_link_vjp(one, v, c, d))
    suffix = hisq_staged.variant(split.config)["SUF"]
    assert ("cuda_function", "force", "hisq_staged_vjp.cu", "svjp_links_h" + suffix) in split.backend.kernels
    assert ("cuda_function", "force", "hisq_staged_vjp.cu", "svjp_links" + suffix) not in split.backend.kernels


@pytest.mark.parametrize("blocks", [0, 3])
def test_row_kernels_equal_the_matrix_ones(blocks):
    """The _rows kernels (three threads a matrix, hisq_staged_rows) give the one-thread kernels' fat link and chain
    rule to the bit, the intermediates included."""
    one = Geometry(DIMS, Backend("cupy", FakeCuPy()), config=RunConfig(hisq_min_blocks=blocks))
    rows = Geometry(DIMS, Backend("cupy", FakeCuPy()), config=RunConfig(hisq_min_blocks=blocks, hisq_staged_rows=True))
    _, v, d = fields(one, 7)
    for c in (sm.HISQ_LEVEL2, sm.asqtad_coefficients(0.87)):
        assert all(np.array_equal(r, o) for r, o in zip(hisq_staged.forward(rows, v, c), hisq_staged.forward(one, v, c)))
        assert np.array_equal(hisq_staged.fat_link(rows, v, c), hisq_staged.fat_link(one, v, c))
        assert np.array_equal(hisq_staged_vjp.fat_link_vjp(rows, v, c, d), hisq_staged_vjp.fat_link_vjp(one, v, c, d))
    split = Geometry(DIMS, Backend("cupy", FakeCuPy()),
                     config=RunConfig(hisq_min_blocks=blocks, hisq_staged_rows=True, hisq_links_split=True))
    assert np.array_equal(hisq_staged_vjp.fat_link_vjp(split, v, c, d), hisq_staged_vjp.fat_link_vjp(one, v, c, d))
    suffix = hisq_staged.variant(rows.config)["SUF"]
    assert ("cuda_function", "force", "hisq_staged.cu", "staged_inner_rows" + suffix) in rows.backend.kernels
    assert ("cuda_function", "force", "hisq_staged_vjp.cu", "svjp_links_rows" + suffix) in rows.backend.kernels
    assert ("cuda_function", "force", "hisq_staged_vjp.cu", "svjp_links_h_rows" + suffix) in split.backend.kernels


def test_setting_is_checked():
    assert RunConfig.resolve(env={"HMC_HISQ_MIN_BLOCKS": "4"}).hisq_min_blocks == 4
    with pytest.raises(ConfigError):
        RunConfig.resolve(env={"HMC_HISQ_MIN_BLOCKS": "-1"})
