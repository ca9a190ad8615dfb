"""Long, independent runs that tests start in the background when the session's collection ends, at the lowest CPU
priority (``nice -n 19``), so that they use the core the serial suite leaves idle (CI: two cores, one pytest
process; most tests keep one core busy). A test file registers a run under the name of the fixture that needs it
(:func:`register`); the run starts when a collected test uses that fixture and the test takes its outcome through
:func:`result`, waiting for it if it has not ended. Every check stays in the test: the background only moves when
the runs happen. Runs go one after another in one thread (each may launch several processes, e.g.
``hmc check --milc --jobs 2``), each in its own process group under a guard (this file run as a script) that
ends the group (SIGTERM) when the pytest process is gone, even killed with -9; at the end of the session a run still
going is ended the same way. ``tests/conftest.py`` calls :func:`start` and :func:`stop`.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass
class Finished:
    """A background run's outcome: its folder, the command, exit status and output (stdout and stderr)."""
    folder: Path
    command: list
    returncode: int
    stdout: str
    stderr: str


@dataclass
class _Job:
    name: str
    command: Callable            # command(folder) -> argv (may raise, e.g. pytest.skip: re-raised by result)
    env: dict | None
    order: str
    done: threading.Event
    queued: bool = False         # handed to the background thread
    outcome: object = None       # a Finished, or the exception command() raised


_JOBS: dict[str, _Job] = {}
_STATE = {"root": None, "thread": None, "process": None, "running": None, "stopping": False}
_LOCK = threading.Lock()


def register(name: str, command: Callable, env: dict | None = None, order: str | None = None) -> None:
    """Register the run that fixture ``name`` needs: ``command(folder)`` gives its argv, run with ``folder`` (empty,
    the run's own) as working directory and ``env`` as environment (default: this process's). Runs start in the
    order of ``order`` (default ``name``): the name of the first test file that needs it, as pytest runs them."""
    if name not in _JOBS:
        _JOBS[name] = _Job(name, command, env, order or name, threading.Event())


def _run(job: _Job, folder: Path) -> None:
    try:
        argv = job.command(folder)
        nice = ["nice", "-n", "19"] if shutil.which("nice") else []
        guard = [sys.executable, os.path.abspath(__file__), str(os.getpid())]
        with _LOCK:
            if _STATE["stopping"]:
                raise RuntimeError("the session ended before this background run started")
            p = subprocess.Popen(nice + guard + list(argv), cwd=folder, env=job.env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
            _STATE["process"], _STATE["running"] = p, job.name
        out, err = p.communicate()
        job.outcome = Finished(folder, list(argv), p.returncode, out, err)
    except BaseException as e:          # noqa: BLE001  (pytest's Skipped is a BaseException: handed to the test)
        job.outcome = e
    finally:
        job.done.set()


def _run_all(jobs: list) -> None:
    for job in jobs:
        folder = Path(_STATE["root"]) / job.name
        folder.mkdir()
        _run(job, folder)


def start(items) -> None:
    """Start, in one background thread, the registered runs that a collected test (``items``) needs: it uses the
    fixture, or names it as a parameter (for ``request.getfixturevalue``)."""
    wanted = {n for item in items for n in getattr(item, "fixturenames", ())}
    wanted |= {v for item in items for v in getattr(getattr(item, "callspec", None), "params", {}).values()
               if isinstance(v, str)}
    jobs = sorted((j for n, j in _JOBS.items() if n in wanted and not j.done.is_set()), key=lambda j: j.order)
    if not jobs or _STATE["thread"] is not None:
        return
    for j in jobs:
        j.queued = True
    _STATE["root"] = tempfile.mkdtemp(prefix="hmc-tests-background-")
    _STATE["thread"] = threading.Thread(target=_run_all, args=(jobs,), name="tests-background", daemon=True)
    _STATE["thread"].start()


def result(name: str) -> Finished:
    """The outcome of run ``name``, waiting for it; started here (in the foreground) if it was not started."""
    job = _JOBS[name]
    if not job.queued and not job.done.is_set():
        _STATE["root"] = _STATE["root"] or tempfile.mkdtemp(prefix="hmc-tests-background-")
        folder = Path(_STATE["root"]) / name
        folder.mkdir(exist_ok=True)
        _run(job, folder)
    if not job.done.is_set():
        _hurry(name)
    job.done.wait()
    if isinstance(job.outcome, BaseException):
        raise job.outcome
    return job.outcome


def _hurry(name: str) -> None:
    """A test waits for run ``name``: the run's processes back to normal priority where this user may raise it
    (root; elsewhere they keep nice 19, which only matters while other work competes for the cores)."""
    with _LOCK:
        p = _STATE["process"]
        if _STATE["running"] != name or p is None or p.poll() is not None:
            return
        try:
            os.setpriority(os.PRIO_PGRP, p.pid, 0)        # the guard leads the group: every process of the run
        except OSError:
            pass


def stop() -> None:
    """End the session's background work: the running process group gets SIGTERM; the folders are removed."""
    with _LOCK:
        _STATE["stopping"] = True
        p = _STATE["process"]
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    if _STATE["thread"] is not None:
        _STATE["thread"].join(timeout=30)
    if _STATE["root"] is not None:
        shutil.rmtree(_STATE["root"], ignore_errors=True)


def _guard(parent: int, argv: list) -> int:
    """Run ``argv`` in this process group (its leader: started with a new session) and end the group when process
    ``parent`` (the pytest process) is gone or this guard gets SIGTERM; the command's exit status."""
    p = subprocess.Popen(argv)

    def end_group(*_):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(0, signal.SIGTERM)
        sys.exit(143)

    signal.signal(signal.SIGTERM, end_group)
    while p.poll() is None:
        if os.getppid() != parent and not _alive(parent):
            end_group()
        time.sleep(0.5)
    return p.returncode


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


if __name__ == "__main__":
    sys.exit(_guard(int(sys.argv[1]), sys.argv[2:]))
