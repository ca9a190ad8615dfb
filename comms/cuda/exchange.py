"""One posted exchange of the GPU halo engine (comms/cuda/transports.py): ``finish`` enqueues the waits, the copies
out and the credits on the exchange's compute stream, or, for a transport with receive chains (stream_gated, with
parallel receives), on the link's own receive stream joined back by an event (docs/halo-protocol.md,
"stream_gated (CUDA)"). The transports' steps are theirs (comms/transport/gpu.py); the order is this module's.

In-place receive (``finish_in_place`` / ``release``, HMC_P2P_IN_PLACE, docs/halo-protocol.md "In-place receive"):
every link's arrival wait in one batch of memory operations on the compute stream, no copy out: the consumer reads
the faces where the peers wrote them, then ``release`` returns every credit in one batch after it. In credit-free
graph mode (HMC_P2P_CREDIT_FREE, comms/cuda/creditfree.py) no credits at all: ``release`` and ``finish`` only note
the stream the buffer was last read on.
"""
from __future__ import annotations

import numpy as np
from cuda.bindings import driver as drv

from ..base import CommsError, link_name
from .cu import batch, call
from .segment import data_offset


class GpuExchange:
    """One posted GPU exchange; ``finish`` enqueues the waits and the unpack on the exchange's compute stream."""

    __slots__ = ("engine", "buffer", "stream", "host_in", "recvs", "sends", "sent", "done", "observed", "keep",
                 "fenced", "held", "pads")

    def __init__(self, engine, buffer, stream, host_in):
        self.engine, self.buffer, self.stream, self.host_in = engine, buffer, stream, host_in
        self.recvs = []
        self.sends = []
        self.sent = []
        self.keep = []
        self.done = False
        self.fenced = False
        self.held = False
        self.observed = {}
        self.pads = []              # (dim, side) of the signals without data (credit-free mode, creditfree.py)

    def in_place_ok(self) -> bool:
        """Whether this exchange can be received in place: device faces, every receive on a peer-to-peer link whose
        transport reads in place (stream_gated), no mpi send to complete."""
        links = self.engine.links
        return (not self.host_in and not self.sends and all(
            links[(dim, side)].p2p and links[(dim, side)].kind.reads_in_place for dim, side, *_ in self.recvs))

    def finish_in_place(self) -> dict:
        """Enqueue on the exchange's stream, after this exchange's sends (my sends before my waits), every link's
        arrival wait as ONE batch of memory operations; returns {(dim, side): device address of the face in this
        rank's receive buffer}. The faces stay valid, and the buffer held, until :meth:`release`, which the caller
        enqueues after the last kernel that reads them (docs/halo-protocol.md "In-place receive")."""
        if self.done:
            raise CommsError("finish() called twice on one halo exchange")
        if not self.in_place_ok():
            raise CommsError("in-place receive needs device faces and every link of the exchange stream_gated")
        eng, b, csp = self.engine, self.buffer, self.stream.ptr
        for ev in self.sent:
            call(drv.cuStreamWaitEvent, csp, ev.ptr, 0)
        ops, where = [], {}
        for dim, side, shape, dtype, expected, _, _ in self.recvs:
            link = eng.links[(dim, side)]
            ops += link.kind.arrival_ops(eng, self, link, dim, side, expected)
            where[(dim, side)] = eng.seg.ptr + data_offset(b, dim, side, eng.capacity)
        batch(csp, ops + self._pad_ops())
        self._watch(csp)
        self.done = self.held = True
        return where

    def release(self, stream=None) -> None:
        """After the kernels that read the faces of :meth:`finish_in_place` (on ``stream``, default the exchange's):
        every link's credit as ONE batch of memory operations; the buffer is free for the next exchange."""
        if not self.held:
            raise CommsError("release() of a halo exchange not finished in place (or released twice)")
        eng, b = self.engine, self.buffer
        sp = self.stream.ptr if stream is None else int(getattr(stream, "ptr", stream))
        if eng.credit_free:                  # implied by the order (comms/cuda/creditfree.py)
            eng.credit_order.released(self.stream if stream is None else stream)
        else:
            batch(sp, [eng.links[(dim, side)].kind.credit_op(eng, eng.links[(dim, side)], dim, side, b, expected)
                       for dim, side, _, _, expected, _, _ in self.recvs])
        self.held = False
        eng.state.busy[b] = None
        eng.state.outstanding -= 1
        self.keep = []

    def finish(self, out: dict | None = None) -> dict:
        if self.done:
            raise CommsError("finish() called twice on one halo exchange")
        eng, st, b = self.engine, self.engine.state, self.buffer
        cs = self.stream
        csp = cs.ptr
        switch = eng.cp.cuda.get_current_stream().ptr != csp
        if switch:
            cs.__enter__()
        try:
            results = {}
            self.fenced = False
            joins = []
            started = False
            for dim, side, shape, dtype, expected, req, view in self.recvs:
                link = eng.links[(dim, side)]
                dest = None if out is None else out.get((dim, side))
                if self._chained(link, shape, dtype, dest):
                    if not started:                            # the chains start after the compute stream's
                        call(drv.cuEventRecord, eng.fin_event.ptr, csp)   # earlier readers of the destinations
                        started = True
                    results[(dim, side)] = self._receive_chain(link, dim, side, shape, dtype, expected, dest)
                    joins.append(link.ev_recv[b])
                    continue
                results[(dim, side)] = self._receive(link, dim, side, shape, dtype, expected, req, view, dest)
            for ev in joins:                                   # the parallel receive chains
                call(drv.cuStreamWaitEvent, csp, ev.ptr, 0)
            if self.pads:
                batch(csp, self._pad_ops())
            self._watch(csp)
            if not self.fenced:
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
        if eng.credit_free:
            eng.credit_order.released(cs)
        st.busy[b] = None
        st.outstanding -= 1
        self.done = True
        self.keep = []
        return results

    def _pad_ops(self) -> list:
        """The waits for (and resets of) the signals without data of this exchange (credit-free mode)."""
        links = self.engine.links
        return [op for dim, side in self.pads
                for op in links[(dim, side)].kind.arrival_ops(self.engine, self, links[(dim, side)], dim, side, 0)]

    def _watch(self, csp):
        """Hand the device-side waits of this uncaptured exchange to the engine's watchdog (comms/watchdog.py): an
        event recorded after them on the compute stream, which the device completes only when every peer arrived."""
        eng = self.engine
        if eng.graph_mode:
            return
        for dim, side, _, _, expected, _, _ in self.recvs:
            link = eng.links[(dim, side)]
            if link.p2p and not link.kind.capabilities.host_driven:
                ev = eng.watch_events[self.buffer]
                call(drv.cuEventRecord, ev.ptr, csp)
                eng.watchdog().watch(self.buffer, ev.ptr, (
                    f"rank {eng.world_rank}: no halo from rank {link.peer_world} on link {link_name(dim, side)} "
                    f"({link.transport}) after {eng.timeout:g} s (HMC_COMMS_TIMEOUT): the device-side wait for "
                    f"message {expected} has not completed (the peer is stopped, hung or dead)"))
                return

    def _chained(self, link, shape, dtype, dest) -> bool:
        """Whether side (dim, side) is received on the link's own receive stream (a transport with receive
        chains, parallel receives on, device faces, and a destination the copy engine can write)."""
        cp = self.engine.cp
        return (link.rstream is not None and self.engine.parallel_recv and not self.host_in
                and (dest is None or (isinstance(dest, cp.ndarray) and dest.flags.c_contiguous and dest.dtype == dtype
                                      and dest.shape == tuple(shape))))

    def _receive(self, link, dim, side, shape, dtype, expected, req, view, dest):
        """One face on the compute stream: an mpi link's host buffer, or a peer-to-peer link's wait (after this
        exchange's sends: my sends before my waits), copy out and credit."""
        eng, b = self.engine, self.buffer
        cp, csp = eng.cp, self.stream.ptr
        if not link.p2p:
            if not req.Test():
                eng._wait_request(req, lambda: (
                    f"rank {eng.world_rank}: no halo from rank {link.peer_world} on link "
                    f"{link_name(dim, side)} (mpi) after {eng.timeout:g} s (HMC_COMMS_TIMEOUT): waiting for "
                    f"message {expected} of this link; {eng._counter_text()}"))
            return self._deliver(view, dest, shape, dtype)         # host buffer -> caller's kind
        if not self.fenced:
            for ev in self.sent:                               # my sends before my waits
                call(drv.cuStreamWaitEvent, csp, ev.ptr, 0)
            self.fenced = True
        link.kind.wait_arrival(eng, self, link, dim, side, expected, req, view, csp)
        src_ptr = eng.seg.ptr + data_offset(b, dim, side, eng.capacity)
        if dest is None and not self.host_in:
            dest = cp.empty(shape, dtype)
        if (isinstance(dest, cp.ndarray) and dest.flags.c_contiguous and dest.dtype == dtype
                and dest.shape == tuple(shape)):
            call(drv.cuMemcpyAsync, dest.data.ptr, src_ptr, dest.nbytes, csp)   # copy engine, no kernel
            result = dest
        else:
            src = eng._dev_view(src_ptr, shape, dtype)
            result = self._deliver(src, dest, shape, dtype)
        if not eng.credit_free:
            link.kind.return_credit(eng, link, dim, side, b, expected, csp)
        return result

    def _receive_chain(self, link, dim, side, shape, dtype, expected, dest):
        """One link on its receive stream, after this exchange's sends (events: my sends before my waits) and the
        compute stream's earlier work: the transport's wait (stream_gated in graph mode: EQ 1, then the flag's reset
        on the same stream before the join), the copy out, its credit; record ev_recv[b]."""
        eng, b = self.engine, self.buffer
        rs = link.rstream.ptr
        call(drv.cuStreamWaitEvent, rs, eng.fin_event.ptr, 0)
        for ev in self.sent:
            call(drv.cuStreamWaitEvent, rs, ev.ptr, 0)
        link.kind.wait_arrival(eng, self, link, dim, side, expected, None, None, rs)
        if dest is None:
            dest = eng.cp.empty(shape, dtype)
        call(drv.cuMemcpyAsync, dest.data.ptr, eng.seg.ptr + data_offset(b, dim, side, eng.capacity), dest.nbytes, rs)
        if not eng.credit_free:
            link.kind.return_credit(eng, link, dim, side, b, expected, rs)
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
