"""The device-suite runner (``hmc bench suite``, bench/suite.py) on the CPU: every suite of bench/suites.toml
dry-runs and prints its commands (the GPU ones as they would run on the device); a small suite of shell commands
runs for real (foreach, rows, when, optional failures, timeouts, logs, stdout files, archives, budgets); bad input
is a one-line error."""
from __future__ import annotations

import argparse
import sys
import tarfile

import pytest

from bench import suite as S


def _args(**kw):
    base = {"name": None, "dry_run": False, "file": None, "python": None, "set": None, "out": None, "steps": None}
    return argparse.Namespace(**{**base, **kw})


def _dry(capsys, name, **kw):
    rc = S.cli(_args(name=name, dry_run=True, **kw))
    out = capsys.readouterr().out
    assert rc == 0, out
    return out


@pytest.mark.parametrize("name", sorted(S.load()))
def test_every_suite_dry_runs(capsys, name):
    out = _dry(capsys, name)
    steps = [l for l in out.splitlines() if l.startswith("[")]
    commands = [l for l in out.splitlines() if l.startswith("    $ ")]
    assert steps and len(commands) == len(steps), out
    assert "{" not in "".join(commands).replace("{budget_left}", ""), "a placeholder was left unfilled:\n" + out


def test_transports_suite_runs_the_scripts_commands(capsys):
    out = _dry(capsys, "transports", python="python3")
    for cmd in ("mpiexec --oversubscribe -n 2 python3 tests/comms/cuda_checks.py halo /tmp/out/rep/smoke_stream_gated "
                "--transports stream_gated --partition xt --iters 20",
                "mpiexec --oversubscribe -n 4 python3 -m bench.halo_cuda --transport mpi,event,stream_gated "
                "--sizes 2 8 32 --reps 100 --repeats 3 --graph --graph-reps 200 "
                "--json /tmp/out/rep/bench_mps_4ranks.json --label '4 ranks, one H200'",
                "python3 -m pytest tests/comms/test_gpu_transports.py -q -p no:cacheprovider -rA -k 'not legacy'"):
        assert f"    $ {cmd}\n" in out, cmd
    assert "HMC_P2P_ALLOC=legacy" in out and "pack /tmp/out/rep /tmp/out/reports.tgz" in out


def test_set_and_steps_select(capsys):
    out = _dry(capsys, "scaling_gpu", set=["backend=numpy", "transports=mpi shm", "graph=", "mps=",
                                           "lattices=4^4"], steps="hmc scaling 4*")
    assert out.count("\n[") == 1
    assert "scaling --lattice '4^4' --ranks 1 2 4 --transports mpi shm --what halo,dslash,cg" in out


def test_included_suite_takes_its_variables(capsys):
    out = _dry(capsys, "final_device")
    assert "bench rhmc --lattice 32 --deck runs/hisq211_16.toml --trajectories 1" in out
    assert "on the CPU" not in out                       # cpu_sizes set empty by final_device
    assert "hmc bench mg --lattice 16" in out and "mg_bench_L32.log" in out


SMALL = """
[suites.small]
description = "a small suite of shell commands"
out = "{tmp}/out"
log = "runner.txt"

[suites.small.vars]
tmp = "TMP"
words = "a b"
budget = "60"

[[suites.small.steps]]
name = "echo {w}{n}"
foreach = { w = "{words}" }
rows = [{ n = 1 }, { n = 2 }]
run = "echo {w}{n}"
log = "log.txt"

[[suites.small.steps]]
name = "fails"
run = "false"
optional = true

[[suites.small.steps]]
name = "after a failure"
when = "failed:fails"
run = ["sh", "-c", "echo left $0 > {out}/rep/note.txt", "{budget_left}"]
mkdir = ["{out}/rep"]

[[suites.small.steps]]
name = "after a success"
when = "ok:fails"
run = "touch {out}/never"

[[suites.small.steps]]
name = "slow"
run = "sleep 30"
timeout = 1
optional = true

[[suites.small.steps]]
name = "stdout"
run = "echo {python}"
stdout = "python.txt"

[[suites.small.steps]]
archive = ["rep", "rep.tgz"]
"""


def test_a_small_suite_runs(tmp_path, capsys):
    f = tmp_path / "suites.toml"
    f.write_text(SMALL.replace("TMP", str(tmp_path)))
    rc = S.cli(_args(name="small", file=str(f)))
    out = capsys.readouterr().out
    assert rc == 0, out
    d = tmp_path / "out"
    assert (d / "log.txt").read_text().split() == ["a1", "a2", "b1", "b2"]
    assert "skipped: only when 'fails' succeeded" in out and not (d / "never").exists()
    assert "rc=124 (timed out)" in out
    assert (d / "python.txt").read_text().strip() == sys.executable
    runner = (d / "runner.txt").read_text()
    assert "[1/10] echo a1" in runner and "suite small: 0 failed step(s), 9 run" in runner
    assert not (d / "rep").exists()
    with tarfile.open(d / "rep.tgz") as t:
        note = t.extractfile("note.txt").read().decode().split()
    assert note[0] == "left" and 0 < int(note[1]) <= 50          # {budget_left}: the budget less 10 s, at run time


def test_a_failing_step_fails_the_suite(tmp_path, capsys):
    f = tmp_path / "suites.toml"
    f.write_text('[suites.bad]\nout = "%s"\n[[suites.bad.steps]]\nrun = "false"\n' % tmp_path)
    assert S.cli(_args(name="bad", file=str(f))) == 1
    assert "rc=1" in capsys.readouterr().out


@pytest.mark.parametrize("text,kw,message", [
    ("", {"name": "nope"}, "no suite 'nope'"),
    ('[suites.x]\n[[suites.x.steps]]\nrun = "echo {missing}"\n', {"name": "x"}, "define it in the suite's vars"),
    ('[suites.x]\n[[suites.x.steps]]\nrun = "echo"\ncolour = 1\n', {"name": "x"}, "unknown step keys ['colour']"),
    ('[suites.x]\n', {"name": "x", "set": ["novalue"]}, "--set 'novalue': give NAME=VALUE"),
    ("[suites.x\n", {"name": "x"}, "cannot read the suites file")])
def test_bad_input_is_one_line(tmp_path, capsys, text, kw, message):
    f = tmp_path / "suites.toml"
    f.write_text(text)
    assert S.cli(_args(file=str(f), **kw)) == 2
    err = capsys.readouterr().err
    assert err.startswith("hmc bench suite: error: ") and message in err and err.count("\n") == 1, err
