"""Shared pieces of the gauge-file readers and writers: the error type, checksums, atomic writes and the small
observables (plaquette, link trace) that file headers carry.

Arrays here are in MILC's in-file site order: (nt, nz, ny, nx, ...) with x fastest (docs/conventions.md 1.1).
"""
from __future__ import annotations

import errno
import os
import zlib
from contextlib import contextmanager

import numpy as np

KNOWN_FORMATS = "MILC v5, MILC 1996, NERSC, ILDG, SciDAC, openQCD"


class GaugeFileError(ValueError):
    """A gauge file that cannot be read or written. The message is one line: the file, the problem, the fix."""


def fail(path, problem: str, fix: str) -> GaugeFileError:
    return GaugeFileError(f"{os.fspath(path)}: {problem}; {fix}")


def truncated(path, kind: str, expected: int, actual: int, what: str = "", site_bytes: int = 0,
              data_start: int = 0) -> GaugeFileError:
    """The file's size disagrees with what its header implies. With ``site_bytes`` (the bytes of one site's data,
    which start at ``data_start``): a short file that still holds a whole number of sites was not cut by an
    incomplete copy (that would end mid-site nearly always) -- its header's lattice size is damaged."""
    what = f" ({what})" if what else ""
    data = actual - data_start
    if actual < expected and site_bytes and data > 0 and data % site_bytes == 0:
        return fail(path, f"{kind} header does not fit the file: it implies {expected} bytes{what}, but the file "
                          f"holds {actual}, a whole {data // site_bytes} sites",
                    "the header (its lattice size) is damaged: copy the file again from the original")
    if actual < expected:
        return fail(path, f"truncated {kind} file: expected {expected} bytes{what}, found {actual}",
                    "the copy is incomplete: copy the file again")
    return fail(path, f"{kind} file has the wrong size: expected {expected} bytes{what}, found {actual}",
                "the header and the data disagree: check that the file is not damaged")


def checksum_error(path, kind: str, expected: str, computed: str) -> GaugeFileError:
    return fail(path, f"{kind} checksum mismatch: the file says {expected}, the data give {computed}",
                "the file is corrupt: copy it again, or pass --ignore-checksum to read it anyway")


def check_dims(path, dims, kind: str) -> tuple:
    dims = tuple(int(n) for n in dims)
    if len(dims) != 4 or any(n <= 0 or n > 1 << 16 for n in dims):
        raise fail(path, f"{kind} header gives impossible lattice dimensions {dims}",
                   "the file is damaged or not a gauge file")
    return dims


def dims_str(dims) -> str:
    return "x".join(str(n) for n in dims)


# -------------------------------------------------------------------------------------------------- checksums
def _rotl_xor_classes(words: np.ndarray, period: int) -> int:
    """XOR over k of rotl32(words[k], k % period).

    Rotation distributes over XOR, so the words are first XOR-reduced within each residue class k % period and
    only the ``period`` class sums are rotated: fully vectorized, no per-word shifts needed.
    """
    n_main = words.size // period * period
    classes = np.zeros(period, dtype=np.uint32)
    if n_main:
        classes ^= np.bitwise_xor.reduce(words[:n_main].reshape(-1, period), axis=0)
    tail = words[n_main:]
    classes[:tail.size] ^= tail
    classes = classes.astype(np.uint64)
    r = np.arange(period, dtype=np.uint64)
    rot = ((classes << r) | (classes >> (np.uint64(32) - r))) & np.uint64(0xFFFFFFFF)
    return int(np.bitwise_xor.reduce(rot))


def milc_checksum(words) -> tuple[int, int]:
    """MILC's (sum29, sum31) over uint32 words w_k, k the global word index (generic/io_lat4.c):
    sum29 ^= rotl32(w_k, k % 29), sum31 ^= rotl32(w_k, k % 31)."""
    w = np.ascontiguousarray(words).view("<u4").ravel().astype(np.uint32, copy=False)
    return _rotl_xor_classes(w, 29), _rotl_xor_classes(w, 31)


def site_crc32(raw: bytes | memoryview, site_bytes: int) -> np.ndarray:
    """CRC-32 (zlib's, as QIO's DML_crc32) of each site's bytes, as uint32, in file order."""
    mv = memoryview(raw)
    n = len(mv) // site_bytes
    return np.fromiter((zlib.crc32(mv[i * site_bytes:(i + 1) * site_bytes]) for i in range(n)),
                       dtype=np.uint32, count=n)


def scidac_checksum(raw: bytes | memoryview, site_bytes: int) -> tuple[int, int]:
    """QIO's (suma, sumb) (DML_checksum_accum in qio/lib/dml/dml_utils.c): for each site with global lexicographic
    index r, crc = CRC-32 of the site's bytes as stored; suma ^= rotl32(crc, r % 29), sumb ^= rotl32(crc, r % 31)."""
    crc = site_crc32(raw, site_bytes)
    return _rotl_xor_classes(crc, 29), _rotl_xor_classes(crc, 31)


def nersc_checksum(words) -> int:
    """The NERSC header CHECKSUM: the low 32 bits of the unsigned sum of the stored data taken as uint32 words
    (MILC generic/nersc_cksum.c, QCDUTILS, PyQUDA)."""
    w = np.ascontiguousarray(words).view("<u4").ravel()
    return int(w.sum(dtype=np.uint64)) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------- header observables
def plaquette_site_major(a: np.ndarray) -> tuple[float, float]:
    """MILC's (ss, st) plaquette, averages of ReTr P (max 3), of a site-major field (nt, nz, ny, nx, 4, 3, 3)."""
    vol = int(np.prod(a.shape[:4]))
    ss = st = 0.0
    for mu in range(4):
        for nu in range(mu + 1, 4):
            umu, unu = a[..., mu, :, :], a[..., nu, :, :]
            unu_xmu = np.roll(unu, -1, axis=3 - mu)
            umu_xnu = np.roll(umu, -1, axis=3 - nu)
            # ReTr(A B C^dag D^dag) = Re sum (A B) * conj(D C)
            left = umu @ unu_xmu
            right = unu @ umu_xnu
            p = float(np.vdot(right, left).real) / vol
            if nu == 3:
                st += p / 3
            else:
                ss += p / 3
    return ss, st


def link_trace_site_major(a: np.ndarray) -> float:
    """<ReTr U>/3 over all links (MILC's LINKTR, NERSC's LINK_TRACE)."""
    return float(np.trace(a.real, axis1=-2, axis2=-1).sum()) / (a.size // 3)


def reconstruct_third_row(a2: np.ndarray) -> np.ndarray:
    """Add row 2 = conj(row0 x row1) to an array of 2x3 matrices (NERSC 4D_SU3_GAUGE)."""
    row2 = np.cross(a2[..., 0, :], a2[..., 1, :]).conj()
    return np.concatenate([a2, row2[..., None, :]], axis=-2)


# -------------------------------------------------------------------------------------------- atomic writing
# One convention for every atomic write (gauge files, run files, rational functions, results): the new content goes
# to PATH.tmp.PID beside PATH, is fsynced, renamed over PATH, and the folder is fsynced (the rename itself is then
# durable). A save killed midway leaves PATH.tmp.PID; remove_stale_temporaries deletes it once PID is dead.
def temporary_name(path) -> str:
    return f"{os.fspath(path)}.tmp.{os.getpid()}"


def fsync_directory(directory) -> None:
    """fsync a folder (a rename in it is durable afterwards); file systems that cannot (EINVAL) are let be."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def durable_replace(tmp, path) -> None:
    """fsync the finished file ``tmp``, rename it over ``path`` and fsync the folder: after a crash ``path`` holds
    either its old content or all of the new."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(os.path.dirname(os.path.abspath(path)))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # another user's process
        return True
    return True


def remove_stale_temporaries(path) -> list[str]:
    """Delete the PATH.tmp.PID files of saves whose process PID is dead (a save killed midway); returns their
    names. Those of live processes are left (a save may be under way); a folder that refuses is let be."""
    path = os.path.abspath(os.fspath(path))
    base = os.path.basename(path)
    return remove_temporaries(os.path.dirname(path), lambda stem, pid: stem == base and not _pid_alive(pid))


def remove_temporaries(directory, doomed) -> list[str]:
    """Delete the ``STEM.tmp.PID`` files in ``directory`` (PID not this process's) for which ``doomed(stem, pid)``
    holds; returns their names. A folder or file that refuses is let be."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        stem, _, pid = name.rpartition(".tmp.")
        if stem and pid.isdigit() and int(pid) != os.getpid() and doomed(stem, int(pid)):
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(name)
            except OSError:
                pass
    return removed


@contextmanager
def atomic_write(path):
    """Open PATH.tmp.PID for binary writing; on success flush it and :func:`durable_replace` it onto ``path``; on
    failure remove it. A reader never sees a half-written file, and a crash never loses the old one."""
    path = os.fspath(path)
    remove_stale_temporaries(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
        durable_replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_at(path, offset: int, count: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(count)
