"""``hmc milc`` and ``hmc init --milc`` on a small MILC deck (4^4 cold start, the project's rational functions):
MILC's lines in MILC's order, the run file (the MILC deck kept in it, resumed), RHMD's CHECK line."""
import re

import pytest

from hmc import runfile
from hmc.cli import main
from milc_folders import rationals_into

DECK = """prompt 0
nx 4
ny 4
nz 4
nt 4
iseed 1234
n_pseudo 4
load_rhmc_params rationals.su3_rhmc_hisq
beta 7.4
n_dyn_masses 2
dyn_mass .0018 .018
dyn_flavors 2 1
u0  0.890
warms 0
trajecs 2
traj_between_meas 1
microcanonical_time_step .02
steps_per_trajectory 2
""" + """cgresid_md_fa_gr .000005 1e-6 1e-6
max_multicg_md_fa_gr  2500  2500  2500
cgprec_md_fa_gr  2 2 2
""" * 4 + """prec_ff 2
number_of_pbp_masses 1
max_cg_prop 500
max_cg_prop_restarts 5
npbp_reps 1
prec_pbp 1
mass 0.018
naik_term_epsilon 0
error_for_propagator 1e-6
rel_error_for_propagator 0
fresh
forget
"""


@pytest.fixture
def deck(tmp_path):
    rationals_into(tmp_path)
    p = tmp_path / "small.in"
    p.write_text(DECK)
    return p


def numbers(line):
    return [float(x.rstrip(",")) for x in re.findall(r"[-+]?\d\.\d+e[-+]\d+,?", line)]


def test_milc_run_prints_milc_lines_and_resumes(deck, tmp_path, capsys):
    out = tmp_path / "run.h5"
    assert main(["init", "--milc", str(deck), "-o", str(out)]) == 0
    state = runfile.load(out)
    assert state.files["milc_deck"] == DECK and state.deck["milc"]["build"] == "su3_rhmc_hisq"
    assert state.deck["run"]["start"] == "cold" and state.trajectory == 0
    capsys.readouterr()
    assert main(["milc", str(deck), "-o", str(out), "--no-progress"]) == 0       # resumes the run file
    text = capsys.readouterr().out
    lines = text.splitlines()
    kinds = [m.group(1) for m in (re.match(r"(WARMUPS|PLAQUETTE ACTION|ACTION|DG|ACCEPT|REJECT|PLAQ|PBP|FACTION|"
                                           r"RUNNING)\b", s) for s in lines) if m]
    traj = ["PLAQUETTE ACTION", "ACTION", "DG"] * 2 + ["delta", "PLAQ", "PBP", "FACTION"]
    kinds = ["delta" if k in ("ACCEPT", "REJECT") else k for k in kinds]
    assert kinds == ["WARMUPS"] + traj * 2 + ["RUNNING"]
    acts = [numbers(s) for s in lines if s.startswith("ACTION: g,h,f")]
    dgs = [numbers(s) for s in lines if s.startswith("DG = ")]
    assert len(acts) == len(dgs) == 4
    assert dgs[0] == pytest.approx(acts[0], rel=1e-6)                      # from MILC's zeros at the start
    for k in (1, 2, 3):                                                    # then the change since the last call
        assert dgs[k][:3] == pytest.approx([a - b for a, b in zip(acts[k][:3], acts[k - 1][:3])], abs=2e-6,
                                           rel=1e-6)
    assert any(s.startswith(("ACCEPT: delta S", "REJECT: delta S")) for s in lines)
    assert "traj " not in text                                             # no project summary lines
    assert runfile.load(out).trajectory == 2
    assert main(["milc", str(deck), "-o", str(out), "--no-progress"]) == 0
    assert "all 2 trajectories of the deck are done" in capsys.readouterr().out
    deck.write_text(DECK.replace("iseed 1234", "iseed 1235"))
    assert main(["milc", str(deck), "-o", str(out)]) == 2
    assert "was not made from this MILC deck" in capsys.readouterr().err


def test_single_precision_formats(deck, tmp_path, capsys):
    """--precision 1: the formats of MILC's single-precision build (PLAQ %f, G_LOOP %e), double arithmetic."""
    deck.write_text(DECK.replace("trajecs 2", "trajecs 1"))
    assert main(["milc", str(deck), "--precision", "1", "-o", str(tmp_path / "p1.h5"), "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"PLAQ:\t\d\.\d{6}\t\d\.\d{6}", next(s for s in lines if s.startswith("PLAQ:")))
    assert re.match(r"G_LOOP:  0  0  4   \t\d\.\d{6}e[-+]\d\d\t", next(s for s in lines if s.startswith("G_LOOP:")))
    assert runfile.load(tmp_path / "p1.h5").deck["milc"]["precision"] == 1


def test_rhmd_build_has_no_metropolis_test(deck, tmp_path, capsys):
    out = tmp_path / "rhmd.h5"
    deck.write_text(DECK.replace("trajecs 2", "trajecs 1"))
    assert main(["milc", str(deck), "--build", "su3_rhmd_hisq", "-o", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^CHECK: delta S = \S+$", text, re.M) and "ACCEPT" not in text and "REJECT" not in text
    assert "no Metropolis test (RHMD)" in text
    assert runfile.load(out).history[0]["accepted"] == 1


def test_init_milc_rejects_lattice_options(deck, tmp_path, capsys):
    assert main(["init", "--milc", str(deck), "-o", str(tmp_path / "x.h5"), "--from-lattice", "lat"]) == 2
    assert "no --from-lattice" in capsys.readouterr().err
    bad = tmp_path / "bad.in"
    bad.write_text(DECK.replace("beta 7.4", "betta 7.4"))
    assert main(["milc", str(bad), "-o", str(tmp_path / "y.h5")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "line 9" in err and "'betta'" in err


def test_milc_deck_from_standard_input(deck, tmp_path, capsys, monkeypatch):
    """``hmc milc -``: the deck on standard input, its files relative to the working directory."""
    import io

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO(DECK.replace("trajecs 2", "trajecs 1")))
    assert main(["milc", "-", "-o", "stdin.h5", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert text.count("ACTION: g,h,f") == 2 and "RUNNING COMPLETED" in text
    state = runfile.load(tmp_path / "stdin.h5")
    assert state.files["milc_deck"].startswith("prompt 0")
    assert state.deck["run"]["name"] == "MILC su3_rhmc_hisq: <stdin>"
