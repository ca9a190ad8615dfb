"""One-step rank sums over all node peers for the device-resident solvers (HMC_P2P_PEER_SUMS; docs/halo-protocol.md
"Peer sums"), instead of one ring exchange per step and partitioned dimension.

Every rank of the communicator owns, in its halo segment (comms/cuda/segment.py), two areas (parity b = 0, 1) for
its partial of a rank sum (the fused kernel's pair, or its exact records) and, in the header, one binary flag per
(b, rank). One sum of parity b, all on the caller's stream, after the partial is in the own area b:

1. ONE batch of memory operations: write 1 into flag (b, me) of every peer ("my partial b is ready");
2. ONE batch: for every peer r, wait until the own flag (b, r) is 1, then reset it to 0;
3. (the caller) one kernel reads the k areas b, in rank order, where their owners left them (pulled through the peer
   mappings; no copy engine, no remote write), and sums them in rank order.

Two batches a sum whatever the rank count (the ring: k - 1 steps a dimension, each 4 memory operations, two copies
and a kernel). No credits: a rank overwrites its area b (sum n + 2) only after its wait of sum n + 1, which every peer
signals only after its own sum n, the kernel that read area b: the two parities alternate, so every graph must span
an even number of sums (:meth:`PeerSum.parity` flips per sum; the solvers use it with an even ``solver_graph``).
The flags' reset is ordered the same way: a peer writes flag (b, r) again (sum n + 2) only after its wait for sum
n + 1, which this rank signals after its reset of sum n. The flags are zeroed with the other slots in lock-step
(``_reset_slots``). The data are read by the kernel after the wait that saw the writer's flag, which the writer set
with the default (ordered) write after the kernel that made the partial: a remote read behind an ordered signal,
not a remote write behind a signal (which needs a FLUSH wait; docs/halo-protocol.md "Invariants").
"""
from __future__ import annotations

import numpy as np

from .cu import batch, wait_op, write_op
from .segment import AREA_BYTES, area_offset, rsf_slot


class PeerSum:
    """The flags and areas of one engine's one-step rank sums (made by ``GpuHaloEngine.peer_sum()``)."""

    def __init__(self, engine):
        self.engine = engine
        self.k, self.me = int(engine.comm.size), int(engine.rank)
        self.index = 0                  # the parity of the next sum (flips per sum, at capture time)

    def base(self, r: int) -> int:
        """The address of rank r's segment here (its mapping, or the own segment)."""
        eng = self.engine
        if r == self.me:
            return eng.seg.ptr
        return eng.peer_maps[eng.node_rank_of[r]].ptr

    def areas(self, b: int) -> list:
        """Device addresses of every rank's area b, in rank order (what the summing kernel reads)."""
        return [self.base(r) + area_offset(b) for r in range(self.k)]

    def own(self, b: int) -> int:
        return self.engine.seg.ptr + area_offset(b)

    def own_array(self, b: int, shape, dtype):
        """The own area b as a CuPy array of ``shape`` and ``dtype`` (where this rank writes its partial)."""
        if not self.fits(int(np.prod(shape)) * np.dtype(dtype).itemsize):
            raise ValueError(f"a peer-sum partial of {tuple(shape)} {np.dtype(dtype)} exceeds {AREA_BYTES} bytes")
        return self.engine._dev_view(self.own(b), tuple(shape), np.dtype(dtype))

    @staticmethod
    def fits(nbytes: int) -> bool:
        return 0 < int(nbytes) <= AREA_BYTES

    def parity(self) -> int:
        """The parity of the next sum; flips it (call once per sum, in the same order on every rank)."""
        b = self.index
        self.index ^= 1
        return b

    def signal_ops(self, b: int) -> list:
        return [write_op(self.base(r) + 8 * rsf_slot(b, self.me), 1) for r in range(self.k) if r != self.me]

    def wait_ops(self, b: int) -> list:
        ops = []
        for r in range(self.k):
            if r != self.me:
                addr = self.engine.seg.ptr + 8 * rsf_slot(b, r)
                ops += [wait_op(addr, 1), write_op(addr, 0)]
        return ops

    def exchange(self, stream_ptr: int, b: int) -> None:
        """Steps 1 and 2 of the module docstring on ``stream_ptr``: after it every rank's area b holds its partial
        and may be read until this rank's next sum of parity b."""
        batch(stream_ptr, self.signal_ops(b))
        batch(stream_ptr, self.wait_ops(b))
