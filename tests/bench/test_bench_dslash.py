"""hmc bench dslash in every precision it offers: the bytes a site it divides by follow the operator's link form
(half: every link in 16 bits, half-naik: the Naik links), and the mixed CG beside it still reaches 1e-10."""
import types

import pytest


# the NumPy hop keeps its Naik links whole (the GPU table compresses them: 1432 B a site in single, 2864 in double)
@pytest.mark.parametrize("precision,half,site_bytes", [("single", "off", 1560), ("half-naik", "naik", 1304),
                                                       ("half", "all", 1048), ("double", "off", 3120)])
def test_bytes_and_link_form_follow_the_precision(monkeypatch, capsys, precision, half, site_bytes):
    from bench import dslash

    monkeypatch.setattr(dslash, "copy_bandwidth", lambda backend: 1e10)      # no 1 GiB copy in a unit test
    args = types.SimpleNamespace(backend="numpy", lattice=[4, 4, 4, 4], precision=precision, repeat=1, json=False,
                                 local=None, grid=None, transports=None)
    monkeypatch.setattr(dslash, "_dist_wanted", lambda a: False)
    out = dslash.bench_dslash(args)
    assert out["half_links"] == half
    assert out["bytes_per_site"] == site_bytes
    assert out["cg_mixed_true_residual"] <= 1e-10 and out["cg_double_true_residual"] <= 1e-10
    printed = capsys.readouterr().out
    assert (f"{half} links in 16 bits" in printed) is (half != "off")
