"""Transport ``event`` (docs/halo-protocol.md, "event (CUDA)"): the face is copied by the copy engine into the peer's
buffer on the link's stream, an interprocess event (cuEventCreate with CU_EVENT_INTERPROCESS |
CU_EVENT_DISABLE_TIMING, handles exchanged once) is recorded and the host sends an MPI doorbell (the message number).
The receiver's host waits for the doorbell (with the deadline), its stream waits on the peer's event, unpacks, records
its own interprocess "consumed" event and sends a credit doorbell; the sender waits for that credit and makes its
stream wait on the consumed event before it writes buffer b again (which also makes re-recording either event safe).
The event orders the pack kernel's stores, so remote_write is allowed here. Imports CUDA: loaded by the GPU engine
only.
"""
from __future__ import annotations

import numpy as np
from cuda.bindings import driver as drv

from ..base import CommsError, link_name
from ..cuda import vmm
from ..cuda.cu import call
from .gpu import GpuTransport
from .registry import lookup

DOORBELL_TAG = 760
CREDIT_TAG = 780



def _await_doorbell(engine, req, buf, expected: int, timeout_text, what: str):
    """Wait (bounded: the engine's timeout, ``timeout_text()`` in the error) for the MPI message ``req`` into
    ``buf``, and check that it carries ``expected``: a credit or doorbell out of order is a protocol error."""
    engine._wait_request(req, timeout_text)
    if int(buf[0]) != expected:
        raise CommsError(f"rank {engine.world_rank}: {what} is {int(buf[0])}, expected {expected}")

class Event(GpuTransport):
    name = "event"

    def __init__(self):
        self.capabilities = lookup(self.name).capabilities

    def after_map(self, engine):
        """Create this rank's interprocess events once, exchange their handles (collective over the engine's
        communicator) and open the neighbours'."""
        flags = int(drv.CUevent_flags.CU_EVENT_INTERPROCESS) | int(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        if not engine._owned_events:
            for link in engine.links.values():
                if not link.p2p:
                    continue
                for b in (0, 1):
                    link.ev_data[b] = call(drv.cuEventCreate, flags)
                    link.ev_done[b] = call(drv.cuEventCreate, flags)
                    engine._owned_events += [link.ev_data[b], link.ev_done[b]]
            engine._ipc_keys.append(vmm.register(engine.serial, f"{len(engine._owned_events)} interprocess events of "
                                                             f"rank {engine.world_rank}"))
        mine = {}
        for (dim, d), link in engine.links.items():
            if not link.p2p:
                continue
            for b in (0, 1):
                mine[("data", dim, d, b)] = bytes(call(drv.cuIpcGetEventHandle, link.ev_data[b]).reserved)
                mine[("done", dim, d, b)] = bytes(call(drv.cuIpcGetEventHandle, link.ev_done[b]).reserved)
        everyone = engine.comm.allgather(mine)
        for (dim, d), link in engine.links.items():
            if not link.p2p:
                continue
            peer_link_dir = 1 - d
            for b in (0, 1):
                if link.peer == engine.rank:
                    link.ev_data_peer[b] = engine.links[(dim, peer_link_dir)].ev_data[b]
                    link.ev_done_peer[b] = engine.links[(dim, peer_link_dir)].ev_done[b]
                    continue
                theirs = everyone[link.peer]
                for kind, attr in (("data", "ev_data_peer"), ("done", "ev_done_peer")):
                    h = drv.CUipcEventHandle()
                    h.reserved = theirs[(kind, dim, peer_link_dir, b)]
                    ev = call(drv.cuIpcOpenEventHandle, h, detail=f"{kind} event of rank {link.peer_world}")
                    getattr(link, attr)[b] = ev
                    engine._opened_events.append(ev)
        if engine._opened_events:
            engine._ipc_keys.append(vmm.register(engine.serial, f"{len(engine._opened_events)} opened peer events of "
                                                             f"rank {engine.world_rank}"))

    def post_recv(self, engine, link, dim, side, d, b):
        view = engine._doorbell(("r", dim, side, b))
        return engine.comm.Irecv(view, source=link.peer, tag=DOORBELL_TAG + 2 * dim + d), view

    def wait_credit(self, engine, link, dim, d, b, stream_ptr):
        need = engine.state.last_sent[dim][d][b]
        if not need:
            return
        req, buf = engine._credit_reqs.pop((dim, d, b), (None, None))
        if req is None:                 # drained already (push without reset): only the device-side wait
            call(drv.cuStreamWaitEvent, stream_ptr, link.ev_done_peer[b], 0)
            return
        _await_doorbell(engine, req, buf, need, lambda: (
            f"rank {engine.world_rank}: rank {link.peer_world} has not freed halo buffer {b} on link "
            f"{link_name(dim, d)} (event) after {engine.timeout:g} s (HMC_COMMS_TIMEOUT): need credit {need}; "
            f"{engine._counter_text()}"), f"credit from rank {link.peer_world} on link {link_name(dim, d)}")
        call(drv.cuStreamWaitEvent, stream_ptr, link.ev_done_peer[b], 0)

    def signal(self, engine, ex, link, dim, d, b, msg, stream_ptr):
        call(drv.cuEventRecord, link.ev_data[b], stream_ptr)
        key = ("s", dim, d, b)
        buf = engine._doorbell(key)
        buf[0] = msg
        req = engine.comm.Isend(buf, dest=link.peer, tag=DOORBELL_TAG + 2 * dim + d)
        engine._pending[key] = req
        cbuf = np.zeros(1, dtype=np.int64)
        engine._credit_reqs[(dim, d, b)] = (engine.comm.Irecv(cbuf, source=link.peer, tag=CREDIT_TAG + 2 * dim + d),
                                            cbuf)

    def wait_arrival(self, engine, ex, link, dim, side, expected, req, view, stream_ptr):
        """The host waits for the doorbell, then the stream waits on the peer's data event."""
        _await_doorbell(engine, req, view, expected, lambda: (
            f"rank {engine.world_rank}: no doorbell from rank {link.peer_world} on link "
            f"{link_name(dim, side)} (event) after {engine.timeout:g} s (HMC_COMMS_TIMEOUT): waiting "
            f"for message {expected}; {engine._counter_text()}"), f"doorbell on link {link_name(dim, side)}")
        call(drv.cuStreamWaitEvent, stream_ptr, link.ev_data_peer[ex.buffer], 0)

    def return_credit(self, engine, link, dim, side, b, expected, stream_ptr):
        call(drv.cuEventRecord, link.ev_done[b], stream_ptr)
        key = ("k", dim, side, b)
        buf = engine._doorbell(key)
        buf[0] = expected
        engine._pending[key] = engine.comm.Isend(buf, dest=link.peer, tag=CREDIT_TAG + 2 * dim + (1 - side))


TRANSPORT = Event()
