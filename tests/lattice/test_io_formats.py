"""Format fixes and new formats of lattice/io (issue 20): NERSC's bare IEEE32/IEEE64 label read by its checksum in
either byte order and never written; MILC v5 written in single precision only; ILDG always with ildg-data-lfn;
the usqcdInfo plaquette/link-trace record written and checked; the SciDAC gauge writer; openQCD read and write
(layout checked against a loop transcription of the format, written from Grid's OpenQcdIO.h and openQCD's
description); c-lime's lime_contents where installed. PyQUDA's pyquda_io reads and writes them in
tests/lattice/test_io_pyquda.py."""
from __future__ import annotations

import math
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from lattice import su3
from lattice.io import GaugeFileError, detect_format, lime, read_gauge, read_site_major, write_gauge
from lattice.io.common import link_trace_site_major, plaquette_site_major
from tests.lattice.test_io import fixture, one_line_error, random_links


def nersc_plaquette(a) -> float:
    ss, st = plaquette_site_major(a)
    return (ss + st) / 6.0


def su3_links(shape=(4, 2, 6, 4), seed=3):
    """SU(3) links of an asymmetric lattice (nt, nz, ny, nx): a wrong axis or direction changes the plaquette."""
    return su3.reunitarize(random_links(shape, seed))


# ---------------------------------------------------------------------------------------------------- NERSC
def relabel(path: Path, old: str, new: str) -> None:
    b = path.read_bytes()
    assert b.count(old.encode()) == 1
    path.write_bytes(b.replace(f"FLOATING_POINT = {old}\n".encode(), f"FLOATING_POINT = {new}\n".encode()))


@pytest.mark.parametrize("bits,order", [(64, "LITTLE"), (64, "BIG"), (32, "LITTLE"), (32, "BIG")])
def test_nersc_bare_label_read_in_the_byte_order_of_its_checksum(tmp_path, bits, order):
    """Grid, gpt and PyQUDA write IEEE64 (bare) little-endian; older files meant big: the checksum tells."""
    a = random_links(seed=21)
    if bits == 32:
        a = a.astype(np.complex64).astype(np.complex128)
    p = tmp_path / "bare.nersc"
    write_gauge(p, a, "nersc", floating_point=f"IEEE{bits}{order}")
    relabel(p, f"IEEE{bits}{order}", f"IEEE{bits}")
    u, info = read_gauge(p)
    assert info["endian"] == order.lower() and info["checksums"]["ok"] and info["precision"] == bits
    assert np.array_equal(u.site_major(), a)


def test_nersc_bare_label_without_checksum_is_little_endian_and_damage_is_caught(tmp_path):
    a = random_links(seed=22)
    p = tmp_path / "bare.nersc"
    write_gauge(p, a, "nersc", floating_point="IEEE64LITTLE")
    relabel(p, "IEEE64LITTLE", "IEEE64")
    text = p.read_bytes()
    start = text.index(b"CHECKSUM = ")
    end = text.index(b"\n", start)
    p.write_bytes(text[:start] + text[end + 1:])             # no CHECKSUM line: little-endian, the plaquette checks
    u, info = read_gauge(p)
    assert info["endian"] == "little" and info["checksums"]["ok"] is None and np.array_equal(u.site_major(), a)
    write_gauge(p, a, "nersc", floating_point="IEEE64BIG")
    relabel(p, "IEEE64BIG", "IEEE64")
    b = bytearray(p.read_bytes())
    b[-3] ^= 0x10                                             # one bit: neither byte order reproduces the checksum
    p.write_bytes(bytes(b))
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p)
    assert "checksum mismatch" in one_line_error(e, p)


@pytest.mark.parametrize("label", ["IEEE64", "IEEE32"])
def test_nersc_bare_label_is_never_written(tmp_path, label):
    p = tmp_path / "x.nersc"
    with pytest.raises(GaugeFileError) as e:
        write_gauge(p, random_links(), "nersc", floating_point=label)
    msg = one_line_error(e, p)
    assert "names no byte order" in msg and f"{label}BIG or {label}LITTLE" in msg and not p.exists()
    header = write_gauge(p, random_links(), "nersc")
    assert header["FLOATING_POINT"] == "IEEE64BIG"


def test_milc_v5_is_written_single_precision_only(tmp_path):
    p = tmp_path / "x.lat"
    with pytest.raises(GaugeFileError) as e:
        write_gauge(p, random_links(), "milc", precision=64)
    assert "single precision" in one_line_error(e, p) and not p.exists()


# -------------------------------------------------------------------------------------- ILDG, SciDAC, usqcdInfo
def records(path):
    return [(r.type, lime.read_data(path, r)) for r in lime.scan(path)]


def usqcd_info(path) -> dict:
    from lattice.io.scidac import xml_fields

    body = dict(records(path))["scidac-record-xml"]
    fields = xml_fields(body)
    assert body.split(b"?>", 1)[1].startswith(b"<usqcdInfo><version>1.0</version>"), body
    return fields


@pytest.mark.parametrize("precision", [64, 32])
def test_ildg_has_lfn_and_usqcd_info_of_the_stored_links(tmp_path, precision):
    a = su3_links()
    p = tmp_path / "conf.ildg"
    write_gauge(p, a, "ildg", precision=precision)
    assert dict(records(p))["ildg-data-lfn"] == b"conf.ildg\0"          # the file's name when none is given
    stored, info = read_site_major(p)
    fields = usqcd_info(p)
    assert abs(float(fields["plaq"]) - nersc_plaquette(stored)) < 1e-15
    assert abs(float(fields["linktr"]) - link_trace_site_major(stored)) < 1e-15
    assert set(info["usqcd_info"]) == {"plaq", "linktr"}
    write_gauge(p, a, "ildg", lfn="lfn://hisq/ens/cfg.10")
    assert dict(records(p))["ildg-data-lfn"] == b"lfn://hisq/ens/cfg.10\0"


def test_usqcd_info_plaquette_is_checked(tmp_path):
    a = su3_links()
    p = tmp_path / "conf.scidac"
    write_gauge(p, a, "scidac")
    good = f"<plaq>{nersc_plaquette(a):.15e}</plaq>".encode()
    bad = f"<plaq>{nersc_plaquette(a) + 1e-3:.15e}</plaq>".encode()
    assert len(good) == len(bad)
    b = p.read_bytes()
    assert b.count(good) == 1
    p.write_bytes(b.replace(good, bad))
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p)
    assert "usqcdInfo plaq mismatch" in one_line_error(e, p)
    u, info = read_gauge(p, ignore_checksum=True)
    assert np.array_equal(u.site_major(), a)


@pytest.mark.parametrize("precision,tol", [(64, 0.0), (32, 1e-7)])
def test_scidac_round_trip(tmp_path, precision, tol):
    a = su3_links()
    p = tmp_path / "conf.scidac"
    sums = write_gauge(p, a, "scidac", precision=precision)
    u, info = read_gauge(p)
    assert info["format"] == "scidac" and info["precision"] == precision and info["dims"] == (4, 6, 2, 4)
    assert info["checksums"]["ok"] and info["checksums"]["expected"] == sums
    assert info["records"] == ["scidac-private-file-xml", "scidac-file-xml", "scidac-private-record-xml",
                               "scidac-record-xml", "scidac-binary-data", "scidac-checksum"]
    assert info["datatype"] == f"QDP_{'D' if precision == 64 else 'F'}3_ColorMatrix"
    assert np.abs(u.site_major() - a).max() <= tol
    if tol == 0.0:
        assert np.array_equal(u.site_major(), a)


def test_scidac_writer_reproduces_milc_scidac_sample(tmp_path):
    """MILC's lat.sample.l4444.scidac written back in single precision: the same binary record and checksums."""
    src = fixture("lat.sample.l4444.scidac")
    a, _ = read_site_major(src)
    p = tmp_path / "copy.scidac"
    sums = write_gauge(p, a, "scidac", precision=32)
    assert sums == {"suma": 0x37affb9c, "sumb": 0x2fc07bbf}
    assert dict(records(p))["scidac-binary-data"] == dict(records(src))["scidac-binary-data"]
    assert [r.mb for r in lime.scan(p)] == [r.mb for r in lime.scan(src)]
    assert [r.me for r in lime.scan(p)] == [r.me for r in lime.scan(src)]


def lime_contents_records(text: str) -> list[tuple]:
    """(message, record, type, data length, MB, ME) of each record lime_contents lists."""
    out = []
    for block in text.split("Message:")[1:]:
        f = dict(line.split(":", 1) for line in block.splitlines()[1:] if ":" in line and not line.startswith(" "))
        f = {k.strip(): v.strip() for k, v in f.items()}
        out.append((int(block.split()[0]), int(f["Record"]), f["Type"], int(f["Data Length"]), f["MB flag"] == "1",
                    f["ME flag"] == "1"))
    return out


@pytest.mark.parametrize("fmt", ["scidac", "ildg"])
def test_lime_contents_reads_the_structure(tmp_path, fmt):
    """c-lime's own lime_contents lists our records, message by message, with their lengths and MB/ME flags."""
    tool = shutil.which("lime_contents")
    if tool is None:
        pytest.skip("c-lime's lime_contents is not installed (not on PATH): the LIME structure is checked by "
                    "lattice.io.lime only")
    p = tmp_path / f"conf.{fmt}"
    write_gauge(p, su3_links(), fmt)
    out = subprocess.run([tool, str(p)], capture_output=True, text=True, timeout=60, check=True).stdout
    listed = lime_contents_records(out)
    ours = lime.scan(p)
    assert [(t, n, mb, me) for _, _, t, n, mb, me in listed] == [(r.type, r.length, r.mb, r.me) for r in ours]
    assert [(m, r) for m, r, *_ in listed] == [(1, 1), (1, 2)] + [(2, i + 1) for i in range(len(ours) - 2)]
    binary = "ildg-binary-data" if fmt == "ildg" else "scidac-binary-data"
    assert (binary, 4 * 2 * 6 * 4 * 4 * 18 * 8) in [(t, n) for _, _, t, n, _, _ in listed]


# ---------------------------------------------------------------------------------------------------- openQCD
def openqcd_by_loops(a) -> bytes:
    """The openQCD file of the site-major links ``a`` (t, z, y, x, mu = x y z t), written point by point from the
    format's description: header N0..N3 = (nt, nx, ny, nz) and <ReTr U_p> over 6 planes; then for each odd point
    in (t, x, y, z) order, z fastest, the links U(x, d) and U(x - d^, d) for d = 0 (t), 1 (x), 2 (y), 3 (z)."""
    nt, nz, ny, nx = a.shape[:4]
    ext = (nt, nx, ny, nz)
    ours = {0: 3, 1: 0, 2: 1, 3: 2}
    ss, st = plaquette_site_major(a)
    out = [struct.pack("<iiiid", nt, nx, ny, nz, (ss + st) / 2)]
    for t in range(nt):
        for x in range(nx):
            for y in range(ny):
                for z in range(nz):
                    if (t + x + y + z) % 2 == 0:
                        continue
                    for d in range(4):
                        point = [t, x, y, z]
                        back = list(point)
                        back[d] = (back[d] - 1) % ext[d]
                        for (pt, px, py, pz) in (point, back):
                            m = a[pt, pz, py, px, ours[d]]
                            out.append(np.ascontiguousarray(m).view(np.float64).astype("<f8").tobytes())
    return b"".join(out)


def test_openqcd_layout_matches_the_format_point_by_point(tmp_path):
    a = su3_links()
    p = tmp_path / "conf.oqcd"
    header = write_gauge(p, a, "openqcd")
    assert header["N0..N3"] == (4, 4, 6, 2)
    assert p.read_bytes() == openqcd_by_loops(a)
    assert detect_format(p) == "openqcd"


def test_openqcd_round_trip_and_header_plaquette(tmp_path):
    a = su3_links(seed=4)
    p = tmp_path / "conf"                       # no suffix: found from the header and the size
    write_gauge(p, a, "openqcd")
    u, info = read_gauge(p)
    assert info["format"] == "openqcd" and info["dims"] == (4, 6, 2, 4) and info["precision"] == 64
    assert np.array_equal(u.site_major(), a)
    n0, n1, n2, n3, plaq = struct.unpack("<iiiid", p.read_bytes()[:24])
    assert (n0, n1, n2, n3) == (4, 4, 6, 2)
    assert math.isclose(plaq / 3, nersc_plaquette(a), rel_tol=1e-14) and info["checksums"]["ok"]
    assert math.isclose(info["plaquette"], nersc_plaquette(a), rel_tol=1e-14)
    # a hot field far from 1 (a unit field's plaquette cannot tell the axes apart)
    assert abs(plaq / 3) < 0.5


def test_openqcd_of_milc_sample_keeps_its_plaquette(tmp_path):
    a, _ = read_site_major(fixture("lat.sample.l4444"))
    p = tmp_path / "l4444.oqcd"
    write_gauge(p, a, "openqcd")
    b, info = read_site_major(p)
    assert np.array_equal(a, b)
    ss, st = plaquette_site_major(a)
    assert math.isclose(info["header"]["plaquette"], (ss + st) / 2, rel_tol=1e-15)


def test_openqcd_damage_is_caught(tmp_path):
    a = su3_links()
    p = tmp_path / "conf.oqcd"
    write_gauge(p, a, "openqcd")
    b = bytearray(p.read_bytes())
    b[24 + 5 * 8 + 7] ^= 0x40                     # the exponent of one double of the first link
    p.write_bytes(bytes(b))
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p)
    assert "header plaquette" in one_line_error(e, p)
    _, info = read_gauge(p, ignore_checksum=True)
    assert info["checksums"]["ok"] is False
    p.write_bytes(bytes(b[:-8]))                  # cut short: no longer an openQCD file by its size
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p)
    assert "not a gauge file of a known format" in one_line_error(e, p) and "openQCD" in str(e.value)


def test_openqcd_needs_even_extents(tmp_path):
    p = tmp_path / "odd.oqcd"
    with pytest.raises(GaugeFileError) as e:
        write_gauge(p, random_links((4, 2, 3, 2)), "openqcd")
    assert "even extents" in one_line_error(e, p) and not p.exists()
