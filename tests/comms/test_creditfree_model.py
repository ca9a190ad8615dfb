"""The credit-free graph mode of the stream-gated halo exchange (comms/cuda/creditfree.py, docs/halo-protocol.md
"Credit-free graph mode"), model-checked on the host as tests/comms/test_peersum_model.py does for the peer sums:
k ranks on a periodic ring, each a program of exchanges; exchange n sends on some links (copy into the neighbour's
receive buffer b(n) of the opposite side, then its binary flag), waits for and resets its own flags, then reads its
buffers (the exterior kernel). Steps of one group (the sends of one exchange, on their own link streams; the waits)
run in any order, groups in program order; many random interleavings. Every read must see its own exchange's
message (no overwrite by a later one before the read) and no flag may be set while it is still set (a lost signal).

Without credits this holds when the preconditions hold (every exchange carries every link, one exchange at a time,
buffers alternating); breaking any one of them (a ring step, two outstanding exchanges, an odd graph replayed) the
same model finds the race, so the tests can fail; with credits (the protocol of graph mode without the switch) the
broken schedules are safe again."""
from __future__ import annotations

import random

import pytest

BOTH = (0, 1)


def _exchanges(n, schedule):
    """[(dirs sent, buffer)] of ``n`` exchanges: "full" (every link, buffers alternate), "ring" (every other
    exchange a ring step: only the forward link), "odd" (a graph of three exchanges replayed: buffers 0 1 0 0 1 0)."""
    if schedule == "odd":
        return [(BOTH, (i % 3) % 2) for i in range(n)]
    if schedule == "ring":
        return [(BOTH if i % 2 == 0 else (1,), i % 2) for i in range(n)]
    return [(BOTH, i % 2) for i in range(n)]


def _program(exchanges, overlap):
    """Groups of steps of one rank: sends of n, waits of n, read of n; ``overlap``: the sends of n + 1 before the
    waits of n (two exchanges outstanding)."""
    sends = [[("send", n, d) for d in dirs] for n, (dirs, _) in enumerate(exchanges)]
    recv = [[[("wait", n, 1 - d) for d in dirs], [("read", n)]] for n, (dirs, _) in enumerate(exchanges)]
    groups = []
    if overlap:
        groups.append(sends[0])
        for n in range(len(exchanges)):
            groups += ([sends[n + 1]] if n + 1 < len(exchanges) else []) + recv[n]
        return groups
    for n in range(len(exchanges)):
        groups += [sends[n]] + recv[n]
    return groups


class _Model:
    def __init__(self, k, exchanges, credits):
        self.k, self.ex, self.credits = k, exchanges, credits
        self.buf, self.flag, self.bad = {}, {}, []
        self.ack = {(r, d, b): 1 for r in range(k) for d in BOTH for b in BOTH}   # every buffer free at the start

    def peer(self, me, d):
        return (me + (1 if d else -1)) % self.k

    def ready(self, me, step):
        kind, n = step[0], step[1]
        b = self.ex[n][1]
        if kind == "wait":
            return self.flag.get((me, step[2], b), 0) == 1
        if kind == "send" and self.credits:
            return self.ack[(me, step[2], b)] == 1
        return True

    def do(self, me, step):
        kind, n = step[0], step[1]
        dirs, b = self.ex[n]
        if kind == "send":
            d = step[2]
            if self.credits:
                self.ack[(me, d, b)] = 0
            where = (self.peer(me, d), 1 - d, b)
            held = self.buf.get(where)
            if held is not None and not held[1]:
                self.bad.append(f"rank {me} overwrote exchange {held[0]} in {where} with {n} before it was read")
            self.buf[where] = (n, False)
            if self.flag.get(where, 0) == 1:
                self.bad.append(f"rank {me} set flag {where} while still set (exchange {n})")
            self.flag[where] = 1
        elif kind == "wait":
            self.flag[(me, step[2], b)] = 0
        else:
            for s in {1 - d for d in dirs}:
                held = self.buf.get((me, s, b))
                if held != (n, False):
                    self.bad.append(f"rank {me} read {held} on side {s} buffer {b} for exchange {n}")
                self.buf[(me, s, b)] = (n, True)
                if self.credits:
                    self.ack[(self.peer(me, s), 1 - s, b)] = 1


def _run(k, n, schedule="full", overlap=False, credits=False, seed=0):
    """One random interleaving; returns the violations seen (empty: the protocol held)."""
    rng = random.Random(seed)
    exchanges = _exchanges(n, schedule)
    model = _Model(k, exchanges, credits)
    groups = [[list(g) for g in _program(exchanges, overlap)] for _ in range(k)]
    while any(groups):
        ready = [(me, i) for me in range(k) if groups[me] for i, step in enumerate(groups[me][0])
                 if model.ready(me, step)]
        if not ready:
            model.bad.append("deadlock")
            break
        me, i = rng.choice(ready)
        model.do(me, groups[me][0].pop(i))
        if not groups[me][0]:
            groups[me].pop(0)
    return model.bad


@pytest.mark.parametrize("k", [2, 3, 4])
def test_credit_free_holds_when_every_exchange_carries_every_link(k):
    for seed in range(100):
        assert _run(k, 7, seed=seed) == [], (k, seed)


@pytest.mark.parametrize("schedule,overlap,k", [("ring", False, 3), ("full", True, 2), ("odd", False, 2)])
def test_credit_free_races_when_a_precondition_breaks(schedule, overlap, k):
    found = [bad for seed in range(100) if (bad := _run(k, 7, schedule, overlap, seed=seed))]
    assert found and any("overwrote" in b or "read" in b for bad in found for b in bad)
    for seed in range(100):                                  # the credits protect the same schedules
        assert _run(k, 7, schedule, overlap, credits=True, seed=seed) == [], (schedule, seed)
