"""The link interface of the host halo engine (comms/halo.py): what a transport does for the links that use it.

The engine owns the protocol state (counters, buffer_index, credits), the order of the steps (every receive posted,
then every send; then, in ``finish``, every receive completed in a fixed (dim, side) order, then every send) and the
host waits with their deadline (``engine._wait`` on a slot, ``engine._wait_request`` on an MPI request). A
transport fills in the steps for its links; a route is one face sent on (dim, dir) and the matching one received on
(dim, 1 - dir) (``route.send`` / ``route.recv`` are the links, ``route.send_kind`` / ``route.recv_kind`` their
transports). Work a transport batches over the links of one exchange (one fence before every signal) is returned as
a *deferred* item and handed back in one ``flush_sends`` / ``flush_receives`` call.

Subclass :class:`HostTransport`, give it ``name`` and ``capabilities`` and register an instance
(comms/transport/registry.py).
"""
from __future__ import annotations


class HostTransport:
    """Defaults: a transport with no shared buffers and no batched steps; ``post_recv``, ``send`` and ``receive``
    must be given."""

    name = ""
    capabilities = None
    #: a single-face exchange of its own (``start_one(engine, route, face, b)`` -> exchange or None), or None
    start_one = None

    # set-up and lifecycle (collective over the engine's communicator where the engine is) -------------------------
    def setup(self, engine) -> None:
        """After the links are resolved, on every rank, for every transport some rank's links use (and the request)."""

    def map_peers(self, engine) -> None:
        """After set-up and after every pop / growth: map what the links of this transport need from the peers."""

    def unmap_peers(self, engine) -> None:
        """Before a push, a growth or free: release the peers' mappings."""

    def reset(self, engine) -> None:
        """Zero this rank's slots (between the engine's barriers; the protocol state is reset by the engine)."""

    def reserve(self, engine, nbytes: int) -> bool:
        """Make faces of ``nbytes`` fit (collective); True when buffers were reallocated (routes are then rebuilt)."""
        return False

    def free(self, engine) -> None:
        """Free what :meth:`setup` made and check that nothing leaked."""

    def counters(self, engine, snap: dict) -> None:
        """Add this transport's slot values to the counter snapshot (tests, timeouts)."""

    def prepare_route(self, engine, route) -> None:
        """Fill in what this transport needs on ``route`` (slots, offsets, cached views)."""

    # one exchange ----------------------------------------------------------------------------------------------
    def post_recv(self, engine, route, face, b: int):
        """Post the receive of the face arriving on ``route.recv_key`` (shape and dtype of ``face``); a token."""
        raise NotImplementedError

    def send(self, engine, ex, route, face, b: int, msg: int):
        """Send ``face`` (message number ``msg`` of the link, buffer ``b``); append (route, token) to ``ex.sends`` if
        it must be completed in ``finish``; return a deferred item or None."""
        raise NotImplementedError

    def flush_sends(self, engine, items: list) -> None:
        """The deferred items of :meth:`send` of one exchange, in send order."""

    def receive(self, engine, ex, route, shape, dtype, expected: int, token, b: int):
        """Wait for message ``expected`` on ``route.recv_key``: (array holding the face, deferred item or None). The
        array is read before :meth:`flush_receives` returns the buffer to the sender."""
        raise NotImplementedError

    def flush_receives(self, engine, items: list) -> None:
        """The deferred items of :meth:`receive` of one exchange, in receive order."""

    def complete_send(self, engine, route, token) -> None:
        """Complete a send that :meth:`send` put into ``ex.sends``."""


MIN_CAPACITY = 1 << 16           # bytes per receive buffer of any engine, grown to a power of two as needed
TAG_BASE = 700                   # MPI tag of a face: TAG_BASE + 2 dim + dir of the sender
