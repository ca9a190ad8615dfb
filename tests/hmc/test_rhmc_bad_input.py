"""RHMC bad input: rational functions that do not match the deck's masses, approximations less accurate than their
bound, and a solver that does not converge during ``hmc run`` -- each a one-line error; init writes nothing, and a
failed run keeps the last good trajectory in its run file."""
import re

import numpy as np
import pytest

from hmc.cli import main
from hmc.rhmc import FermionMonomial
from hmc.runfile import load
from tests.conftest import ROOT, fixture_path
from tests.hmc.hisq211_decks import cgresid_triples, hisq211_deck

RATIONALS = ROOT / "runs" / "rationals" / "rationals.hisq211_b580"


def deck(rationals=RATIONALS, masses="[0.013, 0.065, 0.838]", extra="", run_extra=""):
    """A cheap 4^4 2+1+1 deck (the production masses and rational functions, short trajectories)."""
    return hisq211_deck({
        "run": {"seed": "77"},
        "fermions": {"rationals": f'"{rationals}"', "dyn_mass": masses, "cgresid_md_fa_gr": cgresid_triples("1e-8")},
    }, extra={"run": run_extra, "fermions": extra})


def init_fails(tmp_path, capsys, text, *opts):
    """``hmc init`` of ``text``: exit 2, one line on stderr, no run file. Returns the line."""
    (tmp_path / "d.toml").write_text(text)
    out = tmp_path / "x.h5"
    assert main(["init", str(tmp_path / "d.toml"), "-o", str(out), *opts]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert not out.exists() and not list(tmp_path.glob("x.h5*"))
    return err


# -- rational functions against the deck's masses -------------------------------------------------------------------

def test_rationals_of_other_masses(tmp_path, capsys):
    err = init_fails(tmp_path, capsys, deck(masses="[0.013, 0.065, 0.5]"))
    assert "0.5" in err and "0.838" in err and "rationals.hisq211_b580" in err
    err = init_fails(tmp_path, capsys, deck(masses="[0.0125, 0.065, 0.838]"))
    assert "0.0125" in err and "0.013" in err


def test_rationals_override_of_another_ensemble(tmp_path, capsys):
    """--rationals with MILC's f211 test file (0.01, 0.05, 0.5) for the production deck's masses."""
    milc = fixture_path("rationals.sample.su3_rhmc_hisq_f211")
    err = init_fails(tmp_path, capsys, deck(), "--rationals", str(milc))
    assert "0.013" in err and str(milc) in err


# -- approximation errors against their bounds ----------------------------------------------------------------------

def _corrupt_residue(text, pf, tag, line, factor):
    """Multiply the ``line``-th res_TAG value of pseudofermion ``pf`` by ``factor``."""
    blocks = re.split(r"(?m)^(?=naik_term_epsilon)", text)
    lines = blocks[pf + 1].splitlines()
    idx = [i for i, l in enumerate(lines) if l.startswith(f"res_{tag} ")][line]
    lines[idx] = f"res_{tag} {float(lines[idx].split()[1]) * factor:.16e}"
    blocks[pf + 1] = "\n".join(lines) + "\n"
    return "".join(blocks)


def test_approximation_worse_than_its_stated_error(tmp_path, capsys):
    bad = tmp_path / "bad.rat"
    bad.write_text(_corrupt_residue(RATIONALS.read_text(), 4, "MD", 3, 1.001))
    err = init_fails(tmp_path, capsys, deck(rationals=bad))
    assert "pseudofermion 4" in err and "MD approximation" in err and "relative error" in err
    m = re.search(r"relative error ([0-9.e+-]+) on \[1e-15, 90\], above its bound ([0-9.e+-]+) \(1.1 x the file's "
                  r"stated error 1.451e-10\)", err)
    assert m and float(m.group(1)) > 1e-6 and float(m.group(2)) == pytest.approx(1.1 * 1.451256e-10, rel=1e-6), err


def test_approximation_without_stated_error_uses_the_deck_bound(tmp_path, capsys):
    plain = tmp_path / "plain.rat"
    plain.write_text("\n".join(l for l in RATIONALS.read_text().splitlines() if "Converged" not in l) + "\n")
    # default max_rational_error 1e-5: every approximation is better (the worst, MD of a 0.2 flavour, 2.4e-7)
    (tmp_path / "ok.toml").write_text(deck(rationals=plain))
    assert main(["init", str(tmp_path / "ok.toml"), "-o", str(tmp_path / "ok.h5")]) == 0
    err = init_fails(tmp_path, capsys, deck(rationals=plain, extra="max_rational_error = 1e-8"))
    assert "pseudofermion 1" in err and "MD approximation" in err and "2.398e-07" in err
    assert "above its bound 1.000e-08 (max_rational_error (the file states no error))" in err


def test_stated_error_above_the_deck_bound(tmp_path, capsys):
    err = init_fails(tmp_path, capsys, deck(extra="max_rational_error = 1e-8"))
    assert "pseudofermion 1" in err and "states a relative error 2.398e-07, above max_rational_error 1.0e-08" in err


# -- a solver that does not converge during hmc run ----------------------------------------------------------------

def test_solver_failure_in_the_first_trajectory(tmp_path, capsys):
    (tmp_path / "d.toml").write_text(deck(extra="max_multicg = 3"))
    f = str(tmp_path / "t.h5")
    assert main(["init", str(tmp_path / "d.toml"), "-o", f]) == 0
    before = load(f)
    capsys.readouterr()
    assert main(["run", f, "--no-progress"]) == 1  # a runtime failure: the solve ran and did not converge
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("hmc run: error: fermion: the heat-bath (GR) multishift solve of pseudofermion 0")
    m = re.search(r"did not converge: (\d+) iterations \(max_multicg 3\), residual \|r\|/\|b\| = ([0-9.e+-]+) > "
                  r"1\.0e-08", err)
    assert m and int(m.group(1)) == 3 and float(m.group(2)) > 1e-8, err
    after = load(f)
    assert after.trajectory == 0 and np.array_equal(after.links, before.links) and after.history == []


def test_solver_failure_keeps_the_last_good_trajectory(tmp_path, capsys, monkeypatch):
    """The second trajectory's heat bath fails (max_multicg drops to 3 after the first); checkpoint_every = 2, so
    the first was not yet written: the run file gets it, equal to a clean one-trajectory run, and can be resumed."""
    (tmp_path / "d.toml").write_text(deck(run_extra="checkpoint_every = 2\nrng = \"philox\""))
    bad, good = str(tmp_path / "bad.h5"), str(tmp_path / "good.h5")
    for f in (bad, good):
        assert main(["init", str(tmp_path / "d.toml"), "-o", f]) == 0
    assert main(["run", good, "--trajectories", "1", "--no-progress"]) == 0
    refresh = FermionMonomial.refresh

    def failing_refresh(self, u, rng):
        self._refreshes = getattr(self, "_refreshes", 0) + 1
        if self._refreshes == 2:
            for t in self.terms:
                t.maxiter = 3
        return refresh(self, u, rng)

    monkeypatch.setattr(FermionMonomial, "refresh", failing_refresh)
    capsys.readouterr()
    assert main(["run", bad, "--no-progress"]) == 1
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "did not converge: 3 iterations" in err
    assert "STOPPED in trajectory 2" in out and "keeps trajectory 1" in out
    sb, sg = load(bad), load(good)
    assert sb.trajectory == sg.trajectory == 1
    assert np.array_equal(sb.links, sg.links) and sb.rng == sg.rng

    def physics(h):
        return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in h]

    assert physics(sb.history) == physics(sg.history)
    monkeypatch.setattr(FermionMonomial, "refresh", refresh)
    assert main(["run", bad, "--no-progress"]) == 0 and load(bad).trajectory == 2


def test_run_file_of_an_older_schema_still_loads(tmp_path):
    """A run file whose stored deck predates max_rational_error (the key missing) loads; an edited value does not."""
    import json

    import h5py

    from hmc.runfile import RunFileError

    (tmp_path / "d.toml").write_text(deck())
    f = str(tmp_path / "t.h5")
    assert main(["init", str(tmp_path / "d.toml"), "-o", f]) == 0
    with h5py.File(f, "r+") as h:
        stored = json.loads(h["params"].attrs["deck_json"])
        del stored["fermions"]["max_rational_error"]
        h["params"].attrs["deck_json"] = json.dumps(stored, sort_keys=True)
    assert load(f).deck["fermions"]["max_rational_error"] == 1e-5
    with h5py.File(f, "r+") as h:
        stored["fermions"]["max_multicg"] = 7
        h["params"].attrs["deck_json"] = json.dumps(stored, sort_keys=True)
    with pytest.raises(RunFileError, match="the file was edited"):
        load(f)
