"""Two ranks' recorded stream programs of the GPU halo engine, executed against one shared flag and buffer memory.

Two real ``GpuHaloEngine`` objects (rank 0 and rank 1 of a 1x1x1x2 grid: links t- and t+ both go to the other rank)
run consecutive exchanges against the recording stand-in ``cuda.bindings.driver`` of test_capture_nodes_host.py (in a
subprocess); each rank's peer mapping is the other's segment, so every flag write and copy of one rank lands on the
other's own slots and receive buffers. The recorded calls (memory-operation batches, waits, writes, copies, event
records and waits, plus a marker for the exterior kernel that reads the faces in place) are then replayed on the host
by a scheduler that runs the streams of both ranks in many random interleavings (fixed seeds): a wait EQ blocks its
stream until the flag holds the value, a batch runs in array order, an event wait blocks until the stream of its last
record has passed it, a copy and a read each take two steps (begin, end), so a concurrent step can fall between.

It proves, for credit-free graph mode (docs/halo-protocol.md "Credit-free graph mode"; binary flags, "CUDA graphs and
the stream-gated protocol"), with and without batched signals ("Batched signals"), with the in-place receive ("In-place
receive") and the copying receive (receive chains), and with exchanges that lack links (a signal without data,
rule 1), over 6 exchanges (both buffers reused three times), that in every explored interleaving:

* every stream of both ranks runs to its end (no deadlock) and every flag is 0 at the end (no signal left over);
* no flag is set to 1 while it is still 1, no 1 is reset before a wait observed it, no wait is satisfied twice by one
  signal (no lost signal);
* no copy starts into a receive buffer whose last data the receiver has not finished reading, and every read (the
  in-place kernel or the copy out) sees, whole, the face its peer sent in the same exchange (no overwrite, no stale
  or torn halo).

It can fail: with the buffer index forced to repeat (two exchanges in a row on one buffer: the bug fixed by 2b16da0,
an index read before a buffer growth) the same scheduler reports violations in credit-free mode, and none with the
credits (graph mode with HMC_P2P_CREDIT_FREE=0: the credit flags of "CUDA graphs" start at 1); with the signals
without data switched off (rule 1 broken) it reports overwrites; a signal deleted from a program is a deadlock.
Not covered: the engine's set-up and growth, graph capture and launch (the recorded calls are those a capture
would hold; the launch checks and the realigning pad are test_capture_nodes_host.py's), peer sums, exchanges on
several streams, more than two ranks or one dimension (test_creditfree_model.py, abstractly); the copying receive in
credit-free mode is not a production combination (``creditfree.decide`` needs in place) but runs the same code."""
from __future__ import annotations

import json
import random

import pytest

from tests.comms.test_capture_nodes_host import FAKE_ARRAYS, run_scenario

N = 6                                  # exchanges per run: buffers 0 1 0 1 0 1
SEEDS = 200
SEGS, CAP = [1 << 40, 2 << 40], 1 << 16
HEADER, FLAGS_END, ACKF = 8192, 4096, 40

SCENARIO = r'''
import itertools, json, sys, types
import numpy as np
from cuda.bindings import driver as drv
from comms.config import RunConfig
from comms.cuda import creditfree
from comms.cuda.transports import GpuHaloEngine, GpuLink
from comms.halo import ProtocolState

SEGS, CAP = %(segs)r, %(cap)r
%(fake_arrays)s
class Stream:
    def __init__(self):
        self.ptr = next(_ids)
    def is_capturing(self):
        return False

CURRENT = [None]
cp = types.SimpleNamespace(ndarray=FakeArray, cuda=types.SimpleNamespace(get_current_stream=lambda: CURRENT[0],
                                                                         Event=lambda disable_timing=True: obj()))

def engine(r, case):
    e = GpuHaloEngine.__new__(GpuHaloEngine)
    e.cp, e.state = cp, ProtocolState()
    e.config = RunConfig(p2p_in_place=case["in_place"], p2p_credit_free=case["credit_free"],
                         p2p_batch_signals=case["batch"])
    e.world_rank = e.rank = r
    e.seg, e.capacity = types.SimpleNamespace(ptr=SEGS[r]), CAP
    e.links, e._used_streams, e.graph_mode, e.parallel_recv = {}, {}, True, True
    e.policy, e.wait_flags, e.timeout = "copy_engine", None, 5.0
    e.pack_event, e.fin_event = obj(), obj()
    e.credit_free, e.credit_order = case["credit_free"], creditfree.CreditFreeOrder(e)
    for d in (0, 1):
        l = GpuLink(3, d, 1 - r, 1 - r, "stream_gated", "test")
        l.stream, l.rstream = obj(), obj()
        l.ev_sent, l.ev_recv = [obj(), obj()], [obj(), obj()]
        l.peer_ptr = SEGS[1 - r]                       # the other rank's segment: one simulated address space
        e.links[(3, d)] = l
    e.comm = types.SimpleNamespace(size=2, rank=r)
    e.node_rank_of = {0: 0, 1: 1}
    return e

def hop(e, r, n, keys, in_place, faces_of):
    faces = {k: FakeArray((3, 4, 4, 4, 3)) for k in keys}
    faces_of.update({f.data.ptr: [r, n, k[0], k[1]] for k, f in faces.items()})
    drv.CALLS.append(("mark", r, n))
    ex = e.start(faces)
    if in_place:
        where = ex.finish_in_place()
        drv.CALLS.append(("kernel", CURRENT[0].ptr, sorted(where.values())))   # the exterior kernel reads them
        ex.release()
    else:
        ex.finish({(dim, 1 - d): FakeArray((3, 4, 4, 4, 3)) for dim, d in keys})

out = {}
for name, case in json.loads(sys.argv[1]).items():
    engines, cs, faces_of = [engine(r, case) for r in (0, 1)], [Stream(), Stream()], {}
    if case.get("no_pads"):                             # rule 1 broken: no signal on the links an exchange lacks
        for e in engines:
            e.credit_order.missing = lambda sends: []
    drv.CALLS.clear()
    for n, keys in enumerate(case["links"]):
        for r in (0, 1):
            CURRENT[0] = cs[r]
            if n in case.get("repeat_at", ()):
                engines[r].state.buffer_index ^= 1      # the stale index: this exchange reuses the last one's buffer
            hop(engines[r], r, n, [tuple(k) for k in keys], case["in_place"], faces_of)
    out[name] = {"calls": list(drv.CALLS), "faces": faces_of, "ranks": {
        p: r for r, e in enumerate(engines) for p in [cs[r].ptr] + [s.ptr for l in e.links.values()
                                                                  for s in (l.stream, l.rstream)]}}
print(json.dumps(out))
'''

FULL = [[[3, 0], [3, 1]]] * N
GAPS = [[[3, 0], [3, 1]], [[3, 1]], [[3, 0], [3, 1]], [[3, 0]], [], [[3, 0], [3, 1]]]   # a ring step each way, none
CASES = {f"{'in place' if ip else 'copy'} {'batched' if bt else 'per link'} {lk}":
         {"in_place": ip, "batch": bt, "credit_free": True, "links": FULL if lk == "full" else GAPS}
         for ip in (True, False) for bt in (True, False) for lk in ("full", "gaps")}
BROKEN = {f"repeat {'credit-free' if cf else 'credits'} {'in place' if ip else 'copy'}":
          {"in_place": ip, "batch": True, "credit_free": cf, "links": FULL, "repeat_at": [2, 4]}
          for cf in (True, False) for ip in (True, False)}
BROKEN["no pads"] = {"in_place": True, "batch": True, "credit_free": True, "links": GAPS, "no_pads": True}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return run_scenario(tmp_path_factory.mktemp("credit_free_sim"),
                        SCENARIO % {"segs": SEGS, "cap": CAP, "fake_arrays": FAKE_ARRAYS}, json.dumps({**CASES, **BROKEN}))


def where(addr):
    """('flag', rank) for a header slot, ('buf', rank, b, dim, side) for a receive buffer's start, else None."""
    for r, s in enumerate(SEGS):
        off = addr - s
        if 0 <= off < FLAGS_END:
            return ("flag", r)
        if off >= HEADER and (off - HEADER) % CAP == 0 and off - HEADER < 16 * CAP:
            i = (off - HEADER) // CAP
            return ("buf", r, i // 8, (i // 2) % 4, i % 2)
    return None


def programs(rec):
    """Per stream, its steps in order: ('wait'|'write', addr, value), ('copy0'|'copy1', dst, tag) (a copy's begin
    and end), ('read0'|'read1', addr, want) (a read of a receive buffer that must hold the face ``want``: sender
    rank, exchange, link), ('after', stream, index): an event wait (the stream's step ``index`` done)."""
    progs, records, exchange = {}, {}, {}
    faces = {int(k): tuple(v) for k, v in rec["faces"].items()}
    for c in rec["calls"]:
        if c[0] == "mark":
            exchange[c[1]] = c[2]
            continue
        s = c[1]
        prog = progs.setdefault(s, [])
        rank = rec["ranks"][str(s)]
        if c[0] == "batch":
            prog += [(kind, addr, v) for kind, addr, v in c[2]]
        elif c[0] in ("wait", "write"):
            prog.append(tuple(c[0:1] + c[2:4]))
        elif c[0] == "record":
            records[c[2]] = (s, len(prog))
            prog.append(("nop",))
        elif c[0] == "waitevent":
            if c[2] in records:                         # waiting for an event never recorded waits for nothing
                prog.append(("after",) + records[c[2]])
        elif c[0] == "memcpy":
            dst, src = c[2], c[3]
            if src in faces:                            # a send: into the peer's receive buffer
                assert where(dst)[:2] == ("buf", 1 - rank), c
                prog += [("copy0", dst, faces[src]), ("copy1", dst, faces[src])]
            else:                                       # the copying receive's copy out
                prog += reads(rank, exchange[rank], [src])
        elif c[0] == "kernel":                          # the in-place exterior kernel
            prog += reads(rank, exchange[rank], c[2])
    return progs


def reads(rank, n, addrs):
    out = []
    for a in addrs:
        kind, owner, b, dim, side = where(a)
        assert (kind, owner) == ("buf", rank), a
        out.append((a, (1 - rank, n, dim, 1 - side)))   # the peer's face of link (dim, 1 - side), same exchange
    return [("read0",) + r for r in out] + [("read1",) + r for r in out]


class Violation(AssertionError):
    pass


class Memory:
    """Flags and receive buffers of both ranks, checking each step against the protocol's promises."""

    def __init__(self, credits):
        self.flag, self.seen = {}, {}                   # addr -> value; addr -> the 1 there was observed by a wait
        if credits:                                     # graph mode's credit flags start at 1 (_write_header)
            for s in SEGS:
                for i in range(16):
                    self.flag[s + 8 * (ACKF + i)] = 1
        self.buf = {}                                   # addr -> [tag written, copy in flight, reads under way, read]

    def ready(self, op, done):
        if op[0] == "wait":
            return self.flag.get(op[1], 0) == op[2]
        if op[0] == "after":
            return done[op[1]] > op[2]
        return True

    def step(self, op):
        kind, addr = op[0], op[1] if len(op) > 1 else None
        if kind == "wait":
            if op[2] == 1:
                if self.seen.get(addr):
                    raise Violation(f"flag {addr:#x}: a second wait satisfied by one signal")
                self.seen[addr] = True
        elif kind == "write":
            old = self.flag.get(addr, 0)
            if op[2] == 1 and old == 1:
                raise Violation(f"flag {addr:#x}: set while still set (a signal lost)")
            if op[2] == 0 and old == 1 and not self.seen.get(addr):
                raise Violation(f"flag {addr:#x}: reset before a wait observed it (a signal lost)")
            self.flag[addr], self.seen[addr] = op[2], False
        elif kind in ("copy0", "copy1", "read0", "read1"):
            self.data(kind, addr, op[2])

    def data(self, kind, addr, tag):
        b = self.buf.setdefault(addr, [None, False, 0, True])
        if kind == "copy0":
            if b[1] or b[2] or not b[3]:
                raise Violation(f"buffer {addr:#x}: {tag} written before {b[0]} was read")
            b[:] = [tag, True, 0, False]
        elif kind == "copy1":
            b[1] = False
        elif kind == "read0":
            if b[0] != tuple(tag) or b[1]:
                raise Violation(f"buffer {addr:#x}: read for {tag} found {b[0]}{' in flight' if b[1] else ''}")
            b[2] += 1
        else:
            if b[0] != tuple(tag) or b[1]:
                raise Violation(f"buffer {addr:#x}: overwritten during its read for {tag}")
            b[2] -= 1
            b[3] = True


def run(progs, seed, credits=False):
    """One interleaving of every stream of both ranks; raises Violation (with the seed) on a broken promise."""
    rng = random.Random(seed)
    mem, done = Memory(credits), {s: 0 for s in progs}
    prio = {s: rng.random() for s in progs}             # odd seeds: mostly the highest-priority runnable stream
    steps = 0
    while True:
        live = [s for s, p in progs.items() if done[s] < len(p)]
        if not live:
            break
        runnable = [s for s in live if mem.ready(progs[s][done[s]], done)]
        if not runnable:
            stuck = {s: progs[s][done[s]] for s in live}
            raise Violation(f"seed {seed}: deadlock after {steps} steps: {stuck}")
        if seed % 2 and rng.random() < 0.9:
            s = max(runnable, key=prio.get)
        else:
            s = rng.choice(runnable)
        if rng.random() < 0.02:
            prio[s] = rng.random()
        try:
            mem.step(progs[s][done[s]])
        except Violation as v:
            raise Violation(f"seed {seed}, step {steps}: {v}") from None
        done[s] += 1
        steps += 1
    left = {a: v for a, v in mem.flag.items() if v and not (credits and (a - SEGS[a >= SEGS[1]]) // 8 >= ACKF)}
    if left:
        raise Violation(f"seed {seed}: flags still set at the end: {left}")
    return steps


def violations(progs, credits=False):
    out = []
    for seed in range(SEEDS):
        try:
            run(progs, seed, credits)
        except Violation as v:
            out.append(str(v))
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_credit_free_two_ranks_no_deadlock_no_lost_signal_no_overwrite(recorded, name):
    progs = programs(recorded[name])
    kinds = {op[0] for p in progs.values() for op in p}
    assert {"wait", "write", "copy0", "read0", "after"} <= kinds and len(progs) >= 4
    assert all(where(op[1])[0] == "flag" for p in progs.values() for op in p if op[0] in ("wait", "write"))
    assert violations(progs) == []
    writes = sum(op[0] == "write" and op[2] == 1 for p in progs.values() for op in p)
    assert writes == 2 * 2 * N                          # a signal per link and exchange on both ranks, data or not


@pytest.mark.parametrize("receive", ["in place", "copy"])
def test_a_repeated_buffer_index_is_caught_without_credits_and_safe_with_them(recorded, receive):
    broken = violations(programs(recorded[f"repeat credit-free {receive}"]))
    assert broken, "the simulator found no violation with two exchanges in a row on one buffer"
    assert any("written before" in v or "set while still set" in v or "found" in v for v in broken), broken[:3]
    assert violations(programs(recorded[f"repeat credits {receive}"]), credits=True) == []


def test_gaps_without_their_signals_are_caught(recorded):
    """Rule 1 broken (an exchange that lacks a link sends nothing on it): a sender overwrites unread data."""
    broken = violations(programs(recorded["no pads"]))
    assert broken and all("written before" in v or "found" in v for v in broken), broken[:3]


def test_a_dropped_signal_is_reported_as_a_deadlock(recorded):
    progs = programs(recorded["in place batched full"])
    s, i = next((s, i) for s, p in progs.items() for i, op in enumerate(p) if op[0] == "write" and op[2] == 1)
    progs[s] = progs[s][:i] + progs[s][i + 1:]
    with pytest.raises(Violation, match="deadlock"):
        run(progs, 0)
