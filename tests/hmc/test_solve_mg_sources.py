"""Several sources by multigrid in the application (hmc/solve_mg.py): ``hmc solve --ksprop --solver mg`` and
``hmc spectrum --solver mg`` share one set-up among the three colours and solve them together with the batched solve
(solvers/multigrid/batched.py solve_columns); the same solutions as one solve after another (--no-mg-batch) and the
same correlator as CG; the set-up tells the progress line what it does."""
import numpy as np

from hmc.solve import load_links, make_dslash
from hmc.spectrum import point_correlator
from lattice.io import read_ksprop
from tests.conftest import fixture_path
from tests.hmc.test_solve_spectrum import run_json

MG = ["--solver", "mg", "--mg-nv", "4", "--mg-setup-iters", "5", "--tol", "1e-6", "--mass", "0.5"]


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_ksprop_by_batched_multigrid_equals_one_solve_after_another(tmp_path, capsys):
    lat = str(fixture_path("lat.sample.l8888"))
    base = ["solve", lat, "--action", "hisq", "--point", "1", "2", "3", "1", "--ksprop", *MG]
    batched = run_json(capsys, base + ["--out", str(tmp_path / "b.ksprop"), "--no-mg-compare"])
    single = run_json(capsys, base + ["--no-mg-batch", "--out", str(tmp_path / "s.ksprop"), "--no-mg-compare"])
    assert batched["converged"] and single["converged"]
    assert batched["mg"]["batched"]["columns"] == 3 and "batched" not in single.get("mg", {})
    assert batched["full_residual"] <= 1e-6 and single["full_residual"] <= 1e-6
    assert [s["color"] for s in batched["solves"]] == [0, 1, 2]
    for sb, ss in zip(batched["solves"], single["solves"]):
        assert abs(sb["iters"] - ss["iters"]) <= 1, (sb["iters"], ss["iters"])
    assert [s["mg"]["setup_fine_applies"] > 0 for s in single["solves"]] == [True, False, False]   # one set-up
    assert batched["mg"]["setup_fine_applies"] == single["solves"][0]["mg"]["setup_fine_applies"]
    xb, _, _ = read_ksprop(str(tmp_path / "b.ksprop"))
    xs, _, _ = read_ksprop(str(tmp_path / "s.ksprop"))
    for c in range(3):
        assert rel(xb[c], xs[c]) < 1e-8


class Notes:
    """A stand-in for hmc.progress.Progress: records the notes."""

    def __init__(self):
        self.done, self.notes = 0, []

    def step(self, note=""):
        self.update(self.done + 1, note)

    def update(self, done, note=""):
        self.done = done
        self.notes.append(note)


def test_spectrum_by_batched_multigrid_matches_cg_and_reports_the_set_up():
    class Args:
        config, action, mass, u0, eps, time_bc = str(fixture_path("lat.sample.l8888")), "hisq", 0.5, None, 0.0, \
            "antiperiodic"
        reunitarize, ignore_checksum, force_reunitarize = True, False, False
        tol, maxiter = 1e-6, 10000

    _, links, _ = load_links(Args)
    D = make_dslash(links)
    bar = Notes()
    mg = {"nv": [4], "setup_iters": [5]}
    c_mg, solves = point_correlator(D, 0.5, (1, 0, 2, 3), solver="mg", tol=1e-6, progress=bar, mg=mg)
    c_cg, _ = point_correlator(D, 0.5, (1, 0, 2, 3), solver="cg", tol=1e-6)
    assert rel(c_mg, c_cg) < 1e-5 and [s["color"] for s in solves] == [0, 1, 2]
    assert all(s["converged"] and s["true_residual"] <= 1e-6 for s in solves)
    for note in ("multigrid set-up: level 2 of 2, 4 near-null vectors, CG iteration 5 of 5",
                 "multigrid: level 2 of 2, the Galerkin coarse operator", "multigrid: the coarsest factorization",
                 "multigrid: 3 sources solved together (batched)"):
        assert note in bar.notes, bar.notes
    assert not any("solve 1 of 1" in n for n in bar.notes)
