"""Halo exchanges over the partitioned dimensions of a ProcessGrid: the protocol of COMMS.md on the host.

An exchange moves one face per (dim, dir) that this rank sends: ``dir`` 0 to the backward neighbour, 1 to the
forward one. Every rank sends the same set of faces (SPMD), so the face a rank sends on (dim, dir) is matched by
the one it receives on side (dim, 1 - dir) from the opposite neighbour. ``start`` posts every receive and every
send of the exchange (no wait that a send could be blocked by comes before the sends); ``finish`` waits, unpacks
in a fixed (dim, side) order and releases the buffer.

Transports, per link (this rank's link to neighbour[dim][dir], used both ways):

* ``mpi``: the reference. Faces are packed into host buffers, Irecv posted before Isend; tags encode only the
  displacement (2 dim + dir of the sender).
* ``shm``: MPI-3 shared windows on the node communicator (MPI.Win.Allocate_shared). Each rank's segment holds a
  header (signal slots [dim][side], ack slots [dim][dir][buffer]: monotonic 64-bit counters) and its receive
  buffers [buffer][dim][side]. The sender copies its face straight into the peer's buffer at (buffer_index, dim,
  1 - dir), fences (MPI.Win.Sync: a full memory barrier in Open MPI's osc/sm) and stores ++send_counter into the
  peer's signal slot (dim, 1 - dir) with one aligned 64-bit store. The receiver polls its slot until it is >=
  the expected count (GEQ: the peer may already have signalled the next exchange), fences, copies the face out,
  fences and returns a credit: the message number it consumed from that buffer, into the sender's ack slot. A
  sender waits for that credit before it writes the same buffer again, so it is never more than one exchange
  ahead of its slowest reader (double buffering).

``buffer_index`` (0/1) is process-wide, the same on every rank before each exchange, and flips after every
exchange; counters are per link and monotonic. Both, and the signal and ack slots, are reset in lock-step when a
communicator is pushed or popped (split grid) or when the shared buffers grow. Every host wait has a deadline
(HMC_COMMS_TIMEOUT seconds, default 60) and fails with a CommsTimeout naming the rank, the link and the counters.
"""
from __future__ import annotations

import os
import time

import numpy as np

from .config import ConfigError, RunConfig
from .grid import DIRS, CommsError, CommsTimeout, is_mpi_comm, mpi

TRANSPORTS = ("mpi", "shm")
GPU_TRANSPORTS = ("event", "stream_gated")
HEADER = 256                     # bytes: 8 signal slots [dim][side] at 0, 16 ack slots [dim][dir][buffer] at 64
_ACK0 = 8                        # index of the first ack slot in the uint64 header
MIN_CAPACITY = 1 << 16           # bytes per receive buffer, grown to a power of two as needed
TAG_BASE = 700

_LIVE: dict = {}                 # live windows and peer mappings, for the teardown leak check


def leaked(owner=None) -> list:
    """Live engines, windows and peer mappings (of the ProcessGrid with id ``owner``, or of all)."""
    return sorted(text for o, text in _LIVE.values() if owner is None or o == owner)


def link_name(dim: int, dir_: int) -> str:
    return f"{DIRS[dim]}{'-+'[dir_]}"


def format_table(rows: list, title: str = "") -> str:
    """The resolved transport table, one line per rank: link:peer transport (reason when not peer-to-peer; on the
    GPU engine's peer-to-peer links [data policy, allocation kind])."""
    by_rank = {}
    for r in rows:
        by_rank.setdefault(r["rank"], []).append(r)
    lines = [f"comms: {title}".rstrip(": ")] if title else ["comms:"]
    for rank in sorted(by_rank):
        rs = by_rank[rank]
        cells = [f"{r['link']}:{r['peer']} {r['transport']}" + (f" ({r['reason']})" if r["transport"] == "mpi" else
                                                                  f" [{r['policy']}, {r['alloc']}]" if r.get("alloc")
                                                                  else "")
                 for r in rs]
        lines.append(f"  rank {rank} {tuple(rs[0]['coords'])}: " + ", ".join(cells))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------
# transport settings (from the run configuration, comms.config: HMC_P2P_TRANSPORT, HMC_P2P_MASK, ...)

def check_transport_name(name) -> None:
    """A one-line CommsError for a transport name that is unknown or that this build cannot provide (checked before
    any MPI set-up)."""
    err = _unavailable(_transport_name(name))
    if err:
        raise CommsError(err)


# --- GPU transports hook (comms/cuda): event and stream_gated run where CuPy, cuda-bindings and a GPU are present
def gpu_transports_available() -> bool:
    try:
        from .cuda import available
    except Exception:  # noqa: BLE001
        return False
    return available()


def wants_gpu_transport(request) -> bool:
    """True when ``request`` (a resolved transport name or None) names a GPU transport that this machine can run."""
    return request in GPU_TRANSPORTS and gpu_transports_available()
# --- end of the GPU transports hook


def _transport_name(name):
    """``name`` checked and normalised by the configuration's rule ("auto" and "" mean None), else a CommsError."""
    try:
        return RunConfig(transport=name).transport
    except ConfigError as e:
        raise CommsError(str(e)) from None


def _unavailable(req):
    """Why transport ``req`` cannot run in this build, or None."""
    if req in GPU_TRANSPORTS and not gpu_transports_available():          # GPU transports hook (comms/cuda)
        return (f"transport {req!r} needs CUDA buffers (the GPU transports are not part of this CPU build): "
                "use mpi or shm, or leave HMC_P2P_TRANSPORT unset")
    return None


def _read_config(request, config):
    """(transport request or None, mask, clique, error or None): the request (a transport name, already checked by
    the configuration, or None for the best every rank can use) and the configuration's mask and clique."""
    req = _transport_name(request)
    return req, config.p2p_mask, config.p2p_fake_clique, _unavailable(req)


# --------------------------------------------------------------------------------------------------------------

class ProtocolState:
    """Counters, buffer index and credits: process-wide, shared by every communicator context, reset together."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.send = [[0, 0] for _ in range(4)]           # messages sent on link (dim, dir)
        self.recv = [[0, 0] for _ in range(4)]           # messages expected on side (dim, side)
        self.last_sent = [[[0, 0], [0, 0]] for _ in range(4)]   # message number last written to (dim, dir, buffer)
        self.buffer_index = 0
        self.busy = [None, None]                         # the unfinished exchange holding each buffer
        self.outstanding = 0
        self.resets = getattr(self, "resets", -1) + 1

    def snapshot(self) -> dict:
        return {"send": [list(r) for r in self.send], "recv": [list(r) for r in self.recv],
                "buffer_index": self.buffer_index, "outstanding": self.outstanding}


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


class _Link:
    """This rank's link to neighbour[dim][dir]: used to send on dir and to receive from side dir."""

    __slots__ = ("dim", "dir", "peer", "peer_world", "transport", "reason", "peer_node", "peer_header")

    def __init__(self, dim, dir_, peer, peer_world, transport, reason):
        self.dim, self.dir, self.peer, self.peer_world = dim, dir_, peer, peer_world
        self.transport, self.reason = transport, reason
        self.peer_node = None
        self.peer_header = None


class _Route:
    """Everything the hot path needs for a face sent on (dim, dir) and the matching one received on side
    (dim, 1 - dir): links, slots, offsets per buffer, MPI tag, and one cached view per buffer and end."""

    __slots__ = ("key", "recv_key", "dim", "dir", "side", "send", "recv", "send_mpi", "recv_mpi", "tag",
                 "sig_slot", "ack_slot", "own_sig_slot", "credit_slot", "peer_off", "own_off", "send_views",
                 "recv_views", "fast")

    def __init__(self, engine, dim, d):
        side = 1 - d
        self.key, self.recv_key = (dim, d), (dim, side)
        self.dim, self.dir, self.side = dim, d, side
        self.send, self.recv = engine.links[(dim, d)], engine.links[(dim, side)]
        self.send_mpi, self.recv_mpi = self.send.transport == "mpi", self.recv.transport == "mpi"
        self.fast = self.send.transport == "shm" and self.recv.transport == "shm"
        self.tag = TAG_BASE + 2 * dim + d
        self.sig_slot = dim * 2 + side                                  # in the peer's header
        self.ack_slot = [_ACK0 + (dim * 2 + d) * 2 + b for b in (0, 1)]          # in my header
        self.own_sig_slot = dim * 2 + side                              # in my header
        self.credit_slot = [_ACK0 + (dim * 2 + d) * 2 + b for b in (0, 1)]       # in the sender's header
        cap = engine.windows.capacity if engine.windows is not None else 0
        self.peer_off = [HEADER + ((b * 4 + dim) * 2 + side) * cap for b in (0, 1)]
        self.own_off = [HEADER + ((b * 4 + dim) * 2 + side) * cap for b in (0, 1)]
        self.send_views = [None, None]
        self.recv_views = [None, None]


class HaloEngine:
    """Halo exchanges of one communicator context (see the module docstring)."""

    #: faces are host (NumPy) arrays; the GPU engine (comms.cuda.transports) takes and returns device arrays
    device_faces = False

    def __init__(self, grid, ctx, protocol: ProtocolState, request=None):
        MPI = mpi()
        self.grid, self.ctx, self.state = grid, ctx, protocol
        self.config = grid.config                # the run configuration (comms.config): transport settings
        base = ctx.comm if is_mpi_comm(ctx.comm) else MPI.COMM_SELF
        self.comm = base.Dup()
        self.rank = self.comm.rank
        self.world_rank = grid.rank
        self.node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.timeout = 60.0
        self.spin = 0 if self.node.size > (os.cpu_count() or 1) else 4000   # oversubscribed: yield at once
        self._mpi_bufs = {}
        self._mpi_views = {}             # (kind, dim, dir, buffer, shape, dtype) -> (typed view, byte view)
        self._shm_views = {}             # (node rank, offset, shape, dtype) -> typed view into a shared segment
        self._routes = {}                # (dim, dir) -> _Route
        self.windows = None
        self._live_key = f"engine {id(self):x}"
        self.links = {}
        self.profile = None              # a dict: seconds spent waiting accumulate in profile["wait"]
        self._resolve(request)
        _LIVE[self._live_key] = (id(grid), f"halo engine {self._live_key} of rank {self.world_rank}")

    # transport resolution ---------------------------------------------------------------------------------
    def _agreed_config(self, request):
        """(req, mask, clique, world_of): this rank's transport settings, checked to be the same on every rank
        (collective; a bad setting or a disagreement is one CommsError on every rank)."""
        req, mask, clique, err = _read_config(request, self.config)
        everyone = self.comm.allgather((self.world_rank, req, err, mask, clique))
        errors = [(r, e) for r, _, e, _, _ in everyone if e]
        if errors:
            raise CommsError(errors[0][1])
        reqs = sorted({str(q) for _, q, _, _, _ in everyone})
        if len(reqs) > 1:
            raise CommsError(f"ranks disagree on the transport (HMC_P2P_TRANSPORT / --transport: "
                             f"{', '.join(reqs)}): every rank must ask for the same")
        return req, mask, clique, [w for w, _, _, _, _ in everyone]

    def _node_members(self) -> set:
        """The grid ranks on this node (collective over the node); sets ``node_rank_of``."""
        members = self.node.allgather(self.rank)
        self.node_rank_of = {r: i for i, r in enumerate(members)}
        return set(members)

    def _link_permissions(self, req, mask, clique, world_of, node_members) -> list:
        """[dim][dir] -> (peer-to-peer allowed?, why) for this rank's links, from the request, the node, the fake
        clique and the mask (the same rule for the CPU and the GPU transports; made symmetric by the caller)."""
        parts = self.grid.partitioned
        allow = [[(False, "not partitioned")] * 2 for _ in range(4)]
        for dim in range(4):
            if not parts[dim]:
                continue
            for d in (0, 1):
                peer = self.ctx.neighbours[dim][d]
                if req == "mpi":
                    allow[dim][d] = (False, "mpi requested")
                elif peer not in node_members:
                    allow[dim][d] = (False, "other node")
                elif clique and world_of[peer] // clique != self.world_rank // clique:
                    allow[dim][d] = (False, f"other clique (HMC_P2P_FAKE_CLIQUE={clique})")
                elif mask & (1 << dim):
                    allow[dim][d] = (False, f"masked (HMC_P2P_MASK={mask})")
                else:
                    allow[dim][d] = (True, "same node")
        return allow

    def _resolve(self, request):
        req, mask, clique, world_of = self._agreed_config(request)
        self.request = req
        self.timeout = self.config.comms_timeout
        allow = self._link_permissions(req, mask, clique, world_of, self._node_members())
        tables = self.comm.allgather(allow)
        any_shm = False
        for dim in range(4):
            if not self.grid.partitioned[dim]:
                continue
            for d in (0, 1):
                peer = self.ctx.neighbours[dim][d]
                mine, theirs = tables[self.rank][dim][d], tables[peer][dim][1 - d]
                if mine[0] and theirs[0]:
                    t, why = "shm", "shared window (same node)"
                elif not mine[0]:
                    t, why = "mpi", mine[1]
                else:
                    t, why = "mpi", f"peer forbids: {theirs[1]}"
                self.links[(dim, d)] = _Link(dim, d, peer, world_of[peer], t, why)
                any_shm |= t == "shm"
        any_shm = self.comm.allreduce(any_shm, op=mpi().LOR)
        if any_shm or req == "shm":
            self.windows = _Windows(self.node, MIN_CAPACITY, id(self.grid))
            self.windows.zero_header()
            self.node.Barrier()
            self._map_peers()

    def _map_peers(self):
        self._shm_views.clear()
        self._routes.clear()
        for link in self.links.values():
            if link.transport != "shm":
                continue
            node_rank = self.node_rank_of.get(link.peer)
            if node_rank is None:
                raise CommsError(f"rank {self.world_rank}: shm link {link_name(link.dim, link.dir)} to rank "
                                 f"{link.peer_world} has no mapping (peer not on this node)")
            link.peer_node = node_rank
            link.peer_header = self.windows.header(node_rank)

    def _unmap_peers(self):
        self._shm_views.clear()
        self._routes.clear()
        for link in self.links.values():
            if link.peer_header is not None:
                link.peer_header.release()
                link.peer_header = None
        if self.windows is not None:
            self.windows.unmap_peers()

    def table_rows(self) -> list:
        return [{"rank": self.world_rank, "coords": list(self.ctx.coords), "link": link_name(dim, d),
                 "peer": l.peer_world, "transport": l.transport, "reason": l.reason}
                for (dim, d), l in sorted(self.links.items())]

    def transport(self, dim: int, dir_: int) -> str:
        return self.links[(dim, dir_)].transport

    def counters(self) -> dict:
        snap = self.state.snapshot()
        if self.windows is not None:
            h = self.windows.own_header
            snap["signal_slots"] = [[int(h[dim * 2 + s]) for s in (0, 1)] for dim in range(4)]
            snap["ack_slots"] = [[[int(h[_ACK0 + (dim * 2 + d) * 2 + b]) for b in (0, 1)] for d in (0, 1)]
                                 for dim in range(4)]
        return snap

    # lifecycle --------------------------------------------------------------------------------------------
    def _check_idle(self, what):
        if self.state.outstanding:
            raise CommsError(f"rank {self.world_rank}: {what} with {self.state.outstanding} halo exchange(s) not "
                             "finished: finish them first")

    def _reset_slots(self):
        """Zero this rank's signal and ack slots and the protocol state; all ranks do it between barriers."""
        self.comm.Barrier()
        if self.windows is not None:
            self.windows.zero_header()
        self.state.reset()
        self.comm.Barrier()

    def suspend(self, reset=True):
        """A communicator is pushed on top of this one: free the peer mappings (keep the buffers)."""
        self._check_idle("push()")
        self._unmap_peers()

    def resume(self, reset=True):
        """Back on top after a pop: map the peers again and reset counters, slots and buffer_index in
        lock-step (``reset=False``: the testing hook that shows why the reset is needed)."""
        if self.windows is not None:
            self._map_peers()
        if reset:
            self._reset_slots()
        else:
            self.comm.Barrier()

    def free(self):
        """Unmap and free everything of this context (collective over its communicator); check for leaks."""
        self._unmap_peers()
        if self.windows is not None:
            key = self.windows.key
            self.windows.free()
            self.windows = None
            left = [v[1] for k, v in _LIVE.items() if k == key or (isinstance(k, tuple) and k[0] == key)]
            if left:
                raise CommsError(f"rank {self.world_rank}: leaked after free: {left}")
        self.node.Free()
        self.comm.Free()
        _LIVE.pop(self._live_key, None)

    def _grow(self, nbytes: int):
        """Larger shared buffers for every rank of the node (the same decision everywhere: all ranks exchange
        faces of the same size); the protocol state restarts from zero in lock-step."""
        self._check_idle(f"growing the shared halo buffers to {nbytes} bytes")
        cap = max(MIN_CAPACITY, 1 << (int(nbytes) - 1).bit_length())
        self._unmap_peers()
        self.node.Barrier()
        self.windows.free()
        self.windows = _Windows(self.node, cap, id(self.grid))
        self._map_peers()
        self._reset_slots()

    def reserve(self, nbytes: int):
        """Grow the shared buffers now (collective) so that faces of ``nbytes`` need no growth later."""
        if self.windows is not None and nbytes > self.windows.capacity:
            self._grow(nbytes)

    # exchanges --------------------------------------------------------------------------------------------
    def _mpi_view(self, kind, dim, d, b, shape, dtype):
        """(typed view, byte view) of the host buffer of an MPI message (grown, never shrunk; views cached)."""
        key = (kind, dim, d, b, shape, dtype)
        v = self._mpi_views.get(key)
        if v is None:
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            bkey = (kind, dim, d, b)
            buf = self._mpi_bufs.get(bkey)
            if buf is None or buf.size < nbytes:
                buf = np.empty(max(nbytes, 64), dtype=np.uint8)
                self._mpi_bufs[bkey] = buf
                self._mpi_views.clear()
            if len(self._mpi_views) > 512:
                self._mpi_views.clear()
            v = (buf[:nbytes].view(dtype).reshape(shape), buf[:nbytes])
            self._mpi_views[key] = v
        return v

    def _shm_view(self, node_rank, off, shape, dtype):
        key = (node_rank, off, shape, dtype)
        v = self._shm_views.get(key)
        if v is None:
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if len(self._shm_views) > 512:
                self._shm_views.clear()
            v = self.windows.maps[node_rank][off:off + nbytes].view(dtype).reshape(shape)
            self._shm_views[key] = v
        return v

    def _route(self, k) -> _Route:
        r = self._routes.get(k)
        if r is None:
            if k not in self.links or (k[0], 1 - k[1]) not in self.links:
                raise CommsError(f"rank {self.world_rank}: no halo link {k}: dimension {DIRS[k[0]]} is not "
                                 "partitioned")
            r = self._routes[k] = _Route(self, *k)
        return r

    def start(self, sends: dict) -> "Exchange":
        """Post an exchange: ``sends`` maps (dim, dir) to the face (any array) sent to neighbour[dim][dir]."""
        st = self.state
        b = st.buffer_index
        if st.busy[b] is not None:
            raise CommsError(f"rank {self.world_rank}: halo buffer {b} is still held by an unfinished exchange: at "
                             "most two exchanges may be outstanding (double buffering); finish the older first")
        if len(sends) == 1:                          # one face both ways over shm (every Geometry.shift): fast path
            for k, face in sends.items():
                r = self._routes.get(k)
                if r is not None and r.fast and type(face) is np.ndarray and face.nbytes <= self.windows.capacity:
                    return self._start_shm1(r, face, b, st)
        plan = []
        for k, f in (sends.items() if len(sends) == 1 else sorted(sends.items())):
            plan.append((self._route(k), f if type(f) is np.ndarray else np.asarray(f)))
        win = self.windows
        if win is not None:
            need = max(f.nbytes for _, f in plan) if plan else 0
            if need > win.capacity:
                self._grow(need)
                win = self.windows
                plan = [(self._route(r.key), f) for r, f in plan]
        ex = Exchange(self, b)
        recvs = ex.recvs
        comm = self.comm
        send_ctr, recv_ctr, last_sent = st.send, st.recv, st.last_sent
        # receives first (MPI), then every send
        for r, face in plan:
            dim, side = r.dim, r.side
            expected = recv_ctr[dim][side] + 1
            recv_ctr[dim][side] = expected
            if r.recv_mpi:
                view, raw = self._mpi_view("r", dim, side, b, face.shape, face.dtype)
                recvs.append((r, face.shape, face.dtype, expected, comm.Irecv(raw, source=r.recv.peer, tag=r.tag),
                              view))
            else:
                recvs.append((r, face.shape, face.dtype, expected, None, None))
        signals = None
        for r, face in plan:
            dim, d = r.dim, r.dir
            msg = send_ctr[dim][d] + 1
            send_ctr[dim][d] = msg
            if r.send_mpi:
                view, raw = self._mpi_view("s", dim, d, b, face.shape, face.dtype)
                np.copyto(view, face)
                ex.sends.append((r, comm.Isend(raw, dest=r.send.peer, tag=r.tag)))
                continue
            need = last_sent[dim][d][b]
            ack = win.own_header
            if ack[r.ack_slot[b]] < need:
                link = r.send
                self._wait(ack, r.ack_slot[b], need, lambda v, dim=dim, d=d, need=need: (
                    f"rank {self.world_rank}: rank {link.peer_world} has not freed halo buffer {b} on link "
                    f"{link_name(dim, d)} (shm) after {self.timeout:g} s (HMC_COMMS_TIMEOUT): ack slot {v}, "
                    f"need >= {need}; {self._counter_text()}"))
            cached = r.send_views[b]
            if cached is None or cached.shape != face.shape or cached.dtype != face.dtype:
                cached = r.send_views[b] = self._shm_view(r.send.peer_node, r.peer_off[b], face.shape, face.dtype)
            np.copyto(cached, face)
            last_sent[dim][d][b] = msg
            if signals is None:
                signals = []
            signals.append((r.send.peer_header, r.sig_slot, msg))
        if signals:
            win.win.Sync()                           # the data before the signal (a full memory barrier)
            for header, slot, msg in signals:
                header[slot] = msg                   # one aligned 64-bit store
        st.buffer_index = b ^ 1
        st.busy[b] = ex
        st.outstanding += 1
        return ex

    def _start_shm1(self, r, face, b, st) -> "_ShmExchange1":
        """``start`` for one face over a shm route: the same protocol with the bookkeeping of one link."""
        dim, d = r.dim, r.dir
        recv = st.recv[dim]
        expected = recv[r.side] + 1
        recv[r.side] = expected
        send = st.send[dim]
        msg = send[d] + 1
        send[d] = msg
        last = st.last_sent[dim][d]
        win = self.windows
        ack = win.own_header
        if ack[r.ack_slot[b]] < last[b]:
            need, link = last[b], r.send
            self._wait(ack, r.ack_slot[b], need, lambda v: (
                f"rank {self.world_rank}: rank {link.peer_world} has not freed halo buffer {b} on link "
                f"{link_name(dim, d)} (shm) after {self.timeout:g} s (HMC_COMMS_TIMEOUT): ack slot {v}, "
                f"need >= {need}; {self._counter_text()}"))
        v = r.send_views[b]
        if v is None or v.dtype is not face.dtype or v.shape != face.shape:
            v = r.send_views[b] = self._shm_view(r.send.peer_node, r.peer_off[b], face.shape, face.dtype)
        np.copyto(v, face)
        last[b] = msg
        win.win.Sync()                               # the data before the signal (a full memory barrier)
        r.send.peer_header[r.sig_slot] = msg         # one aligned 64-bit store
        ex = _ShmExchange1(self, b, r, face.shape, face.dtype, expected)
        st.buffer_index = b ^ 1
        st.busy[b] = ex
        st.outstanding += 1
        return ex

    def _counter_text(self) -> str:
        st = self.state
        return (f"send counters {st.send}, recv counters {st.recv}, buffer_index {st.buffer_index}, "
                f"outstanding {st.outstanding}")

    def _wait(self, mv, slot, target, describe):
        """Poll ``mv[slot]`` until it is >= target (GEQ), with the deadline."""
        t0 = time.monotonic()
        deadline = t0 + self.timeout
        spins, spin = 0, self.spin
        while mv[slot] < target:
            spins += 1
            if spins > spin:
                os.sched_yield()
            if not spins & 255 and time.monotonic() > deadline:
                raise CommsTimeout(describe(int(mv[slot])))
        if self.profile is not None:
            self.profile["wait"] += time.monotonic() - t0

    def _wait_request(self, req, describe):
        if req.Test():
            return
        t0 = time.monotonic()
        deadline = t0 + self.timeout
        spins, spin = 0, self.spin
        while not req.Test():
            spins += 1
            if spins > spin:
                os.sched_yield()
            if not spins & 63 and time.monotonic() > deadline:
                raise CommsTimeout(describe())
        if self.profile is not None:
            self.profile["wait"] += time.monotonic() - t0


class Exchange:
    """One posted exchange; ``finish`` completes it."""

    __slots__ = ("engine", "buffer", "recvs", "sends", "done", "observed")

    def __init__(self, engine: HaloEngine, buffer: int):
        self.engine = engine
        self.buffer = buffer
        self.recvs = []
        self.sends = []
        self.done = False
        self.observed = {}       # (dim, side): the signal slot value the wait saw (tests: GEQ)

    def finish(self, out: dict | None = None) -> dict:
        """Wait for every face of the exchange; copy each into ``out[(dim, side)]`` when given (an array of the
        face's shape), else into a new array. Returns {(dim, side): array}: side 0 came from the backward
        neighbour, side 1 from the forward one."""
        if self.done:
            raise CommsError("finish() called twice on one halo exchange")
        eng, st, b = self.engine, self.engine.state, self.buffer
        results = {}
        credits = None
        win = eng.windows
        for r, shape, dtype, expected, req, src in self.recvs:
            key = r.recv_key
            dest = None if out is None else out.get(key)
            if req is not None:
                if not req.Test():
                    link = r.recv
                    eng._wait_request(req, lambda link=link, expected=expected: (
                        f"rank {eng.world_rank}: no halo from rank {link.peer_world} on link "
                        f"{link_name(link.dim, link.dir)} (mpi) after {eng.timeout:g} s (HMC_COMMS_TIMEOUT): "
                        f"waiting for message {expected} of this link; {eng._counter_text()}"))
            else:
                own = win.own_header
                slot = r.own_sig_slot
                if own[slot] < expected:
                    link = r.recv
                    eng._wait(own, slot, expected, lambda v, link=link, expected=expected: (
                        f"rank {eng.world_rank}: no halo from rank {link.peer_world} on link "
                        f"{link_name(link.dim, link.dir)} (shm) after {eng.timeout:g} s (HMC_COMMS_TIMEOUT): "
                        f"signal slot {v}, expected >= {expected}, buffer {b}; {eng._counter_text()}"))
                self.observed[key] = own[slot]
                win.win.Sync()                       # the signal before the data
                src = r.recv_views[b]
                if src is None or src.shape != shape or src.dtype != dtype:
                    src = r.recv_views[b] = eng._shm_view(win.node.rank, r.own_off[b], shape, dtype)
                if credits is None:
                    credits = []
                credits.append((r.recv.peer_header, r.credit_slot[b], expected))
            if dest is None:
                dest = src.copy()
            else:
                np.copyto(dest, src)
            results[key] = dest
        if credits:
            win.win.Sync()                           # our reads before the credit that lets the sender overwrite
            for header, slot, msg in credits:
                header[slot] = msg
        for r, req in self.sends:
            if req.Test():
                continue
            link = r.send
            eng._wait_request(req, lambda link=link: (
                f"rank {eng.world_rank}: send to rank {link.peer_world} on link {link_name(link.dim, link.dir)} "
                f"(mpi) not complete after {eng.timeout:g} s (HMC_COMMS_TIMEOUT); {eng._counter_text()}"))
        st.busy[b] = None
        st.outstanding -= 1
        self.done = True
        return results


class _ShmExchange1:
    """An exchange of one face over a shm route (``HaloEngine._start_shm1``); ``finish`` as Exchange.finish."""

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
        own = win.own_header
        slot = r.own_sig_slot
        if own[slot] < expected:
            link = r.recv
            eng._wait(own, slot, expected, lambda v: (
                f"rank {eng.world_rank}: no halo from rank {link.peer_world} on link {link_name(link.dim, link.dir)} "
                f"(shm) after {eng.timeout:g} s (HMC_COMMS_TIMEOUT): signal slot {v}, expected >= {expected}, "
                f"buffer {b}; {eng._counter_text()}"))
        self.seen = own[slot]
        win.win.Sync()                               # the signal before the data
        src = r.recv_views[b]
        if src is None or src.dtype is not self.dtype or src.shape != self.shape:
            src = r.recv_views[b] = eng._shm_view(win.node.rank, r.own_off[b], self.shape, self.dtype)
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
