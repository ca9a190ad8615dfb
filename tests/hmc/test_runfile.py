"""Run file and CLI: init, run, resume, atomic checkpoints, refusal of bad input."""
import json
import os
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest

from hmc.cli import main
from hmc import deck as deckmod
from hmc.runfile import load
from tests.conftest import ROOT

QUICK = """
[run]
seed = 5
trajectories = 4
start = "hot"
[lattice]
dims = [4, 4, 4, 4]
[gauge]
action = "wilson"
beta = 5.5
[integrator]
scheme = "omelyan"
steps = 4
"""


def physics(history):
    """History rows without the wall-clock columns."""
    return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in history]


def write_deck(tmp_path, text=QUICK, name="deck.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def hmc_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "hmc", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


def test_embedded_deck_matches_runs_quick4():
    assert deckmod.default_deck_text() == (ROOT / "runs" / "quick4.toml").read_text()


@pytest.mark.parametrize("deck", sorted(p.name for p in (ROOT / "runs").glob("*.toml")))
def test_runs_decks_validate(deck):
    deckmod.load(ROOT / "runs" / deck)


def test_init_run_info_resume(tmp_path, capsys):
    out = str(tmp_path / "t.h5")
    assert main(["init", write_deck(tmp_path), "-o", out]) == 0
    assert main(["run", out, "--trajectories", "2", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert text.count("delta S =") == 2 and "PLAQ:" in text
    assert main(["run", out, "--no-progress"]) == 0  # resumes: 2 more up to the deck's 4
    st = load(out)
    assert st.trajectory == 4 and [r["traj"] for r in st.history] == [1, 2, 3, 4]
    # the same four trajectories in one go give the same history, bit for bit
    out2 = str(tmp_path / "u.h5")
    main(["init", write_deck(tmp_path), "-o", out2])
    main(["run", out2, "--no-progress"])
    st2 = load(out2)
    assert physics(st2.history) == physics(st.history)
    assert np.array_equal(st2.links, st.links)
    capsys.readouterr()
    assert main(["info", out, "--schedule"]) == 0
    info = capsys.readouterr().out
    assert "4 done of 4" in info and "continue: hmc run" in info and "force evaluations" in info
    assert main(["info", out, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["trajectories_done"] == 4


def test_killed_during_checkpoint_resumes_exactly(tmp_path, cli_env):
    deck = write_deck(tmp_path)
    ref, run = str(tmp_path / "ref.h5"), str(tmp_path / "run.h5")
    for f in (ref, run):
        assert hmc_cli("init", deck, "-o", f, env=cli_env).returncode == 0
    assert hmc_cli("run", ref, "--no-progress", env=cli_env).returncode == 0
    env = dict(cli_env, HMC_FAULT_INJECT="kill_during_checkpoint:3")
    r = hmc_cli("run", run, "--no-progress", env=env)
    assert r.returncode == -signal.SIGKILL
    assert list(tmp_path.glob("run.h5.tmp*")), "the kill should leave a half-written temporary file"
    assert load(run).trajectory == 2  # the third checkpoint never landed
    r = hmc_cli("run", run, "--no-progress", env=cli_env)
    assert r.returncode == 0, r.stderr
    a, b = load(ref), load(run)
    assert physics(a.history) == physics(b.history)
    assert np.array_equal(a.links, b.links)


def _one_line_error(r):
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("hmc ")
    return lines[0]


@pytest.mark.parametrize("edit,expect", [
    (lambda s: s.replace("beta = 5.5", "beta = -5.5"), "beta"),
    (lambda s: s.replace("beta = 5.5", "beta = 5.5\nbeat = 3"), "unknown key 'beat'"),
    (lambda s: s.replace("dims = [4, 4, 4, 4]", "dims = [4, 4, 5, 4]"), "dims"),
    (lambda s: s.replace("dims = [4, 4, 4, 4]", "dims = [4, 4, 4, 4]\ngrid = [1, 1, 1, 3]"), "cannot be split"),
    (lambda s: s.replace("steps = 4", "steps = 5"), "even"),
    (lambda s: s + "\n[solver]\ntol = 1\n", "unknown section"),
    (lambda s: s.replace("[gauge]", "[gauge"), "not valid TOML"),
])
def test_bad_deck_is_refused(tmp_path, cli_env, edit, expect):
    out = tmp_path / "t.h5"
    r = hmc_cli("init", write_deck(tmp_path, edit(QUICK)), "-o", str(out), env=cli_env)
    assert expect in _one_line_error(r)
    assert not out.exists() and not list(tmp_path.glob("t.h5*"))


def test_bad_run_files_are_refused(tmp_path, cli_env):
    good = str(tmp_path / "good.h5")
    main(["init", write_deck(tmp_path), "-o", good])
    cases = {}
    cases["missing"] = str(tmp_path / "nope.h5")
    trunc = tmp_path / "trunc.h5"
    data = open(good, "rb").read()
    trunc.write_bytes(data[: len(data) // 2])
    cases["truncated"] = str(trunc)
    foreign = tmp_path / "foreign.h5"
    foreign.write_text("this is not HDF5\n")
    cases["foreign"] = str(foreign)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = 1
    cases["other hdf5"] = str(other)
    version = tmp_path / "version.h5"
    version.write_bytes(data)
    with h5py.File(version, "a") as f:
        f.attrs["format_version"] = 99
    cases["version"] = str(version)
    damaged = tmp_path / "damaged.h5"
    damaged.write_bytes(data)
    with h5py.File(damaged, "a") as f:
        f["gauge/links"][0, 0, 0, 0, 0, 0, 0] = 2.0
    cases["damaged"] = str(damaged)
    for name, path in cases.items():
        before = open(path, "rb").read() if os.path.exists(path) else None
        line = _one_line_error(hmc_cli("run", path, env=cli_env))
        assert path in line or os.path.basename(path) in line, (name, line)
        after = open(path, "rb").read() if os.path.exists(path) else None
        assert before == after, f"{name}: the file was modified"


def test_init_refuses_to_overwrite(tmp_path):
    out = str(tmp_path / "t.h5")
    deck = write_deck(tmp_path)
    assert main(["init", deck, "-o", out]) == 0
    assert main(["init", deck, "-o", out]) == 2
    assert main(["init", deck, "-o", out, "--force"]) == 0
