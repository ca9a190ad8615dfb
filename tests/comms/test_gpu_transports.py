"""GPU halo transports (event, stream_gated over CUDA VMM buffers): every invariant of docs/halo-protocol.md that needs
a GPU. They launch ``tests/comms/cuda_checks.py`` (or this file as a script) under mpiexec themselves, with timeouts,
several ranks sharing the one GPU; with HMC_GPU_MPS=1 they run under MPS, started and stopped here (the line saying
whether it ran goes to HMC_GPU_REPORT_DIR/mps.txt when that is set). They skip where no GPU is visible (CI).
test_legacy_ipc_allocation (HMC_P2P_ALLOC=legacy, comms/cuda/ipc.py) was written without device time and has not
yet run on a GPU.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, launch_env

pytestmark = [pytest.mark.gpu, pytest.mark.mpi]

MPIEXEC = shutil.which("mpiexec")
CHECKS = Path(__file__).with_name("cuda_checks.py")      # the multi-rank checks, run as a script
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec is not on PATH")
TIMEOUT = int(os.environ.get("HMC_GPU_TEST_TIMEOUT", "150"))


@pytest.fixture(scope="module")
def mps():
    """MPS for the module's launches when HMC_GPU_MPS=1 (its environment variables), else an empty dict."""
    want = os.environ.get("HMC_GPU_MPS", "0") == "1"
    if not want:
        yield {}
        return
    from comms.cuda.mps import Mps

    m = Mps(True).start()
    yield m
    m.poll_servers()
    line = m.line()
    m.stop()
    rep = os.environ.get("HMC_GPU_REPORT_DIR")
    if rep:
        Path(rep).mkdir(parents=True, exist_ok=True)
        with open(Path(rep, "mps.txt"), "a") as f:
            f.write(line + "\n")


def _env(mps, extra=None):
    return launch_env({"HMC_COMMS_TIMEOUT": "60", **(mps.vars if mps else {}), **(extra or {})})


def launch(n, args, mps, env=None, check=True):
    cmd = [MPIEXEC, "--oversubscribe", "-n", str(n), sys.executable] + args
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(mps, env), timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{' '.join(cmd)} timed out after {TIMEOUT} s\nstdout:\n{(e.stdout or b'')[-3000:]!r}\n"
                             f"stderr:\n{(e.stderr or b'')[-3000:]!r}") from None
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\nstdout:\n{r.stdout[-4000:]}\n"
                             f"stderr:\n{r.stderr[-4000:]}")
    return r


def checks(n, case, out, mps, *opts, env=None, check=True):
    return launch(n, [str(CHECKS), case, str(out)] + list(opts), mps, env, check)


def _keep(tmp_path, name):
    rep = os.environ.get("HMC_GPU_REPORT_DIR")
    if rep:
        Path(rep).mkdir(parents=True, exist_ok=True)
        for p in Path(tmp_path).glob("*.json"):
            shutil.copy(p, Path(rep, f"{name}_{p.name}"))


HALO_CASES = [(2, "1x1x1x2", "4x4x4x8", ""), (2, "1x1x1x2", "4x4x4x8", "xt"), (4, "1x1x2x2", "4x4x8x8", ""),
              (4, "2x1x1x2", "8x4x4x8", "")]


@needs_mpi
@pytest.mark.parametrize("n,grid,lattice,partition", HALO_CASES)
def test_halo_bitwise_equal_to_mpi(tmp_path, mps, n, grid, lattice, partition):
    """event and stream_gated halos (depth 1 and 3, pipelined, two outstanding, NumPy faces, grown buffers) are
    bitwise mpi's; the registry is empty after close."""
    opts = ["--grid", grid, "--lattice", lattice] + (["--partition", partition] if partition else [])
    checks(n, "halo", tmp_path, mps, *opts)
    rep = json.loads(Path(tmp_path, "halo.json").read_text())
    _keep(tmp_path, f"halo_{n}_{grid}_{partition or 'none'}")
    assert rep["links"]["stream_gated"] == ["stream_gated"]
    assert rep["links"]["event"] == ["event"]
    assert rep["registry_after_close"] == []


@needs_mpi
def test_fabric_fallback_and_flush_notices(tmp_path, mps):
    """Fabric allocation falls back to POSIX fds with a logged reason; remote_write is disabled with one line where
    the device cannot FLUSH remote writes."""
    r = checks(2, "halo", tmp_path, mps, "--transports", "stream_gated", "--iters", "4")
    rep = json.loads(Path(tmp_path, "halo.json").read_text())
    notes = rep["notices"]["stream_gated"]
    fabric = [x for x in notes if "fabric" in x]
    assert len(fabric) == 1, notes
    assert "falling back to POSIX file descriptors" in fabric[0] or "fabric handles" in fabric[0]
    if "falling back" in fabric[0]:
        assert "CUDA_ERROR_" in fabric[0]
        assert fabric[0] in r.stderr                       # logged once, by rank 0
    assert r.stderr.count("fabric handle unavailable") <= 1
    flush = [x for x in notes if "remote_write" in x]
    assert len(flush) <= 1 and all("\n" not in x for x in notes)


@needs_mpi
def test_forced_flush_reports_the_driver(tmp_path, mps):
    r = checks(2, "flush", tmp_path, mps, env={"HMC_P2P_FORCE_FLUSH": "1"})
    rep = json.loads(Path(tmp_path, "flush.json").read_text())
    _keep(tmp_path, "flush")
    lines = [x for x in r.stderr.splitlines() if "HMC_P2P_FORCE_FLUSH=1" in x]
    assert len(lines) == 1, r.stderr
    assert rep["flush_answer"] and rep["flush_answer"] in lines[0]
    assert ("remote_write enabled (forced)" in lines[0]) == (rep["policy"] == "remote_write")
    assert rep["correct"]


@needs_mpi
@pytest.mark.parametrize("env,grid,lattice,expect", [
    ({"HMC_P2P_MASK": "8"}, "1x1x2x2", "4x4x8x8", {"z": "p2p", "t": "mpi"}),
    ({"HMC_P2P_FAKE_CLIQUE": "2"}, "1x1x1x4", "4x4x4x16", {"t": "mixed"}),
])
def test_masked_dimension_and_fake_clique_mix_links(tmp_path, mps, env, grid, lattice, expect):
    checks(4, "halo", tmp_path, mps, "--grid", grid, "--lattice", lattice, "--iters", "12", env=env)
    rep = json.loads(Path(tmp_path, "halo.json").read_text())
    _keep(tmp_path, "mixed_" + "_".join(env))
    for tr in ("event", "stream_gated"):
        assert set(rep["links"][tr]) == {"mpi", tr}, rep["links"]
        for rank_links in rep["tables"][tr]:
            for link, kind in rank_links.items():
                want = expect.get(link[0])
                if want == "p2p":
                    assert kind == tr
                elif want == "mpi":
                    assert kind == "mpi"
    if "HMC_P2P_FAKE_CLIQUE" in env:
        # ranks 0,1 | 2,3: the link 1 -> 2 and 3 -> 0 (wrapping) are mpi, 0 <-> 1 peer-to-peer
        t = rep["tables"]["stream_gated"]
        assert t[0]["t+"] == "stream_gated" and t[1]["t+"] == "mpi" and t[2]["t-"] == "mpi" and t[0]["t-"] == "mpi"


@needs_mpi
@pytest.mark.parametrize("transport", ["stream_gated", "event"])
def test_split_grid(tmp_path, mps, transport):
    checks(4, "split", tmp_path, mps, "--grid", "1x1x2x2", "--lattice", "4x4x8x8", "--split", "1x1x1x2",
           "--transport", transport)
    rep = json.loads(Path(tmp_path, "split.json").read_text())
    _keep(tmp_path, f"split_{transport}")
    assert sorted(set(rep["sub_exchanges"])) == [1, 2]
    assert rep["registry_after_close"] == []


@needs_mpi
def test_graph_replays_give_the_uncaptured_answer(tmp_path, mps):
    checks(2, "graph", tmp_path, mps, "--L", "4", "--replays", "1000")
    rep = json.loads(Path(tmp_path, "graph_L4.json").read_text())
    _keep(tmp_path, "graph")
    assert rep["replays"] == 1000
    assert rep["credit_free"] and "not in graph mode" in rep["refused"], rep     # the default (HMC_P2P_CREDIT_FREE)


@needs_mpi
def test_geometry_shift_on_cupy(tmp_path, mps):
    """Geometry.shift / halo on the cupy backend with a partitioned grid through stream_gated: bitwise the
    single-process shift."""
    launch(2, [str(Path(__file__)), "geometry", str(tmp_path)], mps)


LEGACY = {"HMC_P2P_ALLOC": "legacy"}
LEGACY_NOTE = "as asked (HMC_P2P_ALLOC=legacy)"


@needs_mpi
def test_legacy_ipc_allocation(tmp_path, mps):
    """HMC_P2P_ALLOC=legacy: the segments are cuMemAlloc allocations shared by CUDA IPC handles (comms/cuda/ipc.py).
    Halos through event and stream_gated (depth 1 and 3, pipelined, two outstanding, NumPy faces, grown buffers) are
    bitwise mpi's; the transport table says ``legacy`` on every peer-to-peer link; push/pop re-opens the mappings;
    a graph-captured stream-gated round trip replays right on IPC memory; the registry is empty at teardown.
    NOT YET RUN ON A GPU: written in a session without device time (``hmc bench suite transports --steps 'legacy*,pytest legacy'``)."""
    r = checks(2, "halo", tmp_path, mps, "--grid", "1x1x1x2", "--lattice", "4x4x4x8", "--partition", "xt",
               "--iters", "12", env=LEGACY)
    rep = json.loads(Path(tmp_path, "halo.json").read_text())
    _keep(tmp_path, "legacy_halo")
    assert rep["links"]["stream_gated"] == ["stream_gated"] and rep["links"]["event"] == ["event"]
    assert rep["registry_after_close"] == []
    for tr in ("event", "stream_gated"):
        notes = rep["notices"][tr]
        assert [n for n in notes if "legacy CUDA IPC" in n and LEGACY_NOTE in n], notes
        assert not [n for n in notes if "fabric" in n], notes            # VMM not tried at all
    assert r.stderr.count(LEGACY_NOTE) == 1                              # printed once, by rank 0
    # the table, the kinds of the live objects, growth and re-mapping (this file in script mode)
    launch(2, [str(Path(__file__)), "legacy", str(tmp_path)], mps, env=LEGACY)
    rep = json.loads(Path(tmp_path, "legacy.json").read_text())
    _keep(tmp_path, "legacy_table")
    assert rep["alloc"] == {"stream_gated": ["legacy"], "event": ["legacy"]}
    assert rep["registry_after_close"] == []
    # split grid (push/pop: mappings closed and re-opened) and graph replays over IPC-mapped slots
    checks(4, "split", tmp_path, mps, "--grid", "1x1x2x2", "--lattice", "4x4x8x8", "--split", "1x1x1x2",
           "--transport", "stream_gated", env=LEGACY)
    rep = json.loads(Path(tmp_path, "split.json").read_text())
    assert sorted(set(rep["sub_exchanges"])) == [1, 2] and rep["registry_after_close"] == []
    checks(2, "graph", tmp_path, mps, "--L", "4", "--replays", "100", env=LEGACY)
    rep = json.loads(Path(tmp_path, "graph_L4.json").read_text())
    _keep(tmp_path, "legacy_graph")
    assert rep["replays"] == 100


# --------------------------------------------------------------------------------------------------------------
# script mode (under mpiexec): the Geometry check, the legacy IPC check

def _geometry(out):
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from comms import ProcessGrid
    from comms.grid import _SingleComm
    from lattice import Geometry
    from lattice.backend import get_backend

    dims = (4, 4, 4, 8)
    rng = np.random.default_rng(3)
    f = rng.normal(size=(8, 4, 4, 4, 3)) + 1j * rng.normal(size=(8, 4, 4, 4, 3))
    ref = Geometry(dims, backend=get_backend("numpy"),
                   grid=ProcessGrid((1, 1, 1, 1), comm=_SingleComm(), partitioned=(False,) * 4))
    be = get_backend("cupy")
    for tr in ("stream_gated", "event"):
        grid = ProcessGrid((1, 1, 1, 2), partitioned="xt", transport=tr)
        g = Geometry(dims, backend=be, grid=grid)
        loc = be.xp.asarray(g.local_part(f))
        for mu in (0, 3):
            for k in (1, -1, 3, -3, 5):
                got = be.to_numpy(g.shift(loc, mu, k))
                if not np.array_equal(got, g.local_part(ref.shift(f, mu, k))):
                    raise SystemExit(f"rank {grid.rank}: {tr} Geometry.shift mu={mu} k={k} differs")
        h = g.halo(loc, 2)
        for (mu, side), a in h.items():
            axis = 3 - mu
            n = g.local_dims[mu]
            want = np.roll(f, -n, axis=axis) if side == 1 else np.roll(f, 2, axis=axis)
            sl = [slice(None)] * 4
            sl[axis] = slice(0, 2)
            if not np.array_equal(be.to_numpy(a), g.local_part(want)[tuple(sl)]):
                raise SystemExit(f"rank {grid.rank}: {tr} Geometry.halo ({mu},{side}) differs")
        grid.close()
    Path(out, "geometry.json").write_text(json.dumps({"ok": True}))


def _legacy(out):
    """Under HMC_P2P_ALLOC=legacy (set by the caller): every peer-to-peer link of the table says ``legacy``; the
    segment and the peer mappings are IPC objects, registered while alive; faces of a known value arrive right,
    also after the segments grew (freed, re-allocated, re-opened); nothing is left registered after close."""
    import cupy as cp
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from comms import ProcessGrid, world
    from comms.cuda import ipc, vmm

    comm = world()
    rep = {"alloc": {}, "rows": {}}
    for tr in ("stream_gated", "event"):
        grid = ProcessGrid((1, 1, 1, comm.size), partitioned="t", transport=tr)
        eng = grid.halo
        rows = grid.transport_table(everywhere=True)
        rep["alloc"][tr] = sorted({r["alloc"] for r in rows if r["transport"] != "mpi"})
        rep["rows"][tr] = rows
        if eng.alloc_kind != "legacy" or not isinstance(eng.seg, ipc.IpcAllocation):
            raise SystemExit(f"rank {grid.rank}: {tr}: allocation {eng.alloc_kind}, segment {type(eng.seg).__name__}")
        if not eng.peer_maps or not all(isinstance(m, ipc.IpcMapping) for m in eng.peer_maps.values()):
            raise SystemExit(f"rank {grid.rank}: {tr}: peer mappings {eng.peer_maps}")
        live = vmm.leaked(eng.serial)
        if not any("own cuMemAlloc allocation" in t for t in live) or not any("IPC mapping" in t for t in live):
            raise SystemExit(f"rank {grid.rank}: {tr}: registry while alive: {live}")
        down, up = grid.neighbours[3]
        for n in (16, 300000):                           # the second grows the segments: free, re-allocate, re-open
            for i in range(6):
                got = eng.start({(3, 0): cp.full(n, 1000.0 * grid.rank + i),
                                 (3, 1): cp.full(n, -1000.0 * grid.rank - i)}).finish()
                back = cp.asnumpy(got[(3, 1)])           # from the forward neighbour's backward send
                ahead = cp.asnumpy(got[(3, 0)])          # from the backward neighbour's forward send
                if not (np.all(back == 1000.0 * up + i) and np.all(ahead == -1000.0 * down - i)):
                    raise SystemExit(f"rank {grid.rank}: {tr}: legacy halo {n} values, exchange {i}: got "
                                     f"{back[:2]}, {ahead[:2]} (neighbours {down}, {up})")
        grid.close()
        if vmm.leaked():
            raise SystemExit(f"rank {comm.rank}: {tr}: registry after close: {vmm.leaked()}")
    rep["registry_after_close"] = vmm.leaked()
    if comm.rank == 0:
        Path(out, "legacy.json").write_text(json.dumps(rep, indent=1, default=str))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "geometry":
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        _geometry(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "legacy":
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        _legacy(sys.argv[2])
