"""The GPU halo engine: the peer-to-peer transports with device buffers (``stream_gated``, ``event``:
comms/transport/stream_gated.py, comms/transport/event.py, behind the link interface of comms/transport/gpu.py) over
one segment per rank (comms/cuda/segment.py), and ``mpi`` per link where peer-to-peer is not possible (other node,
fake clique, mask, failed probe: device to host, MPI, host to device).

Each rank owns one *segment*, mapped into every peer-to-peer neighbour on its node: a VMM allocation (fabric or
POSIX file-descriptor handle), or a legacy CUDA IPC allocation (cuMemAlloc + IPC handle) where VMM is missing or
cannot export a file descriptor, or with HMC_P2P_ALLOC=legacy. The kind is decided collectively per node
(comms/cuda/alloc.py), printed on rank 0 and stored in the transport table (column ``alloc``).

Send (link (dim, dir), buffer b, message m): the face is packed on the compute stream into this rank's send buffer
(dim, dir, b) (or read in place when contiguous); the link's own non-blocking stream waits for the pack (event), then
for the transport's credit, copies into the peer's receive buffer (cuMemcpyAsync, copy engine) and signals. Receive
(comms/cuda/exchange.py): the compute stream first waits for this exchange's send streams (the "sends before waits"
edge, as CUDA events), then for the transport's arrival, copies out and returns the credit; stream_gated receive
chains run on their own streams, joined by events.

Data policy ``remote_write`` (HMC_P2P_DATA=remote_write): the pack kernel stores straight into the peer's buffer. It
is correct on the ``event`` path (the event orders it); behind a stream-gated signal only with a FLUSH wait, which
needs CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES (0 on the H200: disabled with a one-line notice;
HMC_P2P_FORCE_FLUSH=1 asks the driver anyway and reports its answer in one line).
"""
from __future__ import annotations

import time

import numpy as np
from cuda.bindings import driver as drv

from ..base import _LIVE, DIRS, CommsError, CommsTimeout, link_name, mpi
from ..halo import FALLBACK, HaloEngine
from ..transport import registry
from ..transport.host import MIN_CAPACITY, TAG_BASE
from ..watchdog import Watchdog
from . import alloc as alloc_policy
from . import creditfree, cu, vmm
from .creditfree import CreditFreeOrder
from .cu import WAIT_GEQ, call, try_call
from .exchange import GpuExchange
from .segment import ACK, ACKF, HEADER, MAX_PEERS, SCRATCH, SIG, SIGF, SegmentMixin, data_offset, notice


class GpuLink:
    """This rank's link to neighbour[dim][dir] (sends on dir, receives from side dir)."""

    __slots__ = ("dim", "dir", "peer", "peer_world", "transport", "reason", "peer_node", "peer_header",
                 "peer_ptr", "stream", "ev_data", "ev_data_peer", "ev_done", "ev_done_peer", "ev_sent", "rstream",
                 "ev_recv", "kind", "p2p")

    def __init__(self, dim, dir_, peer, peer_world, transport, reason):
        self.dim, self.dir, self.peer, self.peer_world = dim, dir_, peer, peer_world
        self.transport, self.reason = transport, reason
        self.kind = registry.lookup(transport).load()     # the transport object (the registry's)
        self.p2p = self.kind.capabilities.same_node       # peer-to-peer through the segment, else staged mpi
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


class GpuHaloEngine(SegmentMixin, HaloEngine):
    """Halo exchanges of one communicator context on the GPU (see the module docstring). Faces may be CuPy arrays
    (device to device) or NumPy arrays (staged through the device); results come back as the faces came in."""

    device_faces = True

    # set-up ---------------------------------------------------------------------------------------------------
    def _resolve(self, request):
        import cupy

        self.cp = cupy
        self._init_state()
        req, mask, clique, world_of = self._agreed_config(request)
        kind = registry.lookup(req).load() if req is not None else None
        if kind is None or not (kind.capabilities.gpu_buffers or req == FALLBACK):
            raise CommsError(f"GpuHaloEngine serves the transports with device buffers "
                             f"{tuple(n for n in registry.names() if registry.lookup(n).capabilities.gpu_buffers)} "
                             f"(and mpi with device faces), not {req!r}")
        self.request = req
        self.p2p_kind = kind if kind.capabilities.gpu_buffers else None    # None: every link on the staged mpi path
        self.timeout = self.config.comms_timeout
        rank0 = self.rank == 0
        node_members = self._node_members()
        self.dev = cu.device(self.node.rank, self.config.cuda_device)
        self.aux = cupy.cuda.Stream(non_blocking=True)
        self._start_checks()
        allow = self._link_permissions(req, mask, clique, world_of, node_members)   # per link, as on the CPU
        # the allocation kind (collective per node: fabric, posix_fd or legacy), the fd broker, and the symmetric
        # reachability probe
        self.handle_type = vmm.POSIX_FD
        self.alloc_kind = None
        self._alloc_facts = []
        self.probe = {}
        if self.p2p_kind is not None:
            self._choose_alloc(rank0)
            before = [list(row) for row in allow]
            self.probe = self._probe(allow)
            failed = [v for v in self.probe.values() if v]
            if self.alloc_kind == "fabric" and self.comm.allreduce(bool(failed), op=mpi().LOR):
                # fabric handles were created but a peer could not import one (no shared IMEX channel)
                kind, text = alloc_policy.after_fabric_import_failure(self._alloc_facts)
                notice(rank0, f"comms: fabric handle import failed ({failed[0] if failed else 'on a peer'}); "
                              f"{text}", self.notices)
                self._set_alloc(kind)
                allow[:] = before
                self.probe = self._probe(allow)
        self._make_links(req, FALLBACK, allow, world_of, GpuLink)
        self._make_streams()

    def _init_state(self):
        self.seg = None
        self.capacity = 0
        self.peer_maps = {}               # node rank -> PeerMapping of its segment
        self.graph_mode = False
        self.peer_sums = False
        self._peer_sum = None
        self.credit_free = False
        self.credit_order = CreditFreeOrder(self)
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

    def _start_checks(self):
        """Collective start-up checks: the transport's device needs (64-bit memops for stream_gated), then the data
        policy (copy_engine unless remote_write is asked for and allowed: FLUSH behind a stream-gated signal)."""
        facts = self.comm.allgather(self.dev.facts())
        self.facts = facts
        if self.p2p_kind is not None:
            self.p2p_kind.check_device(self, facts)
        data_req = self.config.p2p_data                # copy_engine or remote_write (checked by the configuration)
        self.policy = "copy_engine"
        self.wait_flags = WAIT_GEQ
        self.flush_answer = None
        if self.p2p_kind is not None:
            self.p2p_kind.choose_policy(self, facts, data_req)
        elif data_req == "remote_write":
            self.policy = "remote_write"

    def _make_streams(self):
        """Each peer-to-peer link's streams and events (its transport's ``setup_link``), then the segment where
        some rank has a peer-to-peer link (collective)."""
        cupy = self.cp
        any_p2p = any(link.p2p for link in self.links.values())
        any_p2p = self.comm.allreduce(any_p2p, op=mpi().LOR)
        self.pack_event = cupy.cuda.Event(disable_timing=True)
        for link in self.links.values():
            if link.p2p:
                link.kind.setup_link(self, link)
        self.fin_event = cupy.cuda.Event(disable_timing=True)
        self.watch_events = [cupy.cuda.Event(disable_timing=True) for _ in (0, 1)]
        self._watchdog = None
        # stream_gated receives: each link's chain (wait, reset, copy out, credit) on its own stream, joined by events,
        # so that they overlap (in a graph: parallel branches); HMC_P2P_PARALLEL_RECV=0: one after the other on the
        # compute stream. Decided collectively (it changes no protocol step, only where the steps are enqueued).
        par = self.config.p2p_parallel_recv
        self.parallel_recv = all(self.comm.allgather(par))
        self._decide_peer_sums()
        if any_p2p:
            self._new_segment(MIN_CAPACITY)
            self._map_peers()
            self._reset_slots()

    def _decide_peer_sums(self):
        """Whether the device-resident solvers' rank sums take one step over all node peers (HMC_P2P_PEER_SUMS,
        comms/cuda/peersum.py): asked for on every rank, every rank of the communicator on this node (at most
        MAX_PEERS), every link stream_gated everywhere (the binary flags of graph mode). Collective; the segments of
        all node peers are then mapped, not only the neighbours'."""
        want = bool(self.config.p2p_peer_sums and self.links and all(
            l.p2p and l.kind.capabilities.graph_capture for l in self.links.values()))
        self.peer_sums = (all(self.comm.allgather(want)) and self.node.size == self.comm.size
                          and 1 < self.comm.size <= MAX_PEERS)
        self._peer_sum = None

    def peer_sum(self):
        """The one-step rank sums of this engine (comms/cuda/peersum.py), or None where :meth:`_decide_peer_sums`
        said no (the rings of the halo engine serve)."""
        if not self.peer_sums:
            return None
        if self._peer_sum is None:
            from .peersum import PeerSum

            self._peer_sum = PeerSum(self)
        return self._peer_sum

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
        self.credit_order.reset()
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
        """Binary flags instead of counters (docs/halo-protocol.md "CUDA graphs", option 1), so that a captured exchange can be
        replayed: collective; every link must be stream_gated; slots and counters are reset in lock-step."""
        self._check_idle("set_graph_mode()")
        if on:
            bad = [f"{link_name(*k)}: {l.transport} ({l.reason})" for k, l in sorted(self.links.items())
                   if not l.kind.capabilities.graph_capture]
            bad = self.comm.allgather(bad)
            bad = [f"rank {r}: {x}" for r, xs in enumerate(bad) for x in xs]
            if bad:
                raise CommsError("graph capture needs every link stream_gated: " + "; ".join(bad[:4]))
            if self.policy == "remote_write":
                raise CommsError("graph capture is implemented for the copy_engine policy only")
        self.graph_mode = bool(on)
        self._reset_slots()
        self.credit_free = creditfree.decide(self)      # collective (docs/halo-protocol.md "Credit-free graph mode")

    def receives_in_place(self) -> bool:
        """Whether this rank's exchanges are received in place (HMC_P2P_IN_PLACE on and every link's transport
        reads in place, i.e. stream_gated): ``GpuExchange.finish_in_place`` / ``release``. A receiver's choice
        alone: the senders' steps do not change."""
        return bool(self.config.p2p_in_place and self.links and self.seg is not None and all(
            l.p2p and l.kind.reads_in_place for l in self.links.values()))

    def face_address(self, b: int, dim: int, side: int) -> int:
        """Device address of this rank's receive buffer b for side (dim, side) (where an in-place reader finds it)."""
        return self.seg.ptr + data_offset(b, dim, side, self.capacity)

    def watchdog(self) -> Watchdog:
        """The bound on this engine's device-side waits (comms/watchdog.py), made on first use."""
        if self._watchdog is None:
            ctx = self.dev.ctx
            self._watchdog = Watchdog(lambda ev: try_call(drv.cuEventQuery, ev)[0] is None, self.timeout,
                                      setup=lambda: call(drv.cuCtxSetCurrent, ctx))
        return self._watchdog

    def free(self):
        self.sync("free()")
        creditfree.ENGINES.discard(self)
        self.credit_free = False
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None
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
        left = vmm.leaked(self.serial)
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
            r["policy"] = self.policy if l.p2p else "host"
            r["alloc"] = self.alloc_kind if l.p2p else "host"
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
        # the buffer index after a growth (which resets it on every rank): credit-free order needs the buffers to
        # alternate from exchange to exchange
        b = st.buffer_index
        if st.busy[b] is not None:
            raise CommsError(f"rank {self.world_rank}: halo buffer {b} is still held by an unfinished exchange: at "
                             "most two exchanges may be outstanding (double buffering); finish the older first")
        cs = cp.cuda.get_current_stream()
        if self.graph_mode:
            self.credit_order.before_start(cs)
        self._used_streams[cs.ptr] = cs
        ex = GpuExchange(self, b, cs, host_in)
        comm = self.comm
        for (dim, d), face in zip(keys, faces):                 # receives first
            side = 1 - d
            link = self.links[(dim, side)]
            expected = st.recv[dim][side] + 1
            st.recv[dim][side] = expected
            if link.p2p:
                req, view = link.kind.post_recv(self, link, dim, side, d, b)
            else:
                view, raw = self._mpi_view("r", dim, side, b, face.shape, face.dtype)
                req = comm.Irecv(raw, source=link.peer, tag=TAG_BASE + 2 * dim + d)
            ex.recvs.append((dim, side, face.shape, face.dtype, expected, req, view))
        p2p = []
        for (dim, d), face in zip(keys, faces):
            link = self.links[(dim, d)]
            msg = st.send[dim][d] + 1
            st.send[dim][d] = msg
            if not link.p2p:
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
        if self.credit_free:                # every link signals in every exchange (comms/cuda/creditfree.py, rule 1)
            self._signal_missing(sends, b, cs, ex)
        st.buffer_index ^= 1
        st.busy[b] = ex
        st.outstanding += 1
        return ex

    def _send_p2p(self, p2p, b, cs, ex):
        st = self.state
        cap = self.capacity
        if self.policy == "remote_write":
            for dim, d, link, msg, face in p2p:
                link.kind.wait_credit(self, link, dim, d, b, cs.ptr)
                st.last_sent[dim][d][b] = msg
                dst = self._dev_view(link.peer_ptr + data_offset(b, dim, 1 - d, cap), face.shape, face.dtype)
                if isinstance(face, np.ndarray):
                    dst.set(np.ascontiguousarray(face), stream=cs)
                else:
                    dst[...] = face
                link.kind.signal(self, ex, link, dim, d, b, msg, cs.ptr)
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
        batched = self._batch_signals(p2p)
        for (dim, d, link, msg, face), (src, nbytes) in zip(p2p, srcs):
            sp = link.stream.ptr
            call(drv.cuStreamWaitEvent, sp, self.pack_event.ptr, 0)
            if not self.credit_free:                    # credit-free: implied by the order (creditfree.py)
                link.kind.wait_credit(self, link, dim, d, b, sp)
            st.last_sent[dim][d][b] = msg
            call(drv.cuMemcpyAsync, link.peer_ptr + data_offset(b, dim, 1 - d, cap), src, nbytes, sp)
            if not batched:
                link.kind.signal(self, ex, link, dim, d, b, msg, sp)
            call(drv.cuEventRecord, link.ev_sent[b].ptr, sp)
            ex.sent.append(link.ev_sent[b])
        if batched:
            self._signal_batch(p2p, b, ex)

    def _signal_missing(self, sends, b, cs, ex):
        """Credit-free mode: a signal without data on every link this exchange lacks, one batch on the compute stream
        (after every read enqueued before it); the receivers wait for them and reset them (``ex.pads``)."""
        missing = self.credit_order.missing(sends)
        if missing:
            cu.batch(cs.ptr, [self.links[k].kind.signal_op(self, self.links[k], k[0], k[1], b, 0) for k in missing])
            ex.pads = [(dim, 1 - d) for dim, d in missing]

    def _batch_signals(self, p2p) -> bool:
        """Whether this exchange's signals go out as ONE batch after every link's copy (HMC_P2P_BATCH_SIGNALS, every
        link's transport with a ``signal_op``, more than one link): a sender's choice, the receivers see the same
        writes."""
        return bool(self.config.p2p_batch_signals and len(p2p) > 1
                    and all(hasattr(link.kind, "signal_op") for _, _, link, _, _ in p2p))

    def _signal_batch(self, p2p, b, ex):
        """The last link's stream waits for every other link's copy (their ev_sent), then writes every signal in
        one batch (default flags: after the copies it waits for) and records its ev_sent, which the compute stream
        then waits for (my sends before my waits)."""
        last = p2p[-1][2]
        sp = last.stream.ptr
        for _, _, link, _, _ in p2p[:-1]:
            call(drv.cuStreamWaitEvent, sp, link.ev_sent[b].ptr, 0)
        cu.batch(sp, [link.kind.signal_op(self, link, dim, d, b, msg) for dim, d, link, msg, _ in p2p])
        call(drv.cuEventRecord, last.ev_sent[b].ptr, sp)


