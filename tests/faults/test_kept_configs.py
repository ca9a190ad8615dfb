"""Kept configurations (``save_every`` in [run]: RUN.traj<N>.ildg beside the run file) are written as the run file
is: through RUN.traj<N>.ildg.tmp.PID, fsynced and renamed (hmc.guard.save_kept). A kill during that write leaves no
partial file under the final name, and the resumed run writes it whole; a full or failing disk is one line naming
the kept file, exit 1, the run file intact and resumable to the uninterrupted result."""
import errno
import os
import subprocess
import sys

import numpy as np
import pytest

from hmc.cli import main
from hmc.kept_configs import kept_path, read_kept
from hmc.runfile import load
from tests.conftest import ROOT, launch_env
from tests.faults.killing import fingerprint, leftovers, one_line, tiny_deck

TRAJ = 4


def _kept_deck(folder) -> str:
    """The tiny deck with a configuration kept every 2 trajectories."""
    path = tiny_deck(str(folder), trajectories=TRAJ)
    with open(path) as f:
        text = f.read().replace("checkpoint_every = 1", "checkpoint_every = 1\nsave_every = 2")
    with open(path, "w") as f:
        f.write(text)
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kept_ref")
    deck = _kept_deck(folder)
    ref = str(folder / "ref.h5")
    assert main(["init", deck, "-o", ref]) == 0 and main(["run", ref, "--no-progress"]) == 0
    assert os.path.exists(kept_path(ref, 2)) and os.path.exists(kept_path(ref, 4))
    return deck, ref


# Run 'hmc run' in a child that SIGKILLs itself when the kept file of trajectory 2 is complete in its temporary
# file, just before the rename (the moment a partial file under the final name would show).
_KILLED_AT_RENAME = """
import os, signal, sys
import lattice.io.common as common
real = common.durable_replace
def durable_replace(tmp, path):
    if str(path).endswith(".traj2.ildg"):
        os.kill(os.getpid(), signal.SIGKILL)
    real(tmp, path)
common.durable_replace = durable_replace
from hmc.cli import main
sys.exit(main(["run", sys.argv[1], "--no-progress"]))
"""


def test_kill_during_a_kept_write_leaves_no_partial_file(tmp_path, reference):
    deck, ref = reference
    run = str(tmp_path / "run.h5")
    assert main(["init", deck, "-o", run]) == 0
    p = subprocess.run([sys.executable, "-c", _KILLED_AT_RENAME, run], cwd=ROOT, env=launch_env(None),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr
    assert not os.path.exists(kept_path(run, 2))
    assert [n for n in leftovers(str(tmp_path)) if ".traj2.ildg.tmp." in n]      # the killed write's temporary
    assert load(run).trajectory == 1
    assert main(["run", run, "--no-progress"]) == 0
    assert fingerprint(run) == fingerprint(ref) and leftovers(str(tmp_path)) == []
    for n in (2, 4):
        assert np.array_equal(read_kept(run, n)[0], read_kept(ref, n)[0])


def _failing_kept(name, err):
    """os.replace / os.fsync raising ``err`` when it is called for a kept file (RUN.trajN.ildg)."""
    real = getattr(os, name)

    def wrapper(*a, **k):
        target = a[1] if name == "replace" else os.readlink(f"/proc/self/fd/{a[0]}")
        if ".traj" in os.fspath(target):
            raise OSError(err, os.strerror(err))
        return real(*a, **k)
    return wrapper


@pytest.mark.parametrize("name,err", [("replace", errno.ENOSPC), ("fsync", errno.EIO)])
def test_failed_kept_write_is_one_line_and_the_run_file_intact(monkeypatch, tmp_path, capsys, reference, name, err):
    deck, ref = reference
    run = str(tmp_path / "run.h5")
    assert main(["init", deck, "-o", run]) == 0
    capsys.readouterr()
    with monkeypatch.context() as m:
        m.setattr(os, name, _failing_kept(name, err))
        code = main(["run", run, "--no-progress"])
    line = one_line(capsys.readouterr().err)
    assert code == 1, line
    kept = kept_path(run, 2)
    assert f"writing the kept configuration {kept} failed ({os.strerror(err)})" in line, line
    assert "bytes free" in line and f"{run} keeps trajectory 1 intact" in line, line
    assert not os.path.exists(kept) and leftovers(str(tmp_path)) == []
    assert load(run).trajectory == 1
    assert main(["run", run, "--no-progress"]) == 0
    assert fingerprint(run) == fingerprint(ref)
