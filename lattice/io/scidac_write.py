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
  </usqcdKSPropInfo>``. The source is written on the whole lattice (QIO recordtype field; MILC writes the source of
  a time slice t0 as a hypercube record, which :mod:`lattice.io.scidac` refuses with a one-line error).
"""
from __future__ import annotations

import time
from xml.sax.saxutils import escape

import numpy as np

from . import lime, usqcd_info
from .common import scidac_checksum

PRECISIONS = (32, 64)
KSPROP_C1V3 = "USQCD_ColorVector_ScalarSource_ThreeSink"
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


def field_message(a: np.ndarray, kind: str, precision: int, record_xml: bytes, before_binary=(),
                  binary_type: str = "scidac-binary-data") -> tuple[list, dict]:
    """(the LIME records of one field, its checksums {"suma", "sumb"}). ``a``: (nt, nz, ny, nx, datacount) + the
    shape of one value of ``kind`` (a key of :data:`KINDS`); ``before_binary``: more (type, data) records before the
    binary one (ILDG's)."""
    ncomplex, colors, value_shape = KINDS[kind]
    a = np.asarray(a)
    if a.ndim != 5 + len(value_shape) or a.shape[5:] != value_shape:
        raise ValueError(f"a {kind} field has shape (nt, nz, ny, nx, datacount) + {value_shape}, not {a.shape}")
    p = _check_precision(precision)
    nbytes, count = precision // 8, a.shape[4]
    raw, _ = stored(a, precision)
    suma, sumb = scidac_checksum(raw, count * ncomplex * 2 * nbytes)
    datatype = f"QDP_{p}3_{kind}" if colors else f"QDP_{p}_{kind}"
    stamp = time.strftime("%a %b %d %H:%M:%S %Y UTC", time.gmtime())
    private = xml(f"<scidacRecord><version>1.0</version><date>{stamp}</date><globaldata>0</globaldata>"
                  f"<datatype>{datatype}</datatype><precision>{p}</precision>"
                  + (f"<colors>{colors}</colors>" if colors else "")
                  + f"<typesize>{ncomplex * 2 * nbytes}</typesize><datacount>{count}</datacount></scidacRecord>")
    records = [("scidac-private-record-xml", private), ("scidac-record-xml", record_xml), *before_binary,
               (binary_type, raw),
               ("scidac-checksum", xml(f"<scidacChecksum><version>1.0</version><suma>{suma:x}</suma>"
                                       f"<sumb>{sumb:x}</sumb></scidacChecksum>"))]
    return records, {"suma": suma, "sumb": sumb}


def _dims_of(a: np.ndarray) -> tuple:
    nt, nz, ny, nx = np.shape(a)[:4]
    return nx, ny, nz, nt


def _gauge_records(a: np.ndarray, precision: int, title: str, info: str, ildg_lfn: str | None) -> tuple[list, dict]:
    """The two LIME messages of a gauge file of ``a`` (ILDG when ``ildg_lfn`` is given) and what they record."""
    _check_precision(precision, "ILDG" if ildg_lfn is not None else "SciDAC")
    usqcd, _ = usqcd_info.record_xml(stored(a, precision)[1], info)
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
    return [file_message(_dims_of(a), xml(f"<title>{escape(title)}</title>")), rec_msg], sums


def write_ildg(f, a: np.ndarray, lfn: str, precision: int = 64, title: str = "hisq-hmc ILDG gauge configuration",
               info: str = "") -> dict:
    """Write an ILDG file of the site-major array ``a`` (nt, nz, ny, nx, 4, 3, 3) to the open binary file ``f``;
    ``lfn``: its ildg-data-lfn (a logical file name; :func:`lattice.io.write_gauge` gives the file's name).
    Returns the checksums (suma, sumb) written."""
    if not lfn:
        raise ValueError("an ILDG file needs its logical file name (ildg-data-lfn): give lfn=")
    messages, written = _gauge_records(a, precision, title, info, lfn)
    lime.write_messages(f, messages)
    return written


def write_scidac(f, a: np.ndarray, precision: int = 64, title: str = "hisq-hmc SciDAC gauge configuration",
                 info: str = "") -> dict:
    """Write a SciDAC (QIO, single file) gauge file of the site-major array ``a`` to the open binary file ``f``.
    Returns the checksums (suma, sumb) written."""
    messages, written = _gauge_records(a, precision, title, info, None)
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
                 source_info: str = "", record_info: str = "") -> dict:
    """Write a USQCD KS propagator (``USQCD_ColorVector_ScalarSource_ThreeSink``) to the open binary file ``f``:
    ``solutions`` (3, nt, nz, ny, nx, 3), the solution of the source of each colour c; ``source`` (nt, nz, ny, nx)
    complex, the scalar source (None: zeros, as MILC writes when it has none). Returns {"source": checksums,
    "colors": [checksums of colour 0, 1, 2]}."""
    solutions = np.asarray(solutions)
    if solutions.ndim != 6 or solutions.shape[0] != 3 or solutions.shape[-1] != 3:
        raise ValueError(f"a KS propagator has shape (3 colours, nt, nz, ny, nx, 3), not {solutions.shape}")
    if source is None:
        source = np.zeros(solutions.shape[1:5], dtype=np.complex128)
    if np.shape(source) != solutions.shape[1:5]:
        raise ValueError(f"the scalar source has shape {np.shape(source)}, not {solutions.shape[1:5]} (nt, nz, ny, nx)")
    _check_precision(precision)
    file_xml = xml(f"<usqcdKSPropFile><version>1.0</version><type>{KSPROP_C1V3}</type><info>{escape(info)}</info>"
                   "</usqcdKSPropFile>")
    messages = [file_message(_dims_of(source), file_xml)]
    src_msg, src_sums = field_message(np.asarray(source)[..., None], "Complex", precision,
                                      xml(f"<usqcdSourceInfo><version>1.0</version><info>{escape(source_info)}"
                                          "</info></usqcdSourceInfo>"))
    messages.append(src_msg)
    color_sums = []
    for c in range(3):
        msg, sums = field_message(solutions[c][..., None, :], "ColorVector", precision,
                                  xml(f"<usqcdKSPropInfo><version>1.0</version><color>{c}</color>"
                                      f"<info>{escape(record_info)}</info></usqcdKSPropInfo>"))
        messages.append(msg)
        color_sums.append(sums)
    lime.write_messages(f, messages)
    return {"source": src_sums, "colors": color_sums}
