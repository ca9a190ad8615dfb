"""hmc bench keeps the command line's conventions (issue 20): counts validated in one line (exit 2), bad input of
hmc bench mg in one line without a traceback, Ctrl-C exits 130 with one line (its report so far written), and a
missing MPI library is one line naming the mpi extra."""
import json
import signal
import subprocess
import sys
import time
import types

import pytest

from tests.conftest import launch_env


def one_line(r, code, *words):
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.parametrize("argv,words", [
    (["gauge", "--lattice", "4", "4", "4", "4", "--repeat", "0"], ["--repeat", ">= 1"]),
    (["mg", "--lattice", "4", "--therm", "-1"], ["--therm", ">= 0"]),
    (["mg", "--lattice", "5"], ["lattice extent 5", "even"]),
    (["halo", "--sizes", "0"], ["--sizes"]),
])
def test_bad_counts_and_lattices_are_one_line(tmp_path, argv, words):
    r = subprocess.run([sys.executable, "-m", "hmc", "bench", *argv], capture_output=True, text=True, cwd=tmp_path,
                       env=launch_env(), timeout=120)
    one_line(r, 2, *words)


def test_bench_mg_ctrl_c_exits_130_with_its_report(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "hmc", "bench", "mg", "--lattice", "4", "--therm", "100000",
                          "--budget", "100000", "--out", str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=launch_env())
    assert "mg_bench" in p.stdout.readline()                   # started: thermalizing from here
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    one_line(types.SimpleNamespace(returncode=p.returncode, stderr=err), 130, "interrupted", "mg_bench_L4.json")
    assert json.loads((tmp_path / "mg_bench_L4.json").read_text())["status"].startswith("interrupted during")


def test_no_mpi_library_is_one_line(monkeypatch):
    """mpi4py without a libmpi to load (a plain pip install has none) raises a one-line CommsError."""
    from comms import CommsError
    from comms.base import mpi

    class NoLibrary(types.ModuleType):
        def __getattr__(self, name):
            raise RuntimeError("cannot load MPI library\nlibmpi.so: cannot open shared object file")

    monkeypatch.setitem(sys.modules, "mpi4py", NoLibrary("mpi4py"))
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    with pytest.raises(CommsError) as e:
        mpi()
    assert "\n" not in str(e.value) and "pip install 'hisq-hmc[mpi]'" in str(e.value)

