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

1. every exchange carries every link (both directions), so that P signals A in exchange n + 1: an exchange that
   names fewer links (a shift, one stage of a padded stencil, a ring step) signals on each link it lacks without
   data (:meth:`CreditFreeOrder.missing`: one batch of flag writes by the sender, the flags' waits and resets in the
   receiver's batch of arrival waits), and the solvers' rank sums are peer sums (comms/cuda/peersum.py), not rings;
2. exchanges do not overlap: exchange n is finished and released before n + 1 starts, on the same stream or on
   streams joined in that order (:meth:`CreditFreeOrder.before_start` joins them by an event where they differ);
3. the buffers strictly alternate in device order: a captured graph spans an even number of exchanges and is
   launched where the engine's buffer index is the one it was captured at (:func:`capture_marks`,
   :func:`check_capture`, :func:`before_launch`, called by comms/cuda/graph.py): after an odd number of uncaptured
   exchanges (a single hop) one exchange of signals alone on every link (:meth:`CreditFreeOrder.pad`) realigns it;
4. graph mode (binary flags), every link stream_gated with the copy_engine policy, in-place receive and peer sums on
   every rank, an even ``solver_graph`` (the solvers' sums of an odd one take rings): decided collectively by
   :func:`decide` at ``set_graph_mode(True)``; else, and with counters (host-driven mode), the credits stay.

Where rule 2 or 3 (an odd capture) does not hold the engine refuses with a CommsError naming it (different streams
are joined, not refused, except after an exchange captured outside CapturedGraph, whose parity cannot be checked).
A graph records whether each engine it holds exchanges of was credit-free when it was captured; a launch where that
changed (graph mode left, or credit-free mode switched) is refused with one line (:func:`before_launch`): its
memory operations are those of the other mode.
"""
from __future__ import annotations

import weakref

from cuda.bindings import driver as drv

from ..base import CommsError
from .cu import call
from .segment import notice

ENGINES: "weakref.WeakSet" = weakref.WeakSet()      # engines in graph mode (what a capture records, graph.py)


def decide(engine) -> bool:
    """Collective: credit-free where asked for on every rank (the default), every rank receives in place, peer sums
    are on (no ring exchanges), and the engine is in graph mode (set_graph_mode checked stream_gated and
    copy_engine). One notice line where a rank stated HMC_P2P_CREDIT_FREE=1 and it is not granted (none for the
    default: the credits then stay, as they must)."""
    ENGINES.discard(engine)
    if not engine.graph_mode:                        # collective: set_graph_mode is
        return False
    ENGINES.add(engine)
    want = bool(engine.config.p2p_credit_free)
    ok = (want and engine.peer_sums and engine.receives_in_place()
          and int(getattr(engine.config, "solver_graph", 0)) % 2 == 0)     # odd: the solvers' sums take rings
    stated = want and "p2p_credit_free" in getattr(engine.config, "stated", ())   # asked for, not the default
    answers = engine.comm.allgather((stated, ok))
    asked, on = any(a for a, _ in answers), all(o for _, o in answers)
    if asked and not on:
        notice(engine.rank == 0, "comms: HMC_P2P_CREDIT_FREE=1 not used: it needs graph mode, in-place receive, "
                                 "peer sums and an even HMC_SOLVER_GRAPH on every rank (docs/halo-protocol.md "
                                 "\"Credit-free graph mode\")",
               engine.notices)
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

    def before_start(self, stream) -> None:
        """Count an exchange of an engine in graph mode (what a capture checks); in credit-free mode check it (about
        to start on ``stream``, a CuPy stream, with every link: :meth:`missing`) and join the stream
        of the last release into it where they differ (an event), before the pack event that gates the sends."""
        self.started += 1
        eng = self.engine
        if not eng.credit_free:
            return
        if eng.state.outstanding:
            raise CommsError("credit-free graph mode (HMC_P2P_CREDIT_FREE) needs every exchange finished and "
                             "released before the next starts (docs/halo-protocol.md \"Credit-free graph mode\")")
        self.capturing = bool(stream.is_capturing())
        if self.last is None:
            return
        ptr, captured = self.last
        if captured and not self.capturing:
            raise CommsError("credit-free graph mode: an exchange was captured outside comms.cuda.graph."
                             "CapturedGraph (its parity and launch order cannot be checked)")
        if ptr != stream.ptr and not (self.capturing and not captured):   # the first exchange of a capture: joined
            self.join(ptr, stream.ptr)                                     # at launch (before_launch)

    def missing(self, sends) -> list:
        """Rule 1: the links (dim, d) an exchange with faces ``sends`` lacks. Each gets a signal and no data: the
        sender writes the receiver's arrival flag (one batch on the compute stream, after the reads that came
        before), the receiver waits for it and resets it (with its other arrival waits); that signal is what orders
        the peer's next write into the buffer (module docstring), the data of such a link would be dropped."""
        return [k for k in sorted(self.engine.links) if k not in sends]

    def join(self, from_ptr: int, to_ptr: int) -> None:
        """Order what is enqueued on stream ``from_ptr`` so far before what follows on ``to_ptr``."""
        if self.event is None:
            self.event = self.engine.cp.cuda.Event(disable_timing=True)
        call(drv.cuEventRecord, self.event.ptr, from_ptr)
        call(drv.cuStreamWaitEvent, to_ptr, self.event.ptr, 0)

    def pad(self, stream) -> None:
        """One exchange of signals alone on every link (:meth:`missing`), on ``stream``, uncaptured: it flips the
        buffer index so that a graph launched next finds the index it was captured at (every rank has the same
        index, invariant 6, and launches the same graphs: collective)."""
        with stream:
            ex = self.engine.start({})
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
    """Before a capture: (engine, buffer index, exchanges started, last release, its stream, credit-free) of every
    engine in graph mode."""
    return [(eng, eng.state.buffer_index, eng.credit_order.started, eng.credit_order.last, eng.credit_order.keep,
             bool(eng.credit_free)) for eng in list(ENGINES)]


def check_capture(marks, strict: bool = True) -> list:
    """After a capture: every credit-free engine back at its buffer index (an even number of exchanges), its last
    release restored (the capture ran nothing); returns (engine, buffer index, credit-free) for
    :func:`before_launch`, for the engines that started exchanges in the capture.
    ``strict=False`` (the capture failed): restore only, so that the capture's own error is the one raised."""
    out = []
    for eng, index, started, last, keep, free in marks:
        if eng.credit_order.started == started:
            continue                                 # none of this engine's exchanges in the graph
        if free:
            eng.credit_order.last, eng.credit_order.keep = last, keep
            if strict and eng.state.buffer_index != index:
                raise CommsError("credit-free graph mode (HMC_P2P_CREDIT_FREE): a captured graph must span an even "
                                 "number of halo exchanges (the buffers alternate without credits): capture two "
                                 "operator applications, or run with HMC_P2P_CREDIT_FREE=0")
        out.append((eng, index, free))
    return out


def before_launch(marks, stream) -> None:
    """Before a replay on ``stream`` (CuPy stream): every engine of the graph in the mode it was captured in (graph
    mode, credit-free or not: else one CommsError line); for a credit-free one the buffer index is the captured one,
    and the stream of the last release is joined into the launch stream."""
    stream_ptr = int(stream.ptr)
    for eng, index, free in marks:
        if not eng.graph_mode or bool(eng.credit_free) != free:
            now = ("not in graph mode" if not eng.graph_mode else
                   "credit-free now" if eng.credit_free else "with credits now")
            raise CommsError(f"a CUDA graph captured {'in' if free else 'outside'} credit-free graph mode "
                             f"(HMC_P2P_CREDIT_FREE) is launched where its halo engine is {now}: capture it again "
                             "(docs/halo-protocol.md \"Credit-free graph mode\")")
        if not free:
            continue
        order = eng.credit_order
        if eng.state.buffer_index != index:          # an odd number of uncaptured exchanges since the capture
            order.pad(stream)
        if order.last is not None and order.last[0] != int(stream_ptr):
            order.join(order.last[0], int(stream_ptr))
        order.last, order.keep = (stream_ptr, False), stream
