"""LIME containers (USQCD c-lime, "Lattice QCD Interchange Message Encapsulation"; the record layer of SciDAC
and ILDG files).

A file is a sequence of records. Each record has a 144-byte big-endian header -- uint32 magic 0x456789ab,
uint16 version (1), uint16 flags (bit 15: message begin MB, bit 14: message end ME), uint64 data length,
char[128] record type (NUL padded) -- followed by the data, padded with zeros to a multiple of 8 bytes.
Records are grouped into messages: the first record of a message has MB set, the last ME.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from .common import fail, truncated

MAGIC = 0x456789AB
VERSION = 1
HEADER_BYTES = 144
_HEAD = struct.Struct(">IHHQ")
_MB, _ME = 1 << 15, 1 << 14


@dataclass
class Record:
    type: str
    offset: int      # file offset of the data
    length: int      # data bytes, without padding
    mb: bool
    me: bool


def sniff(head: bytes) -> bool:
    return len(head) >= 4 and struct.unpack(">I", head[:4])[0] == MAGIC


def padded(n: int) -> int:
    return (n + 7) // 8 * 8


def scan(path) -> list[Record]:
    """The records of a LIME file, in order. Raises GaugeFileError on a damaged or truncated file."""
    path = os.fspath(path)
    size = os.path.getsize(path)
    records = []
    off = 0
    with open(path, "rb") as f:
        while off < size:
            f.seek(off)
            head = f.read(HEADER_BYTES)
            if len(head) < HEADER_BYTES:
                raise truncated(path, "LIME", off + HEADER_BYTES, size, f"a record header at byte {off}")
            magic, version, flags, length = _HEAD.unpack(head[:16])
            if magic != MAGIC:
                raise fail(path, f"bad LIME record magic {magic:#x} at byte {off} (expected {MAGIC:#x})",
                           "the file is damaged: copy it again")
            rtype = head[16:].split(b"\0")[0].decode("ascii", "replace")
            data_off = off + HEADER_BYTES
            if data_off + length > size:
                following = _next_header(f, data_off, size)
                if following is not None:
                    raise fail(path, f"LIME record {rtype!r} at byte {off} claims {length} bytes, past the end of "
                                     f"the file ({size} bytes), yet another record header follows at byte "
                                     f"{following}", "the record header is damaged: copy the file again")
                raise truncated(path, "LIME", data_off + length, size, f"record {rtype!r} of {length} bytes")
            records.append(Record(rtype, data_off, length, bool(flags & _MB), bool(flags & _ME)))
            off = data_off + padded(length)
    if records and not records[-1].me:
        raise fail(path, f"truncated LIME file: it ends after record {records[-1].type!r} in the middle of a "
                         f"message (no message-end flag; {size} bytes)", "the copy is incomplete: copy it again")
    return records


def _next_header(f, start: int, size: int) -> int | None:
    """The offset of the first LIME record header after ``start`` (records start on 8-byte boundaries), or None:
    tells a damaged length field (the records go on) from a file cut short (they do not)."""
    magic = struct.pack(">I", MAGIC)
    f.seek(start)
    rest = f.read(size - start)
    at = rest.find(magic)
    while at >= 0:
        if (start + at) % 8 == 0:
            return start + at
        at = rest.find(magic, at + 1)
    return None


def read_data(path, rec: Record) -> bytes:
    with open(path, "rb") as f:
        f.seek(rec.offset)
        return f.read(rec.length)


def find(records: list[Record], rtype: str) -> Record | None:
    for r in records:
        if r.type == rtype:
            return r
    return None


def write_record(f, rtype: str, data, mb: bool, me: bool) -> None:
    """Append one record (header, data, zero padding) to the open binary file ``f``."""
    data = memoryview(data).cast("B")
    name = rtype.encode("ascii")
    if len(name) >= 128:
        raise ValueError(f"LIME record type {rtype!r} is longer than 127 characters")
    flags = (_MB if mb else 0) | (_ME if me else 0)
    f.write(_HEAD.pack(MAGIC, VERSION, flags, len(data)) + name.ljust(128, b"\0"))
    f.write(data)
    f.write(b"\0" * (padded(len(data)) - len(data)))


def write_messages(f, messages) -> None:
    """Write messages, each a list of (type, data) records; MB and ME are set on each message's first and last."""
    for message in messages:
        for i, (rtype, data) in enumerate(message):
            write_record(f, rtype, data, i == 0, i == len(message) - 1)
