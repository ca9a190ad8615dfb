"""MILC's G_LOOP / GACTION lines (hmc.milc_loops) against MILC's sample outputs, field by field within MILC's errtol."""
import pytest

from force.gauge_action import SymanzikAction, WilsonAction
from hmc.milc.compare import compare_lines
from hmc.milc_loops import g_loop_lines
from lattice import CounterRNG, GaugeField, Geometry
from tests.conftest import fixture_path


def _loop_block(path, which=0):
    """The ``which``-th block of G_LOOP lines and its GACTION line of a MILC output or errtol file."""
    blocks, cur = [], []
    for line in open(path, encoding="utf-8"):
        if line.startswith("G_LOOP:"):
            cur.append(line.rstrip("\n"))
        elif line.startswith("GACTION:"):
            blocks.append(cur + [line.rstrip("\n")])
            cur = []
    return blocks[which]


def test_format_and_loop_table():
    geom = Geometry((4, 4, 4, 4))
    one = GaugeField.unit(geom)
    lines = g_loop_lines(one, SymanzikAction(6.5, 0.862, 3, "asqtad"))
    assert len(lines) == 6 + 12 + 16 + 1
    assert lines[0] == "G_LOOP:  0  0  4   \t3.0000000000000000e+00\t( 0 1 7 6  )"
    assert lines[6].startswith("G_LOOP:  1  0  6   \t") and lines[6].endswith("( 0 0 1 7 7 6  )")
    assert lines[-2].endswith("( 1 5 4 6 2 3  )")
    assert lines[-1] == "GACTION: 0.000000e+00"
    assert g_loop_lines(one, WilsonAction(6.0), precision=1)[0] == "G_LOOP:  0  0  4   \t3.000000e+00\t( 0 1 7 6  )"
    with pytest.raises(ValueError, match="precision"):
        g_loop_lines(one, WilsonAction(6.0), precision=3)


def test_gaction_is_the_gauge_action():
    geom = Geometry((4, 4, 4, 4))
    u = GaugeField.random(geom, CounterRNG(5))
    act = SymanzikAction(7.4, 0.89, 3, "hisq")
    gaction = float(g_loop_lines(u, act)[-1].split()[1])
    assert gaction == pytest.approx(3 * act.action(u) / (act.beta * geom.volume), rel=1e-6)


def test_milc_su3_rhmc_hisq_2_g_loops(twin_su3_rhmc_hisq):
    """After su3_rhmc_hisq.2's trajectory (reproduced by runs/milc_su3_rhmc_hisq.toml, run in the background:
    tests/hmc/conftest.py; test_rhmc.py checks the same run's trajectory): MILC's 34 G_LOOP lines and GACTION
    within su3_rhmc_hisq.2.errtol."""
    from hmc import runfile

    state = runfile.load(twin_su3_rhmc_hisq.path)
    geom = Geometry((6, 6, 6, 6))
    u = GaugeField.from_site_major(geom, state.links)
    got = g_loop_lines(u, SymanzikAction(7.4, 0.89, 3, "hisq"))
    want = _loop_block(fixture_path("ks_imp_rhmc/su3_rhmc_hisq.2.sample-out"))
    tol = _loop_block(fixture_path("ks_imp_rhmc/su3_rhmc_hisq.2.errtol"))
    c = compare_lines(got, want, tol)
    print(f"G_LOOP/GACTION worst |difference|/errtol: {c.worst:.2e}")
    # measured: the loops agree to ~1e-15 (PLAQ is reproduced to 1e-14)
    assert c.ok and c.lines == 35 and c.worst < 1e-3
