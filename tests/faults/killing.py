"""Helpers of the fault tests: the tiny pure-gauge deck, hmc launched as a process (on one rank or under mpiexec),
what a run file holds that must come out bitwise equal, and the leftovers a run must not leave."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time

import numpy as np

from hmc.runfile import load
from tests.conftest import ROOT, launch_env

# 4^4 Wilson, hot start: about 0.1 s a trajectory on one core
TINY = """
[run]
name = "fault suite 4^4"
seed = 11
trajectories = {trajectories}
warmups = 2
start = "hot"
checkpoint_every = {every}
[lattice]
dims = [4, 4, 4, 4]
[gauge]
action = "wilson"
beta = 5.7
[integrator]
scheme = "omelyan"
steps = 4
"""


def tiny_deck(folder, trajectories=8, every=1, name="tiny.toml") -> str:
    p = os.path.join(folder, name)
    with open(p, "w") as f:
        f.write(TINY.format(trajectories=trajectories, every=every))
    return p


def hmc_argv(*args, ranks: int = 1, transport: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "hmc", *args]
    if ranks == 1:
        return cmd
    mpiexec = shutil.which("mpiexec") or os.path.join(os.path.dirname(sys.executable), "mpiexec")
    extra = ["--transport", transport] if transport else []
    return [mpiexec, "--oversubscribe", "-n", str(ranks), *cmd[:3], *extra, *args]


def start(*args, ranks=1, transport=None, env=None, **kw) -> subprocess.Popen:
    """hmc ARGS as a process of its own group (so that a signal can reach the whole job, as a terminal's would)."""
    return subprocess.Popen(hmc_argv(*args, ranks=ranks, transport=transport), cwd=ROOT, env=launch_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **kw)


def hmc(*args, ranks=1, transport=None, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(hmc_argv(*args, ranks=ranks, transport=transport), cwd=ROOT, env=launch_env(env),
                          capture_output=True, text=True, timeout=timeout)


def fingerprint(path) -> dict:
    """What an exact resume must reproduce: the configuration's checksum, the generator state and the history rows
    without their wall-clock columns."""
    st = load(path)
    rng = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in st.rng.get("milc", {}).items()}
    rows = [{k: v for k, v in r.items() if not k.startswith("time_")} for r in st.history]
    return {"trajectory": st.trajectory, "links": hashlib.sha256(st.links.tobytes()).hexdigest(),
            "rng": (st.rng["seed"], st.rng["counters"], rng), "history": rows}


def leftovers(folder) -> list[str]:
    """Temporary files of saves and lock files still in ``folder``."""
    return sorted(n for n in os.listdir(folder) if ".tmp." in n or n.endswith(".lock"))


def wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 60.0) -> list[str]:
    """Read ``proc``'s stdout up to a line containing ``text``; the lines read."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"no line with {text!r} within {timeout} s: {''.join(lines)[-2000:]}")


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]
