"""Gauge-file formats: MILC v5 and 1996 (milc.py), NERSC (nersc.py), ILDG and SciDAC over LIME (scidac.py, lime.py;
written by scidac_write.py), openQCD (openqcd.py); SciDAC (QIO) colour-matrix and colour-vector fields and USQCD KS
propagators (``write_color_matrices``, ``write_color_vector``, ``write_ksprop`` and their readers; docs/formats.md).

``read_gauge`` recognises the format from the file's content, verifies its checksums and returns the links as
stored (single-precision values converted to double): following MILC (docs/conventions.md 1.1) quantities such as
CHECK PLAQ and LINKTR are computed on these, and ``reunitarize=True`` then applies MILC's double-precision
``reunit_su3``. ``write_gauge`` writes MILC v5, NERSC, ILDG, SciDAC or openQCD atomically (temporary file, fsync,
rename).
"""
from __future__ import annotations

import os

import numpy as np

from . import lime, milc, nersc, openqcd, physical, scidac, scidac_write
from .common import KNOWN_FORMATS, GaugeFileError, atomic_write, fail
from .scidac import (is_ksprop, read_color_matrices, read_color_vector, read_field, read_ksprop,
                     read_ksprop_pairs)

__all__ = ["read_gauge", "gauge_from_site_major", "write_gauge", "detect_format", "read_site_major", "GaugeFileError",
           "read_field", "read_color_vector", "read_color_matrices", "read_ksprop", "read_ksprop_pairs", "is_ksprop",
           "write_color_vector", "write_color_matrices", "write_ksprop", "write_ksprop_pairs", "FORMATS"]

FORMATS = ("milc", "nersc", "ildg", "scidac", "openqcd")
_READERS = {"milc-v5": milc.read, "milc-1996": milc.read_1996, "nersc": nersc.read, "lime": scidac.read_gauge,
            "openqcd": openqcd.read}


def _open_check(path) -> bytes:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise fail(path, "no such file", "check the path (and the working directory)")
    if os.path.isdir(path):
        raise fail(path, "is a directory, not a gauge file", "give the path of the file itself")
    try:
        with open(path, "rb") as f:
            return f.read(96)
    except OSError as e:
        raise fail(path, f"cannot be read ({e.strerror})", "check the file's permissions") from None


def detect_format(path) -> str:
    """'milc-v5', 'milc-1996', 'nersc', 'lime' (ILDG or SciDAC) or 'openqcd', from the file's content (openQCD's
    header has no magic number: its extents and the file size must agree)."""
    head = _open_check(path)
    kind = milc.sniff(head)
    if kind:
        return kind
    if nersc.sniff(head):
        return "nersc"
    if lime.sniff(head):
        return "lime"
    if openqcd.sniff(head, os.path.getsize(path)):
        return "openqcd"
    what = "is empty, " if not head else "is "
    raise fail(path, f"{what}not a gauge file of a known format ({KNOWN_FORMATS})",
               "check the path; other formats must be converted first")


def read_site_major(path, ignore_checksum: bool = False):
    """The links as stored, converted to complex128, in MILC's in-file order (nt, nz, ny, nx, 4, 3, 3), and info."""
    kind = detect_format(path)
    try:
        return _READERS[kind](os.fspath(path), ignore_checksum=ignore_checksum)
    except OSError as e:
        raise fail(path, f"read failed ({e.strerror or e})", "check the file and the file system") from None


def read_gauge(path, geom=None, backend=None, ignore_checksum: bool = False, reunitarize: bool = False,
               config=None, check_links: bool = False, force_reunitarize: bool = False):
    """Read a gauge file of any supported format: (GaugeField, info).

    ``geom``: the Geometry to read into (its global dims must match the file's; each rank keeps its own sites);
    without one, a Geometry of the file's dims on ``backend`` (a name, a Backend or None) with the run configuration
    ``config`` (comms.config.RunConfig; default: from the environment), which also gives its process grid.
    ``ignore_checksum``: read even if the checksums (or NERSC's PLAQUETTE / LINK_TRACE) disagree.
    ``reunitarize``: apply MILC's reunit_su3 in double precision after reading (not done by default).
    ``check_links``: refuse NaN/inf and links farther from U(3) than the stored precision allows (what a run,
    measure or solve reads: :mod:`lattice.io.physical`); ``force_reunitarize`` (``--force-reunitarize``) projects
    such links onto SU(3) instead of refusing them (info["forced_reunitarized"]: how many).

    info: format ('milc-v5', 'milc-1996', 'nersc', 'ildg', 'scidac', 'openqcd'), path, dims (nx, ny, nz, nt),
    precision (bits of the stored reals), endian, checksums {expected, computed, ok}, header (the format's header
    fields).
    """
    a, info = read_site_major(path, ignore_checksum)
    if check_links:
        a, info["forced_reunitarized"] = physical.check_links(path, a, info["precision"], force_reunitarize)
    return gauge_from_site_major(path, a, info, geom, backend, reunitarize, config)


def gauge_from_site_major(path, a, info: dict, geom=None, backend=None, reunitarize: bool = False, config=None):
    """(GaugeField, info) of the whole lattice ``a`` (site-major, read from ``path``; ``info["dims"]`` its extents)
    placed as :func:`read_gauge` places a file's: each rank of ``geom`` keeps its sites, or a single-rank Geometry
    on ``backend``; re-unitarized on request."""
    from ..backend import Backend, get_backend
    from ..gauge import GaugeField
    from ..geometry import Geometry

    dims = tuple(info["dims"])
    if geom is None:
        be = backend if isinstance(backend, Backend) else get_backend(backend, config)
        try:
            geom = Geometry(dims, backend=be, config=config)
        except ValueError as e:
            raise fail(path, f"lattice {'x'.join(map(str, dims))} cannot be used ({e})", "use another lattice") \
                from None
    elif tuple(geom.dims) != dims:
        raise fail(path, f"file holds a {'x'.join(map(str, dims))} lattice but the run expects "
                         f"{'x'.join(map(str, geom.dims))}", "read the right file or change the lattice size")
    (ox, oy, oz, ot), (lx, ly, lz, lt) = geom.offset, geom.local_dims
    local = a[ot:ot + lt, oz:oz + lz, oy:oy + ly, ox:ox + lx]
    u = GaugeField.from_site_major(geom, local)
    if reunitarize:
        u.reunitarize()
    info["reunitarized"] = bool(reunitarize)
    return u, info


def _site_major_numpy(u) -> np.ndarray:
    a = u.site_major() if hasattr(u, "site_major") else u
    if hasattr(u, "geom"):
        a = u.geom.gather(a)             # the whole lattice on rank 0 (collective), None on the other ranks
        if a is None:
            return None
    a = np.asarray(a)
    if a.ndim != 7 or a.shape[4:] != (4, 3, 3):
        raise ValueError(f"a gauge field must have shape (nt, nz, ny, nx, 4, 3, 3), not {a.shape}")
    return a


def write_gauge(path, u, format: str = "milc", **options) -> dict:
    """Write the GaugeField (or site-major array) ``u`` to ``path`` atomically; returns what was written
    (checksums, header). ``format``: 'milc' (v5, little-endian float32, as MILC writes), 'nersc'
    (4D_SU3_GAUGE_3x3 IEEE64BIG by default; datatype=, floating_point= with an explicit byte order), 'ildg'
    (precision=64 by default; ildg-data-lfn: lfn=, by default the file's name), 'scidac' (precision=64 by
    default; both with usqcdInfo and a scidac-checksum) or 'openqcd' (little-endian doubles, even extents)."""
    fmt = format.lower()
    writers = {"milc": milc.write, "nersc": nersc.write, "ildg": scidac_write.write_ildg,
               "scidac": scidac_write.write_scidac, "openqcd": openqcd.write}
    if fmt not in writers:
        raise GaugeFileError(f"{os.fspath(path)}: unknown gauge-file format {format!r}; "
                             f"use one of {', '.join(FORMATS)}")
    if fmt == "ildg" and not options.get("lfn"):
        options = {**options, "lfn": os.path.basename(os.fspath(path))}
    a = _site_major_numpy(u)
    comm = u.geom.grid.comm if hasattr(u, "geom") else None
    if comm is None or comm.size == 1:
        return _write(path, writers[fmt], a, **options)
    result = error = None                # several ranks: rank 0 writes what it gathered, all return its answer
    if a is not None:
        try:
            result = _write(path, writers[fmt], a, **options)
        except (GaugeFileError, OSError, ValueError) as e:
            error = e
    result, message = comm.bcast((result, None if error is None else str(error)), root=0)
    if error is not None:
        raise error
    if message is not None:
        raise GaugeFileError(message)
    return result


def write_color_vector(path, x, precision: int = 64, file_xml: str = "", record_xml: str = "") -> dict:
    """Write the whole-lattice colour-vector field ``x`` (nt, nz, ny, nx, 3) as a SciDAC file atomically, as MILC's
    save_ks_vector_scidac (QDP_F3/D3_ColorVector, datacount 1, plain-text file and record XML); returns the
    checksums {"suma", "sumb"}."""
    x = np.asarray(x)
    if x.ndim != 5 or x.shape[-1] != 3:
        raise GaugeFileError(f"{os.fspath(path)}: a colour-vector field has shape (nt, nz, ny, nx, 3), not {x.shape}")
    return _write(path, scidac_write.write_color_field, x[..., None, :], "ColorVector", precision=precision,
                  file_xml=file_xml, record_xml=record_xml)


def write_color_matrices(path, a, precision: int = 64, file_xml: str = "", record_xml: str = "") -> dict:
    """Write the whole-lattice colour-matrix field ``a`` (nt, nz, ny, nx, n, 3, 3) (e.g. the 4 fat or long links of
    each site, MILC's fat.l8 / long.l8) as a SciDAC file atomically (QDP_F3/D3_ColorMatrix, datacount n); returns
    the checksums."""
    return _write(path, scidac_write.write_color_field, a, "ColorMatrix", precision=precision, file_xml=file_xml,
                  record_xml=record_xml)


def write_ksprop(path, solutions, source=None, precision: int = 64, info: str = "", source_info: str = "",
                 record_info: str = "", source_slice: int | None = None) -> dict:
    """Write a USQCD KS propagator (3 source colours, MILC's C1V3 file type) atomically:
    :func:`lattice.io.scidac_write.write_ksprop` (``source_slice``: the source on that time slice only, a
    hypercube record)."""
    return _write(path, scidac_write.write_ksprop, solutions, source, precision=precision, info=info,
                  source_info=source_info, record_info=record_info, source_slice=source_slice)


def write_ksprop_pairs(path, sources, solutions, precision: int = 64, info: str = "", source_info: str = "",
                       record_info: str = "", source_slice: int | None = None) -> dict:
    """Write a USQCD KS propagator of source-sink pairs (colour-vector or scalar sources) atomically:
    :func:`lattice.io.scidac_write.write_ksprop_pairs`."""
    return _write(path, scidac_write.write_ksprop_pairs, sources, solutions, precision=precision, info=info,
                  source_info=source_info, record_info=record_info, source_slice=source_slice)


def _write(path, writer, *args, **options) -> dict:
    try:
        with atomic_write(path) as f:
            return writer(f, *args, **options)
    except ValueError as e:  # bad options (precision, datatype, ...): name the file
        if str(e).startswith(os.fspath(path)):
            raise
        raise GaugeFileError(f"{os.fspath(path)}: {e}") from None
