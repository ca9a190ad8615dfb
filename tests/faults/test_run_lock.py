"""One writer per run file (hmc.guard.RunLock) and the failures found before the work: a second 'hmc run' and an
'hmc init --force' of a file being run are refused in one line naming the owner; readers still read; a lock dies
with its owner; folders given as files and read-only folders are refused before a trajectory is computed."""
import os
import signal
import socket
import subprocess

import pytest

from hmc import guard
from hmc.runfile import load
from tests.faults.killing import fingerprint, hmc, leftovers, one_line, start, tiny_deck, wait_for_line


@pytest.fixture
def running(tmp_path):
    """A run file and a live 'hmc run' of it (stopped after the test)."""
    run = str(tmp_path / "c.h5")
    assert hmc("init", tiny_deck(str(tmp_path), trajectories=400), "-o", run).returncode == 0
    p = start("run", run, "--no-progress")
    wait_for_line(p, "traj ")
    yield run, p
    p.kill()
    p.communicate()


def test_second_run_and_forced_init_are_refused_readers_read(running):
    run, owner = running
    for args in (("run", run, "--no-progress"), ("init", "--force", "-o", run)):
        r = hmc(*args)
        assert r.returncode == 2
        line = one_line(r.stderr)
        assert f"{run} is in use by 'hmc run' (PID {owner.pid} on host {socket.gethostname()}" in line, line
        assert "wait for that run to end" in line
    info = hmc("info", run)
    assert info.returncode == 0 and "done of 400 planned" in info.stdout, info.stderr
    assert load(run).deck["run"]["trajectories"] == 400      # the refused init did not overwrite it


def test_lock_dies_with_its_owner(running):
    run, owner = running
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert os.path.exists(run + guard.LOCK_SUFFIX)          # left behind, but no longer held
    r = hmc("run", run, "--trajectories", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(run + guard.LOCK_SUFFIX)      # a clean end removes it


def test_lock_in_process_refuses_then_frees(tmp_path):
    path = str(tmp_path / "x.h5")
    with guard.RunLock(path, "hmc run"):
        with pytest.raises(guard.RunLocked, match=f"PID {os.getpid()}"):
            guard.RunLock(path, "hmc init").acquire()
    with guard.RunLock(path, "hmc init"):
        pass
    assert not os.path.exists(path + guard.LOCK_SUFFIX)


def test_folders_named_as_files_are_refused(tmp_path):
    folder = str(tmp_path)
    run = str(tmp_path / "c.h5")
    assert hmc("init", "-o", run).returncode == 0
    for args, expect in [(("init", "-o", folder, "--force"), f"-o {folder} is a folder"),
                         (("init", "-o", folder), f"-o {folder} is a folder"),
                         (("run", folder), f"{folder} is a folder, not a run file"),
                         (("solve", run, "--action", "hisq", "--mass", "0.1", "--source", folder),
                          f"{folder} is a folder, not a source file"),
                         (("solve", run, "--action", "hisq", "--mass", "0.1", "--out", folder),
                          f"--out {folder} is a folder")]:
        r = hmc(*args)
        assert r.returncode == 2, (args, r.stderr)
        line = one_line(r.stderr)
        assert expect in line and "continue it with" not in line, line


def _mount(folder, options) -> None:
    os.makedirs(folder, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", folder], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}): needs root in a container that allows it")


def _umount(folder) -> None:
    subprocess.run(["umount", "-l", folder], capture_output=True)


def test_read_only_folder_fails_before_a_trajectory(tmp_path):
    src = str(tmp_path / "c.h5")
    assert hmc("init", tiny_deck(str(tmp_path)), "-o", src).returncode == 0
    ro = str(tmp_path / "ro")
    _mount(ro, "size=2m")
    try:
        subprocess.run(["cp", src, ro], check=True)
        subprocess.run(["mount", "-o", "remount,ro", ro], check=True)
        before = fingerprint(os.path.join(ro, "c.h5"))
        r = hmc("run", os.path.join(ro, "c.h5"), "--no-progress")
        assert r.returncode == 1 and "traj " not in r.stdout, r.stdout
        line = one_line(r.stderr)
        assert f"cannot write in the folder {ro}" in line and "Read-only file system" in line, line
        r = hmc("init", "-o", os.path.join(ro, "d.h5"))
        assert r.returncode == 1 and f"cannot write in the folder {ro}" in one_line(r.stderr)
        assert fingerprint(os.path.join(ro, "c.h5")) == before
    finally:
        _umount(ro)


def test_no_room_for_a_checkpoint_fails_before_a_trajectory(tmp_path):
    src = str(tmp_path / "c.h5")
    assert hmc("init", tiny_deck(str(tmp_path)), "-o", src).returncode == 0
    small = str(tmp_path / "small")
    size = os.path.getsize(src)
    _mount(small, f"size={size + size // 2}")                # the file fits, a second copy beside it does not
    try:
        subprocess.run(["cp", src, small], check=True)
        run = os.path.join(small, "c.h5")
        before = fingerprint(run)
        r = hmc("run", run, "--no-progress")
        assert r.returncode == 1 and "traj " not in r.stdout, r.stdout
        line = one_line(r.stderr)
        assert f"no room for a checkpoint of {run}" in line and "bytes" in line and "free" in line, line
        assert fingerprint(run) == before and leftovers(small) == []
    finally:
        _umount(small)
