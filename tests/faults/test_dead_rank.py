"""A dead rank: one rank of a 2-rank 'hmc run' killed (kill -9) or stopped (SIGSTOP: a hung node) mid-trajectory, on
the mpi and shm transports (and, on a GPU, event and stream_gated), with a short comms timeout. The job ends within the timeout (a killed rank: the
launcher ends the job; a stopped one: the survivor's wait times out, naming the silent rank and the link), and the
run file is intact and resumes."""
import os
import re
import signal
import time

import pytest

from hmc.runfile import load
from tests.faults.killing import hmc, start, tiny_deck, wait_for_line

TIMEOUT = 5


def _rank_pids(root: int) -> dict:
    """World rank -> pid of the processes below ``root`` (mpiexec) that Open MPI started as ranks."""
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        try:
            for t in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_RANK" in env and pid != root:
            out[int(env[b"OMPI_COMM_WORLD_RANK"])] = pid
    return out


#: CI: kill -9 on each transport, SIGSTOP on shm; HMC_DEAD_RANK_CASES=all (read only here) adds SIGSTOP on mpi
CASES = [(signal.SIGKILL, "mpi"), (signal.SIGKILL, "shm"), (signal.SIGSTOP, "shm")] + (
    [(signal.SIGSTOP, "mpi")] if os.environ.get("HMC_DEAD_RANK_CASES") == "all" else [])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how,transport", CASES)
def test_dead_rank_ends_the_job_within_the_timeout(tmp_path, transport, how):
    _kill_one_rank(tmp_path, transport, how)


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP])
@pytest.mark.parametrize("transport", ["event", "stream_gated"])
def test_dead_rank_on_the_gpu_transports(tmp_path, transport, how):
    pytest.importorskip("cupy")
    _kill_one_rank(tmp_path, transport, how, ("--backend", "cupy"))


def _kill_one_rank(tmp_path, transport, how, options=()):
    run = str(tmp_path / "c.h5")
    assert hmc(*options, "init", tiny_deck(str(tmp_path), trajectories=400), "-o", run).returncode == 0
    p = start(*options, "run", run, "--no-progress", ranks=2, transport=transport,
              env={"HMC_COMMS_TIMEOUT": str(TIMEOUT)})
    victim = None
    try:
        wait_for_line(p, "traj     2")
        victim = _rank_pids(p.pid)[1]
        os.kill(victim, how)
        t0 = time.monotonic()
        out, err = p.communicate(timeout=TIMEOUT + 60)
        took = time.monotonic() - t0
    finally:
        if victim is not None:
            for s in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(victim, s)
                except ProcessLookupError:
                    pass
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert p.returncode != 0 and "Traceback" not in err, err[-3000:]
    assert took < TIMEOUT + 5, (took, err[-2000:])
    if how == signal.SIGSTOP:                    # the survivor names the silent rank and the link
        # the receive or (mpi: the send's request) that waits on it first, whichever the timeout catches
        # (event: the host-side doorbell or credit wait; stream_gated: the watchdog of the device-side waits)
        named = (r"rank 0: (?:(?:no halo from|send to|no doorbell from) rank 1|rank 1 has not freed halo buffer \d)"
                 r" on link [xyzt][+-] \(" + transport + r"\)")
        assert re.search(named, err), err[-2000:]
    st = load(run)                                   # intact: opens, digest and rows agree
    assert [r["traj"] for r in st.history] == list(range(1, st.trajectory + 1))
    assert hmc(*options, "run", run, "--trajectories", "1", "--no-progress").returncode == 0   # and resumes
    assert [r["traj"] for r in load(run).history] == list(range(1, st.trajectory + 2))
