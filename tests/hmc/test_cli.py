"""The command line as a user meets it: the README's example, measure on MILC's lattice, bad input."""
import json
import os
import re
import subprocess
import sys

import pytest

from hmc.cli import main
from tests.conftest import ROOT, fixture_path


def test_readme_example(tmp_path, cli_env):
    """README: hmc init -o example.h5 && hmc run example.h5 (the embedded quick deck), run as a user would in an
    empty folder: every trajectory printed, the acceptance after the warm-ups between 0.5 and 0.95, and the field
    thermalized away from unit links (plaquette ReTr/3 near 0.556, its 4^4 value at beta 5.7)."""
    from hmc.deck import default_deck_text, loads
    from hmc.runfile import load

    ntraj = loads(default_deck_text())["run"]["trajectories"]
    for cmd in (["init", "-o", "example.h5"], ["run", "example.h5", "--no-progress"]):
        r = subprocess.run([sys.executable, "-m", "hmc", *cmd], capture_output=True, text=True, cwd=tmp_path,
                           env=cli_env, timeout=300)
        assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "RUNNING COMPLETED" in text and text.count("delta S =") == ntraj
    acceptance = float(re.search(r"RUNNING COMPLETED: .*acceptance ([0-9.]+)", text).group(1))
    assert 0.5 <= acceptance <= 0.95, text
    last = load(tmp_path / "example.h5").history[-1]
    assert 0.45 < (last["plaq_ss"] + last["plaq_st"]) / 6 < 0.65, last


def test_measure_milc_gauge_action(capsys):
    """hmc measure on lat.sample.l6666.hisq with beta 7.4, u0 0.89, nf 3, HISQ loops gives MILC's g."""
    path = fixture_path("lat.sample.l6666.hisq")
    assert main(["measure", str(path), "--json", "--beta", "7.4", "--u0", "0.89", "--gauge-action", "symanzik",
                 "--quark-loops", "hisq", "--nf", "3"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert abs(r["gauge_action"]["S_g"] - 1.91689566918234e+04) < 1e-13 * 1.92e4 * 10
    assert abs(r["check_plaq_ss"] - 1.8403954419120214) < 1e-12
    assert abs(r["check_plaq_st"] - 1.8597505785271828) < 1e-12
    assert abs(r["link_trace"] - 1.6866463634818848e-01) < 1e-12
    assert abs(r["polyakov_re"] - 3.164544e-01) < 5e-7 and abs(r["polyakov_im"] + 3.882709e-02) < 5e-8
    assert r["checksums"]["ok"]


@pytest.mark.parametrize("content", [None, b"", b"hello, not a lattice\n", bytes(range(256)) * 4])
def test_measure_bad_files(tmp_path, content):
    path = tmp_path / "lat.bad"
    if content is not None:
        path.write_bytes(content)
    r = subprocess.run([sys.executable, "-m", "hmc", "measure", str(path)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], r.stderr


def test_single_process_needs_no_mpi(tmp_path):
    """A single process runs with mpi4py unavailable."""
    out = tmp_path / "t.h5"
    code = ("import sys; sys.modules['mpi4py'] = None; from hmc.cli import main; "
            f"sys.exit(main(['init', '-o', {str(out)!r}]) or main(['run', {str(out)!r}, '--trajectories', '1', "
            "'--no-progress']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr


def test_help_lists_commands():
    r = subprocess.run([sys.executable, "-m", "hmc", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    for cmd in ("init", "run", "info", "measure", "bench"):
        assert cmd in r.stdout


@pytest.mark.parametrize("name", ["lat.sample.l4444", "lat.sample.l4444.ildg", "lat.sample.l4444.scidac"])
def test_init_from_lattice(tmp_path, name, capsys):
    """hmc init --from-lattice starts from MILC's configuration, re-unitarized as MILC does in double precision."""
    from hmc.runfile import load
    from lattice import su3
    from lattice.io import read_site_major

    path = fixture_path(name)
    out = str(tmp_path / "t.h5")
    assert main(["init", str(ROOT / "runs" / "quick4.toml"), "-o", out, "--from-lattice", str(path)]) == 0
    stored, _ = read_site_major(str(path))
    assert abs(load(out).links - su3.reunitarize(stored.astype(complex))).max() == 0
    assert main(["run", out, "--trajectories", "1", "--no-progress"]) == 0


def test_init_from_a_run_file(tmp_path):
    """hmc init --from-lattice RUN.h5 starts from the run file's configuration (hmc bench precision's thermalized
    start), re-unitarized like any lattice file: equal to rounding."""
    from hmc.runfile import load
    from lattice import su3

    first, second = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    assert main(["init", "-o", first]) == 0 and main(["run", first, "--trajectories", "1", "--no-progress"]) == 0
    assert main(["init", str(ROOT / "runs" / "quick4.toml"), "-o", second, "--from-lattice", first]) == 0
    a, b = load(first), load(second)
    assert b.source == f"trajectory 1 of run file {os.path.abspath(first)}" and b.trajectory == 0
    assert abs(b.links - su3.reunitarize(a.links)).max() == 0 and abs(b.links - a.links).max() < 1e-14
