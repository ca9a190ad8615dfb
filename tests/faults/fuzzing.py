"""Property-based fuzzing of the file readers (hypothesis): mutations of a valid file, and the check that a reader
answers each one with the project's own one-line error, in bounded time and memory.

A mutation is a few header-field replacements (binary fields packed with the format's byte order, text fields
replaced by awkward strings: huge, negative, non-finite, empty, garbage) followed by a few byte operations (flip a
bit, set a byte, insert bytes, delete bytes, truncate). Positions are drawn over the current length, so every
part of the file is reached.

The number of examples per reader is ``HMC_FUZZ_EXAMPLES`` (default: the short CI setting, ``CI_EXAMPLES``);
``HMC_FUZZ_EXAMPLES=20000`` is the long run by hand (docs/faults.md).
"""
from __future__ import annotations

import faulthandler
import os
import re
import signal
import struct
import tracemalloc
from dataclasses import dataclass

import hypothesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

CI_EXAMPLES = 100
TIMEOUT_S = 10.0            # a read of these small seeds takes milliseconds: more is a hang
MEMORY_FACTOR = 64          # peak traced allocation allowed per byte of the file (complex128 copies, plaquettes)
MEMORY_SLACK = 4 << 20      # plus this much for the interpreter's own work (parsers, XML, HDF5 metadata)

INTS = [0, 1, -1, 2, 3, 7, 255, 1 << 15, 1 << 16, (1 << 16) + 1, (1 << 31) - 1, 1 << 31, (1 << 32) - 1,
        (1 << 40), (1 << 62), (1 << 63) - 1, (1 << 64) - 1]
TEXTS = ["0", "-1", "-3", "1", "2", "3", "9", "65536", "99999999999", "18446744073709551617", "1e308", "-1e308",
         "1e-320", "nan", "inf", "-inf", "", " ", "abc", "0x10", "1.5", "true", "[]", "\"x\"", "\x00", "\u00e9",
         "4D_SU3_GAUGE", "4D_SU3_GAUGE_3x3", "IEEE16", "IEEE64LITTLE", "F", "D", "Q", "1 2 3", "2 2 2 2 2"]


def examples() -> int:
    return int(os.environ.get("HMC_FUZZ_EXAMPLES", CI_EXAMPLES))


def fuzz_settings(test, scale: int = 1):
    """Hypothesis settings of the suite: ``scale`` x examples() cases, no example database in the checkout, no
    deadline (the timeout below catches hangs), derandomized so that CI runs the same cases each time;
    HMC_FUZZ_SEED=N draws other cases."""
    seed = os.environ.get("HMC_FUZZ_SEED")
    test = settings(max_examples=scale * examples(), deadline=None, database=None, derandomize=seed is None,
                    suppress_health_check=list(HealthCheck), print_blob=True)(test)
    return hypothesis.seed(int(seed))(test) if seed is not None else test


@dataclass(frozen=True)
class Field:
    """A header field of the seed: its byte span and, for a binary field, its struct format (else text)."""
    start: int
    end: int
    fmt: str = ""


def pack(fmt: str, value: int) -> bytes:
    """``value`` wrapped to the field's width, as its unsigned twin ('<i' -> '<I'): every bit pattern fits."""
    unsigned = fmt[:-1] + fmt[-1].upper()
    return struct.pack(unsigned, value & ((1 << (8 * struct.calcsize(unsigned))) - 1))


def _byte_ops(draw, data: bytearray, min_ops: int) -> bytes:
    for _ in range(draw(st.integers(min_ops, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        n = len(data)
        pos = draw(st.integers(0, max(n - 1, 0)))
        if op == "flip" and n:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and n:
            data[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[pos:pos + draw(st.integers(1, 64))]
        elif op == "truncate":
            del data[pos:]
    return bytes(data)


def _replacement(draw, fmt: str) -> bytes:
    if fmt:
        return pack(fmt, draw(st.sampled_from(INTS) | st.integers(-(1 << 63), (1 << 64) - 1)))
    return draw(st.sampled_from(TEXTS)).encode("utf-8")


@st.composite
def mutations(draw, seed: bytes, fields: list[Field]) -> bytes:
    """A mutated copy of ``seed``: header-field replacements, then byte operations."""
    data = bytearray(seed)
    chosen = draw(st.lists(st.integers(0, len(fields) - 1), max_size=3, unique=True)) if fields else []
    for i in sorted(chosen, key=lambda j: -fields[j].start):          # from the end: spans stay valid
        data[fields[i].start:fields[i].end] = _replacement(draw, fields[i].fmt)
    return _byte_ops(draw, data, 0 if chosen else 1)


@st.composite
def lime_mutations(draw, records: list[tuple[str, bytes, bool, bool]]) -> bytes:
    """A mutated LIME file: XML element values of its records replaced and the records framed again with their
    new lengths (so that the damage reaches the metadata's readers, not only the framing), then byte operations."""
    import io

    from lattice.io import lime

    payloads = [bytearray(r[1]) for r in records]
    spans = [(i, m.start(1), m.end(1)) for i, p in enumerate(payloads) if len(p) < 4096
             for m in re.finditer(rb">([^<>]*)</", bytes(p))]
    chosen = draw(st.lists(st.integers(0, len(spans) - 1), min_size=0, max_size=3, unique=True))
    for j in sorted(chosen, key=lambda j: (-spans[j][0], -spans[j][1])):
        i, a, b = spans[j]
        payloads[i][a:b] = _replacement(draw, "")
    out = io.BytesIO()
    for (rtype, _, mb, me), p in zip(records, payloads):
        lime.write_record(out, rtype, bytes(p), mb, me)
    return _byte_ops(draw, bytearray(out.getvalue()), 0 if chosen else 1)


class Hang(BaseException):
    """A read that ran past TIMEOUT_S (BaseException: no reader's ``except Exception`` can swallow it)."""


def _alarm(signum, frame):
    raise Hang(f"the reader ran longer than {TIMEOUT_S} s")


def check_reader(read, path, errors: tuple, stats: dict | None = None) -> str:
    """Call ``read(path)``; it must return, or raise one of ``errors`` with a one-line message naming ``path``;
    within TIMEOUT_S and with a peak traced allocation below MEMORY_FACTOR x the file's size + MEMORY_SLACK.
    Anything else propagates (hypothesis then shows the mutation and the traceback). Returns 'ok' or 'refused'."""
    size = os.path.getsize(path)
    old = signal.signal(signal.SIGALRM, _alarm)
    tracemalloc.start()
    outcome = "ok"
    # a loop inside a C library (libhdf5) never returns to Python, where SIGALRM is handled: then faulthandler
    # prints the stack and ends the run, so that CI fails instead of waiting forever
    faulthandler.dump_traceback_later(3 * TIMEOUT_S, exit=True)
    try:
        signal.setitimer(signal.ITIMER_REAL, TIMEOUT_S)
        try:
            read(path)
        except errors as e:
            msg = str(e)
            assert msg and "\n" not in msg, f"not a one-line error: {msg!r}"
            assert os.fspath(path) in msg, f"the error does not name the file: {msg!r}"
            outcome = "refused"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        faulthandler.cancel_dump_traceback_later()
        tracemalloc.stop()
        signal.signal(signal.SIGALRM, old)
    budget = MEMORY_FACTOR * size + MEMORY_SLACK
    assert peak <= budget, f"the reader allocated {peak} bytes for a file of {size} bytes (budget {budget})"
    if stats is not None:
        stats[outcome] = stats.get(outcome, 0) + 1
    return outcome
