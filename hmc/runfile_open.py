"""Opening a run file without letting libhdf5 hang hmc (docs/runfile.md, 'Damaged files').

libhdf5 (2.0, h5py 3.16) can loop forever inside C on some damaged files -- where no Python signal reaches it --
when it parses metadata that carries no checksum: the global heap of variable-length strings, version-1 object
headers and superblocks of the HDF5 1.6 layout. Run files written by this hmc (:func:`hmc.runfile.save`) have none
of these: ``libver=("v108", "latest")`` gives a version-2 superblock and version-2 object headers, whose
checksums (Jenkins' lookup3) libhdf5 verifies before it parses them, and every string is fixed-length.

:func:`open_checked` therefore opens a file in this process only when it can show, reading the raw bytes first,
that everything libhdf5 will parse is checksummed: the superblock's own checksum (verified here), and for every
object reached by a link an ``OHDR`` (version-2) header at the link's address, no external or soft link, and no
variable-length type in any attribute or dataset. Any other file -- one of an older hmc (variable-length strings,
the 1.6 layout), or one edited with plain h5py -- is first read whole by a child process (``python -m
hmc.runfile_open PATH``) that must finish within :data:`PROBE_TIMEOUT_S`; only then is it opened here. A probe
that runs out of time or crashes is a damaged file.
"""
from __future__ import annotations

import os
import struct
import subprocess
import sys

import h5py

SIGNATURE = b"\x89HDF\r\n\x1a\n"
PROBE_TIMEOUT_S = 60.0        # reading a run file's metadata takes well under a second, even on a loaded machine
_UNDEFINED = (1 << 64) - 1
_M = 0xFFFFFFFF


class DamagedHDF5(Exception):
    """The file's HDF5 structure is damaged; the message says how (the caller names the file)."""


#: lookup3's mix and final steps on v = [a, b, c]: mix (i, j, k, l): v[i] -= v[j]; v[i] ^= rot(v[j], k); v[j] += v[l];
#: final (i, j, k): v[i] ^= v[j]; v[i] -= rot(v[j], k)
_MIX = ((0, 2, 4, 1), (1, 0, 6, 2), (2, 1, 8, 0), (0, 2, 16, 1), (1, 0, 19, 2), (2, 1, 4, 0))
_FINAL = ((2, 1, 14), (0, 2, 11), (1, 0, 25), (2, 1, 16), (0, 2, 4), (1, 0, 14), (2, 1, 24))


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _M


def lookup3(data: bytes, initval: int = 0) -> int:
    """Bob Jenkins' lookup3 ``hashlittle``, the checksum of HDF5's version-2 metadata (H5_checksum_lookup3)."""
    n = len(data)
    v = [(0xDEADBEEF + n + initval) & _M] * 3
    if n == 0:
        return v[2]
    padded = data + b"\0" * (-n % 12)
    for off in range(0, len(padded), 12):
        v = [(x + k) & _M for x, k in zip(v, struct.unpack_from("<3I", padded, off))]
        if off + 12 >= n:                              # the last block (zero-padded): the final mixing
            for i, j, k in _FINAL:
                v[i] = ((v[i] ^ v[j]) - _rot(v[j], k)) & _M
            return v[2]
        for i, j, k, m in _MIX:
            v[i] = ((v[i] - v[j]) & _M) ^ _rot(v[j], k)
            v[j] = (v[j] + v[m]) & _M
    return v[2]


def superblock(head: bytes) -> dict | None:
    """The version-2/3 superblock at offset 0 (HDF5 file format spec, 'Superblock', version 2): its base,
    extension, end-of-file and root object header addresses; None when the file has another (unchecksummed)
    superblock or a user block. A version-2/3 superblock whose checksum fails is :class:`DamagedHDF5`."""
    if not head.startswith(SIGNATURE):
        if SIGNATURE not in head[:4096]:
            raise DamagedHDF5("is not an HDF5 file (no HDF5 signature): truncated or foreign")
        return None
    if len(head) < 12 or head[8] < 2:
        return None
    size = head[9]
    if size != 8:
        return None
    end = 12 + 4 * size
    if len(head) < end + 4:
        raise DamagedHDF5("is truncated inside its HDF5 superblock")
    if lookup3(head[:end]) != struct.unpack_from("<I", head, end)[0]:
        raise DamagedHDF5("has a damaged HDF5 superblock (its checksum fails)")
    base, ext, eof, root = struct.unpack_from("<4Q", head, 12)
    return {"base": base, "ext": ext, "eof": eof, "root": root}


def _is_v2_header(raw, base: int, addr: int) -> bool:
    raw.seek(base + addr)
    return raw.read(4) == b"OHDR"


def _fixed_size(t) -> bool:
    """A type without variable-length parts (strings, sequences; compound members included)."""
    text = h5py.check_string_dtype(t)
    if text is not None:
        return text.length is not None
    if h5py.check_vlen_dtype(t) is not None or t.kind == "O":
        return False
    return all(_fixed_size(t[n]) for n in t.names) if t.names else True


def _fixed_types(obj) -> bool:
    """No variable-length type in ``obj``'s attributes or (a dataset) its values."""
    dtypes = [obj.attrs.get_id(name).dtype for name in obj.attrs]
    if isinstance(obj, h5py.Dataset):
        dtypes.append(obj.dtype)
    return all(_fixed_size(t) for t in dtypes)


def _all_checksummed(f: h5py.File, raw, sb: dict) -> bool:
    """Every object below the root has a version-2 header at its hard link's address and fixed-size types; each
    header is looked at in the raw file before libhdf5 is asked to parse it."""
    base = sb["base"]
    if not _is_v2_header(raw, base, sb["root"]) or (sb["ext"] != _UNDEFINED and not _is_v2_header(raw, base,
                                                                                                     sb["ext"])):
        return False
    todo = [f]
    while todo:
        group = todo.pop()
        if not _fixed_types(group):
            return False
        for name in group:
            info = group.id.links.get_info(name.encode())
            if info.type != h5py.h5l.TYPE_HARD or not _is_v2_header(raw, base, info.u):
                return False
            obj = group[name]
            if isinstance(obj, h5py.Group):
                todo.append(obj)
            elif not isinstance(obj, h5py.Dataset) or not _fixed_types(obj):
                return False
    return True


def _probe(path: str) -> None:
    """Read the whole file in a child process within PROBE_TIMEOUT_S (:func:`read_everything`)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        r = subprocess.run([sys.executable, "-m", "hmc.runfile_open", os.path.abspath(path)], cwd=root,
                           capture_output=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise DamagedHDF5(f"has damaged HDF5 metadata: reading it did not finish within {PROBE_TIMEOUT_S:g} s "
                          "(libhdf5 loops on it)") from None
    if r.returncode != 0:
        raise DamagedHDF5(f"has damaged HDF5 metadata: reading it ended the reader (exit {r.returncode})")


_H5_ERRORS = (OSError, KeyError, ValueError, TypeError, RuntimeError)


def _damaged(e: Exception) -> DamagedHDF5:
    """libhdf5 refused checksummed metadata (or a header the walk looked at): the file is damaged, not hung."""
    return DamagedHDF5(f"has damaged HDF5 metadata ({str(e).splitlines()[0] if str(e) else type(e).__name__})")


def _open_verified(path: str, raw, sb: dict) -> h5py.File | None:
    """The file opened here when :func:`_all_checksummed` holds, else None (closed again)."""
    try:
        f = h5py.File(path, "r")
    except _H5_ERRORS as e:
        raise _damaged(e) from None
    try:
        if _all_checksummed(f, raw, sb):
            return f
    except _H5_ERRORS as e:
        f.close()
        raise _damaged(e) from None
    f.close()
    return None


def open_checked(path: str) -> h5py.File:
    """``h5py.File(path, "r")``, opened only once nothing in it can hang libhdf5 (the module's docstring).
    :class:`DamagedHDF5` for a damaged file; OSError from h5py as h5py raises it."""
    with open(path, "rb") as raw:
        sb = superblock(raw.read(4096))
        if sb is not None:
            if sb["eof"] > os.fstat(raw.fileno()).st_size:
                raise DamagedHDF5("is truncated (shorter than its HDF5 superblock says): the copy is incomplete")
            f = _open_verified(path, raw, sb)
            if f is not None:
                return f
    _probe(path)
    return h5py.File(path, "r")


def read_everything(path: str) -> None:
    """Parse every object, attribute and variable-length or small value of the file (the probe's work; errors
    are the caller's to report, so each is passed over)."""
    def visit(obj):
        for name in list(obj.attrs):
            try:
                obj.attrs[name]
            except Exception:  # noqa: BLE001 -- a damaged attribute: the in-process reading reports it
                pass
        if isinstance(obj, h5py.Dataset):
            try:
                if h5py.check_vlen_dtype(obj.dtype) is not None or h5py.check_string_dtype(obj.dtype) is not None \
                        or obj.size * obj.dtype.itemsize <= min(1 << 20, os.path.getsize(path)):
                    obj[()]
            except Exception:  # noqa: BLE001
                pass

    with h5py.File(path, "r") as f:
        visit(f)
        todo = [f]
        while todo:
            group = todo.pop()
            for name in list(group):
                try:
                    obj = group[name]
                except Exception:  # noqa: BLE001
                    continue
                visit(obj)
                if isinstance(obj, h5py.Group):
                    todo.append(obj)


if __name__ == "__main__":
    try:
        read_everything(sys.argv[1])
    except Exception:  # noqa: BLE001 -- only a hang or a crash is the probe's verdict
        pass
