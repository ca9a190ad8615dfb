"""The GPU engine's segment (comms/cuda/transports.py): one allocation per rank, mapped into every peer-to-peer
neighbour on its node, its header layout, and the collective steps that make and map it: the allocation kind
(comms/cuda/alloc.py), the reachability probe, the peers' mappings. The layout::

    header (HEADER bytes of uint64 slots)
        [SIG  + dim*2 + side]            signal counters (stream_gated), written by the sender on (dim, 1 - side)
        [ACK  + (dim*2 + dir)*2 + b]      credits: the message number the receiver consumed from buffer b
        [SIGF + (b*4 + dim)*2 + side]     binary signal flags (graph mode)
        [ACKF + (b*4 + dim)*2 + dir]      binary credit flags (graph mode; 1 = the peer may write buffer b)
        [RSF + b*MAX_PEERS + r]           peer sums: rank r's partial of parity b is ready (binary flags)
    peer-sum areas [b] at PEER_AREA + b * AREA_BYTES: this rank's partial of the rank sums of parity b (read in
        place by every node peer, comms/cuda/peersum.py)
    receive buffers [b][dim][side], ``capacity`` bytes each (grown collectively, never shrunk)
"""
from __future__ import annotations

import os
import sys

import numpy as np
from cuda.bindings import driver as drv

from ..base import CommsError
from . import alloc as alloc_policy
from . import ipc, vmm
from .cu import WAIT_FLUSH, WAIT_GEQ, call, try_call

HEADER = 8192                    # 4096 bytes of slots, then the two peer-sum areas
SIG, ACK, SIGF, ACKF, SCRATCH = 0, 8, 24, 40, 56
RSF, MAX_PEERS = 64, 64          # peer-sum flags [b][rank] (slots 64..191), for up to 64 ranks on a node
PEER_AREA, AREA_BYTES = 4096, 2048
_NOTICES_SHOWN: set = set()


def sig_slot(dim, side):
    return SIG + dim * 2 + side


def ack_slot(dim, dir_, b):
    return ACK + (dim * 2 + dir_) * 2 + b


def sigf_slot(b, dim, side):
    return SIGF + (b * 4 + dim) * 2 + side


def ackf_slot(b, dim, dir_):
    return ACKF + (b * 4 + dim) * 2 + dir_


def rsf_slot(b, r):
    return RSF + b * MAX_PEERS + r


def area_offset(b):
    return PEER_AREA + b * AREA_BYTES


def data_offset(b, dim, side, capacity):
    return HEADER + ((b * 4 + dim) * 2 + side) * capacity



def notice(rank0: bool, text: str, sink: list):
    sink.append(text)
    if rank0 and text not in _NOTICES_SHOWN:
        _NOTICES_SHOWN.add(text)
        print(text, file=sys.stderr, flush=True)


class SegmentMixin:
    """The segment steps of GpuHaloEngine (a mixin: the engine holds the state: ``seg``, ``peer_maps``, ``alloc_kind``,
    ``handle_type``, ``broker``, the links)."""

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
            notice(rank0, note, self.notices)
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
            return ipc.IpcAllocation(size, self.dev.ordinal, owner=self.serial, what=what)
        return vmm.Allocation(size, self.dev.ordinal, self.handle_type, owner=self.serial, what=what)

    def _import(self, shared, size: int, what: str):
        """A peer's allocation mapped here from what :meth:`_share` returned for it (registered under the engine)."""
        if self.alloc_kind == "legacy":
            return ipc.IpcMapping(shared, size, owner=self.serial, what=what)
        return vmm.PeerMapping(shared, self.handle_type, size, self.dev.ordinal, owner=self.serial, what=what)

    def _try_import(self, shared, size: int, what: str):
        if self.alloc_kind == "legacy":
            return ipc.try_open(shared, size, owner=self.serial, what=what)
        return vmm.try_import(shared, self.handle_type, size, self.dev.ordinal, owner=self.serial, what=what)

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
        peers = {self.node_rank_of[l.peer] for l in self.links.values() if l.p2p and l.peer != self.rank}
        if getattr(self, "peer_sums", False):          # one-step rank sums read every node peer's area
            peers |= set(range(self.node.size)) - {self.node.rank}
        shared = self._share(self.seg, peers)
        try:
            for nr, h in shared.items():
                self.peer_maps[nr] = self._import(h, self.seg.size, f"halo segment of node rank {nr}")
        finally:
            self._close_handles(shared)
        for link in self.links.values():
            if not link.p2p:
                continue
            link.peer_node = self.node_rank_of[link.peer]
            link.peer_ptr = self.seg.ptr if link.peer == self.rank else self.peer_maps[link.peer_node].ptr
        for kind in dict.fromkeys(link.kind for link in self.links.values() if link.p2p):
            kind.after_map(self)

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
