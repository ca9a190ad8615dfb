"""SciDAC (QIO) and ILDG lattice files: LIME containers with XML metadata and a big-endian binary record.

Sources: QIO (usqcd-software/qio, lib/qio_*.c, lib/dml/dml_utils.c: DML_checksum_accum) and the ILDG file-format
specification (ildg-format record, namespace http://www.lqcd.org/ildg, schema filefmt.xsd).

* SciDAC: ``scidac-private-file-xml`` gives the lattice dims; each field is a ``scidac-private-record-xml``
  (datatype, precision F/D, colors, typesize = bytes per value, datacount = values per site), a
  ``scidac-record-xml`` (user text), a ``scidac-binary-data`` record (site by site in lexicographic order,
  x fastest, big-endian) and a ``scidac-checksum`` (suma, sumb in hex; see :func:`common.scidac_checksum`).
* ILDG: the same container; the gauge field sits in ``ildg-binary-data`` and ``ildg-format`` gives the field
  (su3gauge), the precision in bits and lx, ly, lz, lt. Per site the 4 links (x, y, z, t), each a row-major 3x3
  of (re, im), big-endian.

The usqcdInfo plaquette and link trace of a gauge record (lattice.io.usqcd_info) and Grid's grid-format and
FieldNormMetaData records (lattice.io.grid_meta) are checked when present.
The writers are in scidac_write.py; :func:`read_ksprop` reads a USQCD KS propagator of three colours and
:func:`read_ksprop_pairs` one of source-sink pairs (their layouts are there). Hypercube records (QIO's recordtype 2,
e.g. a source on one time slice) are read into the whole lattice, zero outside (:func:`_hypercube`).

Arrays are returned in MILC's site order: (nt, nz, ny, nx, datacount, 3, 3) for colour matrices and
(nt, nz, ny, nx, datacount, 3) for colour vectors, complex128.
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import numpy as np

from . import grid_meta, lime, usqcd_info
from .common import check_dims, checksum_error, dims_str, fail, scidac_checksum
from .scidac_write import KSPROP_C1V3, KSPROP_CV_PAIRS, KSPROP_VV_PAIRS, hypercube_checksum, hypercube_ranks

KSPROP_PAIRS = (KSPROP_VV_PAIRS, KSPROP_CV_PAIRS)

BINARY_TYPES = ("ildg-binary-data", "scidac-binary-data")


def xml_fields(payload: bytes) -> dict:
    """{local tag name: text} for the elements of an XML payload (namespaces dropped); {} if it is not XML."""
    text = payload.split(b"\0")[0]
    try:
        root = ET.fromstring(text)
    except (ET.ParseError, LookupError, ValueError):   # malformed, or a damaged encoding="..." in its declaration
        return {}
    return {el.tag.rsplit("}", 1)[-1]: (el.text or "").strip() for el in root.iter()}


def _describe(path, records, index: int):
    """Locate the ``index``-th binary record and the metadata that belong to it."""
    binaries = [i for i, r in enumerate(records) if r.type in BINARY_TYPES]
    if not binaries:
        raise fail(path, "LIME file without an ildg-binary-data or scidac-binary-data record is not a gauge file "
                         "of a known format (MILC v5, MILC 1996, NERSC, ILDG, SciDAC)", "check the path")
    if index >= len(binaries):
        raise fail(path, f"field {index} asked for, but the file holds {len(binaries)}", "use a smaller index")
    ib = binaries[index]
    prev = binaries[index - 1] if index else -1
    nxt = binaries[index + 1] if index + 1 < len(binaries) else len(records)

    def before(rtype):
        for r in reversed(records[prev + 1:ib]):
            if r.type == rtype:
                return r
        return None

    def after(rtype):
        for r in records[ib + 1:nxt]:
            if r.type == rtype:
                return r
        return None

    return records[ib], before, after


def _layout(path, records, binrec, before):
    """dims, bytes per real, complex numbers per value, values per site, colours, datatype, format name,
    metadata."""
    meta = {}
    private_file = lime.find(records, "scidac-private-file-xml")
    if private_file is not None:
        meta["scidac_file"] = xml_fields(lime.read_data(path, private_file))
    private_rec = before("scidac-private-record-xml")
    if private_rec is not None:
        meta["scidac_record"] = xml_fields(lime.read_data(path, private_rec))
    user_rec = before("scidac-record-xml")
    if user_rec is not None:
        meta["record_xml"] = lime.read_data(path, user_rec).split(b"\0")[0].decode("utf-8", "replace")
    ildg = before("ildg-format") if binrec.type == "ildg-binary-data" else None
    if binrec.type == "ildg-binary-data":
        if ildg is None:
            raise fail(path, "ILDG file without an ildg-format record", "the file is damaged or incomplete")
        fmt = xml_fields(lime.read_data(path, ildg))
        meta["ildg_format"] = fmt
        lfn = before("ildg-data-lfn")
        if lfn is not None:
            meta["lfn"] = lime.read_data(path, lfn).split(b"\0")[0].decode("utf-8", "replace")
        try:
            dims = check_dims(path, [int(fmt[k]) for k in ("lx", "ly", "lz", "lt")], "ILDG")
            bits = int(fmt["precision"])
        except (KeyError, ValueError):
            raise fail(path, "ILDG ildg-format record lacks precision or lx, ly, lz, lt",
                       "the file is damaged") from None
        if fmt.get("field", "su3gauge") != "su3gauge" or bits not in (32, 64):
            raise fail(path, f"ILDG field {fmt.get('field')!r} with precision {bits} is not supported",
                       "only su3gauge in 32 or 64 bits is read")
        return dims, bits // 8, 9, 4, 3, "su3gauge", "ildg", meta
    # SciDAC
    sf, sr = meta.get("scidac_file", {}), meta.get("scidac_record", {})
    try:
        dims = check_dims(path, [int(n) for n in sf["dims"].split()], "SciDAC")
        nbytes = {"F": 4, "D": 8}[sr["precision"].upper()]
        typesize, count = int(sr["typesize"]), int(sr["datacount"])
        colors = int(sr.get("colors") or (0 if typesize == 2 * nbytes else 3))   # QIO omits colors 0 (Complex)
    except (KeyError, ValueError):
        raise fail(path, "SciDAC file lacks the dims, precision, typesize or datacount in its private XML",
                   "the file is damaged") from None
    meta["hypercube"] = _hypercube(path, sr, dims)
    if typesize % (2 * nbytes):
        raise fail(path, f"SciDAC typesize {typesize} does not fit precision {sr['precision']}", "the file is damaged")
    if typesize <= 0 or count <= 0 or colors < 0 or (colors == 0 and typesize != 2 * nbytes):
        raise fail(path, f"SciDAC private record XML gives typesize {typesize}, datacount {count}, colors {colors}: "
                         "each must be positive", "the file is damaged")
    return dims, nbytes, typesize // (2 * nbytes), count, colors, sr.get("datatype", ""), "scidac", meta


def _hypercube(path, sr: dict, dims) -> tuple | None:
    """The sites of a record: None for a field on the whole lattice (QIO's recordtype 0, QIO_FIELD), else the
    inclusive bounds (lower, upper), each (x, y, z, t), of a hypercube record (recordtype 2, QIO_HYPER: QIO 2's
    private record XML gives ``<recordtype>``, ``<spacetime>``, ``<hyperlower>`` and ``<hyperupper>``; older QIO
    writes ``<globaldata>`` 0 or 1 in place of recordtype). Global records (1) are refused."""
    kind = sr.get("recordtype", sr.get("globaldata", "0"))
    what = f"SciDAC record {sr.get('datatype', '')!r}"
    if kind == "0":
        return None
    if kind != "2":
        raise fail(path, f"{what} is a global record (recordtype {kind!r}), not a lattice field",
                   "only fields on the whole lattice (recordtype 0) and hypercube records (2) are read")
    try:
        lower, upper = (tuple(int(v) for v in sr[k].split()) for k in ("hyperlower", "hyperupper"))
    except (KeyError, ValueError):
        raise fail(path, f"{what} is a hypercube record without readable hyperlower and hyperupper bounds",
                   "the file is damaged") from None
    if len(lower) != 4 or len(upper) != 4 or not all(0 <= lo <= up < n for lo, up, n in zip(lower, upper, dims)):
        raise fail(path, f"{what} is a hypercube record with bounds {lower} .. {upper} outside the "
                         f"{dims_str(dims)} lattice", "the file is damaged")
    return lower, upper


def read_field(path, ignore_checksum: bool = False, index: int = 0):
    """The ``index``-th lattice field of a SciDAC or ILDG file: (array, info).

    The array is complex128 of shape (nt, nz, ny, nx, datacount) + (3, 3) for colour matrices, + (3,) for colour
    vectors (+ (n,) otherwise, (1,) for a Complex field), holding the stored values converted to double. Its
    scidac-checksum is verified (a mismatch raises GaugeFileError unless ``ignore_checksum``)."""
    path = os.fspath(path)
    return _read_record(path, lime.scan(path), index, ignore_checksum)


def _read_record(path: str, records, index: int, ignore_checksum: bool):
    """:func:`read_field` of the scanned ``records``."""
    binrec, before, after = _describe(path, records, index)
    dims, nbytes, ncomplex, count, colors, datatype, fmt, meta = _layout(path, records, binrec, before)
    cube = meta.get("hypercube")
    lower, upper = cube or ((0, 0, 0, 0), tuple(n - 1 for n in dims))
    nx, ny, nz, nt = (up - lo + 1 for lo, up in zip(lower, upper))      # the extents of the stored sites
    volume = nx * ny * nz * nt
    site_bytes = ncomplex * 2 * nbytes * count
    if binrec.length != volume * site_bytes:
        where = f"a {dims_str(dims)} lattice" if cube is None else f"the hypercube {lower} .. {upper}"
        raise fail(path, f"{binrec.type} record holds {binrec.length} bytes, expected {volume * site_bytes} "
                         f"for {where} of {count} x {ncomplex} complex values per site",
                   "the file is damaged or its XML metadata is wrong")
    raw = lime.read_data(path, binrec)
    sums = {"expected": None, "computed": None, "ok": None}
    cks = after("scidac-checksum")
    ca, cb = (scidac_checksum(raw, site_bytes) if cube is None else
              hypercube_checksum(raw, site_bytes, hypercube_ranks(dims, lower, upper)))
    sums["computed"] = {"suma": ca, "sumb": cb}
    if cks is not None:
        x = xml_fields(lime.read_data(path, cks))
        try:
            ea, eb = int(x["suma"], 16), int(x["sumb"], 16)
        except (KeyError, ValueError):
            raise fail(path, "scidac-checksum record without readable suma and sumb",
                       "pass --ignore-checksum to read the file anyway") from None
        sums["expected"] = {"suma": ea, "sumb": eb}
        sums["ok"] = (ea, eb) == (ca, cb)
        if not sums["ok"] and not ignore_checksum:
            raise checksum_error(path, "SciDAC", f"suma {ea:x} sumb {eb:x}", f"{ca:x} {cb:x}")
    meta.update(grid_meta.read_records(path, before, after))
    elem = (colors, colors) if ncomplex == colors * colors else (ncomplex,)
    a = (np.frombuffer(raw, dtype=f">f{nbytes}").astype(np.float64).view(np.complex128)
         .reshape((nt, nz, ny, nx, count) + elem))
    if cube is not None:                       # the whole lattice, zero outside the hypercube
        whole = np.zeros(tuple(dims[::-1]) + a.shape[4:], dtype=np.complex128)
        whole[tuple(slice(lo, up + 1) for lo, up in zip(lower[::-1], upper[::-1]))] = a
        a = whole
    info = {"format": fmt, "path": path, "dims": dims, "precision": 8 * nbytes, "endian": "big",
            "datatype": datatype, "datacount": count, "checksums": sums, "header": meta,
            "hypercube": None if cube is None else {"lower": lower, "upper": upper},
            "records": [r.type for r in records]}
    return a, info


def read_gauge(path, ignore_checksum: bool = False):
    """An ILDG or SciDAC gauge field: (site-major (nt, nz, ny, nx, 4, 3, 3) complex128 array, info)."""
    a, info = read_field(path, ignore_checksum)
    if info["hypercube"] is not None:
        raise fail(path, f"{info['format']} file holds a hypercube record (sites {info['hypercube']['lower']} .. "
                         f"{info['hypercube']['upper']}), not a gauge field on the whole lattice",
                   "read it with lattice.io.read_field")
    if a.shape[4:] != (4, 3, 3):
        raise fail(path, f"{info['format']} file holds a {info['datatype'] or 'field'} ({info['datacount']} x "
                         f"{a.shape[5:]} values per site), not a gauge field",
                   "read it with lattice.io.read_color_vector or read_color_matrices")
    record = xml_fields(info["header"].get("record_xml", "").encode())      # usqcdInfo's plaq and linktr, if any
    info["usqcd_info"] = usqcd_info.check(path, record, a, info["precision"] // 8, strict=not ignore_checksum)
    info["grid_metadata"] = grid_meta.check(path, info["header"], a, info["dims"], info["precision"],
                                            info["checksums"]["computed"], strict=not ignore_checksum)
    return a, info


def read_color_vector(path, ignore_checksum: bool = False, index: int = 0) -> np.ndarray:
    """A SciDAC colour-vector field (e.g. ksvector.*.l8) as an array (nt, nz, ny, nx, 3), complex128."""
    a, info = read_field(path, ignore_checksum, index)
    if a.shape[4:] != (1, 3):
        raise fail(path, f"holds {info['datacount']} x {a.shape[5:]} values per site, not one colour vector",
                   "use read_field for other SciDAC fields")
    return a[..., 0, :]


def read_color_matrices(path, ignore_checksum: bool = False, index: int = 0) -> np.ndarray:
    """A SciDAC field of 4 colour matrices per site (fat.l8, long.l8, colormatrix.mom.*) as an array
    (nt, nz, ny, nx, 4, 3, 3), complex128."""
    a, info = read_field(path, ignore_checksum, index)
    if a.shape[4:] != (4, 3, 3):
        raise fail(path, f"holds {info['datacount']} x {a.shape[5:]} values per site, not 4 colour matrices",
                   "use read_field for other SciDAC fields")
    return a


def field_count(path) -> int:
    """How many lattice fields (binary records) a SciDAC or ILDG file holds."""
    return sum(r.type in BINARY_TYPES for r in lime.scan(os.fspath(path)))


def read_ksprop(path, ignore_checksum: bool = False):
    """A USQCD KS propagator of type USQCD_ColorVector_ScalarSource_ThreeSink (MILC's save_ksprop with QIO, written
    by :func:`lattice.io.scidac_write.write_ksprop`): (solutions, source, info).

    solutions: (3, nt, nz, ny, nx, 3) complex128, the solution of the source of colour c at [c] (each record's
    usqcdKSPropInfo color says which); source: the scalar source (nt, nz, ny, nx); info: the file's dims, precision,
    file-XML fields (type, info), per record the checksums, and the record XML fields."""
    path = os.fspath(path)
    records = lime.scan(path)
    file_fields = _ksprop_file_fields(path, records)
    if file_fields.get("type") != KSPROP_C1V3:
        fix = ("read it with read_ksprop_pairs" if file_fields.get("type") in KSPROP_PAIRS else
               "read a colour vector with read_color_vector")
        raise fail(path, f"is not a USQCD KS propagator of type {KSPROP_C1V3} (file XML type "
                         f"{file_fields.get('type')!r})", fix)
    source, solutions, fields = None, {}, []
    for index in range(sum(r.type in BINARY_TYPES for r in records)):
        a, info = _read_record(path, records, index, ignore_checksum)
        rec = xml_fields(info["header"].get("record_xml", "").encode())
        fields.append({"datatype": info["datatype"], "record_xml": rec, "checksums": info["checksums"]})
        if a.shape[4:] == (1, 1) and source is None:
            source = a[..., 0, 0]
            continue
        color = rec.get("color", "")
        if a.shape[4:] != (1, 3) or color not in ("0", "1", "2") or int(color) in solutions:
            raise fail(path, f"field {index} ({info['datatype']}, record colour {color!r}) is not the solution of "
                             "a new source colour 0, 1 or 2", "the file is damaged or of another propagator type")
        solutions[int(color)] = a[..., 0, :]
    if sorted(solutions) != [0, 1, 2]:
        raise fail(path, f"holds the solutions of source colours {sorted(solutions)}, not of 0, 1 and 2",
                   "the file is incomplete: write it again")
    return np.stack([solutions[c] for c in range(3)]), source, {
        "format": "usqcd-ksprop", "path": path, "type": KSPROP_C1V3, "dims": info["dims"],
        "precision": info["precision"], "file_xml": file_fields, "fields": fields,
        "records": [r.type for r in records]}


def read_ksprop_pairs(path, ignore_checksum: bool = False):
    """A USQCD KS propagator of source-sink pairs (``USQCD_ColorVector_Source_Sink_Pairs`` or
    ``USQCD_ColorVector_ScalarSource_Sink_Pairs``, written by :func:`lattice.io.scidac_write.write_ksprop_pairs`):
    (sources, solutions, info). sources: (n, nt, nz, ny, nx, 3) colour vectors or (n, nt, nz, ny, nx) complex
    scalars (a source written on one time slice, a hypercube record, is zero elsewhere); solutions: (n, nt, nz, ny,
    nx, 3), in the file's order, each after its source; info: dims, precision, type, file-XML fields and per record
    the checksums and record XML fields."""
    path = os.fspath(path)
    records = lime.scan(path)
    file_fields = _ksprop_file_fields(path, records)
    kind = file_fields.get("type")
    if kind not in KSPROP_PAIRS:
        raise fail(path, f"is not a USQCD KS propagator of source-sink pairs (file XML type {kind!r}; "
                         f"{' or '.join(KSPROP_PAIRS)} are)", "read a three-colour propagator with read_ksprop")
    source_value = (1, 3) if kind == KSPROP_VV_PAIRS else (1, 1)
    n = sum(r.type in BINARY_TYPES for r in records)
    if n == 0 or n % 2:
        raise fail(path, f"holds {n} fields, not source-solution pairs", "the file is incomplete: write it again")
    out, fields = {"sources": [], "solutions": []}, []
    for index in range(n):
        a, info = _read_record(path, records, index, ignore_checksum)
        fields.append({"datatype": info["datatype"], "checksums": info["checksums"], "hypercube": info["hypercube"],
                       "record_xml": xml_fields(info["header"].get("record_xml", "").encode())})
        what, want = ("sources", source_value) if index % 2 == 0 else ("solutions", (1, 3))
        if a.shape[4:] != want:
            raise fail(path, f"field {index} ({info['datatype']}) is not the {what[:-1]} of pair {index // 2} of a "
                             f"{kind}", "the file is damaged or of another propagator type")
        out[what].append(a[..., 0, 0] if want == (1, 1) else a[..., 0, :])
    return np.stack(out["sources"]), np.stack(out["solutions"]), {
        "format": "usqcd-ksprop", "path": path, "type": kind, "dims": info["dims"], "precision": info["precision"],
        "file_xml": file_fields, "fields": fields, "records": [r.type for r in records]}


def _ksprop_file_fields(path, records) -> dict:
    user_file = lime.find(records, "scidac-file-xml")
    return xml_fields(lime.read_data(path, user_file)) if user_file is not None else {}


def is_ksprop(path) -> bool:
    """Whether ``path`` is a LIME file whose file XML says it is a USQCD KS propagator (:func:`read_ksprop`)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            if not lime.sniff(f.read(4)):
                return False
    except OSError:
        return False
    user_file = lime.find(lime.scan(path), "scidac-file-xml")
    return user_file is not None and xml_fields(lime.read_data(path, user_file)).get("type") == KSPROP_C1V3
