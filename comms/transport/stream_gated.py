"""Transport ``stream_gated`` (docs/halo-protocol.md, "stream_gated (CUDA)"): after the copy into the peer's buffer,
on the same stream, ``cuStreamWriteValue64`` of the link's monotonic counter into the peer's signal slot (default
flags order the copy before the write); the receiver enqueues ``cuStreamWaitValue64(GEQ)`` on the stream that needs
the halo, copies out and writes its credit into the sender's slot. No host takes part, so the exchange can be
captured in a CUDA graph, with binary flags per buffer instead of counters (``engine.graph_mode``; "CUDA graphs",
option 1). Receive chains run on one stream per link (``rstream``), joined by events (comms/cuda/exchange.py).
Imports CUDA: loaded by the GPU engine only.
"""
from __future__ import annotations

from cuda.bindings import driver as drv

from ..base import CommsError
from ..cuda.cu import WAIT_FLUSH, WAIT_GEQ, WRITE_DEFAULT, call, wait_and_reset, wait_op, write_op
from ..cuda.segment import ack_slot, ackf_slot, notice, sig_slot, sigf_slot
from .gpu import GpuTransport
from .registry import lookup


class StreamGated(GpuTransport):
    name = "stream_gated"
    reads_in_place = True

    def __init__(self):
        self.capabilities = lookup(self.name).capabilities

    def check_device(self, engine, facts):
        bad = [r for r, f in enumerate(facts) if not f["memops64"]]
        if bad:
            raise CommsError(f"transport 'stream_gated' needs 64-bit stream memory operations, but "
                             f"CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0 on rank(s) {bad} "
                             f"({facts[bad[0]]['name']}): use --transport event or mpi")

    def choose_policy(self, engine, facts, data_req):
        """remote_write behind a stream-gated signal needs a FLUSH wait (CAN_FLUSH_REMOTE_WRITES), else copy engine;
        HMC_P2P_FORCE_FLUSH=1 asks the driver anyway and reports its answer in one line."""
        rank0 = engine.rank == 0
        flush_all = all(f["flush_remote_writes"] for f in facts)
        force = engine.config.p2p_force_flush
        if force:
            ok, text = engine._try_flush_wait()
            answers = engine.comm.allgather((ok, text))
            ok = all(a for a, _ in answers)
            text = next((t for a, t in answers if not a), answers[0][1])
            engine.flush_answer = text
            line = (f"comms: HMC_P2P_FORCE_FLUSH=1 on {engine.dev.name} (CAN_FLUSH_REMOTE_WRITES="
                    f"{facts[0]['flush_remote_writes']}): cuStreamWaitValue64(GEQ|FLUSH) -> {text}: "
                    + ("remote_write enabled (forced)" if ok else "remote_write stays disabled"))
            notice(rank0, line, engine.notices)
            if ok:
                engine.policy = "remote_write"
                engine.wait_flags = WAIT_GEQ | WAIT_FLUSH
        elif not flush_all:
            notice(rank0, f"comms: remote_write disabled: CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES is 0 on "
                          f"{engine.dev.name} (no FLUSH for the stream-gated wait); halos move by copy engine",
                   engine.notices)
        elif data_req == "remote_write":
            engine.policy = "remote_write"
            engine.wait_flags = WAIT_GEQ | WAIT_FLUSH

    def setup_link(self, engine, link):
        super().setup_link(engine, link)
        cupy = engine.cp
        link.rstream = cupy.cuda.Stream(non_blocking=True)
        link.ev_recv = [cupy.cuda.Event(disable_timing=True) for _ in (0, 1)]

    def wait_credit(self, engine, link, dim, d, b, stream_ptr):
        need = engine.state.last_sent[dim][d][b]
        if engine.graph_mode:
            wait_and_reset(stream_ptr, engine.seg.ptr + 8 * ackf_slot(b, dim, d))
        elif need:
            call(drv.cuStreamWaitValue64, stream_ptr, engine.seg.ptr + 8 * ack_slot(dim, d, b), need, WAIT_GEQ)

    def signal(self, engine, ex, link, dim, d, b, msg, stream_ptr):
        if engine.graph_mode:
            call(drv.cuStreamWriteValue64, stream_ptr, link.peer_ptr + 8 * sigf_slot(b, dim, 1 - d), 1,
                 WRITE_DEFAULT)
        else:
            call(drv.cuStreamWriteValue64, stream_ptr, link.peer_ptr + 8 * sig_slot(dim, 1 - d), msg,
                 WRITE_DEFAULT)

    def signal_op(self, engine, link, dim, d, b, msg):
        """:meth:`signal` as one operation of a batch (HMC_P2P_BATCH_SIGNALS: every link's signal in one batch, after
        every link's copy)."""
        if engine.graph_mode:
            return write_op(link.peer_ptr + 8 * sigf_slot(b, dim, 1 - d), 1)
        return write_op(link.peer_ptr + 8 * sig_slot(dim, 1 - d), msg)

    def wait_arrival(self, engine, ex, link, dim, side, expected, req, view, stream_ptr):
        """The wait on the own signal slot (graph mode: EQ 1 on the flag, then its reset, one batch of memory
        operations)."""
        own = engine.seg.ptr
        if engine.graph_mode:
            wait_and_reset(stream_ptr, own + 8 * sigf_slot(ex.buffer, dim, side))
        else:
            call(drv.cuStreamWaitValue64, stream_ptr, own + 8 * sig_slot(dim, side), expected, engine.wait_flags)

    def arrival_ops(self, engine, ex, link, dim, side, expected) -> list:
        """:meth:`wait_arrival` as operations of one batch (in-place receive: every link's wait in one batch): the
        flag's wait EQ 1 and its reset in graph mode, else the counter's wait."""
        addr = engine.seg.ptr + 8 * (sigf_slot(ex.buffer, dim, side) if engine.graph_mode else sig_slot(dim, side))
        if engine.graph_mode:
            return [wait_op(addr, 1), write_op(addr, 0)]
        return [wait_op(addr, expected, engine.wait_flags)]

    def credit_op(self, engine, link, dim, side, b, expected):
        """:meth:`return_credit` as one operation of a batch (in-place receive: every link's credit in one batch,
        after the kernel that read the faces)."""
        if engine.graph_mode:
            return write_op(link.peer_ptr + 8 * ackf_slot(b, dim, 1 - side), 1)
        return write_op(link.peer_ptr + 8 * ack_slot(dim, 1 - side, b), expected)

    def return_credit(self, engine, link, dim, side, b, expected, stream_ptr):
        if engine.graph_mode:
            call(drv.cuStreamWriteValue64, stream_ptr, link.peer_ptr + 8 * ackf_slot(b, dim, 1 - side), 1,
                 WRITE_DEFAULT)
        else:
            call(drv.cuStreamWriteValue64, stream_ptr, link.peer_ptr + 8 * ack_slot(dim, 1 - side, b), expected,
                 WRITE_DEFAULT)


TRANSPORT = StreamGated()
