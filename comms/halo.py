"""Halo exchanges over the partitioned dimensions of a ProcessGrid: the protocol of docs/halo-protocol.md on the host.

An exchange moves one face per (dim, dir) that this rank sends: ``dir`` 0 to the backward neighbour, 1 to the
forward one. Every rank sends the same set of faces (SPMD), so the face a rank sends on (dim, dir) is matched by
the one it receives on side (dim, 1 - dir) from the opposite neighbour. ``start`` posts every receive and every
send of the exchange (no wait that a send could be blocked by comes before the sends); ``finish`` waits, unpacks
in a fixed (dim, side) order and releases the buffer.

Each link (this rank's link to neighbour[dim][dir], used both ways) has one transport, an object of the transport
registry (comms/transport/registry.py) with the link interface of comms/transport/host.py: ``mpi`` (the reference and
every link's fallback, comms/transport/mpi.py) and ``shm`` (shared windows of the node, comms/transport/shm.py) here;
the GPU transports run on the GPU engine (comms/cuda/transports.py). The engine decides by the transports'
capabilities, never by their names.

``buffer_index`` (0/1) is process-wide, the same on every rank before each exchange, and flips after every
exchange; counters are per link and monotonic. Both, and the transports' slots, are reset in lock-step when a
communicator is pushed or popped (split grid) or when shared buffers grow. Every host wait has a deadline
(HMC_COMMS_TIMEOUT seconds, default 60) and fails with a CommsTimeout naming the rank, the link and the counters.
"""
from __future__ import annotations

import itertools
import os
import time

import numpy as np

from .base import _LIVE, DIRS, CommsError, CommsTimeout, is_mpi_comm, leaked, link_name, mpi  # noqa: F401
from .config import ConfigError, RunConfig
from .transport import registry
from .transport.host import TAG_BASE

FALLBACK = "mpi"                 # the transport of a link that cannot be peer-to-peer (and the reference)
HOST_DEFAULT = "shm"             # the peer-to-peer transport of host faces when none is asked for


def format_table(rows: list, title: str = "") -> str:
    """The resolved transport table, one line per rank: link:peer transport (reason when not peer-to-peer; on the
    GPU engine's peer-to-peer links [data policy, allocation kind])."""
    by_rank = {}
    for r in rows:
        by_rank.setdefault(r["rank"], []).append(r)
    lines = [f"comms: {title}".rstrip(": ")] if title else ["comms:"]
    for rank in sorted(by_rank):
        rs = by_rank[rank]
        cells = [f"{r['link']}:{r['peer']} {r['transport']}" + (f" ({r['reason']})" if not _peer_to_peer(r) else
                                                                  f" [{r['policy']}, {r['alloc']}]" if r.get("alloc")
                                                                  else "")
                 for r in rs]
        lines.append(f"  rank {rank} {tuple(rs[0]['coords'])}: " + ", ".join(cells))
    return "\n".join(lines)


def _peer_to_peer(row) -> bool:
    return registry.lookup(row["transport"]).capabilities.same_node


# --------------------------------------------------------------------------------------------------------------
# transport settings (from the run configuration, comms.config: HMC_P2P_TRANSPORT, HMC_P2P_MASK, ...)

def check_transport_name(name) -> None:
    """A one-line CommsError for a transport name that is unknown (not in the registry: the run configuration's
    check) or that this build cannot provide (its capabilities: device buffers without the GPU transports); checked
    before any MPI set-up."""
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


def needs_gpu(request) -> bool:
    """True when ``request`` (a resolved transport name or None) names a transport with device buffers."""
    return request is not None and registry.lookup(request).capabilities.gpu_buffers


def wants_gpu_transport(request) -> bool:
    """True when ``request`` (a resolved transport name or None) names a GPU transport that this machine can run."""
    return needs_gpu(request) and gpu_transports_available()
# --- end of the GPU transports hook


def _transport_name(name):
    """``name`` checked and normalised by the configuration's rule ("auto" and "" mean None), else a CommsError."""
    try:
        return RunConfig(transport=name).transport
    except ConfigError as e:
        raise CommsError(str(e)) from None


def _unavailable(req):
    """Why transport ``req`` cannot run in this build, or None."""
    if needs_gpu(req) and not gpu_transports_available():                 # GPU transports hook (comms/cuda)
        host = [n for n in registry.names() if not needs_gpu(n)]
        host = " or ".join([", ".join(host[:-1]), host[-1]] if len(host) > 1 else host)
        return (f"transport {req!r} needs CUDA buffers (the GPU transports are not part of this CPU build): "
                f"use {host}, or leave HMC_P2P_TRANSPORT unset")
    return None


def _read_config(request, config):
    """(transport request or None, mask, clique, error or None): the request (a transport name, already checked by
    the configuration, or None for the best every rank can use) and the configuration's mask and clique."""
    req = _transport_name(request)
    return req, config.p2p_mask, config.p2p_fake_clique, _unavailable(req)


# --------------------------------------------------------------------------------------------------------------

_ENGINE_SERIALS = itertools.count(1)     # HaloEngine.serial


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


class _Link:
    """This rank's link to neighbour[dim][dir]: used to send on dir and to receive from side dir; ``kind`` is the
    transport object of ``transport`` (the registry's)."""

    __slots__ = ("dim", "dir", "peer", "peer_world", "transport", "reason", "peer_node", "peer_header", "kind")

    def __init__(self, dim, dir_, peer, peer_world, transport, reason):
        self.dim, self.dir, self.peer, self.peer_world = dim, dir_, peer, peer_world
        self.transport, self.reason = transport, reason
        self.kind = registry.lookup(transport).load()
        self.peer_node = None
        self.peer_header = None


class _Route:
    """Everything the hot path needs for a face sent on (dim, dir) and the matching one received on side
    (dim, 1 - dir): links, their transports, the MPI tag, and what the transports add (``prepare_route``: slots,
    offsets per buffer, one cached view per buffer and end)."""

    __slots__ = ("key", "recv_key", "dim", "dir", "side", "send", "recv", "send_kind", "recv_kind", "one", "tag",
                 "sig_slot", "ack_slot", "own_sig_slot", "credit_slot", "peer_off", "own_off", "send_views",
                 "recv_views")

    def __init__(self, engine, dim, d):
        side = 1 - d
        self.key, self.recv_key = (dim, d), (dim, side)
        self.dim, self.dir, self.side = dim, d, side
        self.send, self.recv = engine.links[(dim, d)], engine.links[(dim, side)]
        self.send_kind, self.recv_kind = self.send.kind, self.recv.kind
        same = self.send_kind is self.recv_kind
        self.one = self.send_kind if same and self.send_kind.start_one is not None else None
        self.tag = TAG_BASE + 2 * dim + d
        for kind in (self.send_kind,) if same else (self.send_kind, self.recv_kind):
            kind.prepare_route(engine, self)


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
        self._routes = {}                # (dim, dir) -> _Route
        self.windows = None              # the shm transport's shared windows, where some rank's links use shm
        self.kinds = []                  # the transport objects this engine set up (every rank the same)
        # a serial, not id(self): the address of an engine collected without free() comes back for a new one, whose
        # teardown check would then see the old engine's leftovers (the same trap as ProcessGrid.owner)
        self.serial = next(_ENGINE_SERIALS)
        self._live_key = f"engine {self.serial}"
        self.links = {}
        self.profile = None              # a dict: seconds spent waiting accumulate in profile["wait"]
        self._resolve(request)
        _LIVE[self._live_key] = (grid.owner, f"halo engine {self._live_key} of rank {self.world_rank}")

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
                if req is not None and not registry.lookup(req).capabilities.same_node:
                    allow[dim][d] = (False, f"{req} requested")
                elif peer not in node_members:
                    allow[dim][d] = (False, "other node")
                elif clique and world_of[peer] // clique != self.world_rank // clique:
                    allow[dim][d] = (False, f"other clique (HMC_P2P_FAKE_CLIQUE={clique})")
                elif mask & (1 << dim):
                    allow[dim][d] = (False, f"masked (HMC_P2P_MASK={mask})")
                else:
                    allow[dim][d] = (True, "same node")
        return allow

    def _make_links(self, p2p: str, fallback: str, allow, world_of, link_class, p2p_reason=None):
        """Every partitioned link: ``p2p`` where both ends allow peer-to-peer (the symmetric AND of the ranks'
        ``allow`` tables, gathered here: collective), else ``fallback`` with the reason."""
        tables = self.comm.allgather(allow)
        for dim in range(4):
            if not self.grid.partitioned[dim]:
                continue
            for d in (0, 1):
                peer = self.ctx.neighbours[dim][d]
                mine, theirs = tables[self.rank][dim][d], tables[peer][dim][1 - d]
                if mine[0] and theirs[0]:
                    t, why = p2p, p2p_reason or mine[1]
                elif not mine[0]:
                    t, why = fallback, mine[1]
                else:
                    t, why = fallback, f"peer forbids: {theirs[1]}"
                self.links[(dim, d)] = link_class(dim, d, peer, world_of[peer], t, why)

    def _resolve(self, request):
        req, mask, clique, world_of = self._agreed_config(request)
        self.request = req
        self.timeout = self.config.comms_timeout
        allow = self._link_permissions(req, mask, clique, world_of, self._node_members())
        p2p = req if req is not None and registry.lookup(req).capabilities.same_node else HOST_DEFAULT
        fallback = req if req is not None and not registry.lookup(req).capabilities.same_node else FALLBACK
        self._make_links(p2p, fallback, allow, world_of, _Link, "shared window (same node)")
        used = set().union(*self.comm.allgather({l.transport for l in self.links.values()}))
        self.kinds = [registry.lookup(n).load() for n in sorted(used | ({req} if req else set()))]
        for kind in self.kinds:
            kind.setup(self)
        self._map_peers()

    def _map_peers(self):
        self._routes.clear()
        for kind in self.kinds:
            kind.map_peers(self)

    def _unmap_peers(self):
        self._routes.clear()
        for kind in self.kinds:
            kind.unmap_peers(self)

    def table_rows(self) -> list:
        return [{"rank": self.world_rank, "coords": list(self.ctx.coords), "link": link_name(dim, d),
                 "peer": l.peer_world, "transport": l.transport, "reason": l.reason}
                for (dim, d), l in sorted(self.links.items())]

    def transport(self, dim: int, dir_: int) -> str:
        return self.links[(dim, dir_)].transport

    def counters(self) -> dict:
        snap = self.state.snapshot()
        for kind in self.kinds:
            kind.counters(self, snap)
        return snap

    # lifecycle --------------------------------------------------------------------------------------------
    def _check_idle(self, what):
        if self.state.outstanding:
            raise CommsError(f"rank {self.world_rank}: {what} with {self.state.outstanding} halo exchange(s) not "
                             "finished: finish them first")

    def _reset_slots(self):
        """Zero this rank's slots and the protocol state; all ranks do it between barriers."""
        self.comm.Barrier()
        for kind in self.kinds:
            kind.reset(self)
        self.state.reset()
        self.comm.Barrier()

    def suspend(self, reset=True):
        """A communicator is pushed on top of this one: free the peer mappings (keep the buffers)."""
        self._check_idle("push()")
        self._unmap_peers()

    def resume(self, reset=True):
        """Back on top after a pop: map the peers again and reset counters, slots and buffer_index in
        lock-step (``reset=False``: the testing hook that shows why the reset is needed)."""
        self._map_peers()
        if reset:
            self._reset_slots()
        else:
            self.comm.Barrier()

    def free(self):
        """Unmap and free everything of this context (collective over its communicator); check for leaks."""
        self._unmap_peers()
        for kind in self.kinds:
            kind.free(self)
        self.node.Free()
        self.comm.Free()
        _LIVE.pop(self._live_key, None)

    def reserve(self, nbytes: int) -> bool:
        """Grow the transports' buffers now (collective) so that faces of ``nbytes`` need no growth later; True
        when some were reallocated."""
        return any([kind.reserve(self, nbytes) for kind in self.kinds])

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

    def receives_in_place(self) -> bool:
        """Whether exchanges may be received in place (the GPU engine's stream_gated links, HMC_P2P_IN_PLACE); never
        on the host engine."""
        return False

    def peer_sum(self):
        """The one-step rank sums over all node peers (the GPU engine's, HMC_P2P_PEER_SUMS); None here."""
        return None

    def _route(self, k) -> _Route:
        r = self._routes.get(k)
        if r is None:
            if k not in self.links or (k[0], 1 - k[1]) not in self.links:
                raise CommsError(f"rank {self.world_rank}: no halo link {k}: dimension {DIRS[k[0]]} is not "
                                 "partitioned")
            r = self._routes[k] = _Route(self, *k)
        return r

    def start(self, sends: dict):
        """Post an exchange: ``sends`` maps (dim, dir) to the face (any array) sent to neighbour[dim][dir]."""
        st = self.state
        b = st.buffer_index
        if st.busy[b] is not None:
            raise CommsError(f"rank {self.world_rank}: halo buffer {b} is still held by an unfinished exchange: at "
                             "most two exchanges may be outstanding (double buffering); finish the older first")
        if len(sends) == 1:                          # one face both ways (every Geometry.shift): a transport's own
            for k, face in sends.items():
                r = self._routes.get(k)
                if r is not None and r.one is not None:
                    ex = r.one.start_one(self, r, face, b)
                    if ex is not None:
                        st.buffer_index = b ^ 1
                        st.busy[b] = ex
                        st.outstanding += 1
                        return ex
        plan = []
        for k, f in (sends.items() if len(sends) == 1 else sorted(sends.items())):
            plan.append((self._route(k), f if type(f) is np.ndarray else np.asarray(f)))
        if plan and self.reserve(max(f.nbytes for _, f in plan)):
            plan = [(self._route(r.key), f) for r, f in plan]
            b = st.buffer_index                      # a growth restarts the protocol, buffer index 0, on every rank
        ex = Exchange(self, b)
        send_ctr, recv_ctr = st.send, st.recv
        for r, face in plan:                         # receives first, then every send
            expected = recv_ctr[r.dim][r.side] + 1
            recv_ctr[r.dim][r.side] = expected
            ex.recvs.append((r, face.shape, face.dtype, expected, r.recv_kind.post_recv(self, r, face, b)))
        deferred = {}
        for r, face in plan:
            msg = send_ctr[r.dim][r.dir] + 1
            send_ctr[r.dim][r.dir] = msg
            item = r.send_kind.send(self, ex, r, face, b, msg)
            if item is not None:
                deferred.setdefault(r.send_kind, []).append(item)
        for kind, items in deferred.items():
            kind.flush_sends(self, items)
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
        deferred = {}
        for r, shape, dtype, expected, token in self.recvs:
            key = r.recv_key
            dest = None if out is None else out.get(key)
            src, item = r.recv_kind.receive(eng, self, r, shape, dtype, expected, token, b)
            if item is not None:
                deferred.setdefault(r.recv_kind, []).append(item)
            if dest is None:
                dest = src.copy()
            else:
                np.copyto(dest, src)
            results[key] = dest
        for kind, items in deferred.items():
            kind.flush_receives(eng, items)
        for r, token in self.sends:
            r.send_kind.complete_send(eng, r, token)
        st.busy[b] = None
        st.outstanding -= 1
        self.done = True
        return results
