"""Why a device-resident solver loop captures a new CUDA graph (solvers.krylov_graph ``capture_reason``): the
part of its key that changed since the graph it launched last, counted per loop and, with ``solver_graph_log``, one
stderr line per capture. What a run that keeps capturing (issue 17: 3 captures a 16^4 trajectory on 2 ranks, none on
one) spends them on. No GPU: the loop's capture logic runs on a stand-in loop."""
from __future__ import annotations

import types
from collections import OrderedDict

from comms.config import RunConfig
from solvers.krylov_graph import GraphLoop, capture_reason


def _key(vectors=(1, 2, 3), operator=(10, 11, 12), settings=(0.5, False, 7)):
    return (("vectors", vectors), ("operator", operator), ("settings", settings))


def test_reasons_name_the_changed_parts_and_positions():
    assert capture_reason(None, _key()) == "first"
    assert capture_reason(_key(), _key(operator=(10, 99, 98))) == "operator[1, 2]"
    assert capture_reason(_key(), _key(vectors=(1, 5, 3), settings=(0.25, False, 7))) == \
        "vectors[1], settings[0] (0.5 -> 0.25)"
    assert capture_reason(_key(), _key(settings=(0.5, False, 8))) == "settings[2]"
    assert capture_reason(_key(), _key(vectors=(4, 5, 6)), held_elsewhere=True) == \
        "vectors[0, 1, 2] (held by another solve)"
    assert capture_reason(_key(), _key(operator=(10, 11))) == "operator[length 2]"


def _loop(log: bool, keep: int = 8):
    config = RunConfig.resolve(cli={"solver_graph_log": log}, env={})
    geom = types.SimpleNamespace(config=config, grid=types.SimpleNamespace(comm=types.SimpleNamespace(rank=1)))
    loop = types.SimpleNamespace(graphs=OrderedDict(), KEEP=keep, held=1, capture_s=0.0, captures=0, stream=None,
                                 sums=types.SimpleNamespace(before_capture=lambda: None), geom=geom, kind="multishift",
                                 label="9 shifts, float32", last_parts=None, held_elsewhere=False, reasons={},
                                 seen=set(), while_body=0,
                                 _Graph=lambda stream, fn: types.SimpleNamespace(close=lambda: None))
    loop._note_capture = lambda key: GraphLoop._note_capture(loop, key)
    return loop


def test_captures_are_counted_by_reason_and_logged(capsys):
    loop = _loop(log=True, keep=1)
    a, b = _key(), _key(operator=(10, 11, 13))
    for key in (a, a, b, a):                # a; a again (kept); b (a dropped: KEEP 1); a again (seen before)
        GraphLoop.capture(loop, key, lambda: None)
    assert loop.captures == 3
    assert loop.reasons == {"first": 1, "operator[2]": 1,
                            "dropped from the kept graphs (more than KEEP keys in turn)": 1}
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[1] == "solver graph capture (rank 1): multishift loop (9 shifts, float32), capture 2: operator[2]"
    assert len(lines) == 3


def test_no_line_without_the_setting(capsys):
    loop = _loop(log=False)
    GraphLoop.capture(loop, _key(), lambda: None)
    assert loop.reasons == {"first": 1} and capsys.readouterr().err == ""


def test_a_new_key_is_compared_with_the_nearest_key_seen_not_the_last_launched():
    """A loop serving two operators in turn: the third operator's key differs from the last launched (operator B)
    everywhere, but from operator A (seen earlier) in one position; the reason names that one."""
    loop = _loop(log=False)
    a, b, a2 = _key(operator=(10, 11, 12)), _key(operator=(20, 21, 22)), _key(operator=(10, 11, 99))
    for key in (a, b, a2):
        GraphLoop.capture(loop, key, lambda: None)
    assert loop.reasons == {"first": 1, "operator[0, 1, 2]": 1, "operator[2]": 1}
