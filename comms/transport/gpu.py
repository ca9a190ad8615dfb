"""The link interface of the GPU halo engine (comms/cuda/transports.py): what a peer-to-peer transport with device
buffers does for its links (docs/halo-protocol.md, "event (CUDA)", "stream_gated (CUDA)").

The engine owns the protocol state, the segment (comms/cuda/segment.py: the header of signal and credit slots and
the receive buffers, mapped into every peer-to-peer neighbour), the pack and the copies, and the order of the steps:
for each link of an exchange the send stream waits for the pack, then ``wait_credit``, the copy into the peer's
buffer, ``signal``; in ``finish`` the compute stream waits for this exchange's sends, then ``wait_arrival``, the copy
out, ``return_credit``. Links that are not peer-to-peer use the engine's staged ``mpi`` path. Nothing here imports
CUDA: the transports' own modules do, and only the GPU engine loads them.
"""
from __future__ import annotations


class GpuTransport:
    """Defaults shared by the GPU transports; the protocol steps must be given."""

    name = ""
    capabilities = None
    #: whether a consumer may read a received face where it landed (no copy out) and return the credit after it
    #: (comms/cuda/exchange.py ``finish_in_place``; docs/halo-protocol.md "In-place receive")
    reads_in_place = False

    def check_device(self, engine, facts: list) -> None:
        """Start-up check of every rank's device facts (collective result: raise the same error everywhere)."""

    def choose_policy(self, engine, facts: list, data_req: str) -> None:
        """Set ``engine.policy`` (and ``wait_flags``) from the requested data policy: remote_write where asked."""
        if data_req == "remote_write":
            engine.policy = "remote_write"

    def setup_link(self, engine, link) -> None:
        """Streams and events of one peer-to-peer link: its send stream and per-buffer 'sends done' events."""
        cupy = engine.cp
        link.stream = cupy.cuda.Stream(non_blocking=True)
        link.ev_sent = [cupy.cuda.Event(disable_timing=True) for _ in (0, 1)]

    def after_map(self, engine) -> None:
        """After the peers' segments are mapped (collective): what else the links need from the peers."""

    def post_recv(self, engine, link, dim, side, d, b):
        """(request, view) of what the host must wait for in ``finish``; (None, None) when nothing."""
        return None, None

    def wait_credit(self, engine, link, dim, d, b, stream_ptr) -> None:
        """Make ``stream_ptr`` wait until the peer has consumed what this rank last wrote into buffer b."""
        raise NotImplementedError

    def signal(self, engine, ex, link, dim, d, b, msg, stream_ptr) -> None:
        """After the copy on ``stream_ptr``: tell the peer that message ``msg`` is in its buffer b."""
        raise NotImplementedError

    def wait_arrival(self, engine, ex, link, dim, side, expected, req, view, stream_ptr) -> None:
        """Make ``stream_ptr`` wait for message ``expected`` on side (dim, side)."""
        raise NotImplementedError

    def return_credit(self, engine, link, dim, side, b, expected, stream_ptr) -> None:
        """After the copy out on ``stream_ptr``: give buffer b back to the sender."""
        raise NotImplementedError
