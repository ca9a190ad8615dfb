"""What the GPU halo engine enqueues for one exchange and what the one-step peer sums enqueue, executed on the CPU
against a stand-in ``cuda.bindings.driver`` that records every stream call (in a subprocess, as in
test_alloc_policy.py): the graph nodes of a captured exchange (each memory-operation batch, wait, write or copy is
one node; event records and waits are edges), the addresses and values of the flags, and the order of the steps.
The copying receive (default) against the in-place receive (HMC_P2P_IN_PLACE, docs/halo-protocol.md "In-place
receive"), and the peer sums (HMC_P2P_PEER_SUMS, "Peer sums"), on 2 links (1x1x1x2) and 4 links (1x1x2x2)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.comms.test_alloc_policy import FAKE_DRIVER

STREAM_CALLS = r'''
CUstreamBatchMemOpType = _Enum(1, CU_STREAM_MEM_OP_WAIT_VALUE_64=4, CU_STREAM_MEM_OP_WRITE_VALUE_64=5)

class _Op:
    pass

class CUstreamBatchMemOpParams:
    def __init__(self):
        self.waitValue, self.writeValue = _Op(), _Op()

def _kind(op):
    w = op.waitValue if hasattr(op.waitValue, "operation") else op.writeValue
    return ("wait" if "WAIT" in w.operation.name else "write", int(w.address), int(w.value64))

def cuStreamBatchMemOp(stream, n, ops, flags):
    assert n == len(ops) > 0
    CALLS.append(("batch", int(stream), [_kind(o) for o in ops]))
    return _ok()

def cuStreamWaitValue64(stream, addr, value, flags):
    CALLS.append(("wait", int(stream), int(addr), int(value)))
    return _ok()

def cuStreamWriteValue64(stream, addr, value, flags):
    CALLS.append(("write", int(stream), int(addr), int(value)))
    return _ok()

def cuMemcpyAsync(dst, src, n, stream):
    CALLS.append(("memcpy", int(stream), int(dst), int(src), int(n)))
    return _ok()

def cuEventRecord(ev, stream):
    CALLS.append(("record", int(stream), int(ev)))
    return _ok()

def cuStreamWaitEvent(stream, ev, flags):
    CALLS.append(("waitevent", int(stream), int(ev)))
    return _ok()
'''

#: the scenarios' stand-in device objects: fresh addresses and arrays with a shape, a dtype and a pointer
FAKE_ARRAYS = r'''
_ids = itertools.count(1 << 20)
def obj():
    return types.SimpleNamespace(ptr=next(_ids))

class FakeArray:
    def __init__(self, shape, dtype=np.complex128):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize
        self.flags = types.SimpleNamespace(c_contiguous=True)
        self.data = types.SimpleNamespace(ptr=next(_ids) << 8)
'''

SCENARIO = r'''
import itertools, json, sys, types
import numpy as np
from cuda.bindings import driver as drv
from comms.config import RunConfig
from comms.cuda.exchange import GpuExchange
from comms.cuda.peersum import PeerSum
from comms.cuda.segment import HEADER, area_offset, data_offset, rsf_slot, sigf_slot, ackf_slot
from comms.cuda.transports import GpuHaloEngine, GpuLink
from comms.cuda import creditfree
from comms.base import CommsError
from comms.halo import ProtocolState

%(fake_arrays)s
class stream:
    def __init__(self, capturing=False):
        self.ptr, self.capturing = next(_ids), capturing

    def is_capturing(self):
        return self.capturing

    def __enter__(self):
        self.was = CURRENT[0]
        CURRENT[0] = self

    def __exit__(self, *exc):
        CURRENT[0] = self.was

COMPUTE = stream()
CURRENT = [COMPUTE]
cp = types.SimpleNamespace(ndarray=FakeArray, cuda=types.SimpleNamespace(get_current_stream=lambda: CURRENT[0],
                                                                         Event=lambda disable_timing=True: obj()),
                           zeros=lambda n, dtype: FakeArray((n,), dtype))

def engine(dims, in_place, size=2, **cfg):
    e = GpuHaloEngine.__new__(GpuHaloEngine)
    e.cp, e.state, e.config = cp, ProtocolState(), RunConfig(**{
        "p2p_in_place": in_place, "p2p_credit_free": False, "p2p_batch_signals": False, **cfg})   # each asked for
    e.world_rank = e.rank = 0
    e.seg, e.capacity = types.SimpleNamespace(ptr=1 << 40), 1 << 16
    e.links, e._used_streams, e.graph_mode, e.parallel_recv = {}, {}, True, True
    e.policy, e.wait_flags, e.timeout = "copy_engine", None, 5.0
    e.pack_event, e.fin_event = obj(), obj()
    e.credit_free, e.credit_order = False, creditfree.CreditFreeOrder(e)
    peer = {dim: (dim + 1) << 44 for dim in dims}
    for dim in dims:
        for d in (0, 1):
            l = GpuLink(dim, d, 1, 1, "stream_gated", "test")
            l.stream, l.rstream = obj(), obj()
            l.ev_sent, l.ev_recv = [obj(), obj()], [obj(), obj()]
            l.peer_ptr = peer[dim]
            e.links[(dim, d)] = l
    e.comm = types.SimpleNamespace(size=size, rank=0)
    e.node_rank_of = {r: r for r in range(size)}
    e.peer_maps = {r: types.SimpleNamespace(ptr=(r + 8) << 44) for r in range(1, size)}
    return e, peer

def nodes(calls):
    return {k: sum(1 for c in calls if c[0] == k) for k in ("batch", "wait", "write", "memcpy")}

out = {}
for name, dims in (("2 links", [3]), ("4 links", [2, 3])):
    for in_place in (False, True):
        e, peer = engine(dims, in_place)
        faces = {(dim, d): FakeArray((3, 4, 4, 4, 3)) for dim in dims for d in (0, 1)}
        ghosts = {(dim, s): FakeArray((3, 4, 4, 4, 3)) for dim in dims for s in (0, 1)}
        drv.CALLS.clear()
        ex = e.start(faces)
        sends = list(drv.CALLS)
        drv.CALLS.clear()
        assert e.receives_in_place() == in_place
        if in_place:
            where = ex.finish_in_place()
            held_busy = e.state.busy[ex.buffer] is ex
            drv.CALLS.append(("kernel", COMPUTE.ptr))              # the exterior kernel reads the faces here
            ex.release()
            out[f"{name} where"] = sorted([list(k), v] for k, v in where.items())
            out[f"{name} held"] = held_busy
        else:
            ex.finish(ghosts)
        recvs = list(drv.CALLS)
        key = f"{name} {'in place' if in_place else 'copy'}"
        out[key] = {"send": nodes(sends), "receive": nodes(recvs), "calls": recvs, "free": e.state.busy == [None, None],
                    "seg": e.seg.ptr, "cap": e.capacity, "peers": {str(k): v for k, v in peer.items()}}
for name, dims in (("2 links", [3]), ("4 links", [2, 3])):      # credit-free graph mode (HMC_P2P_CREDIT_FREE)
    e, peer = engine(dims, True)
    e.credit_free = True
    faces = {(dim, d): FakeArray((3, 4, 4, 4, 3)) for dim in dims for d in (0, 1)}
    drv.CALLS.clear()
    ex = e.start(faces)
    sends = list(drv.CALLS)
    drv.CALLS.clear()
    ex.finish_in_place()
    drv.CALLS.append(("kernel", COMPUTE.ptr))
    ex.release()
    recvs = list(drv.CALLS)
    got = {"send": nodes(sends), "receive": nodes(recvs), "free": e.state.busy == [None, None],
           "last": list(e.credit_order.last) == [COMPUTE.ptr, False]}
    CURRENT[0] = other = stream()                             # the next exchange on another stream: joined
    drv.CALLS.clear()
    ex = e.start(faces)
    got["join"] = drv.CALLS[:3]
    got["streams"] = [COMPUTE.ptr, other.ptr, e.pack_event.ptr]
    refused = []
    try:
        e.start(faces)                                        # the first one not finished
    except CommsError as err:
        refused.append(str(err))
    ex.finish_in_place()
    ex.release(COMPUTE)
    drv.CALLS.clear()
    # a ring step: one link missing, signalled without data
    ex = e.start({k: v for k, v in faces.items() if k != (dims[0], 0)})
    sent = list(drv.CALLS)
    drv.CALLS.clear()
    where = ex.finish_in_place()
    ex.release(COMPUTE)
    b = 1 - e.state.buffer_index
    got["padded"] = {"copies": len([c for c in sent + drv.CALLS if c[0] == "memcpy"]), "where": sorted(map(list, where)),
                     "pads": sorted(map(list, ex.pads)), "free": e.state.busy == [None, None],
                     "signal": sent[-1] == ("batch", CURRENT[0].ptr, [("write", peer[dims[0]] + 8 * sigf_slot(b, dims[0], 1),
                                                                        1)]),
                     "wait": [o for o in drv.CALLS[-1][2] if o[1] == e.seg.ptr + 8 * sigf_slot(b, dims[0], 1)]}
    creditfree.ENGINES.add(e)
    CURRENT[0] = cap = stream(capturing=True)
    marks = creditfree.capture_marks()
    before = e.credit_order.last
    e.start(faces).finish_in_place()                         # an odd capture: one exchange
    e.state.busy, e.state.outstanding = [None, None], 0
    try:
        creditfree.check_capture(marks)
    except CommsError as err:
        refused.append(str(err))
    got["restored"] = e.credit_order.last == before
    marks = creditfree.capture_marks()
    for _ in range(2):                                       # an even capture
        e.start(faces).finish_in_place()
        e.state.busy, e.state.outstanding = [None, None], 0
    launch = creditfree.check_capture(marks)
    drv.CALLS.clear()
    creditfree.before_launch(launch, other)
    got["launch join"] = [c[0] for c in drv.CALLS]
    CURRENT[0] = other
    ex = e.start(faces)                                      # one uncaptured exchange (a single hop) later
    ex.finish_in_place()
    ex.release()
    drv.CALLS.clear()
    creditfree.before_launch(launch, other)                  # realigned by one exchange of signals alone
    got["pad"] = {"pads": e.credit_order.pads, "index": e.state.buffer_index == launch[0][1],
                  "copies": [c[4] for c in drv.CALLS if c[0] == "memcpy"], "busy": e.state.busy == [None, None]}
    got["idle capture"] = creditfree.check_capture(creditfree.capture_marks()) == []   # no exchange of e in it
    e.credit_free = False                                    # the switch changed after the capture: refused
    try:
        creditfree.before_launch(launch, other)
    except CommsError as err:
        refused.append(str(err))
    CURRENT[0] = cap
    marks = creditfree.capture_marks()                       # a capture with credits, launched credit-free: refused
    for _ in range(2):
        e.start(faces).finish_in_place()
        e.state.busy, e.state.outstanding = [None, None], 0
    credited = creditfree.check_capture(marks)
    got["credited marks"] = [m[1:] for m in credited] == [(e.state.buffer_index, False)]
    e.credit_free = True
    try:
        creditfree.before_launch(credited, other)
    except CommsError as err:
        refused.append(str(err))
    creditfree.ENGINES.discard(e)
    CURRENT[0] = COMPUTE
    got["refused"] = refused
    out[f"{name} credit-free"] = got
for name, dims in (("2 links", [3]), ("4 links", [2, 3])):      # HMC_P2P_BATCH_SIGNALS, credit-free
    e, peer = engine(dims, True, p2p_batch_signals=True)
    e.credit_free = True
    faces = {(dim, d): FakeArray((3, 4, 4, 4, 3)) for dim in dims for d in (0, 1)}
    drv.CALLS.clear()
    ex = e.start(faces)
    sends = list(drv.CALLS)
    ex.finish_in_place()
    ex.release()
    last = e.links[max(e.links)]
    out[f"{name} batched"] = {"send": nodes(sends), "calls": sends, "last": last.stream.ptr,
                              "copied": [l.ev_sent[0].ptr for k, l in sorted(e.links.items()) if l is not last],
                              "sent": last.ev_sent[0].ptr, "peers": sorted(peer.values())}
for k in (2, 4):
    e, _ = engine([3], False, size=k)
    e.rank = 1
    e.peer_maps = {r: types.SimpleNamespace(ptr=(r + 8) << 44) for r in range(k) if r != 1}
    ps = PeerSum(e)
    drv.CALLS.clear()
    b = [ps.parity() for _ in range(3)]
    ps.exchange(COMPUTE.ptr, 1)
    out[f"peersum {k}"] = {"parities": b, "calls": list(drv.CALLS), "areas": ps.areas(1), "own": ps.own(1),
                           "bases": [ps.base(r) for r in range(k)], "fits": [ps.fits(1088), ps.fits(4096)]}
out["layout"] = {"header": HEADER, "area1": area_offset(1), "rsf": [rsf_slot(1, 0), rsf_slot(1, 3)],
                 "sigf": sigf_slot(0, 3, 1), "data0": data_offset(0, 0, 0, 1 << 16)}
print(json.dumps(out))
'''


def run_scenario(tmp, scenario: str, *argv, calls: str = STREAM_CALLS) -> dict:
    """``scenario`` (Python source) run in a fresh process under the stand-in ``cuda.bindings.driver`` (FAKE_DRIVER
    with ``calls``: by default the recorded stream calls), in folder ``tmp``, without the caller's HMC_/MPI
    environment; the JSON object its last output line prints."""
    from tests.conftest import ROOT

    pkg = tmp / "fake" / "cuda" / "bindings"
    pkg.mkdir(parents=True)
    (tmp / "fake" / "cuda" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "driver.py").write_text(FAKE_DRIVER + calls)
    (tmp / "scenario.py").write_text(scenario)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HMC_", "OMPI_", "PMI"))}
    env.update({"PYTHONPATH": f"{tmp / 'fake'}:{ROOT}", "OPENBLAS_NUM_THREADS": "1"})
    r = subprocess.run([sys.executable, str(tmp / "scenario.py"), *argv], capture_output=True, text=True, env=env,
                       cwd=tmp, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return run_scenario(tmp_path_factory.mktemp("capture_nodes"), SCENARIO % {"fake_arrays": FAKE_ARRAYS})


@pytest.mark.parametrize("name,links", [("2 links", 2), ("4 links", 4)])
def test_send_side_is_three_nodes_per_link_either_way(recorded, name, links):
    for how in ("copy", "in place"):
        assert recorded[f"{name} {how}"]["send"] == {"batch": links, "wait": 0, "write": links, "memcpy": links}


@pytest.mark.parametrize("name,links", [("2 links", 2), ("4 links", 4)])
def test_copying_receive_is_three_nodes_per_link(recorded, name, links):
    got = recorded[f"{name} copy"]
    assert got["receive"] == {"batch": links, "wait": 0, "write": links, "memcpy": links}
    assert got["free"]


@pytest.mark.parametrize("name,links", [("2 links", 2), ("4 links", 4)])
def test_in_place_receive_is_two_batches_and_no_copy(recorded, name, links):
    got = recorded[f"{name} in place"]
    assert got["receive"] == {"batch": 2, "wait": 0, "write": 0, "memcpy": 0}
    assert recorded[f"{name} held"] and got["free"]          # held until release(), free after it
    calls = got["calls"]
    kinds = [c[0] for c in calls]
    assert kinds.index("kernel") > max(i for i, k in enumerate(kinds) if k == "waitevent")  # sends before waits
    waits, credits = [c for c in calls if c[0] == "batch"]
    assert kinds.index("kernel") < calls.index(credits)      # the credits follow the kernel that reads the faces
    seg, cap = got["seg"], got["cap"]
    ops = waits[2]
    assert [o[0] for o in ops] == ["wait", "write"] * links
    flags = [o[1] for o in ops[::2]]
    assert [o[1] for o in ops[1::2]] == flags and {o[2] for o in ops[::2]} == {1} and {o[2] for o in ops[1::2]} \
        == {0}                                               # wait EQ 1 then reset, on the own slots
    assert all(seg < f < seg + 4096 for f in flags) and len(set(flags)) == links
    assert {o[0] for o in credits[2]} == {"write"} and {o[2] for o in credits[2]} == {1}
    peers = sorted(got["peers"].values())
    assert all(any(p < o[1] < p + 4096 for p in peers) for o in credits[2])   # into the senders' headers
    where = dict((tuple(k), v) for k, v in recorded[f"{name} where"])
    assert all(seg + 8192 <= v < seg + 8192 + 16 * cap for v in where.values())
    assert len({v - min(where.values()) for v in where.values()}) == links    # distinct faces, one layout


def test_peer_sums_are_two_batches_over_every_peer(recorded):
    lay = recorded["layout"]
    for k in (2, 4):
        got = recorded[f"peersum {k}"]
        assert got["parities"] == [0, 1, 0] and got["fits"] == [True, False]
        signal, wait = got["calls"]
        assert signal[0] == wait[0] == "batch"
        bases = got["bases"]
        me = bases[1]
        assert [o[:1] + o[2:] for o in signal[2]] == [["write", 1]] * (k - 1)
        assert sorted(o[1] for o in signal[2]) == sorted(b + 8 * lay["rsf"][0] + 8 for i, b in enumerate(bases)
                                                         if i != 1)            # flag (1, me = 1) of every peer
        assert [o[0] for o in wait[2]] == ["wait", "write"] * (k - 1)
        assert sorted(o[1] for o in wait[2][::2]) == [me + 8 * (lay["rsf"][0] + r) for r in range(k) if r != 1]
        assert got["areas"] == [b + lay["area1"] for b in bases] and got["own"] == me + lay["area1"]
    assert lay["area1"] + 2048 <= lay["header"] == lay["data0"] and lay["rsf"][1] * 8 < 4096


@pytest.mark.parametrize("name,links", [("2 links", 2), ("4 links", 4)])
def test_credit_free_drops_the_credit_wait_per_link_and_the_credit_batch(recorded, name, links):
    got = recorded[f"{name} credit-free"]
    assert got["send"] == {"batch": 0, "wait": 0, "write": links, "memcpy": links}    # copy and signal per link
    assert got["receive"] == {"batch": 1, "wait": 0, "write": 0, "memcpy": 0}          # the arrival waits only
    assert got["free"] and got["last"]


@pytest.mark.parametrize("name", ["2 links", "4 links"])
def test_credit_free_joins_streams_pads_and_refuses_what_breaks_the_order(recorded, name):
    got = recorded[f"{name} credit-free"]
    old, new, pack = got["streams"]
    (r, s1, ev), (w, s2, ev2), (r2, s3, ev3) = got["join"]
    assert (r, s1, w, s2, ev2) == ("record", old, "waitevent", new, ev) and (r2, s3, ev3) == ("record", new, pack)
    refused = got["refused"]
    assert len(refused) == 4, refused
    assert "finished and released" in refused[0] and "even number" in refused[1]
    assert "captured in credit-free graph mode" in refused[2] and "with credits now" in refused[2]
    assert "captured outside credit-free graph mode" in refused[3] and "credit-free now" in refused[3]
    assert all("\n" not in r for r in refused) and got["credited marks"]
    links = 2 if name == "2 links" else 4
    dim = 3 if links == 2 else 2
    # the ring step lacks (dim, 0): a signal without data on it (one batch), its wait + reset at the receiver
    assert got["padded"]["signal"] and len(got["padded"]["wait"]) == 2, got["padded"]
    assert [o[0] for o in got["padded"]["wait"]] == ["wait", "write"] and [o[2] for o in got["padded"]["wait"]] == [1, 0]
    assert {k: v for k, v in got["padded"].items() if k not in ("signal", "wait")} == {
        "copies": links - 1, "where": sorted([k, s] for k in ([2, 3] if links == 4 else [3]) for s in (0, 1)
                                             if [k, s] != [dim, 1]), "pads": [[dim, 1]], "free": True}
    assert got["pad"] == {"pads": 1, "index": True, "copies": [], "busy": True}   # signals alone, no data
    assert got["restored"] and got["launch join"] == ["record", "waitevent"] and got["idle capture"]


@pytest.mark.parametrize("name,links", [("2 links", 2), ("4 links", 4)])
def test_batched_signals_are_one_batch_after_every_copy(recorded, name, links):
    got = recorded[f"{name} batched"]
    assert got["send"] == {"batch": 1, "wait": 0, "write": 0, "memcpy": links}     # credit-free and batched
    calls = got["calls"]
    at = next(i for i, c in enumerate(calls) if c[0] == "batch")
    assert at > max(i for i, c in enumerate(calls) if c[0] == "memcpy")
    assert calls[at][1] == got["last"] and len(calls[at][2]) == links
    assert {o[0] for o in calls[at][2]} == {"write"} and {o[2] for o in calls[at][2]} == {1}
    assert all(any(p < o[1] < p + 4096 for p in got["peers"]) for o in calls[at][2])
    joined = {c[2] for c in calls[:at] if c[0] == "waitevent" and c[1] == got["last"]}
    assert set(got["copied"]) <= joined                       # after every other link's copy
    assert calls[at + 1] == ["record", got["last"], got["sent"]]
