"""A full or failing file system during 'hmc run' (hmc.guard.save_checkpoint): one line naming the file, the bytes
a checkpoint needs and the free space, saying that the previous run file is intact; exit 1; the previous file
intact and resumable to the same end as an uninterrupted run. Faults: a real tmpfs filled up at random moments of
a run, and ENOSPC/EIO injected at the n-th file creation, fsync and rename of the saves, for every n."""
import errno
import os
import random

import h5py
import pytest

from hmc.cli import main
from tests.faults.killing import fingerprint, hmc, leftovers, one_line, start, tiny_deck, wait_for_line
from tests.faults.test_run_lock import _mount, _umount

TRAJ = 3
#: how many moments the real tmpfs is filled at: CI 2 (nothing and all but 8 KiB of a checkpoint left);
#: HMC_FULL_FS_FILLS=5 by hand adds a third, 4 KiB and a half, more adds random amounts (read only here)
FILLS = int(os.environ.get("HMC_FULL_FS_FILLS", "2"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ref")
    deck = tiny_deck(str(folder), trajectories=TRAJ)
    ref = str(folder / "ref.h5")
    assert hmc("init", deck, "-o", ref).returncode == 0
    assert hmc("run", ref, "--no-progress").returncode == 0
    return deck, fingerprint(ref)


def _writes(name, a, k) -> bool:
    """Whether a call of h5py.File, os.fsync or os.replace is part of a save (h5py.File also opens for reading)."""
    return name != "File" or (a[1] if len(a) > 1 else k.get("mode")) == "w"


def _failing_at(n, exc, real, name):
    """``real`` with its n-th call of a save (counting from 1) raising ``exc`` instead."""
    calls = [0]

    def wrapper(*a, **k):
        if _writes(name, a, k):
            calls[0] += 1
            if calls[0] == n:
                raise exc
        return real(*a, **k)
    return wrapper, calls


def _count_calls(monkeypatch, target, name, deck, tmp_path):
    """How many times one 'hmc run' of ``deck`` calls target.name."""
    wrapper, calls = _failing_at(-1, None, getattr(target, name), name)
    run = str(tmp_path / "count.h5")
    assert main(["init", deck, "-o", run]) == 0
    with monkeypatch.context() as m:
        m.setattr(target, name, wrapper)
        assert main(["run", run, "--no-progress"]) == 0
    return calls[0]


@pytest.mark.parametrize("target,name,err", [(h5py, "File", errno.ENOSPC), (os, "fsync", errno.EIO),
                                             (os, "replace", errno.ENOSPC)])
def test_injected_write_failures_at_every_n(monkeypatch, tmp_path, capsys, reference, target, name, err):
    deck, ref = reference
    total = _count_calls(monkeypatch, target, name, deck, tmp_path)
    assert total >= TRAJ
    for n in range(1, total + 1):
        run = str(tmp_path / f"r{n}.h5")
        assert main(["init", deck, "-o", run]) == 0
        before = fingerprint(run)
        wrapper, _ = _failing_at(n, OSError(err, os.strerror(err)), getattr(target, name), name)
        capsys.readouterr()
        with monkeypatch.context() as m:
            m.setattr(target, name, wrapper)
            code = main(["run", run, "--no-progress"])
        line = one_line(capsys.readouterr().err)
        if code == 0:                     # the n-th call came after the last save (the last folder fsync)
            continue
        assert code == 1, line
        assert f"writing {run} failed ({os.strerror(err)})" in line and "bytes" in line and "free" in line, line
        assert f"the previous {run} is intact" in line, line
        after = fingerprint(run)
        assert after["trajectory"] >= before["trajectory"] and leftovers(str(tmp_path)) == []
        assert main(["run", run, "--no-progress"]) == 0
        assert fingerprint(run) == ref


def _fill(path, nbytes) -> None:
    """Write up to ``nbytes`` into ``path``, fewer when the file system fills first (a save may be under way)."""
    with open(path, "wb") as f:
        while nbytes > 0:
            try:
                nbytes -= f.write(bytes(min(nbytes, 1 << 16)))
                f.flush()
            except OSError as e:
                assert e.errno == errno.ENOSPC
                return


def test_real_full_file_system(tmp_path, reference):
    """A tmpfs four checkpoints big, filled at a random moment of a run to leave 0 .. one checkpoint free (FILLS
    times)."""
    deck, ref = reference
    fs = str(tmp_path / "fs")
    probe = str(tmp_path / "probe.h5")
    assert hmc("init", deck, "-o", probe).returncode == 0
    size = os.path.getsize(probe) + 8 * 40 * TRAJ
    _mount(fs, f"size={4 * size}")
    rnd = random.Random(21)
    try:
        levels = [0, size - 8192, size // 3, 4096, size // 2]
        for leave in (levels + [rnd.randint(0, size) for _ in range(FILLS - len(levels))])[:FILLS]:
            run = os.path.join(fs, "c.h5")
            assert hmc("init", tiny_deck(fs, trajectories=400), "-o", run, env=None).returncode == 0
            p = start("run", run, "--no-progress")
            wait_for_line(p, f"traj {rnd.randint(1, 3):5d}")
            free = os.statvfs(fs).f_bavail * os.statvfs(fs).f_frsize
            _fill(os.path.join(fs, "filler"), free - leave)
            out, err = p.communicate(timeout=120)
            assert p.returncode == 1, (leave, err)
            line = one_line(err)
            assert f"writing {run} failed (No space left on device)" in line, line
            assert "bytes free" in line and f"the previous {run} is intact" in line, line
            assert leftovers(fs) == []
            os.unlink(os.path.join(fs, "filler"))
            done = fingerprint(run)["trajectory"]          # the save of the trajectory printed may have failed
            assert hmc("run", run, "--trajectories", "1", "--no-progress").returncode == 0   # resumable
            same = str(tmp_path / "same.h5")                 # the same trajectories without the fault
            assert hmc("init", "--force", tiny_deck(str(tmp_path), trajectories=400), "-o", same).returncode == 0
            assert hmc("run", same, "--trajectories", str(done + 1), "--no-progress").returncode == 0
            assert fingerprint(run) == fingerprint(same)
            os.unlink(run)
    finally:
        _umount(fs)
