"""``hmc solve ... --solver mg``: per-level iteration counts, set-up and solve time next to even-odd CG's, and the
multigrid's bad input as one-line errors (exit status 2)."""
import json

import numpy as np

from hmc.cli import main
from tests.conftest import fixture_path

HISQ = ["--action", "hisq", "--time-bc", "antiperiodic"]
FAST = ["--mg-nv", "16", "--mg-setup-iters", "50"]


def one_line_error(capsys, argv, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hmc solve: error:"), err
    for w in words:
        assert w in err[0], err[0]


def test_solve_mg_reports_levels_next_to_cg(capsys, tmp_path):
    lat = str(fixture_path("lat.sample.l8888"))
    out = tmp_path / "x.npy"
    argv = ["solve", lat, *HISQ, "--mass", "0.01", "--solver", "mg", "--random", "5", "--tol", "1e-10", *FAST,
            "--out", str(out)]
    assert main(argv + ["--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["solver"] == "mg" and r["converged"] and r["full_residual"] <= 1e-10
    g = r["mg"]
    assert [d["level"] for d in g["levels"]] == [0, 1, 2]
    assert g["levels"][0]["iters"] == g["outer_iters"] == r["iters"] > 0
    assert g["levels"][2]["direct_solves"] == g["outer_iters"]
    assert g["setup_time_s"] > 0 and g["solve_time_s"] > 0 and g["fine_applies"] > g["outer_iters"]
    assert g["params"]["nv"] == [16] and g["params"]["blocks"] == [[4, 4, 4, 4]]
    c = r["cg_compare"]
    assert c["converged"] and c["iters"] > 0 and c["rel_diff_to_mg"] < 1e-6
    x = np.load(out)
    assert x.shape == (8, 8, 8, 8, 3)
    # the text form: one line per level and the CG line
    assert main(argv[:-2] + ["--no-mg-compare"]) == 0
    text = capsys.readouterr().out
    assert "multigrid: set-up" in text and "level 2 (coarse 32x32 stencil, 2x2x2x2" in text
    assert "even-odd CG" not in text
    print(text)


def test_solve_mg_bad_input(capsys):
    lat = str(fixture_path("lat.sample.l8888"))
    base = ["solve", lat, *HISQ, "--mass", "0.01", "--solver", "mg"]
    one_line_error(capsys, base + ["--mg-block", "4", "2", "4", "4"], "narrower than 3", "direction y")
    one_line_error(capsys, base + ["--mg-block", "3", "4", "4", "4"], "is odd")
    one_line_error(capsys, base + ["--mg-block", "4", "4", "4", "6"], "does not tile")
    one_line_error(capsys, base + ["--mg-levels", "4", "--mg-block", "4", "4", "4", "4"], "blocks: 1 given")
    one_line_error(capsys, base + ["--operator", "MdagM"], "--operator M")
