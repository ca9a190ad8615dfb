"""What keeps a run file safe while hmc writes it (docs/faults-kill-suite.md):

* one writer at a time: :class:`RunLock`, an exclusive ``flock`` on ``RUN.h5.lock`` beside the run file, held by
  ``hmc run`` for the whole run and by ``hmc init`` while it writes; the kernel drops it when its owner dies
  however it dies (kill -9 included), so a lock never outlives its process. Readers (``hmc info``) take no lock;
  the saves are atomic, so they always read a complete file;
* the failures found before the work: a folder that cannot be written (the lock file is the probe) and a file
  system without room for one checkpoint (:func:`check_room`);
* a failed write (full file system, quota, I/O error) in one line naming the file, the bytes needed and the free
  space, saying that the previous run file is intact (:func:`save_checkpoint`);
* SIGTERM during ``hmc run`` ends it like Ctrl-C: the trajectory under way is abandoned, the last complete one is
  written (:func:`terminate_as_exception`), exit 143 (128 + SIGTERM, what batch systems expect), Ctrl-C 130; one
  that Python swallowed (it landed in a GC callback) ends the run at the next safe point (:func:`stop_if_signalled`).
"""
from __future__ import annotations

import errno
import fcntl
import gc
import os
import shutil
import signal
import sys
import socket
import time
from contextlib import contextmanager

from . import runfile

LOCK_SUFFIX = ".lock"
EXIT_TERMINATED = 128 + signal.SIGTERM
#: a save failed inside libhdf5 (hmc.__main__ then skips the interpreter's teardown, which can crash in it)
failed_hdf5_write = False


class StorageError(runfile.RunFileError):
    """The file system refused a run file (read-only, full, failing): a runtime failure, exit 1."""


class RunLocked(runfile.RunFileError):
    """Another live process holds the run file's lock: exit 2, nothing touched."""


class Terminated(BaseException):
    """SIGTERM arrived (a BaseException like KeyboardInterrupt: no ``except Exception`` swallows it)."""


def _folder(path: str) -> str:
    return os.path.dirname(os.path.abspath(path)) or "/"


def _why(e: OSError) -> str:
    return os.strerror(e.errno) if e.errno else str(e).splitlines()[0]


def check_not_folder(path: str, option: str) -> None:
    """A run file named by a folder (``-o DIR``, ``hmc run DIR``) is refused before anything else."""
    if os.path.isdir(path):
        raise runfile.RunFileError(f"{option}{path} is a folder, not a run file: name a file in it, e.g. "
                                   f"{os.path.join(path, 'run.h5')}")


class RunLock:
    """An exclusive lock on ``path``: ``flock`` of ``path.lock`` (created if absent, its lines PID, host, command and
    start time, for the message of a refused second writer, removed on release). Creating it is also the check that
    the folder can be written. A file system without locks (ENOLCK, ENOTSUP) runs unlocked, with a warning."""

    def __init__(self, path: str, command: str, warn=None):
        self.path = os.fspath(path)
        self.lock_path = self.path + LOCK_SUFFIX
        self.command = command
        self.warn = warn
        self.fd = None

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()

    def acquire(self) -> None:
        while True:
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                fix = ("copy the run file to a folder you can write and run it there" if self.command == "hmc run"
                       else "write it into a folder you can write")
                raise StorageError(f"cannot write in the folder {_folder(self.path)} of {self.path} ({_why(e)}): "
                                   f"{fix}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = self._owner(fd)
                os.close(fd)
                raise RunLocked(f"{self.path} is in use by {owner} (lock {self.lock_path}): wait for that run to "
                                "end, or stop it, then try again") from None
            except OSError as e:
                os.close(fd)
                if e.errno not in (errno.ENOLCK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
                if self.warn:
                    self.warn(f"warning: the file system of {self.path} has no locks ({_why(e)}): nothing stops a "
                              "second hmc from writing it")
                return
            if self._still_named(fd):
                break
            os.close(fd)                   # its previous owner removed it between our open and flock: again
        self.fd = fd
        text = f"{os.getpid()}\n{socket.gethostname()}\n{self.command}\n{time.strftime('%Y-%m-%dT%H:%M:%S')}\n"
        try:
            os.ftruncate(fd, 0)
            os.write(fd, text.encode())
        except OSError:                    # a full file system: the lock holds all the same, its owner unnamed
            pass

    def _still_named(self, fd) -> bool:
        try:
            return os.fstat(fd).st_ino == os.stat(self.lock_path).st_ino
        except FileNotFoundError:
            return False

    def _owner(self, fd) -> str:
        try:
            pid, host, command, since = os.pread(fd, 4096, 0).decode().splitlines()[:4]
            return f"'{command}' (PID {pid} on host {host}, since {since})"
        except (OSError, ValueError, UnicodeDecodeError):
            return "another process (its PID and host unrecorded)"

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.lock_path)      # while still holding it: a waiting opener sees the name gone and retries
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None


@contextmanager
def locked(path: str, command: str, warn=None):
    """The run file's lock on rank 0 of an MPI job (one writer per job), its outcome shared by every rank, so a
    refusal is the same one-line error on all of them."""
    from comms import world

    comm = world()
    lock, err = None, None
    if comm.rank == 0:
        lock = RunLock(path, command, warn)
        try:
            lock.acquire()
        except runfile.RunFileError as e:
            err = (type(e).__name__, str(e))
        if err is None and lock.fd is not None:
            discard_killed_saves(path)
    err = comm.bcast(err, root=0)
    if err is not None:
        raise {"StorageError": StorageError, "RunLocked": RunLocked}.get(err[0], runfile.RunFileError)(err[1])
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()


def discard_killed_saves(path: str) -> list[str]:
    """Remove the temporary files that saves of the run file ``path`` and of its kept configurations left
    (``PATH.tmp.PID``, ``STEM.trajN.ildg.tmp.PID``: a run killed in a save, e.g. by the launcher's SIGKILL), whatever
    their PID; the names removed. Called by the holder of the run file's lock, the only writer, so none of them is
    a save under way (``lattice.io.common.remove_stale_temporaries``, which readers use, keeps those whose PID is
    alive: a PID reused since, or on another host of a shared file system, kept such a file forever)."""
    from .kept_configs import kept_path

    from lattice.io.common import remove_temporaries

    path = os.path.abspath(os.fspath(path))
    base = os.path.basename(path)
    kept = os.path.basename(kept_path(path, 0))[:-len("0.ildg")]        # RUN.traj

    def ours(stem, _pid):
        return stem == base or (stem.startswith(kept) and stem.endswith(".ildg")
                                and stem[len(kept):-len(".ildg")].isdigit())

    return remove_temporaries(os.path.dirname(path), ours)


def checkpoint_bytes(state: runfile.RunState, more_rows: int = 0) -> int:
    """About the size of the run file of ``state`` (plus ``more_rows`` history rows): links, texts, history, and
    64 KiB for HDF5's metadata and the attributes."""
    rows = len(state.history) + more_rows
    cols = max((len(state.history[0]) if state.history else 40), 40)
    texts = len(state.deck_text.encode()) + sum(len(t.encode()) for t in state.files.values())
    return int(state.links.nbytes + texts + 8 * rows * cols + 65536)


def check_room(path: str, needed: int) -> None:
    """Refuse before the work when the folder of ``path`` has less than ``needed`` bytes free (a save writes the
    new file beside the old one)."""
    free = shutil.disk_usage(_folder(path)).free
    if free < needed:
        raise StorageError(f"no room for a checkpoint of {path}: it needs about {needed} bytes, {_folder(path)} "
                           f"has {free} free: free some space, or run from a copy elsewhere")


def _previous(path: str) -> str:
    """What remains of ``path`` after a failed save: the save renames only a complete file, so the old one."""
    if not os.path.exists(path):
        return f"{path} was not written"
    try:
        with runfile.open_file(path) as f:
            traj = int(f.attrs["trajectory"])
        return f"the previous {path} is intact (trajectory {traj}; 'hmc run {path}' resumes it)"
    except Exception:                      # what we can say without reading it whole
        return f"the previous {path} is untouched"


def _attempt_save(path, state):
    """runfile.save; the OSError or RuntimeError (libhdf5 reports some failed writes so, on closing) it raised, its
    traceback dropped, or None. libhdf5's complaints about the objects of a failed file, printed to stderr as they
    are freed, are silenced."""
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        try:
            runfile.save(path, state)
        except (OSError, RuntimeError) as e:
            global failed_hdf5_write
            failed_hdf5_write = True
            e.__traceback__ = None
            failure = e
        else:
            return None
        gc.collect()
        return failure
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def save_checkpoint(path: str, state: runfile.RunState) -> None:
    """:func:`hmc.runfile.save`, a failed write (ENOSPC, EDQUOT, EIO, ...) turned into one StorageError line."""
    e = _attempt_save(path, state)
    if e is not None:
        reason = _storage_failure(path, path, e, checkpoint_bytes(state), "a checkpoint")
        raise StorageError(f"{reason}; {_previous(path)}") from None


def _storage_failure(what: str, path: str, e: Exception, needed: int, subject: str = "it") -> str:
    """The one-line reason of a failed write of ``path``: ``writing WHAT failed (why): SUBJECT needs about N bytes,
    FOLDER has F bytes free``."""
    try:
        free = shutil.disk_usage(_folder(path)).free
    except OSError:
        free = None
    why = _why(e) if isinstance(e, OSError) and e.errno else (
        os.strerror(errno.ENOSPC) if free is not None and free < needed else str(e).splitlines()[0])
    has = f"{free} bytes free" if free is not None else "its free space unknown"
    return f"writing {what} failed ({why}): {subject} needs about {needed} bytes, {_folder(path)} has {has}"


def save_kept(run_path: str, u, trajectory: int, name: str, recorded: int) -> None:
    """Write trajectory ``trajectory``'s kept configuration (:func:`hmc.kept_configs.write_kept`, collective: an
    atomic, durable write through ``PATH.tmp.PID`` as the run file's), a failed write turned into one StorageError
    line on every rank; ``recorded``: the trajectory the run file holds, which stays intact."""
    from lattice.io import GaugeFileError

    from .kept_configs import kept_path, write_kept

    out = kept_path(run_path, trajectory)
    try:
        write_kept(run_path, u, trajectory, name)
    except (OSError, GaugeFileError) as e:       # GaugeFileError: rank 0's OSError, as the other ranks hear it
        e.__traceback__ = None
        needed = u.geom.volume * 4 * 9 * 16 + 8192     # the 64-bit links and the LIME records around them
        raise StorageError(f"{_storage_failure(f'the kept configuration {out}', out, e, needed)}; {out} was not "
                           f"written and {run_path} keeps trajectory {recorded} intact ('hmc run {run_path}' resumes "
                           "it)") from None


def discard_own_temporary(path: str) -> None:
    """Remove this process's ``PATH.tmp.PID`` (runfile.save's name for the file it writes) after an interrupted
    save: a signal that lands in the save's own cleanup can leave it, and no one else writes it."""
    try:
        os.unlink(f"{os.fspath(path)}.tmp.{os.getpid()}")
    except OSError:
        pass


#: the stop signals received while :func:`terminate_as_exception` listens, in order (their handler records them
#: before it raises: an exception raised inside a GC or weakref callback is swallowed by Python)
_received: list[int] = []


def _raise_terminated(signum, frame):
    _received.append(signum)
    raise Terminated()


def _raise_interrupted(signum, frame):
    _received.append(signum)
    raise KeyboardInterrupt()


def stop_if_signalled() -> None:
    """At a safe point of ``hmc run`` (before and after every trajectory): raise the exception of a SIGTERM
    (:class:`Terminated`) or SIGINT (KeyboardInterrupt) that arrived meanwhile. The handlers raise it at once, but
    Python swallows an exception raised inside a GC or weakref callback (it reaches ``sys.unraisablehook`` and the
    interrupted code goes on), so the signal is also recorded and acted on here: the run ends before its next
    trajectory, the last complete one written, instead of running on to its end."""
    if _received:
        raise Terminated() if _received[0] == signal.SIGTERM else KeyboardInterrupt()


@contextmanager
def terminate_as_exception():
    """SIGTERM raises :class:`Terminated` in the main thread while the block runs and SIGINT KeyboardInterrupt (as
    Python's own handler does), both recorded for :func:`stop_if_signalled`, so ``hmc run`` can end at a clean
    point instead of dying mid-write."""
    _received.clear()
    old = {signal.SIGTERM: signal.signal(signal.SIGTERM, _raise_terminated)}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:    # not when Ctrl-C is ignored (nohup, &)
        old[signal.SIGINT] = signal.signal(signal.SIGINT, _raise_interrupted)
    old_hook = sys.unraisablehook

    def hook(u):                 # a signal landing in a GC callback: swallowed, acted on later; print no traceback
        if not isinstance(u.exc_value, (Terminated, KeyboardInterrupt)):
            old_hook(u)

    sys.unraisablehook = hook
    try:
        yield
    except Exception as e:
        stop = signal_exception()
        if stop is None:
            raise
        raise stop from e
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        sys.unraisablehook = old_hook
        _received.clear()


def signal_exception():
    """The exception of the stop signal received (Terminated for SIGTERM, KeyboardInterrupt for SIGINT), or None.
    What to raise when another error ends the work after a signal came: a handler's exception raised inside a C
    extension's callback can come out as a different error (h5py's attribute iteration: "SystemError: <cyfunction
    FastRLock.__exit__> returned a result with an exception set", seen in CI's kill suite), and the signal, not
    that error, is what ended the run."""
    if not _received:
        return None
    return Terminated() if _received[0] == signal.SIGTERM else KeyboardInterrupt()


@contextmanager
def signals_deferred():
    """SIGINT and SIGTERM ignored while the block runs: the last save after an interruption is not itself cut."""
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
