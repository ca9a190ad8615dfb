"""MILC's asqtad builds su3_leapfrog (RHMD, INT_LEAPFROG with its action monitors) and su3_omelyan_rhmc (RHMC,
INT_OMELYAN): the TOML twins runs/milc_su3_leapfrog.toml and runs/milc_su3_omelyan_rhmc.toml against MILC's
double-precision sample outputs, every line MILC's check selects (PLAQUETTE ACTION, ACTION, DG, delta S, PLAQ,
G_LOOP, GACTION, PBP, FACTION), field by field within MILC's errtol files."""
import pytest

from hmc.integrators import Level, build_schedule, describe, force_evaluations, total_time
from tests.conftest import fixture_path
from hmc.milc.compare import compare_lines, drop_noise, milc_selection, read_checklist, select_lines


@pytest.mark.parametrize("case,twin", [("su3_leapfrog.2", "twin_su3_leapfrog"),
                                       ("su3_omelyan_rhmc.2", "twin_su3_omelyan_rhmc")])
def test_milc_asqtad_case(request, case, twin):
    # the twin deck runs/milc_su3_leapfrog.toml (or _omelyan_rhmc) from MILC's lattice, run in the background
    # (tests/hmc/conftest.py); the project's own one-line summaries dropped
    lines = [l for l in request.getfixturevalue(twin).lines if not l.startswith("traj ")]
    spec = next(c for c in read_checklist(fixture_path("ks_imp_rhmc")) if c.prefix == case)
    got = select_lines(drop_noise(lines), ("", spec.patterns[1]), spec.select)     # the twins print no WARMUPS
    want = milc_selection(open(fixture_path(f"ks_imp_rhmc/{case}.sample-out")).read().splitlines(), spec)
    tol = open(fixture_path(f"ks_imp_rhmc/{case}.errtol")).read().splitlines()
    c = compare_lines(got, want, tol)
    print(f"{case}: {c.lines} lines, {c.fields} fields, worst |difference|/errtol {c.worst:.2e}")
    assert c.ok, c.error or [f.describe() for f in c.failures[:5]]
    assert c.worst < 0.05


def test_milc_schedules():
    """MILC's update_rhmc.c: leapfrog U eps/2, P eps (gauge then fermion), U eps/2, R per step and the action
    measured after steps 4, 8, 12; Omelyan (lambda 0.8) U 0.4 eps, P eps, U 1.2 eps, P eps, U 0.4 eps, R."""
    lf = build_schedule([Level("milc_leapfrog", 12, ["gauge", "fermion"])], 0.12)
    assert [op for op in lf[:5]] == [("U", 0.005), ("P", ("gauge", "fermion"), 0.01), ("U", 0.005), ("R", 0.0),
                                     ("U", 0.005)]
    steps_before = [sum(op[0] == "P" for op in lf[:i]) for i, op in enumerate(lf) if op[0] == "A"]
    assert steps_before == [4, 8, 12] and lf[-1] == ("A", 0.0)
    assert force_evaluations(lf) == {"gauge": 12, "fermion": 12}
    assert total_time(lf) == pytest.approx(0.12) and total_time(lf, "fermion") == pytest.approx(0.12)
    om = build_schedule([Level("milc_omelyan", 12, ["gauge", "fermion"])], 0.12)
    cycle = om[:6]
    assert [op[0] for op in cycle] == ["U", "P", "U", "P", "U", "R"]
    assert [round(op[-1], 15) for op in cycle] == [0.004, 0.01, 0.012, 0.01, 0.004, 0.0]
    assert force_evaluations(om) == {"gauge": 12, "fermion": 12} and "A" not in {op[0] for op in om}
    assert "A  (measure the action)" in describe(lf)
    with pytest.raises(ValueError, match="even"):
        Level("milc_omelyan", 7)
    with pytest.raises(ValueError, match="single-time-scale"):
        build_schedule([Level("milc_leapfrog", 4, ["f"]), Level("leapfrog", 2, ["g"])], 1.0)
