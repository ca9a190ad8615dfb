"""Transport ``mpi``: the reference (docs/halo-protocol.md, "mpi"). Faces are copied into host buffers per (dim, dir,
buffer) (grown, never shrunk: ``engine._mpi_view``), Irecv is posted before Isend, tags encode only the
displacement (2 dim + dir of the sender). It is also the fallback of every link that cannot be peer-to-peer; the GPU
engine runs its ``mpi`` links itself (device to host, MPI, host to device: comms/cuda/transports.py).
"""
from __future__ import annotations

import numpy as np

from ..base import link_name
from .host import HostTransport
from .registry import lookup


class MpiTransport(HostTransport):
    name = "mpi"

    def __init__(self):
        self.capabilities = lookup(self.name).capabilities

    def post_recv(self, engine, route, face, b):
        view, raw = engine._mpi_view("r", route.dim, route.side, b, face.shape, face.dtype)
        return engine.comm.Irecv(raw, source=route.recv.peer, tag=route.tag), view

    def send(self, engine, ex, route, face, b, msg):
        view, raw = engine._mpi_view("s", route.dim, route.dir, b, face.shape, face.dtype)
        np.copyto(view, face)
        ex.sends.append((route, engine.comm.Isend(raw, dest=route.send.peer, tag=route.tag)))
        return None

    def receive(self, engine, ex, route, shape, dtype, expected, token, b):
        req, view = token
        if not req.Test():
            link = route.recv
            engine._wait_request(req, lambda: (
                f"rank {engine.world_rank}: no halo from rank {link.peer_world} on link "
                f"{link_name(link.dim, link.dir)} (mpi) after {engine.timeout:g} s (HMC_COMMS_TIMEOUT): "
                f"waiting for message {expected} of this link; {engine._counter_text()}"))
        return view, None

    def complete_send(self, engine, route, token):
        if token.Test():
            return
        link = route.send
        engine._wait_request(token, lambda: (
            f"rank {engine.world_rank}: send to rank {link.peer_world} on link {link_name(link.dim, link.dir)} "
            f"(mpi) not complete after {engine.timeout:g} s (HMC_COMMS_TIMEOUT); {engine._counter_text()}"))


TRANSPORT = MpiTransport()
