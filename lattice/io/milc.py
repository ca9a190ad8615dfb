"""MILC binary gauge files (MILC generic/io_lat4.c, include/io_lat.h; docs/conventions.md 1.1).

Version 5 (magic 20103): 96-byte header -- int32 magic, int32 dims[4] (nx ny nz nt), char[64] time stamp,
int32 order (0 = natural), uint32 sum29, sum31 -- then, for each site in MILC order (x fastest), the 4 links
(x, y, z, t), each a row-major 3x3 of (re, im). The data are float32 (MILC writes nothing else, and only float32
is written here); a file whose size fits float64 instead is read as the double-precision variant, which this
project wrote before (no other code reads it). The endianness is the one in which the magic number reads 20103.
Checksums: see :func:`lattice.io.common.milc_checksum`, over the uint32 words of the values (in host order).

1996 format (magic 59354, e.g. lat.sample.inst): a 28-byte header (magic, dims[4] and two more 32-bit words)
followed by the same float32 data; it has no checksum.
"""
from __future__ import annotations

import math
import os
import struct
import time

import numpy as np

from .common import (GaugeFileError, check_dims, checksum_error, dims_str, fail, milc_checksum, read_at,
                     truncated)

MAGIC_V5 = 20103
MAGIC_1996 = 59354
HEADER_V5 = 96
HEADER_1996 = 28
WORDS_PER_SITE = 4 * 18


def endianness(head: bytes, magic: int) -> str | None:
    """'<' or '>' when the first int32 of ``head`` is ``magic`` in that byte order, else None."""
    if len(head) < 4:
        return None
    for e in "<>":
        if struct.unpack(e + "i", head[:4])[0] == magic:
            return e
    return None


def sniff(head: bytes) -> str | None:
    """'milc-v5', 'milc-1996' or None, from the first bytes of a file."""
    if endianness(head, MAGIC_V5):
        return "milc-v5"
    if endianness(head, MAGIC_1996):
        return "milc-1996"
    return None


def _data(path, offset: int, dims, fmt: str):
    """The links as stored, converted to complex128, shape (nt, nz, ny, nx, 4, 3, 3), and the raw values."""
    nx, ny, nz, nt = dims
    count = nx * ny * nz * nt * WORDS_PER_SITE
    raw = np.fromfile(path, dtype=fmt, count=count, offset=offset)
    a = raw.astype(np.float64).view(np.complex128).reshape(nt, nz, ny, nx, 4, 3, 3)
    return a, raw


def read(path, ignore_checksum: bool = False):
    """Read a MILC v5 file: (site-major complex128 array, info). Raises GaugeFileError."""
    path = os.fspath(path)
    head = read_at(path, 0, HEADER_V5)
    e = endianness(head, MAGIC_V5)
    if e is None:
        raise fail(path, "not a MILC v5 file (magic number 20103 not found)", "use lattice.io.read_gauge")
    size = os.path.getsize(path)
    if len(head) < HEADER_V5:
        raise truncated(path, "MILC v5", HEADER_V5, size, "the header alone")
    dims = check_dims(path, struct.unpack(e + "4i", head[4:20]), "MILC v5")
    stamp = head[20:84].split(b"\0")[0].decode("ascii", "replace").strip()
    order, = struct.unpack(e + "i", head[84:88])
    sum29, sum31 = struct.unpack(e + "2I", head[88:96])
    if order != 0:
        raise fail(path, f"MILC v5 file in site-list order (order={order}) is not supported",
                   "convert it to natural order (order 0) with MILC first")
    volume = math.prod(dims)
    n32 = HEADER_V5 + volume * WORDS_PER_SITE * 4
    n64 = HEADER_V5 + volume * WORDS_PER_SITE * 8
    if size == n32:
        bits = 32
    elif size == n64:
        bits = 64
    else:
        raise truncated(path, "MILC v5", n32, size, f"{dims_str(dims)} sites x 4 links x 18 float32 + 96-byte header",
                        WORDS_PER_SITE * 4, HEADER_V5)
    a, raw = _data(path, HEADER_V5, dims, f"{e}f{bits // 8}")
    # checksum over the uint32 words of the values as they sit in a little-endian host's memory
    c29, c31 = milc_checksum(raw.astype(f"<f{bits // 8}", copy=False))
    if (c29, c31) != (sum29, sum31) and not ignore_checksum:
        raise checksum_error(path, "MILC", f"sum29 {sum29:x} sum31 {sum31:x}", f"{c29:x} {c31:x}")
    info = {
        "format": "milc-v5", "path": path, "dims": dims, "precision": bits,
        "endian": "little" if e == "<" else "big",
        "checksums": {"expected": {"sum29": sum29, "sum31": sum31}, "computed": {"sum29": c29, "sum31": c31},
                      "ok": (c29, c31) == (sum29, sum31)},
        "header": {"magic": MAGIC_V5, "time_stamp": stamp, "order": order},
    }
    return a, info


def read_1996(path, ignore_checksum: bool = False):
    """Read a 1996-format MILC file (magic 59354): (site-major complex128 array, info). It has no checksum."""
    path = os.fspath(path)
    head = read_at(path, 0, HEADER_1996)
    e = endianness(head, MAGIC_1996)
    if e is None:
        raise fail(path, "not a 1996 MILC file (magic number 59354 not found)", "use lattice.io.read_gauge")
    size = os.path.getsize(path)
    if len(head) < HEADER_1996:
        raise truncated(path, "MILC 1996", HEADER_1996, size, "the header alone")
    dims = check_dims(path, struct.unpack(e + "4i", head[4:20]), "MILC 1996")
    expected = HEADER_1996 + math.prod(dims) * WORDS_PER_SITE * 4
    if size != expected:
        raise truncated(path, "MILC 1996", expected, size,
                        f"{dims_str(dims)} sites x 4 links x 18 float32 + 28-byte header", WORDS_PER_SITE * 4,
                        HEADER_1996)
    a, _ = _data(path, HEADER_1996, dims, e + "f4")
    extra = struct.unpack(e + "2f", head[20:28])
    info = {
        "format": "milc-1996", "path": path, "dims": dims, "precision": 32,
        "endian": "little" if e == "<" else "big",
        "checksums": {"expected": None, "computed": None, "ok": None},
        "header": {"magic": MAGIC_1996, "extra_words_as_float32": extra},
    }
    return a, info


def encode(a: np.ndarray, precision: int = 32, time_stamp: str | None = None) -> tuple[bytes, np.ndarray, dict]:
    """Header bytes, little-endian float32 data and checksums for the site-major array ``a``
    (nt, nz, ny, nx, 4, 3, 3)."""
    if precision != 32:
        raise GaugeFileError(f"MILC v5 precision {precision} is not written: MILC v5 files are single precision "
                             "(other codes read no other); write nersc, ildg, scidac or openqcd for 64 bits")
    nt, nz, ny, nx = a.shape[:4]
    data = np.ascontiguousarray(np.asarray(a, dtype=np.complex128).view(np.float64).ravel(),
                                dtype=f"<f{precision // 8}")
    c29, c31 = milc_checksum(data)
    stamp = (time_stamp or time.asctime()).encode("ascii", "replace")[:63]
    head = struct.pack("<5i", MAGIC_V5, nx, ny, nz, nt) + stamp.ljust(64, b"\0") + struct.pack("<i2I", 0, c29, c31)
    return head, data, {"sum29": c29, "sum31": c31, "time_stamp": stamp.decode()}


def write(f, a: np.ndarray, precision: int = 32, time_stamp: str | None = None) -> dict:
    """Write a MILC v5 file (little-endian float32, as MILC writes it) to the open binary file ``f``.
    Returns the checksums and time stamp written."""
    head, data, meta = encode(a, precision, time_stamp)
    f.write(head)
    f.write(data.tobytes())
    return meta
