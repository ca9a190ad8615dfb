"""``hmc bench mg`` (bench/mg.py: issue 7's benchmark, run on the GPU by the suite ``mg`` of bench/suites.toml)
end to end on a 4^4 lattice with NumPy: the field, the links, mixed-precision CG and multigrid, the JSON and
Markdown it writes; and the hierarchy it picks per lattice size (an exact LU only on a 2^4 or 3^4 coarsest lattice)."""
import json

import pytest


@pytest.fixture(scope="module")
def bench():
    from bench import mg

    return mg


@pytest.mark.parametrize("L,blocks", [(8, [(4, 4, 4, 4)]), (16, [(4, 4, 4, 4), (2, 2, 2, 2)]),
                                      (24, [(4, 4, 4, 4), (2, 2, 2, 2)]),
                                      (32, [(4, 4, 4, 4), (2, 2, 2, 2), (2, 2, 2, 2)])])
def test_hierarchy_per_lattice(bench, monkeypatch, L, blocks):
    for var in ("MG_BLOCKS", "MG_LEVELS", "MG_NV", "MG_SETUP_ITERS", "MG_SMOOTHER_STEPS", "MG_COARSEST"):
        monkeypatch.delenv(var, raising=False)
    hp = bench.hierarchy_params(bench.parse(["--lattice", str(L)]), (L,) * 4)
    assert hp["blocks"] == blocks and hp["levels"] == len(blocks) + 2
    assert hp["nv"] == [48] and hp["setup_iters"] == [50] and hp["smoother_steps"] == [0, 4]
    hp = bench.hierarchy_params(bench.parse(["--mg-blocks", "4,4,4,4 4,4,4,4", "--mg-nv", "24 16"]), (32,) * 4)
    assert hp["blocks"] == [(4, 4, 4, 4), (4, 4, 4, 4)] and hp["levels"] == 4 and hp["nv"] == [24, 16]


def test_end_to_end_4x4(bench, tmp_path):
    rc = bench.main(["--lattice", "4", "--backend", "numpy", "--therm", "3", "--mg-nv", "4", "--mg-setup-iters", "5",
                     "--out", str(tmp_path)])
    assert rc == 0
    r = json.loads((tmp_path / "mg_bench_L4.json").read_text())
    assert r["status"] == "complete" and r["backend"] == "numpy" and r["lattice"] == [4, 4, 4, 4]
    assert set(r["phases_s"]) >= {"gauge", "hisq_links", "cg", "mg_setup", "mg_solve_0"}
    assert r["gauge"]["trajectories"] == 3 and not r["gauge"]["thermalized_in_plaquette"]
    assert r["cg"]["true_residual"] <= 1e-10 and r["mg"]["solve"]["true_residual"] <= 1e-10
    assert r["mg"]["solve"]["fine_applies"] > r["mg"]["solve"]["outer_iters"] > 0
    assert r["mg"]["setup_fine_applies"] == 4 * (2 * 5 + 3) + 2 * 4          # relaxation + Galerkin probes
    assert r["mg"]["params"]["precision"] == "double"                           # --mg-precision's default
    c = r["comparison"]
    assert c["applications_ratio"] == pytest.approx(r["cg"]["fine_applies"] / r["mg"]["solve"]["fine_applies"])
    assert c["rel_diff_mg_cg"] < 1e-6
    md = (tmp_path / "mg_bench_L4.md").read_text()
    assert "| fine-operator applications per solve (M-equivalent) |" in md and "NOT thermalized" in md
