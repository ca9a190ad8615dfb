"""openQCD gauge files: the "universal" format of openQCD's export_cnfg/import_cnfg (modules/archive/archive.c,
main/README.io), read the same way by Grid's OpenQcdIO.h and QudaLapH's CERN reader.

Layout, all little-endian:

* header: int32 N0, N1, N2, N3 -- the extents in openQCD's direction order (0 = time, 1, 2, 3 = x, y, z), so
  (nt, nx, ny, nz) -- then one double, the average plaquette <ReTr U_p> over all 6 planes (between -3 and 3:
  Grid and PyQUDA divide it by 3 to compare with their normalisation);
* data: for each *odd* point x (x0 + x1 + x2 + x3 odd), in lexicographic order with x3 (z) fastest and x0 (t)
  slowest, the 8 link matrices U(x, 0), U(x - 0^, 0), U(x, 1), U(x - 1^, 1), ..., U(x - 3^, 3); each a
  row-major 3x3 of complex doubles (re, im). The backward links of the odd points are the forward links of the even
  ones, so every link is stored once; the extents must be even.

The file has no checksum: the header plaquette is its check (openQCD's import allows ~64 ulp, PyQUDA compares to
1e-9 relative, Grid to 1e-5 absolute; we use 1e-9 relative). openQCD sums it over all 6 N0 N1 N2 N3 plaquettes
whatever the boundary conditions. Open boundaries store zero time links at x0 = N0 - 1, which the unitarity
check of ``read_gauge(check_links=True)`` refuses; SF fields are read as stored, but this project treats every
field as periodic.
"""
from __future__ import annotations

import math
import os
import struct

import numpy as np

from .common import check_dims, dims_str, fail, plaquette_site_major, read_at, truncated

HEADER = struct.Struct("<4id")
MATRIX_BYTES = 18 * 8
POINT_BYTES = 8 * MATRIX_BYTES          # per odd point: 4 directions x (forward, backward)
PLAQUETTE_RTOL = 1e-9
# our direction index (0..3 = x, y, z, t) of openQCD's direction d (0 = t, 1..3 = x, y, z)
OURS = (3, 0, 1, 2)


def data_bytes(dims_openqcd) -> int:
    return math.prod(dims_openqcd) // 2 * POINT_BYTES


def sniff(head: bytes, size: int) -> bool:
    """An openQCD file: a header of four even, positive extents and a finite plaquette, and the size they imply."""
    if len(head) < HEADER.size:
        return False
    *n, plaq = HEADER.unpack(head[:HEADER.size])
    if any(k <= 0 or k > 1 << 16 or k % 2 for k in n) or not math.isfinite(plaq) or abs(plaq) > 3.0 + 1e-6:
        return False
    return size == HEADER.size + data_bytes(n)


def header_plaquette(a: np.ndarray) -> float:
    """openQCD's header value <ReTr U_p> over the 6 planes (max 3) of a site-major field: (ss + st) / 2 in MILC's
    terms (ss, st: the averages of ReTr P over the 3 space-space and the 3 space-time planes)."""
    ss, st = plaquette_site_major(a)
    return (ss + st) / 2.0


def _odd(shape) -> np.ndarray:
    t, x, y, z = np.indices(shape, sparse=True)
    return (t + x + y + z) % 2 == 1


def _check_even(path, dims) -> None:
    if any(n % 2 for n in dims):
        raise fail(path, f"openQCD files need even extents, not {dims_str(dims)}",
                   "use a lattice with even extents (openQCD stores links on odd points only)")


def read(path, ignore_checksum: bool = False):
    """Read an openQCD file: (site-major complex128 array (nt, nz, ny, nx, 4, 3, 3), info). Raises GaugeFileError."""
    path = os.fspath(path)
    size = os.path.getsize(path)
    head = read_at(path, 0, HEADER.size)
    if len(head) < HEADER.size:
        raise truncated(path, "openQCD", HEADER.size, size, "the header alone")
    *n, plaq = HEADER.unpack(head)
    nt, nx, ny, nz = check_dims(path, n, "openQCD")
    _check_even(path, (nx, ny, nz, nt))
    expected = HEADER.size + data_bytes(n)
    if size != expected:
        raise truncated(path, "openQCD", expected, size,
                        f"{dims_str((nx, ny, nz, nt))} sites / 2 odd points x 8 links x 18 doubles + 24-byte header")
    raw = np.fromfile(path, dtype="<f8", count=(expected - HEADER.size) // 8, offset=HEADER.size)
    points = raw.astype(np.float64).view(np.complex128).reshape(-1, 4, 2, 3, 3)   # (point, d, fwd/bwd, 3, 3)
    shape = (nt, nx, ny, nz)
    odd = np.broadcast_to(_odd(shape), shape)
    b = np.empty(shape + (4, 3, 3), dtype=np.complex128)       # openQCD's point order (t, x, y, z), our directions
    for d in range(4):
        b[odd, OURS[d]] = points[:, d, 0]
        backward = np.zeros(shape + (3, 3), dtype=np.complex128)
        backward[odd] = points[:, d, 1]                          # U(x - d^, d) stored at the odd point x
        b[~odd, OURS[d]] = np.roll(backward, -1, axis=d)[~odd]
    a = np.ascontiguousarray(b.transpose(0, 3, 2, 1, 4, 5, 6))  # -> (t, z, y, x)
    computed = header_plaquette(a)
    ok = math.isclose(plaq, computed, rel_tol=PLAQUETTE_RTOL, abs_tol=1e-12)
    if not ok and not ignore_checksum:
        raise fail(path, f"openQCD header plaquette {plaq!r} disagrees with the data's {computed!r} (<ReTr U_p> over "
                         "6 planes, periodic boundaries)",
                   "the file is corrupt or has open/SF boundaries: copy it again, or pass --ignore-checksum to read "
                   "it anyway")
    info = {"format": "openqcd", "path": path, "dims": (nx, ny, nz, nt), "precision": 64, "endian": "little",
            "checksums": {"expected": {"plaquette": plaq}, "computed": {"plaquette": computed}, "ok": ok},
            "header": {"N0..N3": (nt, nx, ny, nz), "plaquette": plaq}, "plaquette": computed / 3.0}
    return a, info


def encode(a: np.ndarray) -> tuple[bytes, np.ndarray, float]:
    """Header bytes, the little-endian doubles of the odd points' 8 links, and the header plaquette, of the
    site-major array ``a`` (nt, nz, ny, nx, 4, 3, 3)."""
    nt, nz, ny, nx = a.shape[:4]
    b = np.asarray(a, dtype=np.complex128).transpose(0, 3, 2, 1, 4, 5, 6)   # (t, x, y, z)
    odd = np.broadcast_to(_odd(b.shape[:4]), b.shape[:4])
    points = np.empty((int(odd.sum()), 4, 2, 3, 3), dtype=np.complex128)
    for d in range(4):
        u = b[..., OURS[d], :, :]
        points[:, d, 0] = u[odd]
        points[:, d, 1] = np.roll(u, 1, axis=d)[odd]             # U(x - d^, d)
    plaq = header_plaquette(a)
    head = HEADER.pack(nt, nx, ny, nz, plaq)
    return head, np.ascontiguousarray(points.view(np.float64), dtype="<f8"), plaq


def write(f, a: np.ndarray) -> dict:
    """Write an openQCD file of the site-major array ``a`` (even extents) to the open binary file ``f``; returns
    the header written."""
    nt, nz, ny, nx = a.shape[:4]
    if any(n % 2 for n in (nx, ny, nz, nt)):
        raise ValueError(f"openQCD files need even extents, not {dims_str((nx, ny, nz, nt))}; write another format "
                         "(openQCD stores links on odd points only)")
    head, data, plaq = encode(a)
    f.write(head)
    f.write(data.tobytes())
    return {"N0..N3": (nt, nx, ny, nz), "plaquette": plaq}
