"""The forms of the staged HISQ kernels (force/hisq_staged.py; run configuration hisq_staged_rows, hisq_links_split,
hisq_min_blocks): on the host build (tests/force/cuda_host.py) the rows form and the split last stage give the
default kernels' fat link, intermediates and chain rule to the bit (the same sums); the launch-bounds variants are
their own modules with their own kernel names, the bounds in the compiled text (checked without compiling: the
bounds are empty on the host; tests/force/test_hisq_staged_forms_gpu.py runs every form on the device)."""
import numpy as np
import pytest

from comms.config import ConfigError, RunConfig
from force import hisq_staged, hisq_staged_vjp, smearing as sm
from lattice import Geometry, cuda_source
from lattice.backend import Backend

from tests.force.cuda_host import FakeCuPy, needs_gxx
from tests.force.test_hisq_cuda_host import DIMS, fields

pytestmark = needs_gxx


def _geom(**config):
    return Geometry(DIMS, Backend("cupy", FakeCuPy()), config=RunConfig(**config))


def test_row_kernels_and_split_last_stage_equal_the_default():
    one, rows, split = _geom(), _geom(hisq_staged_rows=True), _geom(hisq_staged_rows=True, hisq_links_split=True)
    only_split = _geom(hisq_links_split=True)
    _, v, d = fields(one, 7)
    for c in (sm.HISQ_LEVEL2, sm.asqtad_coefficients(0.87)):
        assert all(np.array_equal(r, o) for r, o in zip(hisq_staged.forward(rows, v, c), hisq_staged.forward(one, v, c)))
        assert np.array_equal(hisq_staged.fat_link(rows, v, c), hisq_staged.fat_link(one, v, c))
        want = hisq_staged_vjp.fat_link_vjp(one, v, c, d)
        for g in (rows, split, only_split):
            assert np.array_equal(hisq_staged_vjp.fat_link_vjp(g, v, c, d), want)
    names = {k[3] for g in (rows, split) for k in g.backend.kernels if k[0] == "cuda_function"}
    assert {"staged_inner_rows", "svjp_links_rows", "svjp_links_h_rows"} <= names and "svjp_links" not in names


class _Launches(FakeCuPy):
    """The stand-in CuPy with a RawModule that records the text and the kernels launched, compiling nothing."""

    texts, launched = [], []

    class RawModule:
        def __init__(self, code, options=()):
            _Launches.texts.append(code)

        def get_function(self, name):
            return lambda grid, block, args: _Launches.launched.append(name)


def test_bounded_forms_launch_their_own_kernels():
    _Launches.texts.clear()
    _Launches.launched.clear()
    geom = Geometry(DIMS, Backend("cupy", _Launches()),
                    config=RunConfig(hisq_min_blocks=3, hisq_staged_rows=True, hisq_links_split=True))
    u = np.zeros((4,) + geom.shape + (3, 3), complex)
    hisq_staged_vjp.fat_link_vjp(geom, u, sm.HISQ_LEVEL2, u)
    assert _Launches.launched == ["staged_a_rows_b3", "staged_inner_rows_b3", "svjp_d_inner_rows_b3",
                                  "svjp_d_a_rows_b3", "svjp_links_g_rows_b3", "svjp_links_h_rows_b3"]
    assert all('void __launch_bounds__(128, 3) staged_a_rows_b3(' in t or 'void __launch_bounds__(128, 3) svjp_links_b3('
               in t for t in _Launches.texts) and len(_Launches.texts) == 2


def test_variant_text_and_setting():
    assert hisq_staged.variant(None) == hisq_staged.variant(RunConfig()) == {"BOUNDS": "", "SUF": ""}
    plain = cuda_source.source("force", "hisq_staged.cu", hisq_staged.variant(None))
    assert "${" not in plain and "void __launch_bounds__" not in plain and "void staged_inner(" in plain
    assert RunConfig.resolve(env={"HMC_HISQ_MIN_BLOCKS": "4"}).hisq_min_blocks == 4
    with pytest.raises(ConfigError):
        RunConfig.resolve(env={"HMC_HISQ_MIN_BLOCKS": "-1"})
