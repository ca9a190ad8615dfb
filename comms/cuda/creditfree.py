"""Credit-free graph mode of the stream-gated halo exchange (HMC_P2P_CREDIT_FREE; docs/halo-protocol.md
"Credit-free graph mode"): the senders skip their credit waits and the receivers their credits, because the order
of the exchanges already implies them.

The argument (exchange n uses buffer b = n % 2, link A -> P): P's last read of its buffer b of exchange n (the
exterior kernel, in place; or the copy out) is enqueued on P's stream before P's start of n + 1, whose pack event
gates P's send n + 1 to A (copy, then the ordered signal); A's arrival wait of n + 1 from P is enqueued on A's
stream before A's start of n + 2, whose pack event gates A's copy n + 2 into P's buffer b. So

    P reads b (n)  ->  P signals A (n + 1)  ->  A waits (n + 1)  ->  A writes P's b (n + 2),

each arrow a stream order or a satisfied stream wait: the credit that A's wait would have checked is implied. The
same chain orders P's reset of its arrival flag b (n) before A sets it again (n + 2). It holds only where

1. every exchange carries every link (both directions), so that P sends A exchange n + 1 (no ring steps: the
   solvers' rank sums are peer sums, comms/cuda/peersum.py);
2. exchanges do not overlap: exchange n is finished and released before n + 1 starts, on the same stream or on
   streams joined in that order (:meth:`CreditFreeOrder.before_start` joins them by an event where they differ);
3. the buffers strictly alternate in device order: a captured graph spans an even number of exchanges and is
   launched where the engine's buffer index is the one it was captured at (:func:`capture_marks`,
   :func:`check_capture`, :func:`before_launch`, called by comms/cuda/graph.py): after an odd number of uncaptured
   exchanges (a single hop) one 8-byte exchange of every link (:meth:`CreditFreeOrder.pad`) realigns it;
4. graph mode (binary flags), every link stream_gated with the copy_engine policy, in-place receive and peer sums on
   every rank, an even ``solver_graph`` (the solvers' sums of an odd one take rings): decided collectively by
   :func:`decide` at ``set_graph_mode(True)``; else, and with counters (host-driven mode), the credits stay.

Where rule 1, 2 or 3 (an odd capture) does not hold the engine refuses with a CommsError naming it (different streams are joined, not
refused, except after an exchange captured outside CapturedGraph, whose parity cannot be checked).
"""
from __future__ import annotations

import weakref

import numpy as np
from cuda.bindings import driver as drv

from ..base import CommsError
from .cu import call
from .segment import notice

ENGINES: "weakref.WeakSet" = weakref.WeakSet()      # engines in credit-free graph mode (what graph.py checks)


def decide(engine) -> bool:
    """Collective: credit-free where asked for on every rank, every rank receives in place, peer sums are on (no ring
    exchanges), and the engine is in graph mode (set_graph_mode checked stream_gated and copy_engine)."""
    ENGINES.discard(engine)
    if not engine.graph_mode:                        # collective: set_graph_mode is
        return False
    want = bool(engine.config.p2p_credit_free)
    ok = (want and engine.peer_sums and engine.receives_in_place()
          and int(getattr(engine.config, "solver_graph", 0)) % 2 == 0)     # odd: the solvers' sums take rings
    answers = engine.comm.allgather((want, ok))
    asked, on = any(a for a, _ in answers), all(o for _, o in answers)
    if asked and not on:
        notice(engine.rank == 0, "comms: HMC_P2P_CREDIT_FREE=1 not used: it needs graph mode, in-place receive, "
                                 "peer sums and an even HMC_SOLVER_GRAPH on every rank (docs/halo-protocol.md "
                                 "\"Credit-free graph mode\")",
               engine.notices)
    if on:
        ENGINES.add(engine)
    return on


class CreditFreeOrder:
    """Rules 1 and 2 of the module docstring for one engine: ``last`` is (stream pointer, captured) of the stream
    the last exchange was released on (None after a reset)."""

    def __init__(self, engine):
        self.engine = engine
        self.last = None
        self.keep = None              # the stream of ``last`` (a join records an event on it)
        self.capturing = False
        self.event = None
        self.started = 0              # exchanges started (a capture holds this engine's exchanges if it changed)
        self.pads = 0                 # exchanges made by :meth:`pad`
        self._pad = None

    def before_start(self, stream, keys) -> None:
        """Check an exchange about to start on ``stream`` (CuPy stream) with faces ``keys``; join the stream of the
        last release into it where they differ (an event), before the pack event that gates the sends."""
        eng = self.engine
        if eng.state.outstanding:
            raise CommsError("credit-free graph mode (HMC_P2P_CREDIT_FREE) needs every exchange finished and "
                             "released before the next starts (docs/halo-protocol.md \"Credit-free graph mode\")")
        missing = sorted(set(eng.links) - set(keys))
        if missing:
            raise CommsError(f"credit-free graph mode (HMC_P2P_CREDIT_FREE) needs every exchange to carry every "
                             f"link; this one lacks {missing} (a ring exchange? use peer sums or "
                             f"HMC_P2P_CREDIT_FREE=0)")
        self.capturing = bool(stream.is_capturing())
        self.started += 1
        if self.last is None:
            return
        ptr, captured = self.last
        if captured and not self.capturing:
            raise CommsError("credit-free graph mode: an exchange was captured outside comms.cuda.graph."
                             "CapturedGraph (its parity and launch order cannot be checked)")
        if ptr != stream.ptr and not (self.capturing and not captured):   # the first exchange of a capture: joined
            self.join(ptr, stream.ptr)                                     # at launch (before_launch)

    def join(self, from_ptr: int, to_ptr: int) -> None:
        """Order what is enqueued on stream ``from_ptr`` so far before what follows on ``to_ptr``."""
        if self.event is None:
            self.event = self.engine.cp.cuda.Event(disable_timing=True)
        call(drv.cuEventRecord, self.event.ptr, from_ptr)
        call(drv.cuStreamWaitEvent, to_ptr, self.event.ptr, 0)

    def pad(self, stream) -> None:
        """One exchange of an 8-byte face on every link, on ``stream``, uncaptured: it flips the buffer index so that
        a graph launched next finds the index it was captured at (every rank has the same index, invariant 6, and
        launches the same graphs: collective)."""
        eng = self.engine
        if self._pad is None:
            self._pad = eng.cp.zeros(1, dtype=np.float64)
        with stream:
            ex = eng.start({key: self._pad for key in sorted(eng.links)})
            ex.finish_in_place()
            ex.release()
        self.pads += 1

    def released(self, stream) -> None:
        """The buffer was last read on ``stream`` (a CuPy stream, kept alive until the next join, or a pointer)."""
        self.last = (int(getattr(stream, "ptr", stream)), self.capturing)
        self.keep = stream

    def reset(self) -> None:
        self.last = self.keep = None


def capture_marks() -> list:
    """Before a capture: (engine, buffer index, last release) of every credit-free engine."""
    return [(eng, eng.state.buffer_index, eng.credit_order.started, eng.credit_order.last, eng.credit_order.keep)
            for eng in list(ENGINES)]


def check_capture(marks, strict: bool = True) -> list:
    """After a capture: every credit-free engine back at its buffer index (an even number of exchanges), its last
    release restored (the capture ran nothing); returns (engine, buffer index) for :func:`before_launch`, for the
    engines that started exchanges in the capture.
    ``strict=False`` (the capture failed): restore only, so that the capture's own error is the one raised."""
    out = []
    for eng, index, started, last, keep in marks:
        if eng.credit_order.started == started:
            continue                                 # none of this engine's exchanges in the graph
        eng.credit_order.last, eng.credit_order.keep = last, keep
        if strict and eng.state.buffer_index != index:
            raise CommsError("credit-free graph mode (HMC_P2P_CREDIT_FREE): a captured graph must span an even "
                             "number of halo exchanges (the buffers alternate without credits)")
        out.append((eng, index))
    return out


def before_launch(marks, stream) -> None:
    """Before a replay on ``stream`` (CuPy stream): the engine's buffer index is the captured one, and the stream of
    the last release is joined into the launch stream."""
    stream_ptr = int(stream.ptr)
    for eng, index in marks:
        if not eng.credit_free:
            continue
        order = eng.credit_order
        if eng.state.buffer_index != index:          # an odd number of uncaptured exchanges since the capture
            order.pad(stream)
        if order.last is not None and order.last[0] != int(stream_ptr):
            order.join(order.last[0], int(stream_ptr))
        order.last, order.keep = (stream_ptr, False), stream
