"""The allocation kind of the GPU halo segments (comms/cuda/alloc.py): fabric, POSIX-fd VMM or legacy CUDA IPC,
decided the same way on every rank of a node. Pure functions: no CuPy, no cuda-bindings, no GPU."""
from __future__ import annotations

import pytest

from comms.cuda import alloc
from comms.grid import CommsError

FABRIC_NO = ("comms: fabric handle unavailable (cuMemCreate with CU_MEM_HANDLE_TYPE_FABRIC: CUDA_ERROR_NOT_PERMITTED, "
             "no IMEX channel); falling back to POSIX file descriptors over a Unix socket")
H200 = alloc.rank_facts(1, False, FABRIC_NO, None)          # what the device machine shows: VMM, no IMEX channel
NVL = alloc.rank_facts(1, True, "comms: VMM buffers with fabric handles (CU_MEM_HANDLE_TYPE_FABRIC)", None)
NO_VMM = alloc.rank_facts(0)
NO_FD = alloc.rank_facts(1, False, FABRIC_NO, "cuMemExportToShareableHandle: CUDA_ERROR_NOT_SUPPORTED")


@pytest.mark.parametrize("text,want", [(None, "auto"), ("", "auto"), (" Legacy ", "legacy"), ("vmm", "vmm"),
                                       ("auto", "auto")])
def test_read_request(text, want):
    assert alloc.read_request(text) == want


def test_read_request_rejects_unknown_names_in_one_line():
    with pytest.raises(CommsError, match=r"HMC_P2P_ALLOC='cuda_ipc': use auto, vmm or legacy") as e:
        alloc.read_request("cuda_ipc")
    assert "\n" not in str(e.value)


def test_agree_needs_every_rank_to_ask_the_same():
    assert alloc.agree([None, "", "auto"]) == "auto"
    assert alloc.agree(["legacy", "LEGACY"]) == "legacy"
    with pytest.raises(CommsError, match=r"ranks disagree on HMC_P2P_ALLOC \(auto on rank 0, legacy on rank 2\)"):
        alloc.agree([None, "auto", "legacy"])
    with pytest.raises(CommsError, match=r"^rank 1: HMC_P2P_ALLOC='x'"):
        alloc.agree(["auto", "x"])


def test_device_machine_default_is_posix_fd_with_the_fabric_notice_only():
    kind, notes = alloc.resolve("auto", [H200, H200])
    assert kind == "posix_fd" and notes == [FABRIC_NO]
    assert alloc.resolve("vmm", [H200, H200]) == (kind, notes)


def test_fabric_where_every_rank_has_it():
    assert alloc.resolve("auto", [NVL, NVL, NVL]) == ("fabric", [NVL["fabric_note"]])


def test_fabric_on_some_ranks_only_means_posix_fd_for_all():
    kind, notes = alloc.resolve("auto", [NVL, H200])
    assert kind == "posix_fd" and notes == ["comms: ranks disagree on fabric handles: POSIX file descriptors for all"]


def test_legacy_when_asked_whatever_the_device():
    for facts in ([H200, H200], [NVL], [NO_VMM, H200]):
        kind, notes = alloc.resolve("legacy", facts)
        assert kind == "legacy"
        assert notes == ["comms: legacy CUDA IPC buffers (cuMemAlloc + cuIpcGetMemHandle / cuIpcOpenMemHandle), "
                         "as asked (HMC_P2P_ALLOC=legacy)"]


def test_no_vmm_on_one_rank_means_legacy_for_the_node():
    kind, notes = alloc.resolve("auto", [H200, NO_VMM, NO_VMM])
    assert kind == "legacy"
    assert len(notes) == 1 and "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0 on node ranks 1, 2" \
        in notes[0] and "legacy CUDA IPC" in notes[0] and "fabric" not in notes[0]


def test_vmm_asked_without_vmm_is_a_one_line_error():
    with pytest.raises(CommsError, match=r"HMC_P2P_ALLOC=vmm, but CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_"
                                         r"SUPPORTED is 0 on node rank 0: use HMC_P2P_ALLOC=auto or legacy"):
        alloc.resolve("vmm", [NO_VMM, H200])


def test_failed_fd_export_means_legacy_with_both_reasons():
    kind, notes = alloc.resolve("auto", [H200, NO_FD])
    assert kind == "legacy"
    assert notes[0] == FABRIC_NO
    assert notes[1].startswith("comms: POSIX file-descriptor export failed on node rank 1 "
                               "(cuMemExportToShareableHandle: CUDA_ERROR_NOT_SUPPORTED): legacy CUDA IPC")
    with pytest.raises(CommsError, match=r"HMC_P2P_ALLOC=vmm, but POSIX file-descriptor export failed on node rank 1"):
        alloc.resolve("vmm", [H200, NO_FD])


def test_fabric_everywhere_needs_no_fd_export():
    nvl_no_fd = dict(NVL, posix_error="cuMemCreate: CUDA_ERROR_NOT_SUPPORTED")
    assert alloc.resolve("auto", [nvl_no_fd, nvl_no_fd])[0] == "fabric"


def test_fallback_after_a_failed_fabric_import():
    assert alloc.after_fabric_import_failure([NVL, NVL]) == (
        "posix_fd", "falling back to POSIX file descriptors over a Unix socket")
    kind, text = alloc.after_fabric_import_failure([NVL, dict(NVL, posix_error="cuMemCreate: CUDA_ERROR_X")])
    assert kind == "legacy" and "node rank 1 (cuMemCreate: CUDA_ERROR_X)" in text and "legacy CUDA IPC" in text


def test_the_rule_over_every_mix_of_three_ranks():
    """legacy exactly when a rank lacks VMM, or not every rank has fabric handles and a rank cannot export a file
    descriptor; otherwise fabric when all have it, else posix_fd. (The kind depends on the gathered list only, which
    every rank of the node holds identically, so all ranks of a node agree.)"""
    import itertools

    for facts in itertools.product([H200, NVL, NO_VMM, NO_FD], repeat=3):
        facts = list(facts)
        all_fabric = all(f["fabric"] for f in facts)
        if any(not f["vmm"] for f in facts) or (not all_fabric and any(f["posix_error"] for f in facts)):
            want = "legacy"
        else:
            want = "fabric" if all_fabric else "posix_fd"
        assert alloc.resolve("auto", facts)[0] == want, facts
        assert alloc.resolve("legacy", facts)[0] == "legacy"


def test_unknown_request_and_empty_node_are_errors():
    with pytest.raises(CommsError):
        alloc.resolve("cuda_ipc", [H200])
    with pytest.raises(CommsError):
        alloc.resolve("auto", [])


# --------------------------------------------------------------------------------------------------------------
# comms/cuda/ipc.py and the engine's allocation plumbing, executed on the CPU against a stand-in driver: a fake
# ``cuda.bindings.driver`` that records every call (in a subprocess, so this process never sees it). It checks the
# bookkeeping (registry, every open closed, every allocation freed, the lazy-peer-access flag, handle bytes), not
# the CUDA semantics: those need the device (tests/comms/test_gpu_transports.py::test_legacy_ipc_allocation).

FAKE_DRIVER = r'''
import ctypes, itertools, os, struct

class _Member(int):
    pass

def _member(value, name):
    m = _Member(value)
    m.name = name
    return m

class _Enum:
    def __init__(self, start, **fixed):
        self._n = itertools.count(start)
        for k, v in fixed.items():
            setattr(self, k, _member(v, k))
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        m = _member(next(self._n), name)
        setattr(self, name, m)
        return m

CUresult = _Enum(900, CUDA_SUCCESS=0, CUDA_ERROR_INVALID_VALUE=1, CUDA_ERROR_NOT_SUPPORTED=801,
                 CUDA_ERROR_NOT_PERMITTED=800, CUDA_ERROR_PEER_ACCESS_UNSUPPORTED=217, CUDA_ERROR_MAP_FAILED=205)
CUipcMem_flags = _Enum(10, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS=1)
CUdevice_attribute = _Enum(2000)
CUstreamWaitValue_flags = _Enum(0, CU_STREAM_WAIT_VALUE_GEQ=0, CU_STREAM_WAIT_VALUE_EQ=1,
                                CU_STREAM_WAIT_VALUE_FLUSH=1 << 30)
CUstreamWriteValue_flags = _Enum(0, CU_STREAM_WRITE_VALUE_DEFAULT=0)
CUmemAllocationHandleType = _Enum(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR=1, CU_MEM_HANDLE_TYPE_FABRIC=8)
CUmemAllocationType = _Enum(0, CU_MEM_ALLOCATION_TYPE_PINNED=1)
CUmemLocationType = _Enum(0, CU_MEM_LOCATION_TYPE_DEVICE=1)
CUmemAccess_flags = _Enum(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE=3)
CUmemAllocationGranularity_flags = _Enum(0, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED=1)
CUevent_flags = _Enum(0, CU_EVENT_INTERPROCESS=4, CU_EVENT_DISABLE_TIMING=2)

CALLS = []
ALLOCS = {}          # ptr -> size
OPEN = {}            # mapped ptr -> (owner pid, owner ptr)
_next = itertools.count(1)
OPEN_ERROR = os.environ.get("FAKE_IPC_OPEN_ERROR")
FABRIC_ERROR = os.environ.get("FAKE_FABRIC_ERROR", "CUDA_ERROR_NOT_PERMITTED")
EXPORT_ERROR = os.environ.get("FAKE_EXPORT_ERROR")

def _ok(*out):
    return (CUresult.CUDA_SUCCESS,) + out

class CUipcMemHandle:
    def __init__(self):
        self._buf = ctypes.create_string_buffer(64)
    def getPtr(self):
        return ctypes.addressof(self._buf)

class _NS:
    pass

class CUmemAllocationProp:
    def __init__(self):
        self.location = _NS()

class CUmemAccessDesc:
    def __init__(self):
        self.location = _NS()

def cuMemAlloc(size):
    CALLS.append(("cuMemAlloc", int(size)))
    ptr = next(_next) << 32
    ALLOCS[ptr] = int(size)
    return _ok(ptr)

def cuMemFree(ptr):
    CALLS.append(("cuMemFree", int(ptr)))
    assert not any(p == int(ptr) for _, p in OPEN.values()), "freed while a mapping of it is open"
    del ALLOCS[int(ptr)]
    return _ok()

def cuIpcGetMemHandle(ptr):
    CALLS.append(("cuIpcGetMemHandle", int(ptr)))
    assert int(ptr) in ALLOCS, "IPC handle of something that is not a cuMemAlloc base address"
    h = CUipcMemHandle()
    ctypes.memmove(h.getPtr(), struct.pack("<qq", os.getpid(), int(ptr)) + b"\x5a" * 48, 64)
    return _ok(h)

def cuIpcOpenMemHandle(h, flags):
    CALLS.append(("cuIpcOpenMemHandle", int(flags)))
    assert isinstance(flags, int) and int(flags) == 1, flags
    if OPEN_ERROR:
        return (getattr(CUresult, OPEN_ERROR), None)
    pid, ptr = struct.unpack("<qq", ctypes.string_at(h.getPtr(), 16))
    assert ctypes.string_at(h.getPtr() + 16, 48) == b"\x5a" * 48
    mapped = next(_next) << 32
    OPEN[mapped] = (pid, ptr)
    return _ok(mapped)

def cuIpcCloseMemHandle(ptr):
    CALLS.append(("cuIpcCloseMemHandle", int(ptr)))
    del OPEN[int(ptr)]
    return _ok()

def cuMemsetD8(ptr, value, n):
    CALLS.append(("cuMemsetD8", int(ptr), int(n)))
    return _ok()

def cuMemGetAllocationGranularity(prop, flags):
    return _ok(1 << 21)

def cuMemCreate(size, prop, flags):
    CALLS.append(("cuMemCreate", int(prop.requestedHandleTypes)))
    if int(prop.requestedHandleTypes) == 8 and FABRIC_ERROR:
        return (getattr(CUresult, FABRIC_ERROR), None)
    return _ok(next(_next))

def cuMemExportToShareableHandle(h, kind, flags):
    CALLS.append(("cuMemExportToShareableHandle", int(kind)))
    if EXPORT_ERROR:
        return (getattr(CUresult, EXPORT_ERROR), None)
    return _ok(os.open(os.devnull, os.O_RDONLY))

def cuMemRelease(h):
    CALLS.append(("cuMemRelease",))
    return _ok()
'''

SCENARIO = r'''
import json, os, sys, types
from cuda.bindings import driver as drv
from comms.cuda import ipc, vmm
from comms.config import RunConfig
from comms.cuda.transports import GpuHaloEngine, GpuLink
from comms.grid import CommsError

class Comm:
    """A node of ``n`` ranks seen from rank 0: allgather answers this rank's value for every rank (or the values
    given in ``others`` for ranks 1..)."""
    def __init__(self, n, others=None):
        self.size, self.rank, self.others = n, 0, others
    def allgather(self, x):
        if self.others:
            return [x] + list(self.others.pop(0))
        return [x] * self.size
    def allreduce(self, x, op=None):
        return x
    def Barrier(self):
        pass

def engine(vmm_attr=1, others=None):
    e = GpuHaloEngine.__new__(GpuHaloEngine)
    e.comm = Comm(2, others)
    e.node = Comm(2)
    e.rank = e.world_rank = 0
    e.serial = 1                                 # HaloEngine.serial: the owner of its registered buffers
    e.dev = types.SimpleNamespace(vmm=vmm_attr, ordinal=0)
    e.notices, e.broker, e.timeout = [], None, 5.0
    e.ctx = types.SimpleNamespace(neighbours=[[0, 0], [0, 0], [0, 0], [1, 1]])
    e.node_rank_of = {0: 0, 1: 1}
    e.links, e.peer_maps, e._views = {}, {}, {}
    e._opened_events, e._owned_events, e._ipc_keys = [], [], []
    e.request = "stream_gated"
    e.config = RunConfig.from_environment()     # the engine's run configuration (HMC_P2P_ALLOC of the scenario)
    return e

out = {}
case = sys.argv[1]
if case == "legacy":
    e = engine()
    e._choose_alloc(True)
    out["kind"], out["handle_type"], out["notices"] = e.alloc_kind, e.handle_type, e.notices
    allow = [[(False, "not partitioned")] * 2 for _ in range(3)] + [[(True, "same node")] * 2]
    out["probe"] = e._probe(allow)
    out["allow_t"] = allow[3]
    out["after_probe"] = vmm.leaked(e.serial)
    e._new_segment(1 << 16)
    for d in (0, 1):
        e.links[(3, d)] = GpuLink(3, d, 1, 1, "stream_gated", "legacy CUDA IPC open")
    e._map_peers()
    out["mapped"] = vmm.leaked(e.serial)
    out["peer_ptr_is_mapping"] = all(l.peer_ptr == e.peer_maps[1].ptr for l in e.links.values())
    out["peer_maps"] = sorted(e.peer_maps)
    out["open_targets"] = [v[1] == e.seg.ptr for v in drv.OPEN.values()]
    e.ctx.coords, e.policy = (0, 0, 0, 0), "copy_engine"
    e.links[(2, 0)] = GpuLink(2, 0, 0, 0, "mpi", "mpi requested")
    out["rows"] = [(r["link"], r["transport"], r["policy"], r["alloc"]) for r in e.table_rows()]
    e._unmap_peers()
    e.seg.free()
    e.seg.free()                                         # twice: a no-op
    out["left"] = vmm.leaked(e.serial)
    out["allocs_left"], out["open_left"] = len(drv.ALLOCS), len(drv.OPEN)
    out["calls"] = [c[0] for c in drv.CALLS]
    out["sizes"] = [c[1] for c in drv.CALLS if c[0] == "cuMemAlloc"]
elif case == "probe_unreachable":
    e = engine()
    e._choose_alloc(True)
    allow = [[(False, "not partitioned")] * 2 for _ in range(3)] + [[(True, "same node")] * 2]
    out["probe"] = e._probe(allow)
    out["allow_t"] = allow[3]
    out["left"] = vmm.leaked(e.serial)
    out["allocs_left"] = len(drv.ALLOCS)
elif case == "open_error":
    try:
        ipc.IpcMapping(b"\0" * 64, 1 << 21, owner=1, what="x")
    except CommsError as err:
        out["error"] = str(err)
    try:
        ipc.try_open(b"\0" * 64, 1 << 21)
    except CommsError as err:
        out["try_open_raises"] = str(err)
elif case == "auto":
    vmm.FdBroker = lambda node, timeout, rank: "broker"
    e = engine(vmm_attr=int(os.environ.get("FAKE_VMM", "1")))
    e._choose_alloc(True)
    out["kind"], out["notices"], out["broker"] = e.alloc_kind, e.notices, e.broker
    out["calls"] = [list(c) for c in drv.CALLS]
elif case == "disagree":
    e = engine(others=[["auto"]])
    try:
        e._choose_alloc(True)
    except CommsError as err:
        out["error"] = str(err)
print(json.dumps(out, default=str))
'''


def _run_fake(tmp_path, case, env=None):
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    pkg = tmp_path / "fake" / "cuda" / "bindings"
    pkg.mkdir(parents=True, exist_ok=True)
    (tmp_path / "fake" / "cuda" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "driver.py").write_text(FAKE_DRIVER)
    (tmp_path / "scenario.py").write_text(SCENARIO)
    e = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("HMC_", "OMPI_", "PMI"))}
    e.update({"PYTHONPATH": f"{tmp_path / 'fake'}:{ROOT}", "OPENBLAS_NUM_THREADS": "1", "HMC_P2P_ALLOC": "legacy"})
    e.update(env or {})
    r = subprocess.run([sys.executable, str(tmp_path / "scenario.py"), case], capture_output=True, text=True, env=e,
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_legacy_segment_probe_mapping_and_teardown_against_a_stand_in_driver(tmp_path):
    out = _run_fake(tmp_path, "legacy")
    assert out["kind"] == "legacy" and out["handle_type"] is None
    assert out["notices"] == ["comms: legacy CUDA IPC buffers (cuMemAlloc + cuIpcGetMemHandle / cuIpcOpenMemHandle), "
                              "as asked (HMC_P2P_ALLOC=legacy)"]
    assert out["probe"] == {"1": None} and out["allow_t"] == [[True, "legacy CUDA IPC open"]] * 2
    assert out["after_probe"] == []
    assert len(out["mapped"]) == 2 and any("own cuMemAlloc allocation" in t for t in out["mapped"]) \
        and any("IPC mapping" in t and "node rank 1" in t for t in out["mapped"])
    assert out["peer_ptr_is_mapping"] and out["peer_maps"] == [1] and out["open_targets"] == [True]
    assert out["rows"] == [["z-", "mpi", "host", "host"], ["t-", "stream_gated", "copy_engine", "legacy"],
                           ["t+", "stream_gated", "copy_engine", "legacy"]]
    assert out["left"] == [] and out["allocs_left"] == 0 and out["open_left"] == 0
    assert out["calls"].count("cuIpcOpenMemHandle") == out["calls"].count("cuIpcCloseMemHandle") == 2
    assert out["calls"].count("cuMemAlloc") == out["calls"].count("cuMemFree") == 2
    assert "cuMemCreate" not in out["calls"]                # no VMM call when legacy is asked for
    assert all(s % (1 << 21) == 0 for s in out["sizes"])    # probe and segment rounded to 2 MiB


def test_probe_marks_an_unreachable_ipc_peer_and_leaks_nothing(tmp_path):
    out = _run_fake(tmp_path, "probe_unreachable", {"FAKE_IPC_OPEN_ERROR": "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"})
    assert out["probe"] == {"1": "cuIpcOpenMemHandle: CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"}
    assert out["allow_t"] == [[False, "probe: cuIpcOpenMemHandle: CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"]] * 2
    assert out["left"] == [] and out["allocs_left"] == 0


def test_other_open_errors_are_reported_not_taken_as_unreachable(tmp_path):
    out = _run_fake(tmp_path, "open_error", {"FAKE_IPC_OPEN_ERROR": "CUDA_ERROR_MAP_FAILED"})
    assert out["error"] == "cuIpcOpenMemHandle failed: CUDA_ERROR_MAP_FAILED (x)"
    assert "CUDA_ERROR_MAP_FAILED" in out["try_open_raises"]


@pytest.mark.parametrize("env,kind", [
    ({}, "posix_fd"),
    ({"FAKE_VMM": "0"}, "legacy"),
    ({"FAKE_EXPORT_ERROR": "CUDA_ERROR_NOT_SUPPORTED"}, "legacy"),
    ({"FAKE_FABRIC_ERROR": ""}, "fabric"),
])
def test_engine_auto_choice_against_a_stand_in_driver(tmp_path, env, kind):
    out = _run_fake(tmp_path, "auto", dict(env, HMC_P2P_ALLOC="auto"))
    assert out["kind"] == kind, out
    assert out["broker"] == ("broker" if kind == "posix_fd" else None)
    fabric = [n for n in out["notices"] if "fabric" in n]
    if env.get("FAKE_VMM") == "0":
        assert out["calls"] == [] and fabric == []          # no VMM call without VMM
        assert "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0" in out["notices"][0]
    else:
        assert len(fabric) == 1                             # the device machine's one fabric line, as before
    if "FAKE_EXPORT_ERROR" in env:
        assert out["notices"][-1].startswith("comms: POSIX file-descriptor export failed on node ranks 0, 1 "
                                             "(cuMemExportToShareableHandle: CUDA_ERROR_NOT_SUPPORTED)")


def test_engine_raises_on_every_rank_when_ranks_disagree(tmp_path):
    out = _run_fake(tmp_path, "disagree")
    assert out["error"] == ("ranks disagree on HMC_P2P_ALLOC (auto on rank 1, legacy on rank 0): every rank must "
                            "ask for the same")


def test_printed_table_shows_policy_and_allocation_of_gpu_links():
    from comms.halo import format_table

    row = {"rank": 0, "coords": [0, 0, 0, 0], "peer": 1, "reason": "legacy CUDA IPC open"}
    rows = [dict(row, link="t-", transport="stream_gated", policy="copy_engine", alloc="legacy"),
            dict(row, link="t+", transport="mpi", reason="masked (HMC_P2P_MASK=8)", policy="host", alloc="host"),
            dict(row, rank=1, link="t-", transport="shm", reason="same node")]
    assert format_table(rows, "grid").splitlines() == [
        "comms: grid", "  rank 0 (0, 0, 0, 0): t-:1 stream_gated [copy_engine, legacy], t+:1 mpi (masked "
        "(HMC_P2P_MASK=8))", "  rank 1 (0, 0, 0, 0): t-:1 shm"]
