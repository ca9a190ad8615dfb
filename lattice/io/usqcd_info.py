"""The USQCD ``usqcdInfo`` record XML of SciDAC and ILDG gauge files (MILC's create_QCDML in each application's
gauge_info.c, QIO's QIO_USQCDLatticeInfo, Grid's usqcdInfo in IldgIO): the ``scidac-record-xml`` of the gauge
field holds

    <usqcdInfo><version>1.0</version><plaq>P</plaq><linktr>L</linktr><info>...</info></usqcdInfo>

with P = <ReTr U_p>/3 over all six planes ((ss + st)/6 in MILC's terms, NERSC's PLAQUETTE) and L = <ReTr U>/3
(NERSC's LINK_TRACE), both of the links as stored. MILC prints them with %e; we print 16 significant digits.
"""
from __future__ import annotations

from xml.sax.saxutils import escape

import numpy as np

from .common import fail, link_trace_site_major, plaquette_site_major
from .nersc import TOLERANCE, printed_resolution


def values(a: np.ndarray) -> dict:
    """{'plaq', 'linktr'} of the site-major field ``a`` as the record gives them."""
    ss, st = plaquette_site_major(a)
    return {"plaq": (ss + st) / 6.0, "linktr": link_trace_site_major(a)}


def record_xml(a: np.ndarray, info: str = "") -> tuple[str, dict]:
    """(the usqcdInfo XML body, its values) for the stored field ``a``."""
    v = values(a)
    body = (f"<usqcdInfo><version>1.0</version><plaq>{v['plaq']:.15e}</plaq><linktr>{v['linktr']:.15e}</linktr>"
            f"<info>{escape(info)}</info></usqcdInfo>")
    return body, v


def check(path, fields: dict, a: np.ndarray, nbytes: int, strict: bool = True) -> dict | None:
    """Compare a parsed usqcdInfo (``fields``: tag -> text; {} or no plaq/linktr: nothing to check) with the field
    ``a`` stored with ``nbytes``-byte reals; a mismatch raises GaugeFileError when ``strict``. Returns
    {key: (file's value, data's value)} or None."""
    v = values(a)
    found = {}
    for key in ("plaq", "linktr"):
        text = fields.get(key)
        try:
            hv = float(text)
        except (TypeError, ValueError):
            continue
        found[key] = (hv, v[key])
        if strict and abs(hv - v[key]) > max(TOLERANCE[nbytes] * max(1.0, abs(hv)), printed_resolution(text)):
            raise fail(path, f"usqcdInfo {key} mismatch: the record XML says {text}, the data give {v[key]:.10g}",
                       "the file is corrupt: copy it again, or pass --ignore-checksum to read it anyway")
    return found or None
