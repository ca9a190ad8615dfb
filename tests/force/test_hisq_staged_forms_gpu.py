"""The forms of the staged HISQ kernels on the device (run configuration hisq_staged_rows, hisq_links_split,
hisq_min_blocks; force/hisq_staged.py) give the default kernels' fat link and chain rule to 1e-14 relative: the
same sums (bitwise on the host build, tests/force/test_hisq_staged_forms_host.py); on the device the compiler's
fused multiply-adds may differ with the register budget."""
import pytest

from comms.config import RunConfig
from force import hisq_staged, hisq_staged_vjp, smearing as sm
from lattice import Geometry, get_backend

from tests.force.test_hisq_gpu import close, fields, noise

pytestmark = pytest.mark.gpu

DIMS = (4, 6, 4, 8)
FORMS = {"rows": dict(hisq_staged_rows=True), "split": dict(hisq_links_split=True),
         "rows_split_b4": dict(hisq_staged_rows=True, hisq_links_split=True, hisq_min_blocks=4),
         "bounds3": dict(hisq_min_blocks=3)}


@pytest.mark.parametrize("form", list(FORMS))
def test_staged_forms_on_device(form):
    cpu = Geometry(DIMS, get_backend("numpy"))
    plain = Geometry(DIMS, get_backend("cupy"), config=RunConfig())
    other = Geometry(DIMS, get_backend("cupy"), config=RunConfig(**FORMS[form]))
    links = fields(cpu)["complex"]
    u, d = plain.xp.asarray(links), plain.xp.asarray(noise(links.shape, 7))
    to_host = get_backend("cupy").to_numpy
    for c in (sm.HISQ_LEVEL2, sm.FAT7):
        close(hisq_staged.fat_link(other, u, c), to_host(hisq_staged.fat_link(plain, u, c)), 1e-14)
        close(hisq_staged_vjp.fat_link_vjp(other, u, c, d), to_host(hisq_staged_vjp.fat_link_vjp(plain, u, c, d)),
              1e-14)
