"""Gauge-file formats (lattice/io): MILC's sample files, checksums, round trips and one-line errors.

Reference numbers are MILC's printed CHECK PLAQ / LINKTR and file checksums (docs/conventions.md 4.2), computed on the
stored single-precision links converted to double, before any reunitarization.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from lattice import Geometry, link_trace, plaquette, su3
from lattice.io import (GaugeFileError, detect_format, read_color_matrices, read_color_vector, read_field,
                        read_gauge, write_gauge)
from lattice.io.common import milc_checksum, nersc_checksum, scidac_checksum


def fixtures() -> Path:
    from tests.conftest import FIXTURES

    d = FIXTURES
    if not d.is_dir():
        pytest.skip(f"MILC sample files not found at {d} (the shared fixtures folder beside the repository)")
    return d


def fixture(name: str) -> Path:
    p = fixtures() / name
    if not p.is_file():
        pytest.skip(f"MILC sample file {name} missing from {p.parent}")
    return p


def one_line_error(excinfo, path) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    assert os.fspath(path) in msg
    return msg


def rotl(w: int, r: int) -> int:
    return ((w << r) | (w >> (32 - r))) & 0xFFFFFFFF


@pytest.mark.parametrize("n", [1, 28, 29, 900, 1001])
def test_checksums_against_their_definitions(n):
    """The vectorized checksums equal the word-by-word definitions (MILC io_lat4.c, QIO DML_checksum_accum)."""
    import zlib
    rng = np.random.default_rng(n)
    words = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    s29 = s31 = 0
    for k, w in enumerate(int(x) for x in words):
        s29 ^= rotl(w, k % 29)
        s31 ^= rotl(w, k % 31)
    assert milc_checksum(words.astype("<u4")) == (s29, s31)
    assert nersc_checksum(words.astype("<u4")) == int(words.astype(np.uint64).sum()) % 2**32
    raw = rng.integers(0, 256, 24 * n, dtype=np.uint8).tobytes()
    sa = sb = 0
    for site in range(n):
        c = zlib.crc32(raw[24 * site:24 * (site + 1)])
        sa ^= rotl(c, site % 29)
        sb ^= rotl(c, site % 31)
    assert scidac_checksum(raw, 24) == (sa, sb)


# file, sum29, sum31, CHECK PLAQ ss, st (None: not printed), LINKTR
MILC_REFERENCE = [
    ("lat.sample.l6666.hisq", 0xc9687fe2, 0xb52bd146, 1.8403954419120214, 1.8597505785271828, 1.6866463634818848e-01),
    ("lat.sample.hisq.f211b670.l6666", 0x6297e604, 0x7bbd1714, 1.6833615233062336, 1.6726780328005630,
     1.0759220045157648e-02),
    ("lat.sample.l4448.gf", 0x092a1404, 0x01416736, 1.7237483097967541, 1.6905860453290196, 7.5146618382921793e-01),
    ("lat.sample.l8888", 0x4f9d000e, 0x8d72f72e, 1.7790021544584596, 1.7823592881385857, -6.4563862036388919e-04),
    ("lat.sample.l4444", 0x02352c05, 0xd137321d, None, None, 6.4675873741896e-01),
]


@pytest.mark.parametrize("name,sum29,sum31,ss,st,linktr", MILC_REFERENCE, ids=[r[0] for r in MILC_REFERENCE])
def test_milc_samples_checksums_plaquette_linktr(name, sum29, sum31, ss, st, linktr):
    """MILC's checksums verify, and CHECK PLAQ / LINKTR are reproduced on the stored values (no reunitarization)."""
    u, info = read_gauge(fixture(name))
    assert info["format"] == "milc-v5" and info["precision"] == 32 and not info["reunitarized"]
    sums = info["checksums"]
    assert sums["ok"] and sums["expected"] == sums["computed"] == {"sum29": sum29, "sum31": sum31}
    if ss is not None:
        pss, pst = plaquette(u)
        assert abs(pss - ss) < 1e-12 and abs(pst - st) < 1e-12
    assert abs(link_trace(u) - linktr) < 1e-12


@pytest.mark.parametrize("name", ["lat.sample.l6666", "lat.sample.l6666b650m010m050", "lat.sample.l8",
                                  "lat.sample.l4444.ildg", "lat.sample.l4444.scidac"])
def test_other_gauge_samples_read_with_checksums(name):
    u, info = read_gauge(fixture(name))
    assert info["checksums"]["ok"] is True
    assert u.links.shape == (4,) + u.geom.shape + (3, 3)
    # stored single-precision links: unitary to float32 rounding
    assert su3.unitarity_violation(u.links) < 1e-5


def test_big_endian_milc_detected_from_magic():
    _, info = read_gauge(fixture("lat.sample.l6666"))
    assert info["endian"] == "big" and info["header"]["time_stamp"] == "Sat Aug 10 10:46:56 2002"


def test_three_copies_of_l4444_are_the_same_field():
    u0, i0 = read_gauge(fixture("lat.sample.l4444"))
    u1, i1 = read_gauge(fixture("lat.sample.l4444.ildg"))
    u2, i2 = read_gauge(fixture("lat.sample.l4444.scidac"))
    assert (i0["format"], i1["format"], i2["format"]) == ("milc-v5", "ildg", "scidac")
    assert np.array_equal(u0.links, u1.links) and np.array_equal(u0.links, u2.links)
    assert i1["checksums"]["computed"] == i2["checksums"]["computed"] == {"suma": 0x37affb9c, "sumb": 0x2fc07bbf}


def test_1996_format_instanton():
    u, info = read_gauge(fixture("lat.sample.inst"))
    assert info["format"] == "milc-1996" and info["dims"] == (4, 4, 4, 4)
    assert info["checksums"]["ok"] is None
    assert su3.unitarity_violation(u.links) < 1e-5
    ss, st = plaquette(u)
    assert 2.9 < ss < 3.0 and 2.9 < st < 3.0  # a smooth instanton


def test_reunitarize_option():
    u, _ = read_gauge(fixture("lat.sample.l6666.hisq"))
    v, info = read_gauge(fixture("lat.sample.l6666.hisq"), reunitarize=True)
    assert info["reunitarized"]
    assert su3.unitarity_violation(v.links) < 1e-13
    assert 0 < np.abs(v.links - u.links).max() < 1e-6
    assert np.array_equal(v.links, su3.reunitarize(u.links))


def test_colour_vector_and_matrix_fields():
    for name in ("ksvector.src.sample.l8", "ksvector.ans.Minv.sample.l8", "ksvector.ans.MdaggerMinv.sample.l8"):
        v = read_color_vector(fixture(name))
        assert v.shape == (8, 8, 8, 8, 3) and v.dtype == np.complex128
        assert np.isfinite(v).all() and np.abs(v).max() > 0
    for name in ("fat.l8", "long.l8", "colormatrix.mom.sample.l8"):
        m = read_color_matrices(fixture(name))
        assert m.shape == (8, 8, 8, 8, 4, 3, 3) and m.dtype == np.complex128
        assert np.isfinite(m).all() and np.abs(m).max() > 0
    _, info = read_field(fixture("fat.l8"))
    assert info["checksums"]["ok"] and info["datatype"] == "QDP_F3_ColorMatrix"
    # the momentum is anti-Hermitian (stored in single precision)
    mom = read_color_matrices(fixture("colormatrix.mom.sample.l8"))
    assert np.abs(mom + su3.dagger(mom)).max() < 1e-5 * np.abs(mom).max()
    with pytest.raises(GaugeFileError) as e:
        read_color_vector(fixture("fat.l8"))
    one_line_error(e, fixture("fat.l8"))
    with pytest.raises(GaugeFileError) as e:
        read_gauge(fixture("ksvector.src.sample.l8"))
    assert "read_color_vector" in one_line_error(e, fixture("ksvector.src.sample.l8"))


# ------------------------------------------------------------------------------------------------ round trips
def random_links(shape=(4, 2, 4, 2), seed=7, su3_matrices=False):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=shape + (4, 3, 3)) + 1j * rng.normal(size=shape + (4, 3, 3))
    return su3.reunitarize(a) if su3_matrices else a


def write_old_64bit_milc(path, a):
    """A MILC v5 file with float64 data, as this project's writer made them before MILC v5 became single only."""
    import struct
    data = np.ascontiguousarray(a.view(np.float64), dtype="<f8")
    c29, c31 = milc_checksum(data)
    nt, nz, ny, nx = a.shape[:4]
    head = struct.pack("<5i", 20103, nx, ny, nz, nt) + b"old 64-bit".ljust(64, b"\0") + struct.pack("<i2I", 0, c29, c31)
    Path(path).write_bytes(head + data.tobytes())


def test_milc_round_trip_is_exact(tmp_path):
    a = random_links().astype(np.complex64).astype(np.complex128)  # single-precision representable
    p = tmp_path / "conf.lat"
    meta = write_gauge(p, a, "milc")
    u, info = read_gauge(p)
    assert info["format"] == "milc-v5" and info["dims"] == (2, 4, 2, 4) and info["precision"] == 32
    assert info["checksums"]["expected"] == {"sum29": meta["sum29"], "sum31": meta["sum31"]}
    assert info["header"]["time_stamp"] == meta["time_stamp"] != ""
    assert np.array_equal(u.site_major(), a)
    # double-precision variant, told apart by the file size: this project wrote it before (MILC v5 is single
    # precision, so it is no longer written); its old files are still read
    b = random_links(seed=8)
    write_old_64bit_milc(p, b)
    v, info = read_gauge(p)
    assert info["precision"] == 64 and info["checksums"]["ok"] and np.array_equal(v.site_major(), b)


def test_milc_write_reproduces_milc_file(tmp_path):
    """Writing MILC's l4444 back gives MILC's bytes and checksums (only the time stamp differs)."""
    src = fixture("lat.sample.l4444")
    u, _ = read_gauge(src)
    p = tmp_path / "copy"
    write_gauge(p, u, "milc")
    a, b = src.read_bytes(), p.read_bytes()
    assert len(a) == len(b) and a[:20] == b[:20] and a[84:] == b[84:]


def test_nersc_round_trip_is_exact(tmp_path):
    a = random_links(seed=9)
    p = tmp_path / "conf.nersc"
    header = write_gauge(p, a, "nersc")
    assert header["DATATYPE"] == "4D_SU3_GAUGE_3x3" and header["FLOATING_POINT"] == "IEEE64BIG"
    u, info = read_gauge(p)
    assert info["format"] == "nersc" and info["checksums"]["ok"]
    assert np.array_equal(u.site_major(), a)
    assert info["header"]["CHECKSUM"] == header["CHECKSUM"]


def test_nersc_two_row_single_precision_matches_milc_nersc_checksum(tmp_path):
    """MILC's .info gives nersc_checksum 1245429571 and linktr -0.000646 for l8888; our 2-row IEEE32 file agrees."""
    u, _ = read_gauge(fixture("lat.sample.l8888"))
    p = tmp_path / "l8888.nersc"
    header = write_gauge(p, u, "nersc", datatype="4D_SU3_GAUGE", floating_point="IEEE32LITTLE")
    assert int(header["CHECKSUM"], 16) == 1245429571
    v, info = read_gauge(p)
    assert info["checksums"]["ok"] and abs(float(info["header"]["LINK_TRACE"]) + 0.000646) < 1e-6
    # third row rebuilt in double from the stored two: close to the file's third row at float32 level
    assert np.abs(v.links - u.links).max() < 1e-6
    # and exact two-row round trip for SU(3) data in double
    w = random_links(seed=10, su3_matrices=True)
    write_gauge(p, w, "nersc", datatype="4D_SU3_GAUGE", floating_point="IEEE64LITTLE")
    x, _ = read_gauge(p)
    assert np.abs(x.site_major() - w).max() < 1e-14


def test_ildg_round_trip_is_exact(tmp_path):
    a = random_links(seed=11)
    p = tmp_path / "conf.nersc"  # a misleading name: the format is found from the content
    sums = write_gauge(p, a, "ildg")
    u, info = read_gauge(p)
    assert info["format"] == "ildg" and info["precision"] == 64
    assert info["checksums"]["ok"] and info["checksums"]["expected"] == sums
    assert np.array_equal(u.site_major(), a)
    assert info["records"] == ["scidac-private-file-xml", "scidac-file-xml", "scidac-private-record-xml",
                               "scidac-record-xml", "ildg-format", "ildg-data-lfn", "ildg-binary-data",
                               "scidac-checksum"]                  # ildg-data-lfn always: Grid requires it
    # single precision, checked against MILC's own ILDG copy of l4444
    v, _ = read_gauge(fixture("lat.sample.l4444"))
    write_gauge(p, v, "ildg", precision=32)
    w, info = read_gauge(p)
    assert np.array_equal(w.links, v.links)
    assert info["checksums"]["computed"] == {"suma": 0x37affb9c, "sumb": 0x2fc07bbf}


def test_write_is_atomic(tmp_path):
    p = tmp_path / "conf"
    write_gauge(p, random_links(), "milc")
    before = p.read_bytes()
    with pytest.raises(GaugeFileError) as e:
        write_gauge(p, random_links(), "nersc", floating_point="IEEE16")
    one_line_error(e, p)
    with pytest.raises(GaugeFileError) as e:
        write_gauge(p, random_links(), "szin")      # an unknown format (openqcd, once unknown, is now written)
    one_line_error(e, p)
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["conf"]


# ------------------------------------------------------------------------------------------ damaged files
def corrupt_copy(src: Path, dst: Path, offset_from_end: int = 1000) -> Path:
    b = bytearray(src.read_bytes())
    b[len(b) - offset_from_end] ^= 0x01  # one bit of one data byte
    dst.write_bytes(bytes(b))
    return dst


@pytest.mark.parametrize("kind", ["milc", "nersc", "scidac", "ildg"])
def test_corrupted_byte_is_detected(tmp_path, kind):
    if kind == "nersc":
        src = tmp_path / "good.nersc"
        write_gauge(src, read_gauge(fixture("lat.sample.l4444"))[0], "nersc")
    else:
        src = fixture({"milc": "lat.sample.l4444", "scidac": "lat.sample.l4444.scidac",
                       "ildg": "lat.sample.l4444.ildg"}[kind])
    bad = corrupt_copy(src, tmp_path / "bad", offset_from_end=1000)
    with pytest.raises(GaugeFileError) as e:
        read_gauge(bad)
    msg = one_line_error(e, bad)
    assert "checksum mismatch" in msg and "--ignore-checksum" in msg
    u, info = read_gauge(bad, ignore_checksum=True)
    assert info["checksums"]["ok"] is False
    assert info["checksums"]["expected"] != info["checksums"]["computed"]
    # the expected and computed values are both named
    exp = info["checksums"]["expected"]
    assert all(f"{v:x}" in msg for v in exp.values())


def test_nersc_header_plaquette_is_checked(tmp_path):
    p = tmp_path / "conf"
    header = write_gauge(p, read_gauge(fixture("lat.sample.l4444"))[0], "nersc")
    text = p.read_bytes().replace(f"PLAQUETTE = {header['PLAQUETTE']}".encode(), b"PLAQUETTE = 0.25")
    p.write_bytes(text)
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p)
    assert "PLAQUETTE" in one_line_error(e, p)
    _, info = read_gauge(p, ignore_checksum=True)
    assert abs(info["plaquette"] - float(header["PLAQUETTE"])) < 1e-14


@pytest.mark.parametrize("name", ["lat.sample.l4444", "lat.sample.inst", "lat.sample.l4444.ildg", "nersc"])
def test_truncated_file(tmp_path, name):
    if name == "nersc":
        src = tmp_path / "good"
        write_gauge(src, random_links(), "nersc")
    else:
        src = fixture(name)
    data = src.read_bytes()
    bad = tmp_path / "short"
    bad.write_bytes(data[:-500])
    with pytest.raises(GaugeFileError) as e:
        read_gauge(bad)
    msg = one_line_error(e, bad)
    assert "truncated" in msg and str(len(data) - 500) in msg
    if name != "lat.sample.l4444.ildg":
        assert f"expected {len(data)} bytes" in msg


def test_lime_file_cut_at_a_record_boundary(tmp_path):
    """An ILDG file that lost its final scidac-checksum record is truncated, not silently unchecked."""
    data = fixture("lat.sample.l4444.ildg").read_bytes()
    bad = tmp_path / "cut"
    bad.write_bytes(data[:-(144 + 136)])
    with pytest.raises(GaugeFileError) as e:
        read_gauge(bad)
    assert "truncated" in one_line_error(e, bad)


def test_nersc_header_with_few_digits_is_accepted(tmp_path):
    p = tmp_path / "conf"
    header = write_gauge(p, read_gauge(fixture("lat.sample.l4444"))[0], "nersc")
    short = f"{float(header['PLAQUETTE']):.6f}"
    text = p.read_bytes().replace(f"PLAQUETTE = {header['PLAQUETTE']}".encode(), f"PLAQUETTE = {short}".encode())
    p.write_bytes(text)
    _, info = read_gauge(p)
    assert info["header"]["PLAQUETTE"] == short


def test_missing_file(tmp_path):
    p = tmp_path / "nope.lat"
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p)
    assert "no such file" in one_line_error(e, p)


@pytest.mark.parametrize("content", [b"", b"just some text\nnot a lattice\n", "random"])
def test_foreign_file(tmp_path, content):
    if content == "random":
        content = np.random.default_rng(1).integers(0, 256, 5000, dtype=np.uint8).tobytes()
    p = tmp_path / "foreign"
    p.write_bytes(content)
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p)
    msg = one_line_error(e, p)
    assert "known format" in msg and "MILC v5, MILC 1996, NERSC, ILDG, SciDAC" in msg
    assert isinstance(e.value, ValueError)


def test_foreign_fixtures_and_detection():
    assert detect_format(fixture("lat.sample.l4448.gf")) == "milc-v5"
    assert detect_format(fixture("lat.sample.inst")) == "milc-1996"
    assert detect_format(fixture("lat.sample.l8")) == "lime"
    for name in ("lat.sample.l8888.info", "rationals.sample.su3_rhmc_hisq"):
        with pytest.raises(GaugeFileError) as e:
            read_gauge(fixture(name))
        assert "not a gauge file" in one_line_error(e, fixture(name))


def test_geometry_given_and_mismatch():
    geom = Geometry((4, 4, 4, 4))
    u, _ = read_gauge(fixture("lat.sample.l4444"), geom=geom)
    assert u.geom is geom
    with pytest.raises(GaugeFileError) as e:
        read_gauge(fixture("lat.sample.l6666"), geom=geom)
    assert "6x6x6x6" in one_line_error(e, fixture("lat.sample.l6666"))


def test_8888_reads_fast():
    import time
    t = time.perf_counter()
    read_gauge(fixture("lat.sample.l8888"))
    read_gauge(fixture("lat.sample.l8"))
    assert time.perf_counter() - t < 2.0
