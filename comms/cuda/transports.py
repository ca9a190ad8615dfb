"""The GPU halo engine: transports ``stream_gated`` and ``event`` over VMM buffers (COMMS.md), ``mpi`` per link where
peer-to-peer is not possible (other node, fake clique, mask, failed probe).

Each rank owns one *segment*, mapped into every peer-to-peer neighbour on its node: a VMM allocation (fabric or
POSIX file-descriptor handle), or a legacy CUDA IPC allocation (cuMemAlloc + IPC handle) where VMM is missing or
cannot export a file descriptor, or with HMC_P2P_ALLOC=legacy. The kind is decided collectively per node
(comms/cuda/alloc.py), printed on rank 0 and stored in the transport table (column ``alloc``)::

    header (HEADER bytes of uint64 slots)
        [SIG  + dim*2 + side]            signal counters (stream_gated), written by the sender on (dim, 1 - side)
        [ACK  + (dim*2 + dir)*2 + b]      credits: the message number the receiver consumed from buffer b
        [SIGF + (b*4 + dim)*2 + side]     binary signal flags (graph mode)
        [ACKF + (b*4 + dim)*2 + dir]      binary credit flags (graph mode; 1 = the peer may write buffer b)
    receive buffers [b][dim][side], ``capacity`` bytes each (grown collectively, never shrunk)

``stream_gated`` send (link (dim, dir), buffer b, message m): the face is packed on the compute stream into this
rank's send buffer (dim, dir, b); the link's own non-blocking stream waits for the pack (event), waits for the credit
(cuStreamWaitValue64 of its ACK slot >= the message last written to buffer b, GEQ), copies into the peer's receive
buffer (cuMemcpyAsync, copy engine) and writes m into the peer's signal slot with cuStreamWriteValue64 (default flags:
the write is ordered after the copy). Receive: the compute stream first waits for this exchange's send streams (the
"sends before waits" edge, as CUDA events), then cuStreamWaitValue64(own slot, expected, GEQ), unpacks, and writes the
credit into the sender's ACK slot. No host takes part: the exchange can be captured in a CUDA graph, with binary flags
instead of counters (``set_graph_mode``; COMMS.md "CUDA graphs", option 1).

``event`` send: the same pack and copy; the link's stream records an interprocess event (cuEventCreate with
CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING, handles exchanged once) and the host sends an MPI doorbell (the
message number). Receive: the host waits for the doorbell (with the deadline), the compute stream waits on the
peer's event (cuStreamWaitEvent), unpacks, records its own interprocess "consumed" event and sends a credit doorbell;
the sender waits for that credit and makes its stream wait on the consumed event before it writes buffer b again
(which also makes re-recording either event safe).

Data policy ``remote_write`` (HMC_P2P_DATA=remote_write): the pack kernel stores straight into the peer's buffer. It
is correct on the ``event`` path (the event orders it); behind a stream-gated signal only with a FLUSH wait, which
needs CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES (0 on the H200: disabled with a one-line notice;
HMC_P2P_FORCE_FLUSH=1 asks the driver anyway and reports its answer in one line).
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np
from cuda.bindings import driver as drv

from ..base import CommsError, CommsTimeout, DIRS, mpi
from ..halo import GPU_TRANSPORTS, MIN_CAPACITY, TAG_BASE, _LIVE, HaloEngine, link_name
from . import alloc as alloc_policy
from . import cu, ipc, vmm
from .cu import WAIT_EQ, WAIT_FLUSH, WAIT_GEQ, WRITE_DEFAULT, call, try_call

HEADER = 4096
SIG, ACK, SIGF, ACKF, SCRATCH = 0, 8, 24, 40, 56
DOORBELL_TAG = 760
CREDIT_TAG = 780
_NOTICES_SHOWN: set = set()


def sig_slot(dim, side):
    return SIG + dim * 2 + side


def ack_slot(dim, dir_, b):
    return ACK + (dim * 2 + dir_) * 2 + b


def sigf_slot(b, dim, side):
    return SIGF + (b * 4 + dim) * 2 + side


def ackf_slot(b, dim, dir_):
    return ACKF + (b * 4 + dim) * 2 + dir_


def data_offset(b, dim, side, capacity):
    return HEADER + ((b * 4 + dim) * 2 + side) * capacity


class GpuLink:
    """This rank's link to neighbour[dim][dir] (sends on dir, receives from side dir)."""

    __slots__ = ("dim", "dir", "peer", "peer_world", "transport", "reason", "peer_node", "peer_header",
                 "peer_ptr", "stream", "ev_data", "ev_data_peer", "ev_done", "ev_done_peer", "ev_sent", "rstream",
                 "ev_recv")

    def __init__(self, dim, dir_, peer, peer_world, transport, reason):
        self.dim, self.dir, self.peer, self.peer_world = dim, dir_, peer, peer_world
        self.transport, self.reason = transport, reason
        self.peer_node = None
        self.peer_header = None
        self.peer_ptr = None          # base address of the peer's segment, mapped here
        self.stream = None            # the per-direction send stream (CuPy, non-blocking)
        self.ev_data = [None, None]       # event: interprocess 'data is in the peer' events, recorded by this rank
        self.ev_data_peer = [None, None]  # the peer's data events for what arrives on side dir
        self.ev_done = [None, None]       # this rank's 'consumed side dir buffer b' events
        self.ev_done_peer = [None, None]  # the peer's consumed events for what this rank sent on dir
        self.ev_sent = [None, None]       # local events: sends of buffer b enqueued on the send stream done
        self.rstream = None               # stream_gated, parallel receives: the receive chain of side dir
        self.ev_recv = [None, None]       # local events: the receive chain of buffer b done


def _notice(rank0: bool, text: str, sink: list):
    sink.append(text)
    if rank0 and text not in _NOTICES_SHOWN:
        _NOTICES_SHOWN.add(text)
        print(text, file=sys.stderr, flush=True)


class GpuHaloEngine(HaloEngine):
    """Halo exchanges of one communicator context on the GPU (see the module docstring). Faces may be CuPy arrays
    (device to device) or NumPy arrays (staged through the device); results come back as the faces came in."""

    device_faces = True

    # set-up ---------------------------------------------------------------------------------------------------
    def _resolve(self, request):
        import cupy

        self.cp = cupy
        MPI = mpi()
        self.seg = None
        self.capacity = 0
        self.peer_maps = {}               # node rank -> PeerMapping of its segment
        self.graph_mode = False
        self.notices = []
        self._sendbufs = {}
        self._views = {}
        self._doorbells = {}
        self._pending = {}                # key -> MPI request that must complete before its buffer is reused
        self._credit_reqs = {}            # (dim, dir, b) -> (request, buffer): credit doorbells (event)
        self._used_streams = {}
        self._ipc_keys = []
        self._owned_events = []
        self._opened_events = []
        self.broker = None
        req, mask, clique, world_of = self._agreed_config(request)
        if req not in GPU_TRANSPORTS + ("mpi",):
            raise CommsError(f"GpuHaloEngine serves the GPU transports {GPU_TRANSPORTS} (and mpi with device "
                             f"faces), not {req!r}")
        self.request = req
        self.timeout = self.config.comms_timeout
        rank0 = self.rank == 0
        node_members = self._node_members()
        self.dev = cu.device(self.node.rank, self.config.cuda_device)
        self.aux = cupy.cuda.Stream(non_blocking=True)

        # start-up checks (collective): 64-bit memops, FLUSH, data policy
        facts = self.comm.allgather(self.dev.facts())
        self.facts = facts
        if req == "stream_gated":
            bad = [r for r, f in enumerate(facts) if not f["memops64"]]
            if bad:
                raise CommsError(f"transport 'stream_gated' needs 64-bit stream memory operations, but "
                                 f"CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0 on rank(s) {bad} "
                                 f"({facts[bad[0]]['name']}): use --transport event or mpi")
        data_req = self.config.p2p_data                # copy_engine or remote_write (checked by the configuration)
        self.policy = "copy_engine"
        self.wait_flags = WAIT_GEQ
        self.flush_answer = None
        if req == "stream_gated":
            flush_all = all(f["flush_remote_writes"] for f in facts)
            force = self.config.p2p_force_flush
            if force:
                ok, text = self._try_flush_wait()
                answers = self.comm.allgather((ok, text))
                ok = all(a for a, _ in answers)
                text = next((t for a, t in answers if not a), answers[0][1])
                self.flush_answer = text
                line = (f"comms: HMC_P2P_FORCE_FLUSH=1 on {self.dev.name} (CAN_FLUSH_REMOTE_WRITES="
                        f"{facts[0]['flush_remote_writes']}): cuStreamWaitValue64(GEQ|FLUSH) -> {text}: "
                        + ("remote_write enabled (forced)" if ok else "remote_write stays disabled"))
                _notice(rank0, line, self.notices)
                if ok:
                    self.policy = "remote_write"
                    self.wait_flags = WAIT_GEQ | WAIT_FLUSH
            elif not flush_all:
                _notice(rank0, f"comms: remote_write disabled: CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES is 0 on "
                               f"{self.dev.name} (no FLUSH for the stream-gated wait); halos move by copy engine",
                        self.notices)
            elif data_req == "remote_write":
                self.policy = "remote_write"
                self.wait_flags = WAIT_GEQ | WAIT_FLUSH
        elif data_req == "remote_write":
            self.policy = "remote_write"          # the interprocess event orders the pack kernel's stores

        # per-link permission, as on the CPU
        allow = self._link_permissions(req, mask, clique, world_of, node_members)

        # the allocation kind (collective per node: fabric, posix_fd or legacy), the fd broker, and the symmetric
        # reachability probe
        self.handle_type = vmm.POSIX_FD
        self.alloc_kind = None
        self._alloc_facts = []
        self.probe = {}
        if req != "mpi":
            self._choose_alloc(rank0)
            before = [list(row) for row in allow]
            self.probe = self._probe(allow)
            failed = [v for v in self.probe.values() if v]
            if self.alloc_kind == "fabric" and self.comm.allreduce(bool(failed), op=MPI.LOR):
                # fabric handles were created but a peer could not import one (no shared IMEX channel)
                kind, text = alloc_policy.after_fabric_import_failure(self._alloc_facts)
                _notice(rank0, f"comms: fabric handle import failed ({failed[0] if failed else 'on a peer'}); "
                               f"{text}", self.notices)
                self._set_alloc(kind)
                allow[:] = before
                self.probe = self._probe(allow)
        tables = self.comm.allgather(allow)
        any_p2p = False
        for dim in range(4):
            if not self.grid.partitioned[dim]:
                continue
            for d in (0, 1):
                peer = self.ctx.neighbours[dim][d]
                mine, theirs = tables[self.rank][dim][d], tables[peer][dim][1 - d]
                if mine[0] and theirs[0]:
                    t, why = req, mine[1]
                elif not mine[0]:
                    t, why = "mpi", mine[1]
                else:
                    t, why = "mpi", f"peer forbids: {theirs[1]}"
                self.links[(dim, d)] = GpuLink(dim, d, peer, world_of[peer], t, why)
                any_p2p |= t != "mpi"
        any_p2p = self.comm.allreduce(any_p2p, op=MPI.LOR)
        self.pack_event = cupy.cuda.Event(disable_timing=True)
        for link in self.links.values():
            if link.transport != "mpi":
                link.stream = cupy.cuda.Stream(non_blocking=True)
                link.ev_sent = [cupy.cuda.Event(disable_timing=True) for _ in (0, 1)]
                if link.transport == "stream_gated":
                    link.rstream = cupy.cuda.Stream(non_blocking=True)
                    link.ev_recv = [cupy.cuda.Event(disable_timing=True) for _ in (0, 1)]
        self.fin_event = cupy.cuda.Event(disable_timing=True)
        # stream_gated receives: each link's chain (wait, reset, copy out, credit) on its own stream, joined by events,
        # so that they overlap (in a graph: parallel branches); HMC_P2P_PARALLEL_RECV=0: one after the other on the
        # compute stream. Decided collectively (it changes no protocol step, only where the steps are enqueued).
        par = self.config.p2p_parallel_recv
        self.parallel_recv = all(self.comm.allgather(par))
        if any_p2p:
            self._new_segment(MIN_CAPACITY)
            self._map_peers()
            self._reset_slots()

    def _choose_alloc(self, rank0: bool):
        """The allocation kind, the same on every rank of a node (comms/cuda/alloc.py): every rank states its
        HMC_P2P_ALLOC and its device facts, the node gathers them and applies the same rule; errors are raised on
        every rank of the communicator together. (Not yet run on a GPU: tests/comms/test_alloc_policy.py runs it
        against a stand-in driver; tests/comms/test_gpu_transports.py::test_legacy_ipc_allocation on the device.)"""
        request = err = None
        try:
            request = alloc_policy.agree(self.comm.allgather(self.config.p2p_alloc))
        except CommsError as e:
            err = str(e)
        if err is None:
            dev = self.dev
            if request == "legacy":
                mine = alloc_policy.rank_facts(dev.vmm)
            elif not dev.vmm:
                mine = alloc_policy.rank_facts(0)
            else:
                allow_fabric = self.config.p2p_fabric
                ht, note = vmm.choose_handle_type(dev.ordinal, allow_fabric)
                mine = alloc_policy.rank_facts(1, int(ht) == int(vmm.FABRIC), note,
                                               vmm.posix_fd_export_error(dev.ordinal))
            facts = self.node.allgather(mine)
            self._alloc_facts = facts
            try:
                kind, notes = alloc_policy.resolve(request, facts)
            except CommsError as e:
                err = str(e)
        errors = [e for e in self.comm.allgather(err) if e]
        if errors:
            raise CommsError(errors[0])
        for note in notes:
            _notice(rank0, note, self.notices)
        self._set_alloc(kind)

    def _set_alloc(self, kind: str):
        """Use allocation kind ``kind`` from now on (the descriptor broker is made for posix_fd; collective)."""
        self.alloc_kind = kind
        if kind == "legacy":
            self.handle_type = None
        else:
            self.handle_type = vmm.FABRIC if kind == "fabric" else vmm.POSIX_FD
        if kind == "posix_fd" and self.broker is None:
            self.broker = vmm.FdBroker(self.node, self.timeout, self.world_rank)

    def _allocate(self, size: int, what: str):
        """This rank's exportable memory of the engine's allocation kind (registered under the engine)."""
        if self.alloc_kind == "legacy":
            return ipc.IpcAllocation(size, self.dev.ordinal, owner=id(self), what=what)
        return vmm.Allocation(size, self.dev.ordinal, self.handle_type, owner=id(self), what=what)

    def _import(self, shared, size: int, what: str):
        """A peer's allocation mapped here from what :meth:`_share` returned for it (registered under the engine)."""
        if self.alloc_kind == "legacy":
            return ipc.IpcMapping(shared, size, owner=id(self), what=what)
        return vmm.PeerMapping(shared, self.handle_type, size, self.dev.ordinal, owner=id(self), what=what)

    def _try_import(self, shared, size: int, what: str):
        if self.alloc_kind == "legacy":
            return ipc.try_open(shared, size, owner=id(self), what=what)
        return vmm.try_import(shared, self.handle_type, size, self.dev.ordinal, owner=id(self), what=what)

    def _try_flush_wait(self):
        """Ask the driver for a FLUSH wait on a satisfied local slot: (accepted, one-line answer)."""
        slot = self.cp.zeros(1, dtype=np.uint64)
        err, _ = try_call(drv.cuStreamWaitValue64, self.aux.ptr, slot.data.ptr, 0, WAIT_GEQ | WAIT_FLUSH)
        if err is None:
            err, _ = try_call(drv.cuStreamSynchronize, self.aux.ptr)
        if err is None:
            return True, "CUDA_SUCCESS"
        return False, getattr(err, "name", str(err))

    def _share(self, alloc, peers: set) -> dict:
        """Collective over the node: {node rank: shareable handle} of ``alloc`` from every node rank in ``peers``
        (fabric handles and legacy IPC handles as bytes through MPI, file descriptors through the broker; the caller
        closes fds)."""
        if self.alloc_kind in ("fabric", "legacy"):
            mine = alloc.export() if alloc is not None else None
            allh = self.node.allgather(mine)
            return {p: allh[p] for p in peers}
        wants = {p: "segment" for p in peers}
        got = self.broker.exchange(wants, lambda r, q: (b"", [alloc.export()]))
        return {p: fds[0] for p, (_, fds) in got.items()}

    def _close_handles(self, shared: dict):
        if self.alloc_kind == "posix_fd":
            for fd in shared.values():
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _probe(self, allow) -> dict:
        """Export a small probe allocation, import each same-node candidate neighbour's, and mark links whose
        import failed (NOT_PERMITTED, NOT_SUPPORTED, INVALID_VALUE) unreachable. Collective over the node."""
        cand = {}
        for dim in range(4):
            for d in (0, 1):
                if allow[dim][d][0]:
                    peer = self.ctx.neighbours[dim][d]
                    if peer != self.rank:
                        cand[self.node_rank_of[peer]] = peer
        alloc = self._allocate(1, "reachability probe")
        results = {}
        try:
            shared = self._share(alloc, set(cand))
            try:
                for nr, h in shared.items():
                    m, why = self._try_import(h, alloc.size, f"probe of node rank {nr}")
                    if m is not None:
                        m.free()
                    results[nr] = why
            finally:
                self._close_handles(shared)
        finally:
            self.node.Barrier()          # no rank frees its probe while a peer may still import it
            alloc.free()
        for dim in range(4):
            for d in (0, 1):
                if allow[dim][d][0]:
                    peer = self.ctx.neighbours[dim][d]
                    why = None if peer == self.rank else results.get(self.node_rank_of[peer])
                    if why:
                        allow[dim][d] = (False, f"probe: {why}")
                    else:
                        how = ("legacy CUDA IPC open" if self.alloc_kind == "legacy"
                               else f"VMM {self.alloc_kind} import")
                        allow[dim][d] = (True, "self" if peer == self.rank else how)
        return {k: v for k, v in results.items()}

    # segments, mappings, events ----------------------------------------------------------------------------
    def _new_segment(self, capacity: int):
        self.capacity = int(capacity)
        self.seg = self._allocate(HEADER + 16 * self.capacity, f"halo segment of rank {self.world_rank}")
        call(drv.cuMemsetD8, self.seg.ptr, 0, self.seg.size)

    def _map_peers(self):
        """Import every peer-to-peer neighbour's segment (collective over the node) and open its events."""
        self._views.clear()
        peers = {self.node_rank_of[l.peer] for l in self.links.values() if l.transport != "mpi" and l.peer != self.rank}
        shared = self._share(self.seg, peers)
        try:
            for nr, h in shared.items():
                self.peer_maps[nr] = self._import(h, self.seg.size, f"halo segment of node rank {nr}")
        finally:
            self._close_handles(shared)
        for link in self.links.values():
            if link.transport == "mpi":
                continue
            link.peer_node = self.node_rank_of[link.peer]
            link.peer_ptr = self.seg.ptr if link.peer == self.rank else self.peer_maps[link.peer_node].ptr
        if self.request == "event":
            self._open_events()

    def _open_events(self):
        """event transport: create this rank's interprocess events once, exchange their handles (collective over
        the engine's communicator) and open the neighbours'."""
        flags = int(drv.CUevent_flags.CU_EVENT_INTERPROCESS) | int(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        if not self._owned_events:
            for link in self.links.values():
                if link.transport == "mpi":
                    continue
                for b in (0, 1):
                    link.ev_data[b] = call(drv.cuEventCreate, flags)
                    link.ev_done[b] = call(drv.cuEventCreate, flags)
                    self._owned_events += [link.ev_data[b], link.ev_done[b]]
            self._ipc_keys.append(vmm.register(id(self), f"{len(self._owned_events)} interprocess events of rank "
                                                         f"{self.world_rank}"))
        mine = {}
        for (dim, d), link in self.links.items():
            if link.transport == "mpi":
                continue
            for b in (0, 1):
                mine[("data", dim, d, b)] = bytes(call(drv.cuIpcGetEventHandle, link.ev_data[b]).reserved)
                mine[("done", dim, d, b)] = bytes(call(drv.cuIpcGetEventHandle, link.ev_done[b]).reserved)
        everyone = self.comm.allgather(mine)
        for (dim, d), link in self.links.items():
            if link.transport == "mpi":
                continue
            peer_link_dir = 1 - d
            for b in (0, 1):
                if link.peer == self.rank:
                    link.ev_data_peer[b] = self.links[(dim, peer_link_dir)].ev_data[b]
                    link.ev_done_peer[b] = self.links[(dim, peer_link_dir)].ev_done[b]
                    continue
                theirs = everyone[link.peer]
                for kind, attr in (("data", "ev_data_peer"), ("done", "ev_done_peer")):
                    h = drv.CUipcEventHandle()
                    h.reserved = theirs[(kind, dim, peer_link_dir, b)]
                    ev = call(drv.cuIpcOpenEventHandle, h, detail=f"{kind} event of rank {link.peer_world}")
                    getattr(link, attr)[b] = ev
                    self._opened_events.append(ev)
        if self._opened_events:
            self._ipc_keys.append(vmm.register(id(self), f"{len(self._opened_events)} opened peer events of rank "
                                                         f"{self.world_rank}"))

    def _close_peer_events(self):
        for ev in self._opened_events:
            try_call(drv.cuEventDestroy, ev)
        self._opened_events = []
        for link in self.links.values():
            link.ev_data_peer = [None, None]
            link.ev_done_peer = [None, None]
        while len(self._ipc_keys) > 1:
            vmm.unregister(self._ipc_keys.pop())
        if self._ipc_keys and not self._owned_events:
            vmm.unregister(self._ipc_keys.pop())

    def _unmap_peers(self):
        self._views.clear()
        self._close_peer_events()
        for m in self.peer_maps.values():
            m.free()
        self.peer_maps.clear()
        for link in self.links.values():
            link.peer_ptr = None

    # device and host synchronisation --------------------------------------------------------------------------
    def _streams(self):
        out = [s for s in self._used_streams.values()]
        out += [l.stream for l in self.links.values() if l.stream is not None]
        out += [l.rstream for l in self.links.values() if l.rstream is not None]
        out.append(self.aux)
        return out

    def sync(self, what: str = "synchronize"):
        """Wait for every stream this engine used, with the deadline (a device-side wait that cannot finish is
        reported as a CommsTimeout naming the rank, the slots and the counters)."""
        deadline = time.monotonic() + self.timeout
        pending = self._streams()
        spins = 0
        while pending:
            left = []
            for s in pending:
                err, _ = try_call(drv.cuStreamQuery, s.ptr)
                if err is None:
                    continue
                if err != drv.CUresult.CUDA_ERROR_NOT_READY:
                    raise cu.CudaError("cuStreamQuery", err, f"rank {self.world_rank}, {what}")
                left.append(s)
            pending = left
            if not pending:
                break
            spins += 1
            if spins > 200:
                time.sleep(0.0002)
            if time.monotonic() > deadline:
                raise CommsTimeout(f"rank {self.world_rank}: device work of the halo exchange not finished after "
                                   f"{self.timeout:g} s (HMC_COMMS_TIMEOUT) at {what}: own slots "
                                   f"{self.read_slots()}; {self._counter_text()}")
        self._used_streams.clear()

    def read_slots(self) -> dict:
        """This rank's signal and credit slots, read on the auxiliary stream (not blocked by a compute stream)."""
        if self.seg is None:
            return {}
        host = np.zeros(SCRATCH, dtype=np.uint64)
        call(drv.cuMemcpyDtoHAsync, host, self.seg.ptr, host.nbytes, self.aux.ptr)
        call(drv.cuStreamSynchronize, self.aux.ptr)
        return {"signal": host[SIG:SIG + 8].reshape(4, 2).tolist(),
                "ack": host[ACK:ACK + 16].reshape(4, 2, 2).tolist(),
                "signal_flags": host[SIGF:SIGF + 16].reshape(2, 4, 2).tolist(),
                "ack_flags": host[ACKF:ACKF + 16].reshape(2, 4, 2).tolist()}

    def counters(self) -> dict:
        snap = self.state.snapshot()
        if self.seg is not None:
            s = self.read_slots()
            snap["signal_slots"] = s["signal"]
            snap["ack_slots"] = [[[int(v) for v in s["ack"][dim][d]] for d in (0, 1)] for dim in range(4)]
        return snap

    def _wait_req(self, req, describe):
        self._wait_request(req, describe)

    def _drain(self):
        """Complete every outstanding doorbell, credit and MPI request (all exchanges are finished everywhere)."""
        for key, req in list(self._pending.items()):
            self._wait_req(req, lambda key=key: f"rank {self.world_rank}: MPI request {key} not complete after "
                                                f"{self.timeout:g} s (HMC_COMMS_TIMEOUT); {self._counter_text()}")
        self._pending.clear()
        for (dim, d, b), (req, _) in list(self._credit_reqs.items()):
            self._wait_req(req, lambda dim=dim, d=d, b=b: (
                f"rank {self.world_rank}: no credit from rank {self.links[(dim, d)].peer_world} for buffer {b} on "
                f"link {link_name(dim, d)} (event) after {self.timeout:g} s; {self._counter_text()}"))
        self._credit_reqs.clear()

    def _write_header(self):
        """Zero this rank's slots; graph mode's credit flags start at 1 (every buffer free)."""
        hdr = np.zeros(HEADER // 8, dtype=np.uint64)
        hdr[ACKF:ACKF + 16] = 1
        call(drv.cuMemcpyHtoD, self.seg.ptr, hdr, hdr.nbytes)

    def _reset_slots(self):
        """Counters, slots and buffer_index reset in lock-step (all ranks, between barriers)."""
        self.sync("reset")
        self._drain()
        self.comm.Barrier()
        if self.seg is not None:
            self._write_header()
            call(drv.cuCtxSynchronize)
        self.state.reset()
        self.comm.Barrier()

    # lifecycle ------------------------------------------------------------------------------------------------
    def suspend(self, reset=True):
        self._check_idle("push()")
        self.sync("push()")
        self._drain()
        self.node.Barrier()
        self._unmap_peers()

    def resume(self, reset=True):
        if self.seg is not None:
            self._map_peers()
        if reset:
            self._reset_slots()
        else:
            self.comm.Barrier()

    def set_graph_mode(self, on: bool = True):
        """Binary flags instead of counters (COMMS.md "CUDA graphs", option 1), so that a captured exchange can be
        replayed: collective; every link must be stream_gated; slots and counters are reset in lock-step."""
        self._check_idle("set_graph_mode()")
        if on:
            bad = [f"{link_name(*k)}: {l.transport} ({l.reason})" for k, l in sorted(self.links.items())
                   if l.transport != "stream_gated"]
            bad = self.comm.allgather(bad)
            bad = [f"rank {r}: {x}" for r, xs in enumerate(bad) for x in xs]
            if bad:
                raise CommsError("graph capture needs every link stream_gated: " + "; ".join(bad[:4]))
            if self.policy == "remote_write":
                raise CommsError("graph capture is implemented for the copy_engine policy only")
        self.graph_mode = bool(on)
        self._reset_slots()

    def free(self):
        self.sync("free()")
        self._drain()
        self.node.Barrier()
        self._unmap_peers()
        self.node.Barrier()
        for ev in self._owned_events:
            try_call(drv.cuEventDestroy, ev)
        self._owned_events = []
        for k in self._ipc_keys:
            vmm.unregister(k)
        self._ipc_keys = []
        if self.seg is not None:
            self.seg.free()
            self.seg = None
        self._sendbufs.clear()
        self._views.clear()
        if self.broker is not None:
            self.broker.close()
            self.broker = None
        left = vmm.leaked(id(self))
        self.node.Free()
        self.comm.Free()
        _LIVE.pop(self._live_key, None)
        if left:
            raise CommsError(f"rank {self.world_rank}: leaked after free: {left}")

    def _grow(self, nbytes: int):
        self._check_idle(f"growing the GPU halo buffers to {nbytes} bytes")
        cap = max(MIN_CAPACITY, 1 << (int(nbytes) - 1).bit_length())
        self.sync("grow")
        self._drain()
        self.node.Barrier()
        self._unmap_peers()
        self.node.Barrier()
        self.seg.free()
        self._new_segment(cap)
        self._map_peers()
        self._reset_slots()

    def reserve(self, nbytes: int):
        if self.seg is not None and nbytes > self.capacity:
            self._grow(nbytes)

    def table_rows(self) -> list:
        rows = super().table_rows()
        for r, ((dim, d), l) in zip(rows, sorted(self.links.items())):
            r["policy"] = self.policy if l.transport != "mpi" else "host"
            r["alloc"] = self.alloc_kind if l.transport != "mpi" else "host"
        return rows

    # buffers ------------------------------------------------------------------------------------------------
    def _dev_view(self, ptr: int, shape, dtype):
        key = (ptr, shape, dtype)
        v = self._views.get(key)
        if v is None:
            cp = self.cp
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            mem = cp.cuda.UnownedMemory(ptr, max(nbytes, 1), self, self.dev.ordinal)
            v = cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(mem, 0))
            if len(self._views) > 1024:
                self._views.clear()
            self._views[key] = v
        return v

    def _send_view(self, dim, d, b, shape, dtype):
        key = ("s", dim, d, b, shape, dtype)
        v = self._views.get(key)
        if v is None:
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            buf = self._sendbufs.get((dim, d, b))
            if buf is None or buf.size < nbytes:
                buf = self.cp.empty(max(nbytes, 256), dtype=np.uint8)
                self._sendbufs[(dim, d, b)] = buf
                self._views.clear()
            v = buf[:nbytes].view(dtype).reshape(shape)
            self._views[key] = v
        return v

    def _doorbell(self, key):
        buf = self._doorbells.get(key)
        if buf is None:
            buf = self._doorbells[key] = np.zeros(1, dtype=np.int64)
        req = self._pending.pop(key, None)
        if req is not None:
            self._wait_req(req, lambda: f"rank {self.world_rank}: doorbell {key} not delivered after "
                                        f"{self.timeout:g} s (HMC_COMMS_TIMEOUT); {self._counter_text()}")
        return buf

    # exchanges ----------------------------------------------------------------------------------------------
    def start(self, sends: dict) -> "GpuExchange":
        cp = self.cp
        st = self.state
        b = st.buffer_index
        if st.busy[b] is not None:
            raise CommsError(f"rank {self.world_rank}: halo buffer {b} is still held by an unfinished exchange: at "
                             "most two exchanges may be outstanding (double buffering); finish the older first")
        keys = sorted(sends)
        faces = []
        host_in = False
        for k in keys:
            if k not in self.links:
                raise CommsError(f"rank {self.world_rank}: no halo link {k}: dimension {DIRS[k[0]]} is not "
                                 "partitioned")
            f = sends[k]
            if isinstance(f, cp.ndarray):
                faces.append(f)
            else:
                host_in = True
                faces.append(np.asarray(f))
        if self.seg is not None:
            need = max((f.nbytes for f in faces), default=0)
            if need > self.capacity:
                self._grow(need)
        cs = cp.cuda.get_current_stream()
        self._used_streams[cs.ptr] = cs
        ex = GpuExchange(self, b, cs, host_in)
        comm = self.comm
        for (dim, d), face in zip(keys, faces):                 # receives first
            side = 1 - d
            link = self.links[(dim, side)]
            expected = st.recv[dim][side] + 1
            st.recv[dim][side] = expected
            req = view = None
            if link.transport == "mpi":
                view, raw = self._mpi_view("r", dim, side, b, face.shape, face.dtype)
                req = comm.Irecv(raw, source=link.peer, tag=TAG_BASE + 2 * dim + d)
            elif link.transport == "event":
                view = self._doorbell(("r", dim, side, b))
                req = comm.Irecv(view, source=link.peer, tag=DOORBELL_TAG + 2 * dim + d)
            ex.recvs.append((dim, side, face.shape, face.dtype, expected, req, view))
        p2p = []
        for (dim, d), face in zip(keys, faces):
            link = self.links[(dim, d)]
            msg = st.send[dim][d] + 1
            st.send[dim][d] = msg
            if link.transport == "mpi":
                view, raw = self._mpi_view("s", dim, d, b, face.shape, face.dtype)
                if isinstance(face, np.ndarray):
                    np.copyto(view, face)
                else:
                    view[...] = cp.asnumpy(face)
                ex.sends.append((dim, d, comm.Isend(raw, dest=link.peer, tag=TAG_BASE + 2 * dim + d)))
            else:
                p2p.append((dim, d, link, msg, face))
        if p2p:
            self._send_p2p(p2p, b, cs, ex)
        st.buffer_index ^= 1
        st.busy[b] = ex
        st.outstanding += 1
        return ex

    def _credit(self, link, dim, d, b, stream_ptr):
        """Make ``stream_ptr`` wait until the peer has consumed what this rank last wrote into buffer b."""
        st = self.state
        need = st.last_sent[dim][d][b]
        if link.transport == "stream_gated":
            if self.graph_mode:
                slot = self.seg.ptr + 8 * ackf_slot(b, dim, d)
                call(drv.cuStreamWaitValue64, stream_ptr, slot, 1, WAIT_EQ)
                call(drv.cuStreamWriteValue64, stream_ptr, slot, 0, WRITE_DEFAULT)
            elif need:
                call(drv.cuStreamWaitValue64, stream_ptr, self.seg.ptr + 8 * ack_slot(dim, d, b), need, WAIT_GEQ)
        elif need:
            req, buf = self._credit_reqs.pop((dim, d, b), (None, None))
            if req is None:                 # drained already (push without reset): only the device-side wait
                call(drv.cuStreamWaitEvent, stream_ptr, link.ev_done_peer[b], 0)
                return
            self._wait_req(req, lambda: (
                f"rank {self.world_rank}: rank {link.peer_world} has not freed halo buffer {b} on link "
                f"{link_name(dim, d)} (event) after {self.timeout:g} s (HMC_COMMS_TIMEOUT): need credit {need}; "
                f"{self._counter_text()}"))
            if int(buf[0]) != need:
                raise CommsError(f"rank {self.world_rank}: credit {int(buf[0])} from rank {link.peer_world} on link "
                                 f"{link_name(dim, d)}, expected {need}")
            call(drv.cuStreamWaitEvent, stream_ptr, link.ev_done_peer[b], 0)

    def _signal(self, ex, link, dim, d, b, msg, stream_ptr):
        if link.transport == "stream_gated":
            if self.graph_mode:
                call(drv.cuStreamWriteValue64, stream_ptr, link.peer_ptr + 8 * sigf_slot(b, dim, 1 - d), 1,
                     WRITE_DEFAULT)
            else:
                call(drv.cuStreamWriteValue64, stream_ptr, link.peer_ptr + 8 * sig_slot(dim, 1 - d), msg,
                     WRITE_DEFAULT)
            return
        call(drv.cuEventRecord, link.ev_data[b], stream_ptr)
        key = ("s", dim, d, b)
        buf = self._doorbell(key)
        buf[0] = msg
        req = self.comm.Isend(buf, dest=link.peer, tag=DOORBELL_TAG + 2 * dim + d)
        self._pending[key] = req
        cbuf = np.zeros(1, dtype=np.int64)
        self._credit_reqs[(dim, d, b)] = (self.comm.Irecv(cbuf, source=link.peer, tag=CREDIT_TAG + 2 * dim + d),
                                          cbuf)

    def _send_p2p(self, p2p, b, cs, ex):
        st = self.state
        cap = self.capacity
        if self.policy == "remote_write":
            for dim, d, link, msg, face in p2p:
                self._credit(link, dim, d, b, cs.ptr)
                st.last_sent[dim][d][b] = msg
                dst = self._dev_view(link.peer_ptr + data_offset(b, dim, 1 - d, cap), face.shape, face.dtype)
                if isinstance(face, np.ndarray):
                    dst.set(np.ascontiguousarray(face), stream=cs)
                else:
                    dst[...] = face
                self._signal(ex, link, dim, d, b, msg, cs.ptr)
            return
        srcs = []
        for dim, d, link, msg, face in p2p:
            if not isinstance(face, np.ndarray) and face.flags.c_contiguous:
                srcs.append((face.data.ptr, face.nbytes))   # the copy engine reads the face itself (kept alive
                ex.keep.append(face)                        # by the exchange; the compute stream waits for the
                continue                                    # copy before finish() returns)
            sb = self._send_view(dim, d, b, face.shape, face.dtype)
            if isinstance(face, np.ndarray):
                sb.set(np.ascontiguousarray(face), stream=cs)
            else:
                sb[...] = face
            srcs.append((sb.data.ptr, sb.nbytes))
        call(drv.cuEventRecord, self.pack_event.ptr, cs.ptr)
        for (dim, d, link, msg, face), (src, nbytes) in zip(p2p, srcs):
            sp = link.stream.ptr
            call(drv.cuStreamWaitEvent, sp, self.pack_event.ptr, 0)
            self._credit(link, dim, d, b, sp)
            st.last_sent[dim][d][b] = msg
            call(drv.cuMemcpyAsync, link.peer_ptr + data_offset(b, dim, 1 - d, cap), src, nbytes, sp)
            self._signal(ex, link, dim, d, b, msg, sp)
            call(drv.cuEventRecord, link.ev_sent[b].ptr, sp)
            ex.sent.append(link.ev_sent[b])


class GpuExchange:
    """One posted GPU exchange; ``finish`` enqueues the waits and the unpack on the exchange's compute stream."""

    __slots__ = ("engine", "buffer", "stream", "host_in", "recvs", "sends", "sent", "done", "observed", "keep")

    def __init__(self, engine, buffer, stream, host_in):
        self.engine, self.buffer, self.stream, self.host_in = engine, buffer, stream, host_in
        self.recvs = []
        self.sends = []
        self.sent = []
        self.keep = []
        self.done = False
        self.observed = {}

    def finish(self, out: dict | None = None) -> dict:
        if self.done:
            raise CommsError("finish() called twice on one halo exchange")
        eng, st, b = self.engine, self.engine.state, self.buffer
        cp = eng.cp
        cs = self.stream
        csp = cs.ptr
        switch = cp.cuda.get_current_stream().ptr != csp
        if switch:
            cs.__enter__()
        try:
            results = {}
            fenced = False
            cap = eng.capacity
            joins = []
            started = False
            for dim, side, shape, dtype, expected, req, view in self.recvs:
                link = eng.links[(dim, side)]
                dest = None if out is None else out.get((dim, side))
                if (link.transport == "stream_gated" and eng.parallel_recv and link.rstream is not None
                        and not self.host_in and (dest is None or (isinstance(dest, cp.ndarray)
                                                                   and dest.flags.c_contiguous and dest.dtype == dtype
                                                                   and dest.shape == tuple(shape)))):
                    if not started:                            # the chains start after the compute stream's
                        call(drv.cuEventRecord, eng.fin_event.ptr, csp)   # earlier readers of the destinations
                        started = True
                    results[(dim, side)] = self._receive_chain(link, dim, side, shape, dtype, expected, dest)
                    joins.append(link.ev_recv[b])
                    continue
                if link.transport == "mpi":
                    if not req.Test():
                        eng._wait_request(req, lambda dim=dim, side=side, expected=expected: (
                            f"rank {eng.world_rank}: no halo from rank {link.peer_world} on link "
                            f"{link_name(dim, side)} (mpi) after {eng.timeout:g} s (HMC_COMMS_TIMEOUT): waiting for "
                            f"message {expected} of this link; {eng._counter_text()}"))
                    results[(dim, side)] = self._deliver(view, dest, shape, dtype)   # host buffer -> caller's kind
                    continue
                else:
                    if not fenced:
                        for ev in self.sent:                   # my sends before my waits
                            call(drv.cuStreamWaitEvent, csp, ev.ptr, 0)
                        fenced = True
                    own = eng.seg.ptr
                    if link.transport == "stream_gated":
                        if eng.graph_mode:
                            slot = own + 8 * sigf_slot(b, dim, side)
                            call(drv.cuStreamWaitValue64, csp, slot, 1, WAIT_EQ)
                            call(drv.cuStreamWriteValue64, csp, slot, 0, WRITE_DEFAULT)
                        else:
                            call(drv.cuStreamWaitValue64, csp, own + 8 * sig_slot(dim, side), expected,
                                 eng.wait_flags)
                    else:
                        eng._wait_request(req, lambda dim=dim, side=side, expected=expected: (
                            f"rank {eng.world_rank}: no doorbell from rank {link.peer_world} on link "
                            f"{link_name(dim, side)} (event) after {eng.timeout:g} s (HMC_COMMS_TIMEOUT): waiting "
                            f"for message {expected}; {eng._counter_text()}"))
                        if int(view[0]) != expected:
                            raise CommsError(f"rank {eng.world_rank}: doorbell {int(view[0])} on link "
                                             f"{link_name(dim, side)}, expected {expected}")
                        call(drv.cuStreamWaitEvent, csp, link.ev_data_peer[b], 0)
                src_ptr = own + data_offset(b, dim, side, cap)
                if dest is None and not self.host_in:
                    dest = cp.empty(shape, dtype)
                if (isinstance(dest, cp.ndarray) and dest.flags.c_contiguous and dest.dtype == dtype
                        and dest.shape == tuple(shape)):
                    call(drv.cuMemcpyAsync, dest.data.ptr, src_ptr, dest.nbytes, csp)   # copy engine, no kernel
                    results[(dim, side)] = dest
                else:
                    src = eng._dev_view(src_ptr, shape, dtype)
                    results[(dim, side)] = self._deliver(src, dest, shape, dtype)
                if link.transport == "stream_gated":
                    if eng.graph_mode:
                        call(drv.cuStreamWriteValue64, csp, link.peer_ptr + 8 * ackf_slot(b, dim, 1 - side), 1,
                             WRITE_DEFAULT)
                    else:
                        call(drv.cuStreamWriteValue64, csp, link.peer_ptr + 8 * ack_slot(dim, 1 - side, b), expected,
                             WRITE_DEFAULT)
                elif link.transport == "event":
                    call(drv.cuEventRecord, link.ev_done[b], csp)
                    key = ("k", dim, side, b)
                    buf = eng._doorbell(key)
                    buf[0] = expected
                    eng._pending[key] = eng.comm.Isend(buf, dest=link.peer, tag=CREDIT_TAG + 2 * dim + (1 - side))
            for ev in joins:                                   # the parallel receive chains
                call(drv.cuStreamWaitEvent, csp, ev.ptr, 0)
            if not fenced:
                for ev in self.sent:                           # p2p sends whose receives came by mpi
                    call(drv.cuStreamWaitEvent, csp, ev.ptr, 0)
            for dim, d, req in self.sends:
                link = eng.links[(dim, d)]
                if req.Test():
                    continue
                eng._wait_request(req, lambda dim=dim, d=d: (
                    f"rank {eng.world_rank}: send to rank {link.peer_world} on link {link_name(dim, d)} (mpi) not "
                    f"complete after {eng.timeout:g} s (HMC_COMMS_TIMEOUT); {eng._counter_text()}"))
        finally:
            if switch:
                cs.__exit__()
        st.busy[b] = None
        st.outstanding -= 1
        self.done = True
        self.keep = []
        return results

    def _receive_chain(self, link, dim, side, shape, dtype, expected, dest):
        """stream_gated, one link: on the link's receive stream, after this exchange's sends (events: my sends
        before my waits) and the compute stream's earlier work: wait for the signal (graph mode: EQ 1, then reset
        the flag on the same stream before the join), copy the face out, return the credit; record ev_recv[b]."""
        eng, b = self.engine, self.buffer
        rs = link.rstream.ptr
        call(drv.cuStreamWaitEvent, rs, eng.fin_event.ptr, 0)
        for ev in self.sent:
            call(drv.cuStreamWaitEvent, rs, ev.ptr, 0)
        own = eng.seg.ptr
        if eng.graph_mode:
            slot = own + 8 * sigf_slot(b, dim, side)
            call(drv.cuStreamWaitValue64, rs, slot, 1, WAIT_EQ)
            call(drv.cuStreamWriteValue64, rs, slot, 0, WRITE_DEFAULT)
        else:
            call(drv.cuStreamWaitValue64, rs, own + 8 * sig_slot(dim, side), expected, eng.wait_flags)
        if dest is None:
            dest = eng.cp.empty(shape, dtype)
        call(drv.cuMemcpyAsync, dest.data.ptr, own + data_offset(b, dim, side, eng.capacity), dest.nbytes, rs)
        if eng.graph_mode:
            call(drv.cuStreamWriteValue64, rs, link.peer_ptr + 8 * ackf_slot(b, dim, 1 - side), 1, WRITE_DEFAULT)
        else:
            call(drv.cuStreamWriteValue64, rs, link.peer_ptr + 8 * ack_slot(dim, 1 - side, b), expected,
                 WRITE_DEFAULT)
        call(drv.cuEventRecord, link.ev_recv[b].ptr, rs)
        return dest

    def _deliver(self, src, dest, shape, dtype):
        """Copy a received face (host or device ``src``) into ``dest`` or a new array of the caller's kind."""
        cp = self.engine.cp
        if isinstance(src, np.ndarray):                  # mpi link: host buffer
            if dest is None:
                return src.copy() if self.host_in else cp.asarray(src)
            if isinstance(dest, np.ndarray):
                np.copyto(dest, src)
            else:
                dest[...] = cp.asarray(src)
            return dest
        if dest is None:
            if self.host_in:
                return cp.asnumpy(src, stream=self.stream)
            dest = cp.empty(shape, dtype)
            dest[...] = src
            return dest
        if isinstance(dest, np.ndarray):
            np.copyto(dest, cp.asnumpy(src, stream=self.stream))
        else:
            dest[...] = src
        return dest
