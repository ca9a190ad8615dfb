"""Writing SciDAC (QIO) and ILDG gauge files: the record layout QIO gives them as MILC writes them
(save_serial_scidac / save_serial_ildg), read back by :mod:`lattice.io.scidac`.

* message 1 (file): ``scidac-private-file-xml`` (version, spacetime 4, dims, volfmt 0 = one file) and
  ``scidac-file-xml`` (the user's file XML);
* message 2 (the field): ``scidac-private-record-xml`` (datatype QDP_F3_ColorMatrix or QDP_D3_ColorMatrix,
  precision F/D, colors 3, typesize = bytes per matrix, datacount 4), ``scidac-record-xml`` (the USQCD
  ``usqcdInfo`` with the plaquette and link trace, :mod:`lattice.io.usqcd_info`), for ILDG ``ildg-format`` and
  ``ildg-data-lfn`` (the logical file name, which Grid's reader requires), the binary record
  (``scidac-binary-data``, for ILDG ``ildg-binary-data``: per site in lexicographic order, x fastest, the 4 links
  x, y, z, t, each a row-major 3x3 of big-endian (re, im)) and ``scidac-checksum`` (suma, sumb:
  :func:`lattice.io.common.scidac_checksum`).
"""
from __future__ import annotations

import time
from xml.sax.saxutils import escape

import numpy as np

from . import lime, usqcd_info
from .common import scidac_checksum

PRECISIONS = (32, 64)


def xml(body: str) -> bytes:
    """A NUL-terminated XML payload as QIO writes it."""
    return ('<?xml version="1.0" encoding="UTF-8"?>' + body).encode() + b"\0"


def _gauge_records(a: np.ndarray, precision: int, title: str, info: str, ildg_lfn: str | None) -> tuple[list, dict]:
    """The two LIME messages of a gauge file of ``a`` (ILDG when ``ildg_lfn`` is given) and what they record."""
    if precision not in PRECISIONS:
        raise ValueError(f"{'ILDG' if ildg_lfn is not None else 'SciDAC'} precision {precision} is not supported: "
                         "use 32 or 64")
    nt, nz, ny, nx = a.shape[:4]
    nbytes = precision // 8
    data = np.ascontiguousarray(np.asarray(a, dtype=np.complex128).view(np.float64), dtype=f">f{nbytes}")
    raw = data.tobytes()
    suma, sumb = scidac_checksum(raw, 4 * 18 * nbytes)
    stored = data.astype(np.float64).view(np.complex128).reshape(a.shape)
    usqcd, _ = usqcd_info.record_xml(stored, info)
    p = "F" if precision == 32 else "D"
    stamp = time.strftime("%a %b %d %H:%M:%S %Y UTC", time.gmtime())
    file_msg = [
        ("scidac-private-file-xml", xml(f"<scidacFile><version>1.1</version><spacetime>4</spacetime>"
                                        f"<dims>{nx} {ny} {nz} {nt} </dims><volfmt>0</volfmt></scidacFile>")),
        ("scidac-file-xml", xml(f"<title>{escape(title)}</title>")),
    ]
    rec_msg = [
        ("scidac-private-record-xml", xml(
            f"<scidacRecord><version>1.0</version><date>{stamp}</date><globaldata>0</globaldata>"
            f"<datatype>QDP_{p}3_ColorMatrix</datatype><precision>{p}</precision><colors>3</colors>"
            f"<typesize>{18 * nbytes}</typesize><datacount>4</datacount></scidacRecord>")),
        ("scidac-record-xml", xml(usqcd)),
    ]
    if ildg_lfn is not None:
        rec_msg += [
            ("ildg-format", xml(
                '<ildgFormat xmlns="http://www.lqcd.org/ildg" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
                'xsi:schemaLocation="http://www.lqcd.org/ildg/filefmt.xsd"><version>1.0</version>'
                f"<field>su3gauge</field><precision>{precision}</precision>"
                f"<lx>{nx}</lx><ly>{ny}</ly><lz>{nz}</lz><lt>{nt}</lt></ildgFormat>")),
            ("ildg-data-lfn", ildg_lfn.encode() + b"\0"),
        ]
    rec_msg += [
        ("ildg-binary-data" if ildg_lfn is not None else "scidac-binary-data", raw),
        ("scidac-checksum", xml(f"<scidacChecksum><version>1.0</version><suma>{suma:x}</suma>"
                                f"<sumb>{sumb:x}</sumb></scidacChecksum>")),
    ]
    return [file_msg, rec_msg], {"suma": suma, "sumb": sumb}


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
