"""Grid's own metadata records in ILDG and SciDAC files (Grid's parallelIO: MetaData.h's FieldMetaData and
FieldNormMetaData, IldgIO.h's IldgWriter / IldgReader and ScidacWriter, IldgIOtypes.h's record names).

* ``grid-format``: Grid's serialised ``FieldMetaData``, an XML document whose root element ``<FieldMetaData>``
  holds, in this order: nd, dimension (one ``<elem>`` per direction: x, y, z, t), boundary (``<elem>PERIODIC``
  each), data_start, hdr_version, storage_format, link_trace, plaquette, checksum, scidac_checksuma,
  scidac_checksumb, sequence_number, data_type, ensemble_id, ensemble_label, ildg_lfn, creator, creator_hardware,
  creation_date, archive_date, floating_point (``IEEE64BIG`` or ``IEEE32BIG``). Grid's ILDG writer puts it first
  in the file (the file message); its SciDAC field writer first in the field's message.
* ``FieldNormMetaData``: ``<FieldNormMetaData><norm2>N</norm2></FieldNormMetaData>``, N = sum of |z|^2 over every
  complex number of the field (Grid's norm2); Grid writes it after the binary record, before the scidac-checksum
  (and its ILDG writer once more after grid-format).

The values, of the links as stored: plaquette = <ReTr U_p>/3 over all sites and the six planes (Grid's
avgPlaquette, the usqcdInfo plaq), link_trace = <ReTr U>/3 (Grid's linkTrace, the usqcdInfo linktr). Grid's
IldgReader, when grid-format is present, takes the dimensions and the floating-point format from it and asserts
|plaquette - computed| < 1e-5 and |link_trace - computed| < 1e-5; for FieldNormMetaData it asserts
0.5 |N - computed| / (N + computed) < 1e-5. Grid prints doubles with 6 significant digits; its SciDAC field records
carry plaquette and link_trace 0 (not computed) and its header's checksums are 0 (written before the data).

We write them (on request: ``grid_metadata`` of :func:`lattice.io.scidac_write.write_ildg` / ``write_scidac``)
with 16 significant digits and the record's real scidac checksums, and check them when present on read
(:func:`check`): Grid's tolerances; 0 for plaquette, link_trace and the checksums means "not given".
docs/formats.md, 'Grid metadata records'.
"""
from __future__ import annotations

import getpass
import platform
import time
import xml.etree.ElementTree as ET
from xml.sax.saxutils import escape

import numpy as np

from . import lime
from .common import fail
from .usqcd_info import values as gauge_values

GRID_FORMAT = "grid-format"
FIELD_NORM = "FieldNormMetaData"
TOLERANCE = 1e-5                      # Grid's IldgReader: plaquette, link trace; GRID_FIELD_NORM_CHECK: norm2
FLOATING_POINT = {32: "IEEE32BIG", 64: "IEEE64BIG"}
LISTS = ("dimension", "boundary")
FIELDS = ("nd", "dimension", "boundary", "data_start", "hdr_version", "storage_format", "link_trace", "plaquette",
          "checksum", "scidac_checksuma", "scidac_checksumb", "sequence_number", "data_type", "ensemble_id",
          "ensemble_label", "ildg_lfn", "creator", "creator_hardware", "creation_date", "archive_date",
          "floating_point")


def _document(root: str, fields: dict) -> bytes:
    """Grid's XML of a serialised object (pugixml, two-space indent): lists as one ``<elem>`` per entry."""
    lines = ['<?xml version="1.0"?>', f"<{root}>"]
    for key, v in fields.items():
        if isinstance(v, (list, tuple)):
            lines += [f"  <{key}>"] + [f"    <elem>{escape(str(e))}</elem>" for e in v] + [f"  </{key}>"]
        else:
            lines.append(f"  <{key}>{escape(str(v))}</{key}>")
    return ("\n".join(lines + [f"</{root}>"]) + "\n").encode()


def field_metadata(a: np.ndarray, precision: int, sums: dict, lfn: str = "", sequence: int = 0,
                   ensemble: str = "") -> bytes:
    """The grid-format record of the stored gauge field ``a`` (nt, nz, ny, nx, 4, 3, 3) written at ``precision``
    bits with scidac checksums ``sums``, as Grid's IldgWriter fills it (ensemble_id and ensemble_label: its
    description)."""
    nt, nz, ny, nx = np.shape(a)[:4]
    v = gauge_values(a)
    stamp = time.strftime("%a %b %d %H:%M:%S %Y UTC", time.gmtime())
    fields = {"nd": 4, "dimension": [nx, ny, nz, nt], "boundary": ["PERIODIC"] * 4, "data_start": 0,
              "hdr_version": "1.0", "storage_format": "1.0", "link_trace": f"{v['linktr']:.15e}",
              "plaquette": f"{v['plaq']:.15e}", "checksum": 0, "scidac_checksuma": sums["suma"],
              "scidac_checksumb": sums["sumb"], "sequence_number": sequence, "data_type": "4D_SU3_GAUGE_3x3",
              "ensemble_id": ensemble, "ensemble_label": ensemble, "ildg_lfn": lfn, "creator": _user(),
              "creator_hardware": "-".join(platform.uname()[i] for i in (1, 4, 0, 2)), "creation_date": stamp,
              "archive_date": stamp, "floating_point": FLOATING_POINT[precision]}
    return _document("FieldMetaData", fields)


def field_norm(a: np.ndarray) -> bytes:
    """The FieldNormMetaData record of the stored field ``a``: Grid's norm2, sum |z|^2."""
    return _document(FIELD_NORM, {"norm2": f"{norm2(a):.15e}"})


def norm2(a: np.ndarray) -> float:
    return float(np.vdot(a, a).real)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def parse(payload: bytes) -> dict:
    """{field: text, or list of texts for dimension and boundary} of a grid-format or FieldNormMetaData payload;
    {} if it is not XML."""
    try:
        root = ET.fromstring(payload.split(b"\0")[0])
    except (ET.ParseError, LookupError, ValueError):
        return {}
    out = {}
    for el in root:
        elems = el.findall("elem")
        out[el.tag] = [(e.text or "").strip() for e in elems] if el.tag in LISTS or elems else (el.text or "").strip()
    return out


def read_records(path, before, after) -> dict:
    """{'grid': parsed grid-format, 'grid_norm': parsed FieldNormMetaData} of a field's records, where present
    (``before``/``after``: the record of a type before / after the field's binary record, or None)."""
    out = {}
    rec = before(GRID_FORMAT)
    if rec is not None:
        out["grid"] = parse(lime.read_data(path, rec))
    rec = after(FIELD_NORM) or before(FIELD_NORM)
    if rec is not None:
        out["grid_norm"] = parse(lime.read_data(path, rec))
    return out


def _number(fields: dict, key: str, kind=float):
    try:
        return kind(fields[key])
    except (KeyError, TypeError, ValueError):
        return None


def check(path, meta: dict, a: np.ndarray, dims, precision: int, sums: dict, strict: bool = True) -> dict | None:
    """Compare Grid's records of a gauge field (``meta``: :func:`read_records`' answer) with the field ``a`` read,
    its ``dims`` (nx, ny, nz, nt), ``precision`` in bits and computed checksums ``sums``; a mismatch raises
    GaugeFileError when ``strict``. Returns {what: (file's value, data's value)} or None without Grid records."""
    grid, norm = meta.get("grid"), meta.get("grid_norm")
    if grid is None and norm is None:
        return None
    found = {}
    if grid is not None:
        found.update(_structure(path, grid, dims, precision, sums, strict))
        v = gauge_values(a)
        for key, ours in (("plaquette", v["plaq"]), ("link_trace", v["linktr"])):
            theirs = _number(grid, key)
            if theirs is None or theirs == 0.0:      # Grid's SciDAC field records leave them 0
                continue
            found[key] = (theirs, ours)
            if strict and abs(theirs - ours) >= TOLERANCE:
                _mismatch(path, key, grid[key], f"{ours:.10g}")
    n = _number(norm or {}, "norm2")
    if n is not None:
        ours = norm2(a)
        found["norm2"] = (n, ours)
        if strict and 0.5 * abs(n - ours) / max(n + ours, 1e-300) >= TOLERANCE:
            _mismatch(path, "FieldNormMetaData norm2", norm["norm2"], f"{ours:.10g}")
    return found


def _structure(path, grid: dict, dims, precision: int, sums: dict, strict: bool) -> dict:
    """grid-format's dimension, floating_point and nonzero scidac checksums against the file's."""
    found = {}
    try:
        dimension = tuple(int(d) for d in grid.get("dimension", []))
    except ValueError:
        dimension = ()
    found["dimension"] = (dimension, tuple(dims))
    if strict and dimension != tuple(dims):
        _mismatch(path, "dimension", " ".join(grid.get("dimension", [])) or "nothing",
                  " ".join(str(d) for d in dims))
    fp = grid.get("floating_point", "")
    found["floating_point"] = (fp, FLOATING_POINT.get(precision))
    if strict and fp and fp != FLOATING_POINT.get(precision):
        _mismatch(path, "floating_point", fp, f"{precision}-bit big-endian data")
    for key, ours in (("scidac_checksuma", sums.get("suma")), ("scidac_checksumb", sums.get("sumb"))):
        theirs = _number(grid, key, int)
        if theirs and ours is not None:
            found[key] = (theirs, ours)
            if strict and theirs != ours:
                _mismatch(path, key, f"{theirs:x}", f"{ours:x}")
    return found


def _mismatch(path, key: str, theirs: str, ours: str):
    raise fail(path, f"Grid's metadata {key} mismatch: the file says {theirs}, the data give {ours}",
               "the file is corrupt: copy it again, or pass --ignore-checksum to read it anyway")
