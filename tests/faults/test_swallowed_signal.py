"""A SIGTERM or SIGINT that lands while a GC / weakref callback runs: Python swallows the exception its handler
raises there (it goes to sys.unraisablehook and the interrupted code goes on), so hmc.guard records the signal and
'hmc run' acts on it before its next trajectory (hmc.guard.stop_if_signalled): exit 143 (130), the trajectory
that was complete written, nothing left behind, and the resumed run bitwise equal to an uninterrupted one."""
import gc
import os
import signal
import time
import weakref

import pytest

import hmc.run
from hmc.cli import main
from hmc.guard import Terminated
from hmc.runfile import load
from tests.faults.killing import fingerprint, leftovers, one_line, tiny_deck

TRAJ, AT = 4, 2          # the signal arrives in a GC callback right after trajectory AT of TRAJ


class _Cycle:
    """An object only the cyclic garbage collector frees: its finalizer runs inside gc.collect()."""

    def __init__(self):
        self.me = self


def _signal_in_gc_callback(sig, swallowed: list) -> None:
    """Send ``sig`` to this process from a weakref.finalize callback that gc.collect() runs, and wait there until
    the handler's exception has been raised inside the callback (``swallowed`` records it)."""
    def callback():
        try:
            os.kill(os.getpid(), sig)
            for _ in range(200):          # the handler runs at the first check of the sleep below
                time.sleep(0.005)
        except (Terminated, KeyboardInterrupt) as e:
            swallowed.append(type(e).__name__)
            raise                          # what Python then swallows
    obj = _Cycle()
    weakref.finalize(obj, callback)
    del obj
    gc.collect()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig,code,word", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_signal_swallowed_in_gc_callback_stops_before_the_next_trajectory(monkeypatch, tmp_path, capsys, sig, code,
                                                                          word):
    deck = tiny_deck(str(tmp_path), trajectories=TRAJ)
    ref, run = str(tmp_path / "ref.h5"), str(tmp_path / "run.h5")
    assert main(["init", deck, "-o", ref]) == 0 and main(["init", deck, "-o", run]) == 0
    assert main(["run", ref, "--no-progress"]) == 0
    real, calls, swallowed = hmc.run.hmc_trajectory, [], []

    def trajectory(*a, **k):
        calls.append(1)
        out = real(*a, **k)
        if len(calls) == AT:
            _signal_in_gc_callback(sig, swallowed)
        return out

    capsys.readouterr()
    # as at a terminal: a job started with & (or under nohup) inherits an ignored SIGINT, which hmc run leaves be
    interactive = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with monkeypatch.context() as m:
            m.setattr(hmc.run, "hmc_trajectory", trajectory)
            rc = main(["run", run, "--no-progress"])
    finally:
        signal.signal(signal.SIGINT, interactive)
    err = capsys.readouterr().err
    assert swallowed == [Terminated.__name__ if sig == signal.SIGTERM else "KeyboardInterrupt"]
    assert rc == code, err
    assert len(calls) == AT                      # no trajectory started after the signal
    assert word in one_line(err) and "Exception ignored" not in err
    assert load(run).trajectory == AT and leftovers(str(tmp_path)) == []
    assert main(["run", run, "--no-progress"]) == 0
    assert fingerprint(run) == fingerprint(ref)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig,code,word", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_signal_turned_into_another_error_by_a_c_callback_still_ends_as_the_signal(monkeypatch, tmp_path, capsys, sig,
                                                                                   code, word):
    """The handler's exception raised inside a C extension's callback can come out as another error (CI's kill suite:
    h5py's attribute iteration, "SystemError: <cyfunction FastRLock.__exit__> returned a result with an exception
    set"). hmc.guard.signal_exception turns it back into the signal's: exit 143 (130) in one line, the complete
    trajectories written, nothing left behind, the resumed run bitwise the uninterrupted one."""
    import hmc.guard as guard

    deck = tiny_deck(str(tmp_path), trajectories=TRAJ)
    ref, run = str(tmp_path / "ref.h5"), str(tmp_path / "run.h5")
    assert main(["init", deck, "-o", ref]) == 0 and main(["init", deck, "-o", run]) == 0
    assert main(["run", ref, "--no-progress"]) == 0
    real, calls = hmc.run.hmc_trajectory, []

    def trajectory(*a, **k):
        calls.append(1)
        if len(calls) == AT + 1:              # the signal lands in a C callback during this trajectory
            guard._received.append(sig)
            raise SystemError("<cyfunction FastRLock.__exit__> returned a result with an exception set")
        return real(*a, **k)

    capsys.readouterr()
    with monkeypatch.context() as m:
        m.setattr(hmc.run, "hmc_trajectory", trajectory)
        rc = main(["run", run, "--no-progress"])
    err = capsys.readouterr().err
    assert rc == code, err
    assert word in one_line(err) and "Traceback" not in err and "SystemError" not in err
    assert load(run).trajectory == AT and leftovers(str(tmp_path)) == []
    assert main(["run", run, "--no-progress"]) == 0
    assert fingerprint(run) == fingerprint(ref)


def test_an_error_without_a_signal_is_not_taken_for_one():
    import hmc.guard as guard

    with pytest.raises(SystemError):
        with guard.terminate_as_exception():
            raise SystemError("a real bug")
    with pytest.raises(Terminated):
        with guard.terminate_as_exception():
            guard._received.append(signal.SIGTERM)
            raise SystemError("the signal's exception, turned into another inside a C callback")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_during_interpreter_teardown_ends_with_the_works_status(tmp_path, sig):
    """A Ctrl-C or SIGTERM that lands after the command's work, in the interpreter's teardown (atexit; CI saw one in
    logging's shutdown): ``hmc`` exits at once with the work's status and prints no traceback."""
    import subprocess
    import sys

    from tests.conftest import ROOT
    missing = str(tmp_path / "missing.h5")
    # an atexit hook registered before hmc's own runs last, as a signal in the last moments of the teardown would
    hook = (f"import atexit, os, runpy, sys, time; atexit.register(lambda: (os.kill(os.getpid(), {int(sig)}), "
            f"time.sleep(2))); sys.argv = ['hmc', 'info', {missing!r}]; runpy.run_module('hmc', run_name='__main__')")
    p = subprocess.run([sys.executable, "-c", hook], capture_output=True, text=True, timeout=50,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=str(ROOT))
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1 and "hmc info: error" in p.stderr, p.stderr
