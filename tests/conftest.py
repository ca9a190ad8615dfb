import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fixture_paths import FIXTURES  # noqa: E402  (also when a worker imports tests.conftest outside pytest)


def fixture_path(name: str) -> Path:
    """A MILC reference file from ../shared/fixtures/milc/, or skip the test saying why."""
    p = FIXTURES / name
    if not p.exists():
        pytest.skip(f"MILC fixture {p} is absent (the shared fixtures folder ../shared/fixtures/milc/ is needed)")
    return p


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with CuPy (run on the device machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cli_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("HMC_FAULT_INJECT", None)
    return env


@pytest.fixture(autouse=True)
def _restore_cli_environment():
    """The CLI hands --grid, --transport and --backend to every ProcessGrid / backend of the process through the
    environment; a test that calls hmc.cli.main in-process must not leave them to the tests after it."""
    keys = ("HMC_GRID", "HMC_P2P_TRANSPORT", "HMC_BACKEND", "HMC_PARTITION")
    saved = {k: os.environ.get(k) for k in keys}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# settings that steer a launched process's grid, transports, backend, faults and sums: a test states its own
LAUNCH_CLEARED = ("HMC_GRID", "HMC_P2P_TRANSPORT", "HMC_P2P_MASK", "HMC_P2P_FAKE_CLIQUE", "HMC_P2P_FORCE_FLUSH",
                  "HMC_P2P_DATA", "HMC_P2P_ALLOC", "HMC_P2P_FABRIC", "HMC_PARTITION", "HMC_COMMS_TIMEOUT",
                  "HMC_FAULT_INJECT", "HMC_MPIEXEC", "HMC_BACKEND", "HMC_SOLVER_SUMS")


def launch_env(extra=None) -> dict:
    """The environment of a process a test launches (mpiexec or python): this one's, without the settings in
    LAUNCH_CLEARED, with Open MPI allowed as root and its osc/ucx component off, the project on PYTHONPATH, unbuffered
    output; then ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_CLEARED}
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_osc": "^ucx",
                "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""), "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def numpy_simd_pinned() -> dict:
    """The environment that keeps NumPy's loops on its AVX2 (X86_V3) kernels on a machine with AVX-512: for the runs
    compared with MILC's stored outputs. NumPy picks its SIMD kernels by the CPU, and the AVX-512 ones round complex
    products differently (fused multiply-adds); through a few chaotic trajectories that moves MILC's f211.2 PBP line
    by 1.67 x MILC's errtol (6e-8, below the 1e-7 its seven printed digits resolve), on AVX2 0.83 x
    (runs/milc/README.md). Only the kernels this CPU has are switched off (NumPy refuses others). OpenBLAS (NumPy's
    and SciPy's BLAS) is kept on its AVX2 kernels there too (``OPENBLAS_CORETYPE=Haswell``): on an Intel Sapphire
    Rapids its AVX-512 dot products moved the same PBP line to 5 x the errtol with NumPy pinned (2026-12-04)."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    above_v3 = [f for f in __cpu_dispatch__ if f not in ("X86_V2", "X86_V3") and __cpu_features__.get(f)]
    return {"NPY_DISABLE_CPU_FEATURES": " ".join(above_v3), "OPENBLAS_CORETYPE": "Haswell"} if above_v3 else {}


def keep_gpu_report(name: str, data) -> None:
    """Keep a GPU test's report for the device log: ``data`` (JSON-able) as HMC_GPU_REPORT_DIR/``name`` when that
    variable is set (the device suites of bench/suites.toml set it)."""
    rdir = os.environ.get("HMC_GPU_REPORT_DIR")
    if rdir:
        import json

        Path(rdir).mkdir(parents=True, exist_ok=True)
        Path(rdir, name).write_text(json.dumps(data, indent=1))


def run_mpi_worker(script, mode: str, out, n: int, grid: str, report: str, timeout: int = 300) -> dict:
    """Run ``script`` (a test file's worker: ``python script MODE OUT GRID``) on ``n`` ranks under mpiexec with one
    thread each and a timeout; return its report ``OUT/report`` (JSON), asserting the run and every rank passed
    (the report's ``fails``, written by :func:`write_worker_report`). Skips without mpiexec."""
    import json
    import shutil
    import subprocess

    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("mpiexec is not on PATH")
    cmd = [mpiexec, "--oversubscribe", "-n", str(n), sys.executable, str(script), mode, str(out), grid]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                       env=launch_env({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "HMC_COMMS_TIMEOUT": "60"}))
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    rep = json.loads(Path(out, report).read_text())
    assert rep["fails"] == [], rep["fails"]
    return rep


def write_worker_report(comm, out, report: str, rep: dict, fails: list) -> None:
    """A worker's end (collective): every rank's ``fails`` gathered into ``rep["fails"]`` and the report written
    as ``out/report`` by rank 0."""
    import json

    allf = comm.allgather(fails)
    if comm.rank == 0:
        rep["fails"] = [f"rank {k}: {f}" for k, fs in enumerate(allf) for f in fs]
        Path(out, report).write_text(json.dumps(rep, indent=1, default=str))


def pytest_collection_finish(session):
    """Start the background runs the collected tests need (tests/background.py)."""
    from tests import background

    background.start(session.items)


def pytest_sessionfinish(session):
    from tests import background

    background.stop()
