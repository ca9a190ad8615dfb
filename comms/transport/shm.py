"""Transport ``shm``: the stream-gated protocol on host memory (docs/halo-protocol.md, "shm (CPU)").

MPI-3 shared windows on the node communicator (MPI.Win.Allocate_shared). Each rank's segment holds a header (signal
slots [dim][side], ack slots [dim][dir][buffer]: monotonic 64-bit counters) and its receive buffers
[buffer][dim][side]. The sender copies its face straight into the peer's buffer at (buffer_index, dim, 1 - dir),
fences (MPI.Win.Sync: a full memory barrier in Open MPI's osc/sm) and stores ++send_counter into the peer's signal
slot (dim, 1 - dir) with one aligned 64-bit store. The receiver polls its slot until it is >= the expected count
(GEQ: the peer may already have signalled the next exchange), fences, copies the face out, fences and returns a
credit: the message number it consumed from that buffer, into the sender's ack slot. A sender waits for that credit
before it writes the same buffer again, so it is never more than one exchange ahead of its slowest reader (double
buffering). The windows live on the engine (``engine.windows``), made when some rank's links use shm.
"""
from __future__ import annotations

import numpy as np

from ..base import _LIVE, CommsError, link_name, mpi
from .host import MIN_CAPACITY, HostTransport
from .registry import lookup

HEADER = 256                     # bytes: 8 signal slots [dim][side] at 0, 16 ack slots [dim][dir][buffer] at 64
_ACK0 = 8                        # index of the first ack slot in the uint64 header



class _Windows:
    """The node's shared windows: one segment per rank, header + 2 x 4 x 2 receive buffers of ``capacity``."""

    def __init__(self, node, capacity: int, owner=None):
        MPI = mpi()
        self.owner = owner
        self.node = node
        self.capacity = int(capacity)
        size = HEADER + 16 * self.capacity
        try:
            self.win = MPI.Win.Allocate_shared(size, 1, comm=node)
        except Exception as e:  # noqa: BLE001 - any MPI failure here means: no shared windows
            raise CommsError(f"shared-memory windows are not available (MPI.Win.Allocate_shared failed: {e}): "
                             "use --transport mpi") from None
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.key = f"window {id(self):x} ({size} bytes on {node.size} rank(s))"
        _LIVE[self.key] = (owner, self.key)
        self.maps = {}
        self.own = self.map(node.rank)
        self.own_header = memoryview(self.own[:HEADER]).cast("Q")

    def map(self, node_rank: int) -> np.ndarray:
        seg = self.maps.get(node_rank)
        if seg is None:
            buf, _ = self.win.Shared_query(node_rank)
            seg = np.frombuffer(buf, dtype=np.uint8)
            if seg.size < HEADER + 16 * self.capacity:
                raise CommsError(f"shared segment of node rank {node_rank} is {seg.size} bytes, expected "
                                 f"{HEADER + 16 * self.capacity}")
            self.maps[node_rank] = seg
            _LIVE[(self.key, node_rank)] = (self.owner, f"mapping of node rank {node_rank} in {self.key}")
        return seg

    def header(self, node_rank: int):
        return memoryview(self.map(node_rank)[:HEADER]).cast("Q")

    def data_offset(self, buffer: int, dim: int, side: int) -> int:
        return HEADER + ((buffer * 4 + dim) * 2 + side) * self.capacity

    def unmap_peers(self):
        for r in list(self.maps):
            if r != self.node.rank:
                del self.maps[r]
                _LIVE.pop((self.key, r), None)

    def zero_header(self):
        self.own[:HEADER] = 0
        self.win.Sync()

    def sync(self):
        self.win.Sync()

    def free(self):
        self.own_header.release()
        self.own_header = None
        self.own = None
        for r in list(self.maps):
            _LIVE.pop((self.key, r), None)
        self.maps.clear()
        self.win.Unlock_all()
        self.win.Free()
        _LIVE.pop(self.key, None)



def _view(engine, node_rank, off, shape, dtype):
    """A typed view into node rank ``node_rank``'s segment at byte ``off`` (cached per engine)."""
    key = (node_rank, off, shape, dtype)
    v = engine._shm_views.get(key)
    if v is None:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if len(engine._shm_views) > 512:
            engine._shm_views.clear()
        v = engine.windows.maps[node_rank][off:off + nbytes].view(dtype).reshape(shape)
        engine._shm_views[key] = v
    return v


def _wait_credit(engine, r, b, need):
    """The sender's side of the double buffer: wait until the reader consumed message ``need`` of buffer b."""
    ack = engine.windows.own_header
    if ack[r.ack_slot[b]] < need:
        link, dim, d = r.send, r.dim, r.dir
        engine._wait(ack, r.ack_slot[b], need, lambda v: (
            f"rank {engine.world_rank}: rank {link.peer_world} has not freed halo buffer {b} on link "
            f"{link_name(dim, d)} (shm) after {engine.timeout:g} s (HMC_COMMS_TIMEOUT): ack slot {v}, "
            f"need >= {need}; {engine._counter_text()}"))


def _wait_signal(engine, r, b, expected):
    """The receiver's poll of its own signal slot (GEQ); returns the value seen."""
    own = engine.windows.own_header
    slot = r.own_sig_slot
    if own[slot] < expected:
        link = r.recv
        engine._wait(own, slot, expected, lambda v: (
            f"rank {engine.world_rank}: no halo from rank {link.peer_world} on link "
            f"{link_name(link.dim, link.dir)} (shm) after {engine.timeout:g} s (HMC_COMMS_TIMEOUT): "
            f"signal slot {v}, expected >= {expected}, buffer {b}; {engine._counter_text()}"))
    return own[slot]


class ShmTransport(HostTransport):
    name = "shm"

    def __init__(self):
        self.capabilities = lookup(self.name).capabilities

    # set-up and lifecycle ------------------------------------------------------------------------------------
    def setup(self, engine):
        engine._shm_views = {}           # (node rank, offset, shape, dtype) -> typed view into a shared segment
        engine.windows = _Windows(engine.node, MIN_CAPACITY, engine.grid.owner)
        engine.windows.zero_header()
        engine.node.Barrier()

    def map_peers(self, engine):
        engine._shm_views.clear()
        for link in engine.links.values():
            if link.kind is not self:
                continue
            node_rank = engine.node_rank_of.get(link.peer)
            if node_rank is None:
                raise CommsError(f"rank {engine.world_rank}: shm link {link_name(link.dim, link.dir)} to rank "
                                 f"{link.peer_world} has no mapping (peer not on this node)")
            link.peer_node = node_rank
            link.peer_header = engine.windows.header(node_rank)

    def unmap_peers(self, engine):
        engine._shm_views.clear()
        for link in engine.links.values():
            if link.peer_header is not None:
                link.peer_header.release()
                link.peer_header = None
        engine.windows.unmap_peers()

    def reset(self, engine):
        engine.windows.zero_header()

    def reserve(self, engine, nbytes):
        """Larger shared buffers for every rank of the node (the same decision everywhere: all ranks exchange faces
        of the same size); the protocol state restarts from zero in lock-step."""
        if nbytes <= engine.windows.capacity:
            return False
        engine._check_idle(f"growing the shared halo buffers to {nbytes} bytes")
        cap = max(MIN_CAPACITY, 1 << (int(nbytes) - 1).bit_length())
        engine._unmap_peers()
        engine.node.Barrier()
        engine.windows.free()
        engine.windows = _Windows(engine.node, cap, engine.grid.owner)
        engine._map_peers()
        engine._reset_slots()
        return True

    def free(self, engine):
        key = engine.windows.key
        engine.windows.free()
        engine.windows = None
        left = [v[1] for k, v in _LIVE.items() if k == key or (isinstance(k, tuple) and k[0] == key)]
        if left:
            raise CommsError(f"rank {engine.world_rank}: leaked after free: {left}")

    def counters(self, engine, snap):
        h = engine.windows.own_header
        snap["signal_slots"] = [[int(h[dim * 2 + s]) for s in (0, 1)] for dim in range(4)]
        snap["ack_slots"] = [[[int(h[_ACK0 + (dim * 2 + d) * 2 + b]) for b in (0, 1)] for d in (0, 1)]
                             for dim in range(4)]

    def prepare_route(self, engine, r):
        dim, d, side = r.dim, r.dir, r.side
        r.sig_slot = dim * 2 + side                                  # in the peer's header
        r.ack_slot = [_ACK0 + (dim * 2 + d) * 2 + b for b in (0, 1)]          # in my header
        r.own_sig_slot = dim * 2 + side                              # in my header
        r.credit_slot = [_ACK0 + (dim * 2 + d) * 2 + b for b in (0, 1)]       # in the sender's header
        cap = engine.windows.capacity
        r.peer_off = [HEADER + ((b * 4 + dim) * 2 + side) * cap for b in (0, 1)]
        r.own_off = [HEADER + ((b * 4 + dim) * 2 + side) * cap for b in (0, 1)]
        r.send_views = [None, None]
        r.recv_views = [None, None]

    # one exchange ----------------------------------------------------------------------------------------------
    def post_recv(self, engine, route, face, b):
        return None                      # nothing to post: the sender writes into this rank's segment

    def send(self, engine, ex, r, face, b, msg):
        last_sent = engine.state.last_sent[r.dim][r.dir]
        _wait_credit(engine, r, b, last_sent[b])
        cached = r.send_views[b]
        if cached is None or cached.shape != face.shape or cached.dtype != face.dtype:
            cached = r.send_views[b] = _view(engine, r.send.peer_node, r.peer_off[b], face.shape, face.dtype)
        np.copyto(cached, face)
        last_sent[b] = msg
        return r.send.peer_header, r.sig_slot, msg

    def flush_sends(self, engine, items):
        engine.windows.win.Sync()                # the data before the signal (a full memory barrier)
        for header, slot, msg in items:
            header[slot] = msg                   # one aligned 64-bit store

    def receive(self, engine, ex, r, shape, dtype, expected, token, b):
        ex.observed[r.recv_key] = _wait_signal(engine, r, b, expected)
        win = engine.windows
        win.win.Sync()                           # the signal before the data
        src = r.recv_views[b]
        if src is None or src.shape != shape or src.dtype != dtype:
            src = r.recv_views[b] = _view(engine, win.node.rank, r.own_off[b], shape, dtype)
        return src, (r.recv.peer_header, r.credit_slot[b], expected)

    def flush_receives(self, engine, items):
        engine.windows.win.Sync()                # our reads before the credit that lets the sender overwrite
        for header, slot, msg in items:
            header[slot] = msg

    def start_one(self, engine, r, face, b):
        """``start`` for one face both ways over shm (every Geometry.shift): the same protocol with the bookkeeping
        of one link; None when the face does not qualify (not a NumPy array, or larger than the buffers)."""
        win = engine.windows
        if type(face) is not np.ndarray or face.nbytes > win.capacity:
            return None
        st = engine.state
        dim, d = r.dim, r.dir
        recv = st.recv[dim]
        expected = recv[r.side] + 1
        recv[r.side] = expected
        send = st.send[dim]
        msg = send[d] + 1
        send[d] = msg
        last = st.last_sent[dim][d]
        _wait_credit(engine, r, b, last[b])
        v = r.send_views[b]
        if v is None or v.dtype is not face.dtype or v.shape != face.shape:
            v = r.send_views[b] = _view(engine, r.send.peer_node, r.peer_off[b], face.shape, face.dtype)
        np.copyto(v, face)
        last[b] = msg
        win.win.Sync()                               # the data before the signal (a full memory barrier)
        r.send.peer_header[r.sig_slot] = msg         # one aligned 64-bit store
        return _ShmExchange1(engine, b, r, face.shape, face.dtype, expected)


class _ShmExchange1:
    """An exchange of one face over a shm route (``ShmTransport.start_one``); ``finish`` as Exchange.finish."""

    __slots__ = ("engine", "buffer", "route", "shape", "dtype", "expected", "done", "seen")

    def __init__(self, engine, buffer, route, shape, dtype, expected):
        self.engine, self.buffer, self.route = engine, buffer, route
        self.shape, self.dtype, self.expected = shape, dtype, expected
        self.done = False
        self.seen = None

    @property
    def observed(self) -> dict:
        return {} if self.seen is None else {self.route.recv_key: self.seen}

    def finish(self, out: dict | None = None) -> dict:
        if self.done:
            raise CommsError("finish() called twice on one halo exchange")
        eng, r, b, expected = self.engine, self.route, self.buffer, self.expected
        win = eng.windows
        self.seen = _wait_signal(eng, r, b, expected)
        win.win.Sync()                               # the signal before the data
        src = r.recv_views[b]
        if src is None or src.dtype is not self.dtype or src.shape != self.shape:
            src = r.recv_views[b] = _view(eng, win.node.rank, r.own_off[b], self.shape, self.dtype)
        key = r.recv_key
        dest = None if out is None else out.get(key)
        if dest is None:
            dest = src.copy()
        else:
            np.copyto(dest, src)
        win.win.Sync()                               # our reads before the credit that lets the sender overwrite
        r.recv.peer_header[r.credit_slot[b]] = expected
        st = eng.state
        st.busy[b] = None
        st.outstanding -= 1
        self.done = True
        return {key: dest}


TRANSPORT = ShmTransport()
