"""Writing SciDAC (QIO) and ILDG files: the record layout QIO gives them as MILC writes them, read back by
:mod:`lattice.io.scidac`. One file is a LIME file of messages (:mod:`lattice.io.lime`):

* message 1 (file): ``scidac-private-file-xml`` (version 1.1, spacetime 4, dims, volfmt 0 = one file) and
  ``scidac-file-xml`` (the user's file XML);
* one message per field: ``scidac-private-record-xml`` (version 1.0, date, globaldata 0, datatype, precision F/D,
  colors, typesize = bytes per value, datacount = values per site), ``scidac-record-xml`` (the user's record XML),
  the binary record (``scidac-binary-data``; per site in lexicographic order, x fastest, the datacount values, each
  a row-major array of big-endian (re, im)) and ``scidac-checksum`` (suma, sumb:
  :func:`lattice.io.common.scidac_checksum`).

Field types (QDP's names, QIO's record XML; MILC's io_scidac_types):

==============  ==================================  ========  =================  =============================
kind            datatype                            colors    typesize (F / D)    what MILC writes with it
==============  ==================================  ========  =================  =============================
ColorMatrix     QDP_F3_ColorMatrix, QDP_D3_...       3         72 / 144           gauge, fat and long links,
                                                                                  momenta (datacount 4)
ColorVector     QDP_F3_ColorVector, QDP_D3_...       3         24 / 48            ksvector, KS propagator sinks
Complex         QDP_F_Complex, QDP_D_Complex         (none)    8 / 16             a KS propagator's scalar source
==============  ==================================  ========  =================  =============================

QIO leaves ``colors`` out of the record XML when it is 0 (QIO_insert_colors), as for Complex.

* Gauge files (MILC's save_serial_scidac / save_serial_ildg): one ColorMatrix record of datacount 4 whose record
  XML is the USQCD ``usqcdInfo`` (:mod:`lattice.io.usqcd_info`); an ILDG file adds ``ildg-format`` and
  ``ildg-data-lfn`` (which Grid's reader requires) before the binary, which is then ``ildg-binary-data``.
* USQCD KS propagators (QIO's qio_usqcd_ksprop.c, MILC's io_scidac_ks.c ``open_usqcd_ksprop_write`` /
  ``write_kspropsource_C_usqcd`` / ``write_ksprop_usqcd_c``), the file type
  ``USQCD_ColorVector_ScalarSource_ThreeSink`` (MILC's FILE_TYPE_KS_USQCD_C1V3): the file XML is
  ``<usqcdKSPropFile><version>1.0</version><type>...</type><info>...</info></usqcdKSPropFile>``; then the scalar
  source as a Complex field with record XML ``<usqcdSourceInfo><version>1.0</version><info>...</info>
  </usqcdSourceInfo>``, then one ColorVector field per source colour c = 0, 1, 2 (the solution of the source of
  colour c) with record XML ``<usqcdKSPropInfo><version>1.0</version><color>c</color><info>...</info>
  </usqcdKSPropInfo>``. The source is written on the whole lattice (QIO recordtype field), or on one time slice t0
  as a hypercube record (QIO recordtype 2), as MILC writes the source of a time slice.
* a hypercube record (QIO 2, ``QIO_write`` of a subset): its private record XML has record format version 1.1,
  ``<recordtype>2</recordtype><spacetime>4</spacetime><hyperlower>x y z t </hyperlower><hyperupper>x y z t
  </hyperupper>`` (inclusive corners); the binary record holds only the hypercube's sites, in lexicographic order
  (x fastest), and the checksum rotates each site's CRC-32 by its rank in the whole lattice (qio/lib/dml/
  dml_utils.c: DML_create_subset_rank, DML_partition_out).
"""
from __future__ import annotations

import time
from xml.sax.saxutils import escape

import numpy as np

from . import grid_meta, lime, usqcd_info
from .common import scidac_checksum, site_crc32

PRECISIONS = (32, 64)
KSPROP_C1V3 = "USQCD_ColorVector_ScalarSource_ThreeSink"
# QIO's other two KS propagator file types (qio/include/qioxml_usqcd_ksprop.h): a source and its solution per pair,
# the source a colour vector (VV) or a complex scalar field (CV)
KSPROP_VV_PAIRS = "USQCD_ColorVector_Source_Sink_Pairs"
KSPROP_CV_PAIRS = "USQCD_ColorVector_ScalarSource_Sink_Pairs"
# kind: (complex numbers per value, colors in the record XML, shape of one value)
KINDS = {"ColorMatrix": (9, 3, (3, 3)), "ColorVector": (3, 3, (3,)), "Complex": (1, 0, ())}


def xml(body: str) -> bytes:
    """A NUL-terminated XML payload as QIO writes it."""
    return ('<?xml version="1.0" encoding="UTF-8"?>' + body).encode() + b"\0"


def text(s: str) -> bytes:
    """A NUL-terminated plain-text payload (MILC's file and record XML of colour vectors are plain text)."""
    return s.encode() + b"\0"


def _check_precision(precision: int, what: str = "SciDAC") -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"{what} precision {precision} is not supported: use 32 or 64")
    return "F" if precision == 32 else "D"


def file_message(dims, file_xml: bytes) -> list:
    """The file message: QIO's private file XML of the lattice ``dims`` (nx, ny, nz, nt) and the user's file XML."""
    nx, ny, nz, nt = dims
    return [("scidac-private-file-xml", xml(f"<scidacFile><version>1.1</version><spacetime>4</spacetime>"
                                            f"<dims>{nx} {ny} {nz} {nt} </dims><volfmt>0</volfmt></scidacFile>")),
            ("scidac-file-xml", file_xml)]


def stored(a: np.ndarray, precision: int) -> tuple[bytes, np.ndarray]:
    """(the big-endian bytes of ``a`` at ``precision`` bits, the values they hold as complex128)."""
    data = np.ascontiguousarray(np.asarray(a, dtype=np.complex128).view(np.float64), dtype=f">f{precision // 8}")
    return data.tobytes(), data.astype(np.float64).view(np.complex128).reshape(np.shape(a))


def hypercube_ranks(dims, lower, upper) -> np.ndarray:
    """The global lexicographic ranks x + nx (y + ny (z + nz t)) of a hypercube's sites in their order in the record
    (lexicographic, x fastest: QIO's DML_lex_next from lower to upper)."""
    nx, ny, nz, _ = dims
    t, z, y, x = np.ix_(*(np.arange(lo, up + 1, dtype=np.int64) for lo, up in zip(lower[::-1], upper[::-1])))
    return (x + nx * (y + ny * (z + nz * t))).ravel()


def hypercube_checksum(raw, site_bytes: int, ranks: np.ndarray) -> tuple[int, int]:
    """QIO's (suma, sumb) of a hypercube record: as :func:`lattice.io.common.scidac_checksum`, each site's CRC-32
    rotated by its global lexicographic rank (DML_partition_out accumulates with the site's rank in the whole
    lattice)."""
    crc = site_crc32(raw, site_bytes).astype(np.uint64)
    out = []
    for period in (29, 31):
        r = (ranks % period).astype(np.uint64)
        rot = ((crc << r) | (crc >> (np.uint64(32) - r))) & np.uint64(0xFFFFFFFF)
        out.append(int(np.bitwise_xor.reduce(rot)) if rot.size else 0)
    return out[0], out[1]


def field_message(a: np.ndarray, kind: str, precision: int, record_xml: bytes, before_binary=(),
                  binary_type: str = "scidac-binary-data", hypercube=None) -> tuple[list, dict]:
    """(the LIME records of one field, its checksums {"suma", "sumb"}). ``a``: (nt, nz, ny, nx, datacount) + the
    shape of one value of ``kind`` (a key of :data:`KINDS`); ``before_binary``: more (type, data) records before the
    binary one (ILDG's). ``hypercube``: (lower, upper), inclusive (x, y, z, t) bounds: only those sites are
    written, as a QIO hypercube record (recordtype 2, record format 1.1, each site's checksum rotated by its rank
    in the whole lattice: :mod:`lattice.io.scidac`)."""
    ncomplex, colors, value_shape = KINDS[kind]
    a = np.asarray(a)
    if a.ndim != 5 + len(value_shape) or a.shape[5:] != value_shape:
        raise ValueError(f"a {kind} field has shape (nt, nz, ny, nx, datacount) + {value_shape}, not {a.shape}")
    p = _check_precision(precision)
    nbytes, count = precision // 8, a.shape[4]
    site_bytes = count * ncomplex * 2 * nbytes
    if hypercube is None:
        raw, _ = stored(a, precision)
        suma, sumb = scidac_checksum(raw, site_bytes)
        kind_xml = "<version>1.0</version><date>{}</date><globaldata>0</globaldata>"
    else:
        lower, upper = _check_hypercube(hypercube, _dims_of(a))
        raw, _ = stored(a[tuple(slice(lo, up + 1) for lo, up in zip(lower[::-1], upper[::-1]))], precision)
        suma, sumb = hypercube_checksum(raw, site_bytes, hypercube_ranks(_dims_of(a), lower, upper))
        kind_xml = ("<version>1.1</version><date>{}</date><recordtype>2</recordtype><spacetime>4</spacetime>"
                    f"<hyperlower>{''.join(f'{v} ' for v in lower)}</hyperlower>"
                    f"<hyperupper>{''.join(f'{v} ' for v in upper)}</hyperupper>")
    datatype = f"QDP_{p}3_{kind}" if colors else f"QDP_{p}_{kind}"
    stamp = time.strftime("%a %b %d %H:%M:%S %Y UTC", time.gmtime())
    private = xml(f"<scidacRecord>{kind_xml.format(stamp)}"
                  f"<datatype>{datatype}</datatype><precision>{p}</precision>"
                  + (f"<colors>{colors}</colors>" if colors else "")
                  + f"<typesize>{ncomplex * 2 * nbytes}</typesize><datacount>{count}</datacount></scidacRecord>")
    records = [("scidac-private-record-xml", private), ("scidac-record-xml", record_xml), *before_binary,
               (binary_type, raw),
               ("scidac-checksum", xml(f"<scidacChecksum><version>1.0</version><suma>{suma:x}</suma>"
                                       f"<sumb>{sumb:x}</sumb></scidacChecksum>"))]
    return records, {"suma": suma, "sumb": sumb}


def _check_hypercube(hypercube, dims) -> tuple:
    """(lower, upper) as tuples of 4 ints inside the lattice ``dims`` (nx, ny, nz, nt), lower <= upper."""
    lower, upper = (tuple(int(v) for v in b) for b in hypercube)
    if len(lower) != 4 or len(upper) != 4 or not all(0 <= lo <= up < n for lo, up, n in zip(lower, upper, dims)):
        raise ValueError(f"hypercube bounds {lower} .. {upper} are not (x, y, z, t) corners inside the lattice "
                         f"{dims}, lower <= upper")
    return lower, upper


def _dims_of(a: np.ndarray) -> tuple:
    nt, nz, ny, nx = np.shape(a)[:4]
    return nx, ny, nz, nt


def _gauge_records(a: np.ndarray, precision: int, title: str, info: str, ildg_lfn: str | None,
                   grid_metadata=None) -> tuple[list, dict]:
    """The two LIME messages of a gauge file of ``a`` (ILDG when ``ildg_lfn`` is given) and what they record;
    with ``grid_metadata`` (True, or a dict of sequence_number and ensemble: Grid's header fields) also Grid's
    records where Grid's IldgWriter puts them (:mod:`lattice.io.grid_meta`)."""
    _check_precision(precision, "ILDG" if ildg_lfn is not None else "SciDAC")
    held = stored(a, precision)[1]
    usqcd, _ = usqcd_info.record_xml(held, info)
    extra = []
    if ildg_lfn is not None:
        nt, nz, ny, nx = a.shape[:4]
        extra = [("ildg-format", xml(
                     '<ildgFormat xmlns="http://www.lqcd.org/ildg" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
                     'xsi:schemaLocation="http://www.lqcd.org/ildg/filefmt.xsd"><version>1.0</version>'
                     f"<field>su3gauge</field><precision>{precision}</precision>"
                     f"<lx>{nx}</lx><ly>{ny}</ly><lz>{nz}</lz><lt>{nt}</lt></ildgFormat>")),
                 ("ildg-data-lfn", ildg_lfn.encode() + b"\0")]
    rec_msg, sums = field_message(a, "ColorMatrix", precision, xml(usqcd), extra,
                                  "ildg-binary-data" if ildg_lfn is not None else "scidac-binary-data")
    file_msg = file_message(_dims_of(a), xml(f"<title>{escape(title)}</title>"))
    if grid_metadata:
        grid = grid_metadata if isinstance(grid_metadata, dict) else {}
        header = grid_meta.field_metadata(held, precision, sums, ildg_lfn or "", int(grid.get("sequence_number", 0)),
                                          str(grid.get("ensemble", "")))
        norm = (grid_meta.FIELD_NORM, grid_meta.field_norm(held))
        file_msg = [(grid_meta.GRID_FORMAT, header), norm] + file_msg
        rec_msg.insert(len(rec_msg) - 1, norm)                    # after the binary record, before the checksum
    return [file_msg, rec_msg], sums


def write_ildg(f, a: np.ndarray, lfn: str, precision: int = 64, title: str = "hisq-hmc ILDG gauge configuration",
               info: str = "", grid_metadata=None) -> dict:
    """Write an ILDG file of the site-major array ``a`` (nt, nz, ny, nx, 4, 3, 3) to the open binary file ``f``;
    ``lfn``: its ildg-data-lfn (a logical file name; :func:`lattice.io.write_gauge` gives the file's name).
    ``grid_metadata``: also Grid's grid-format and FieldNormMetaData records (True, or {"sequence_number": n,
    "ensemble": text}). Returns the checksums (suma, sumb) written."""
    if not lfn:
        raise ValueError("an ILDG file needs its logical file name (ildg-data-lfn): give lfn=")
    messages, written = _gauge_records(a, precision, title, info, lfn, grid_metadata)
    lime.write_messages(f, messages)
    return written


def write_scidac(f, a: np.ndarray, precision: int = 64, title: str = "hisq-hmc SciDAC gauge configuration",
                 info: str = "", grid_metadata=None) -> dict:
    """Write a SciDAC (QIO, single file) gauge file of the site-major array ``a`` to the open binary file ``f``;
    ``grid_metadata`` as for :func:`write_ildg`. Returns the checksums (suma, sumb) written."""
    messages, written = _gauge_records(a, precision, title, info, None, grid_metadata)
    lime.write_messages(f, messages)
    return written


def write_color_field(f, a: np.ndarray, kind: str, precision: int = 64, file_xml: str = "",
                      record_xml: str = "") -> dict:
    """Write one ColorMatrix or ColorVector field ``a`` ((nt, nz, ny, nx, datacount) + (3, 3) or (3,)) as a
    SciDAC file with plain-text file and record XML, as MILC's save_ks_vector_scidac and its fat/long-link and
    momentum files; returns the checksums."""
    if kind not in ("ColorMatrix", "ColorVector"):
        raise ValueError(f"kind {kind!r}: use ColorMatrix or ColorVector")
    rec_msg, sums = field_message(a, kind, precision, text(record_xml))
    lime.write_messages(f, [file_message(_dims_of(a), text(file_xml)), rec_msg])
    return sums


def write_ksprop(f, solutions: np.ndarray, source: np.ndarray | None = None, precision: int = 64, info: str = "",
                 source_info: str = "", record_info: str = "", source_slice: int | None = None) -> dict:
    """Write a USQCD KS propagator (``USQCD_ColorVector_ScalarSource_ThreeSink``) to the open binary file ``f``:
    ``solutions`` (3, nt, nz, ny, nx, 3), the solution of the source of each colour c; ``source`` (nt, nz, ny, nx)
    complex, the scalar source (None: zeros, as MILC writes when it has none); ``source_slice`` t0: the source is
    written on that time slice only, as a hypercube record (MILC's sources on one time slice). Returns {"source":
    checksums, "colors": [checksums of colour 0, 1, 2]}."""
    solutions = np.asarray(solutions)
    if solutions.ndim != 6 or solutions.shape[0] != 3 or solutions.shape[-1] != 3:
        raise ValueError(f"a KS propagator has shape (3 colours, nt, nz, ny, nx, 3), not {solutions.shape}")
    if source is None:
        source = np.zeros(solutions.shape[1:5], dtype=np.complex128)
    if np.shape(source) != solutions.shape[1:5]:
        raise ValueError(f"the scalar source has shape {np.shape(source)}, not {solutions.shape[1:5]} (nt, nz, ny, nx)")
    _check_precision(precision)
    dims = _dims_of(source)
    messages = [file_message(dims, _ksprop_file_xml(KSPROP_C1V3, info))]
    src_msg, src_sums = _source_message(source, "Complex", precision, source_info, source_slice)
    messages.append(src_msg)
    color_sums = []
    for c in range(3):
        msg, sums = _solution_message(solutions[c], c, precision, record_info)
        messages.append(msg)
        color_sums.append(sums)
    lime.write_messages(f, messages)
    return {"source": src_sums, "colors": color_sums}


def write_ksprop_pairs(f, sources: np.ndarray, solutions: np.ndarray, precision: int = 64, info: str = "",
                       source_info: str = "", record_info: str = "", source_slice: int | None = None) -> dict:
    """Write a USQCD KS propagator of source-sink pairs to the open binary file ``f``: ``solutions`` (n, nt, nz, ny,
    nx, 3), the solution of each source; ``sources`` (n, nt, nz, ny, nx, 3), colour-vector sources (file type
    ``USQCD_ColorVector_Source_Sink_Pairs``, MILC's FILE_TYPE_KS_USQCD_VV_PAIRS), or (n, nt, nz, ny, nx), complex
    scalar sources (``USQCD_ColorVector_ScalarSource_Sink_Pairs``, FILE_TYPE_KS_USQCD_CV_PAIRS). After the file
    message each pair is two messages, as MILC's write_kspropsource_V_usqcd / _C_usqcd then write_ksprop_usqcd_c:
    the source with record XML ``usqcdSourceInfo`` (version, info; on time slice ``source_slice`` only, a hypercube
    record, when given), then its solution with ``usqcdKSPropInfo`` (version, color = the pair's index, info).
    Returns {"sources": [checksums], "solutions": [checksums]}."""
    sources, solutions = np.asarray(sources), np.asarray(solutions)
    if solutions.ndim != 6 or solutions.shape[-1] != 3:
        raise ValueError(f"the solutions have shape (n, nt, nz, ny, nx, 3), not {solutions.shape}")
    if sources.shape not in (solutions.shape, solutions.shape[:5]):
        raise ValueError(f"the sources have shape {sources.shape}: give {solutions.shape} (colour vectors) or "
                         f"{solutions.shape[:5]} (complex scalars), one per solution")
    _check_precision(precision)
    vector = sources.ndim == 6
    messages = [file_message(_dims_of(solutions[0]), _ksprop_file_xml(KSPROP_VV_PAIRS if vector else KSPROP_CV_PAIRS,
                                                                       info))]
    out = {"sources": [], "solutions": []}
    for k in range(solutions.shape[0]):
        for what, (msg, sums) in (("sources", _source_message(sources[k], "ColorVector" if vector else "Complex",
                                                              precision, source_info, source_slice)),
                                  ("solutions", _solution_message(solutions[k], k, precision, record_info))):
            messages.append(msg)
            out[what].append(sums)
    lime.write_messages(f, messages)
    return out


def _ksprop_file_xml(file_type: str, info: str) -> bytes:
    return xml(f"<usqcdKSPropFile><version>1.0</version><type>{file_type}</type><info>{escape(info)}</info>"
               "</usqcdKSPropFile>")


def _source_message(source, kind: str, precision: int, info: str, source_slice: int | None):
    """A KS propagator's source record (usqcdSourceInfo), on time slice ``source_slice`` only when given."""
    source = np.asarray(source)
    nx, ny, nz, _ = _dims_of(source)
    cube = None if source_slice is None else ((0, 0, 0, source_slice), (nx - 1, ny - 1, nz - 1, source_slice))
    return field_message(source[..., None] if kind == "Complex" else source[..., None, :], kind, precision,
                         xml(f"<usqcdSourceInfo><version>1.0</version><info>{escape(info)}</info></usqcdSourceInfo>"),
                         hypercube=cube)


def _solution_message(solution, color: int, precision: int, info: str):
    """A KS propagator's solution record (usqcdKSPropInfo with its colour)."""
    return field_message(np.asarray(solution)[..., None, :], "ColorVector", precision,
                         xml(f"<usqcdKSPropInfo><version>1.0</version><color>{color}</color>"
                             f"<info>{escape(info)}</info></usqcdKSPropInfo>"))
