"""The one-step peer sums' protocol without credits (comms/cuda/peersum.py, docs/halo-protocol.md "Peer sums"),
model-checked on the host: k ranks, each a program of steps (write its partial of sum n into its area n % 2, signal
flag (n % 2, me) of every peer, wait for and reset every own flag (n % 2, r), read every rank's area n % 2, then the
next sum, which depends on this one), run under many random interleavings. Every read must see sum n's partial (no
overwrite by sum n + 2 before every peer read it) and no flag may be set while it is still set (a lost signal).
With one area and one flag set (no alternation) the same model finds the race: the test can fail."""
from __future__ import annotations

import random

import pytest


def _programs(k, sums, parities):
    """Per rank the list of steps ("write", n) / ("signal", n) / ("wait", n, r) / ("read", n) of ``sums`` sums."""
    progs = []
    for me in range(k):
        steps = []
        for n in range(sums):
            steps += [("write", n), ("signal", n)]
            steps += [("wait", n, r) for r in range(k) if r != me]
            steps += [("read", n)]
        progs.append(steps)
    return progs


def _run(k, sums, parities, seed):
    """One random interleaving; returns the violations seen (empty: the protocol held)."""
    rng = random.Random(seed)
    area = {(r, b): None for r in range(k) for b in range(parities)}          # rank r's area b holds sum n
    flag = {(me, b, r): 0 for me in range(k) for b in range(parities) for r in range(k)}
    progs, pc, bad = _programs(k, sums, parities), [0] * k, []
    while any(pc[me] < len(progs[me]) for me in range(k)):
        ready = []
        for me in range(k):
            if pc[me] < len(progs[me]):
                step = progs[me][pc[me]]
                if step[0] != "wait" or flag[(me, step[1] % parities, step[2])] == 1:
                    ready.append(me)
        if not ready:
            bad.append("deadlock")
            break
        me = rng.choice(ready)
        step = progs[me][pc[me]]
        pc[me] += 1
        n, b = step[1], step[1] % parities
        if step[0] == "write":
            area[(me, b)] = n
        elif step[0] == "signal":
            for r in range(k):
                if r != me:
                    if flag[(r, b, me)] == 1:
                        bad.append(f"rank {me} set flag ({b}, {me}) of rank {r} while still set (sum {n})")
                    flag[(r, b, me)] = 1
        elif step[0] == "wait":
            flag[(me, b, step[2])] = 0
        else:
            got = [area[(r, b)] for r in range(k)]
            if got != [n] * k:
                bad.append(f"rank {me} read {got} for sum {n}")
    return bad


@pytest.mark.parametrize("k", [2, 3, 4])
def test_two_parities_need_no_credits(k):
    for seed in range(100):
        assert _run(k, 5, 2, seed) == [], (k, seed)


def test_one_parity_races():
    found = [bad for seed in range(100) if (bad := _run(3, 5, 1, seed))]
    assert found and any("read" in b for bad in found for b in bad)
