"""The peer-sum tables of the device-resident solvers (solvers/staggered_dist_cuda.PeerRankSums) follow the halo
segments when they move (the engine's switch to graph mode at a solver's first upload moved them after the tables
were made, and every 2- and 4-rank stream_gated RHMC on the H200 raised inside its first capture): GraphLoop.capture
refreshes them first, in place, and a move noticed only inside a capture is still refused. NumPy stand-ins for the
peer and the array module; no GPU."""
from __future__ import annotations

import types
from collections import OrderedDict

import numpy as np
import pytest

from solvers.krylov_graph import DeviceSums, GraphLoop
from solvers.staggered_dist_cuda import PeerRankSums


class FakePeer:
    """k ranks' halo segments at ``bases``; each rank's two areas (one per sum parity) at fixed offsets."""

    def __init__(self, k=2):
        self.k, self.index, self.bases = k, 0, [0x10000 * (r + 1) for r in range(k)]

    def base(self, r):
        return self.bases[r]

    def areas(self, b):
        return [self.bases[r] + 256 * b for r in range(self.k)]

    def own_array(self, b, shape, dtype):
        return np.zeros(shape, dtype)

    def move(self):
        self.bases = [b + 0x100000 for b in self.bases]


def _xp(capturing):
    stream = types.SimpleNamespace(is_capturing=lambda: capturing[0])
    return types.SimpleNamespace(zeros=np.zeros, asarray=np.asarray,
                                 cuda=types.SimpleNamespace(get_current_stream=lambda: stream))


@pytest.fixture
def sums():
    capturing = [False]
    geom = types.SimpleNamespace(backend=None, xp=_xp(capturing))
    peer = FakePeer()
    return PeerRankSums(geom, (2,), np.float64, peer), peer, capturing


def test_moved_segments_refreshed_in_place_before_a_capture(sums):
    ps, peer, capturing = sums
    tables = list(ps.tables)
    assert [list(t) for t in tables] == [peer.areas(0), peer.areas(1)]
    peer.move()
    ds = types.SimpleNamespace(peers=ps)
    DeviceSums.before_capture(ds)
    assert all(a is b for a, b in zip(ps.tables, tables))          # the same arrays: kept graphs read them
    assert [list(t) for t in ps.tables] == [peer.areas(0), peer.areas(1)]
    capturing[0] = True
    ps.local()                                                     # nothing moved since: fine inside a capture


def test_a_move_seen_only_inside_a_capture_is_refused(sums):
    ps, peer, capturing = sums
    peer.move()
    capturing[0] = True
    with pytest.raises(RuntimeError, match="capture again"):
        ps.local()


def test_graph_loop_refreshes_the_sums_before_it_captures():
    order = []
    loop = types.SimpleNamespace(graphs=OrderedDict(), KEEP=8, held=2, capture_s=0.0, captures=0, stream=None,
                                 while_body=0,
                                 sums=types.SimpleNamespace(before_capture=lambda: order.append("refresh")),
                                 _note_capture=lambda key: order.append("noted"))

    def graph(stream, fn):
        order.append("capture")
        fn()
        return types.SimpleNamespace(close=lambda: None)

    loop._Graph = graph
    GraphLoop.capture(loop, ("key",), lambda: order.append("body"))
    assert order == ["noted", "refresh", "capture", "body", "body"]
    GraphLoop.capture(loop, ("key",), lambda: order.append("body"))   # a kept graph: no refresh, no capture
    assert order == ["noted", "refresh", "capture", "body", "body"] and loop.captures == 1
