"""NERSC archive gauge files (the NERSC/Gauge Connection format; MILC generic/io_lat4.c + nersc_cksum.c,
QCDUTILS, Grid Grid/parallelIO/NerscIO.h).

A text header ``BEGIN_HEADER`` ... ``END_HEADER`` of ``KEY = VALUE`` lines, then binary data in MILC's site order
(x fastest), 4 links per site (x, y, z, t):
* DATATYPE ``4D_SU3_GAUGE``: the first two rows of each matrix (the third is conj(row0 x row1));
  ``4D_SU3_GAUGE_3x3``: all three rows;
* FLOATING_POINT ``IEEE32BIG``, ``IEEE32LITTLE``, ``IEEE64BIG``, ``IEEE64LITTLE``; the bare ``IEEE32``/``IEEE64``
  names no byte order (Grid, gpt and PyQUDA write and read it as little-endian, older writers meant big): it is
  read in the byte order whose CHECKSUM the data reproduce, little-endian without one, and never written;
* CHECKSUM: hex, the low 32 bits of the unsigned sum of the stored values taken as uint32 words;
* PLAQUETTE: <ReTr P>/3 over all six planes; LINK_TRACE: <ReTr U>/3.
"""
from __future__ import annotations

import os
import socket
import time

import numpy as np

from .common import (GaugeFileError, check_dims, checksum_error, dims_str, fail, link_trace_site_major,
                     nersc_checksum, plaquette_site_major, reconstruct_third_row, truncated)

MAX_HEADER = 1 << 16
DATATYPES = {"4D_SU3_GAUGE": 2, "4D_SU3_GAUGE_3x3": 3}
FLOATING = {"IEEE32": "<f4", "IEEE32BIG": ">f4", "IEEE32LITTLE": "<f4",
            "IEEE64": "<f8", "IEEE64BIG": ">f8", "IEEE64LITTLE": "<f8"}
BARE = ("IEEE32", "IEEE64")     # read as little-endian unless the checksum says big (_bare_byte_order)
# a single-precision field reproduces the header's plaquette and link trace to about 1e-7 (relative); header
# values printed with few digits are allowed their last digit's rounding
TOLERANCE = {4: 2e-6, 8: 1e-8}


def printed_resolution(text: str) -> float:
    """One unit in the last printed digit of a number such as '0.5887', '5.887e-01' or '1'."""
    mant, _, exp = text.strip().lower().partition("e")
    decimals = len(mant.partition(".")[2])
    try:
        return 10.0 ** (int(exp or 0) - decimals)
    except ValueError:
        return 0.0


def sniff(head: bytes) -> bool:
    return head.lstrip()[:12] == b"BEGIN_HEADER"


def read_header(path) -> tuple[dict, int]:
    """(header dict, byte offset of the data)."""
    with open(path, "rb") as f:
        blob = f.read(MAX_HEADER)
    start = blob.find(b"BEGIN_HEADER")
    end = blob.find(b"END_HEADER", start)
    if start < 0 or end < 0:
        raise fail(path, "NERSC header without END_HEADER in its first 64 KiB", "the file is damaged or truncated")
    nl = blob.find(b"\n", end)
    offset = len(blob) if nl < 0 else nl + 1
    header = {}
    for line in blob[start + len(b"BEGIN_HEADER"):end].decode("ascii", "replace").splitlines():
        if "=" in line:
            key, val = line.split("=", 1)
            header[key.strip()] = val.strip()
    return header, offset


def read(path, ignore_checksum: bool = False):
    """Read a NERSC file: (site-major complex128 array (nt, nz, ny, nx, 4, 3, 3), info)."""
    path = os.fspath(path)
    header, offset = read_header(path)
    try:
        dims = check_dims(path, [int(header[f"DIMENSION_{i}"]) for i in range(1, 5)], "NERSC")
    except (KeyError, ValueError):
        raise fail(path, "NERSC header lacks DIMENSION_1..4", "the file is damaged") from None
    datatype = header.get("DATATYPE", "4D_SU3_GAUGE")
    fp = header.get("FLOATING_POINT", "IEEE32BIG").upper()
    if datatype not in DATATYPES or fp not in FLOATING:
        raise fail(path, f"NERSC DATATYPE {datatype!r} / FLOATING_POINT {fp!r} not supported",
                   f"supported: {', '.join(DATATYPES)} in {', '.join(FLOATING)}")
    rows, dtype = DATATYPES[datatype], np.dtype(FLOATING[fp])
    nx, ny, nz, nt = dims
    count = nx * ny * nz * nt * 4 * rows * 3 * 2
    size = os.path.getsize(path)
    if size != offset + count * dtype.itemsize:
        raise truncated(path, "NERSC", offset + count * dtype.itemsize, size,
                        f"{dims_str(dims)} sites x 4 links x {rows}x3 {fp} + {offset}-byte header",
                        4 * rows * 3 * 2 * dtype.itemsize, offset)
    raw = np.fromfile(path, dtype=dtype, count=count, offset=offset)
    computed = nersc_checksum(raw.astype(dtype.newbyteorder("<"), copy=False))
    expected = None
    if "CHECKSUM" in header:
        try:
            expected = int(header["CHECKSUM"], 16)
        except ValueError:
            raise fail(path, f"NERSC CHECKSUM {header['CHECKSUM']!r} is not hexadecimal",
                       "pass --ignore-checksum to read the file anyway") from None
    endian = "little" if fp.endswith("LITTLE") else "big"
    if fp in BARE:
        raw, computed, endian = _bare_byte_order(raw, computed, expected)
    ok = None if expected is None else expected == computed
    if ok is False and not ignore_checksum:
        raise checksum_error(path, "NERSC", f"{expected:x}", f"{computed:x}")
    a = raw.astype(np.float64).view(np.complex128).reshape(nt, nz, ny, nx, 4, rows, 3)
    if rows == 2:
        a = reconstruct_third_row(a)
    ss, st = plaquette_site_major(a)
    plaq, linktr = (ss + st) / 6.0, link_trace_site_major(a)
    tol = TOLERANCE[dtype.itemsize]
    for key, value in (("PLAQUETTE", plaq), ("LINK_TRACE", linktr)):
        if key in header and not ignore_checksum:
            try:
                hv = float(header[key])
            except ValueError:
                continue
            if abs(hv - value) > max(tol * max(1.0, abs(hv)), printed_resolution(header[key])):
                raise fail(path, f"NERSC {key} mismatch: the header says {header[key]}, the data give {value:.10g}",
                           "the file is corrupt: copy it again, or pass --ignore-checksum to read it anyway")
    info = {"format": "nersc", "path": path, "dims": dims, "precision": 8 * dtype.itemsize,
            "endian": endian, "datatype": datatype,
            "checksums": {"expected": {"checksum": expected}, "computed": {"checksum": computed}, "ok": ok},
            "header": header, "plaquette": plaq, "link_trace": linktr}
    return a, info


def _bare_byte_order(raw: np.ndarray, computed: int, expected: int | None):
    """(values, checksum, 'little' or 'big') of data under a bare IEEE32/IEEE64 label, ``raw`` read as
    little-endian with checksum ``computed``: big-endian when only that order reproduces the CHECKSUM."""
    if expected is None or computed == expected:
        return raw, computed, "little"
    big = raw.view(raw.dtype.newbyteorder(">"))
    big_sum = nersc_checksum(big.astype(big.dtype.newbyteorder("<")))
    if big_sum == expected:
        return big, big_sum, "big"
    return raw, computed, "little"


def write(f, a: np.ndarray, datatype: str = "4D_SU3_GAUGE_3x3", floating_point: str = "IEEE64BIG",
          ensemble_id: str = "hisq-hmc", sequence_number: int = 0) -> dict:
    """Write a NERSC file of the site-major array ``a`` (nt, nz, ny, nx, 4, 3, 3) to the open binary file ``f``.
    PLAQUETTE, LINK_TRACE and CHECKSUM describe the values as stored. Returns the header written."""
    if floating_point in BARE:
        raise GaugeFileError(f"NERSC FLOATING_POINT {floating_point!r} names no byte order (codes disagree on it); "
                             f"write {floating_point}BIG or {floating_point}LITTLE")
    if datatype not in DATATYPES or floating_point not in FLOATING:
        raise GaugeFileError(f"NERSC DATATYPE {datatype!r} / FLOATING_POINT {floating_point!r} not supported; use "
                             f"one of {', '.join(DATATYPES)} and one of "
                             f"{', '.join(k for k in FLOATING if k not in BARE)}")
    rows, dtype = DATATYPES[datatype], np.dtype(FLOATING[floating_point])
    nt, nz, ny, nx = a.shape[:4]
    a = np.asarray(a, dtype=np.complex128)
    data = np.ascontiguousarray(a[..., :rows, :].view(np.float64), dtype=dtype)
    stored = data.astype(np.float64).view(np.complex128).reshape(nt, nz, ny, nx, 4, rows, 3)
    if rows == 2:
        stored = reconstruct_third_row(stored)
    ss, st = plaquette_site_major(stored)
    stamp = time.strftime("%a %b %d %H:%M:%S %Y")
    header = {
        "HDR_VERSION": "1.0", "DATATYPE": datatype, "STORAGE_FORMAT": "1.0",
        "DIMENSION_1": nx, "DIMENSION_2": ny, "DIMENSION_3": nz, "DIMENSION_4": nt,
        "LINK_TRACE": f"{link_trace_site_major(stored):.15g}", "PLAQUETTE": f"{(ss + st) / 6.0:.15g}",
        "BOUNDARY_1": "PERIODIC", "BOUNDARY_2": "PERIODIC", "BOUNDARY_3": "PERIODIC", "BOUNDARY_4": "PERIODIC",
        "CHECKSUM": f"{nersc_checksum(data.astype(dtype.newbyteorder('<'), copy=False)):x}",
        "ENSEMBLE_ID": ensemble_id, "ENSEMBLE_LABEL": ensemble_id, "SEQUENCE_NUMBER": sequence_number,
        "CREATOR": "hisq-hmc", "CREATOR_HARDWARE": socket.gethostname() or "unknown",
        "CREATION_DATE": stamp, "ARCHIVE_DATE": stamp, "FLOATING_POINT": floating_point,
    }
    text = "BEGIN_HEADER\n" + "".join(f"{k} = {v}\n" for k, v in header.items()) + "END_HEADER\n"
    f.write(text.encode("ascii"))
    f.write(data.tobytes())
    return header
