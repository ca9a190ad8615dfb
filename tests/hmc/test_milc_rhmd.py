"""MILC's su3_rhmd_hisq build (RHMD: su3_rhmc_hisq.2's input without the Metropolis test): the TOML twin
runs/milc_su3_rhmd_hisq.toml ([run] metropolis = false) against MILC's su3_rhmd_hisq.2 and .1 outputs, every line
MILC's check selects from delta S on (CHECK: delta S, PLAQ, G_LOOP, GACTION, PBP, FACTION) within the errtol files."""
from tests.conftest import ROOT, fixture_path
from tests.hmc.milc_sample import compare, select_lines, single_precision_format


def test_milc_su3_rhmd_hisq(tmp_path):
    from hmc.run import init_run, run

    out = str(tmp_path / "t.h5")
    init_run(str(ROOT / "runs" / "milc_su3_rhmd_hisq.toml"), out, str(fixture_path("lat.sample.l6666.hisq")),
             log=lambda *a: None)
    lines = []
    run(out, show_progress=False, log=lines.append)
    lines = [l for l in lines if not l.startswith("traj ")]
    check = [l for l in lines if "delta S" in l]
    assert len(check) == 1 and check[0].startswith("CHECK: delta S = ")       # MILC's -1.521986e-05
    assert abs(float(check[0].split("=")[1]) + 1.521986e-05) < 1e-9
    for precision in (2, 1):
        got = select_lines(lines if precision == 2 else [single_precision_format(l) for l in lines], first="delta")
        want = select_lines(open(fixture_path(f"ks_imp_rhmc/su3_rhmd_hisq.{precision}.sample-out")), first="delta")
        tol = open(fixture_path(f"ks_imp_rhmc/su3_rhmd_hisq.{precision}.errtol")).read().splitlines()
        fields, worst = compare(got, want, tol)
        print(f"su3_rhmd_hisq.{precision}: {len(got)} lines, {fields} fields, worst |difference|/errtol {worst:.2e}")
        assert worst < 0.8
