"""Writes durable as well as atomic (lattice.io.common.durable_replace): the new file is fsynced before the rename
and the folder after it; the PATH.tmp.PID of a save killed midway is removed by the next open or save once PID is
dead, never while PID lives."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from hmc import runfile
from hmc.deck import default_deck_text, loads
from lattice.io import write_gauge
from lattice.io.common import remove_stale_temporaries
from tests.conftest import ROOT, launch_env

QUICK = (default_deck_text().replace("[4, 4, 4, 4]", "[2, 2, 2, 2]").replace("trajectories = 40", "trajectories = 2")
         .replace("warmups = 15", "warmups = 1"))


def _state():
    d = loads(QUICK)
    links = np.broadcast_to(np.eye(3, dtype=np.complex128), (2, 2, 2, 2, 4, 3, 3)).copy()
    return runfile.RunState(d, QUICK, links, plaquette=(3.0, 3.0))      # unit links: MILC plaquette 3


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _record_sync_order(monkeypatch) -> list:
    calls = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(a, b):
        calls.append(("replace", os.path.abspath(a), os.path.abspath(b)))
        return real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return calls


@pytest.mark.parametrize("writer", ["runfile", "gauge"])
def test_file_fsynced_before_rename_and_folder_after(tmp_path, monkeypatch, writer):
    path = tmp_path / "out"
    calls = _record_sync_order(monkeypatch)
    if writer == "runfile":
        runfile.save(path, _state())
    else:
        write_gauge(path, _state().links, "milc")
    tmp = f"{path}.tmp.{os.getpid()}"
    assert calls == [("fsync", tmp), ("replace", tmp, str(path)), ("fsync", str(tmp_path))]
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_stale_temporary_of_a_dead_save_is_removed_and_a_live_one_kept(tmp_path):
    path = tmp_path / "run.h5"
    runfile.save(path, _state())
    dead = tmp_path / f"run.h5.tmp.{_dead_pid()}"
    live = tmp_path / f"run.h5.tmp.{os.getppid()}"
    other = tmp_path / "run.h5.tmp.notapid"
    for p in (dead, live, other):
        p.write_bytes(b"half a checkpoint")
    runfile.load(path)                                   # the next open (hmc run, hmc info) cleans up
    assert not dead.exists() and live.exists() and other.exists()
    dead2 = tmp_path / f"conf.tmp.{_dead_pid()}"
    dead2.write_bytes(b"half a lattice")
    assert remove_stale_temporaries(tmp_path / "conf") == [dead2.name]


def test_checkpoint_killed_midway_leaves_a_temporary_that_the_next_run_removes(tmp_path):
    """HMC_FAULT_INJECT=kill_during_checkpoint:2 SIGKILLs `hmc run` halfway through its first checkpoint (the second
    save of the process after init): the old file stays intact, and the full-size PATH.tmp.PID it leaves is gone
    after the resumed run, which ends with both trajectories."""
    path = tmp_path / "run.h5"
    deck = tmp_path / "d.toml"
    deck.write_text(QUICK)
    code = ("import sys; from hmc.run import init_run, run; "
            "init_run(sys.argv[1], sys.argv[2], log=lambda *a: None); run(sys.argv[2], show_progress=False)")
    r = subprocess.run([sys.executable, "-c", code, str(deck), str(path)], cwd=ROOT, capture_output=True, timeout=120,
                       env=launch_env({"HMC_FAULT_INJECT": "kill_during_checkpoint:2"}))
    assert r.returncode == -9, r.stderr[-2000:]
    left = [n for n in os.listdir(tmp_path) if n.startswith("run.h5.tmp.")]
    assert len(left) == 1 and os.path.getsize(tmp_path / left[0]) > 0
    assert runfile.load(path).trajectory == 0            # the old checkpoint, intact; the stale file is gone
    assert not (tmp_path / left[0]).exists()
    from hmc.run import run

    assert run(str(path), show_progress=False, log=lambda *a: None).trajectory == 2
    assert sorted(os.listdir(tmp_path)) == ["d.toml", "run.h5"]


def test_run_removes_every_temporary_of_its_files_under_its_lock(tmp_path):
    """A temporary that a killed save left whose PID is alive again (reused since, or a process of another host on a
    shared file system) is kept by readers, but removed by 'hmc run', which holds the run file's lock and so is its
    only writer (hmc.guard.discard_killed_saves): the run file's and its kept configurations' own, nothing else."""
    from hmc.cli import main

    path = tmp_path / "run.h5"
    deck = tmp_path / "d.toml"
    deck.write_text(QUICK)
    assert main(["init", str(deck), "-o", str(path)]) == 0
    live = os.getppid()
    theirs = [tmp_path / f"run.h5.tmp.{live}", tmp_path / f"run.traj2.ildg.tmp.{live}"]
    others = [tmp_path / f"other.h5.tmp.{live}", tmp_path / "run.h5.tmp.notapid",
              tmp_path / f"run.trajx.ildg.tmp.{live}"]
    for p in theirs + others:
        p.write_bytes(b"half a checkpoint")
    assert main(["info", str(path)]) == 0
    assert all(p.exists() for p in theirs + others)      # a reader leaves a live PID's file alone
    assert main(["run", str(path), "--trajectories", "1", "--no-progress"]) == 0
    assert not any(p.exists() for p in theirs) and all(p.exists() for p in others)
