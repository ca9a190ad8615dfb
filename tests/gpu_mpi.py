"""The GPU tests' mpiexec launcher, MPS fixture and MPI marker (tests/comms/test_gpu_transports.py), importable
where that module is not: ``from tests.gpu_mpi import gpu_launch, mps, needs_mpi  # noqa: F401`` (mps is a
fixture, so it must be a name of the test module)."""
import pytest

try:
    from tests.comms.test_gpu_transports import launch as gpu_launch, mps, needs_mpi  # noqa: F401
except Exception:  # pragma: no cover - the GPU test module always imports
    gpu_launch = mps = None
    needs_mpi = pytest.mark.skip(reason="tests.comms.test_gpu_transports is unavailable")


def run_gpu_worker(script, out, mps, n: int, grid: str, report: str, keep_as: str) -> dict:  # noqa: F811
    """Launch ``script``'s GPU worker (``python script gpu OUT GRID``) on ``n`` ranks (under MPS where the fixture
    gives it), keep its report ``OUT/report`` under ``keep_as`` (HMC_GPU_REPORT_DIR) and return it, asserting that
    every rank passed and that it ran the three transports."""
    import json
    from pathlib import Path

    from tests.conftest import keep_gpu_report

    gpu_launch(n, [str(script), "gpu", str(out), grid], mps)
    rep = json.loads(Path(out, report).read_text())
    keep_gpu_report(keep_as, rep)
    assert rep["fails"] == [], rep["fails"]
    assert set(rep["transports"]) == {"mpi", "event", "stream_gated"}
    return rep
