"""SciDAC (QIO) files beyond gauge fields (issue 20): colour-matrix fields (fat and long links, momenta), colour
vectors and USQCD KS propagators (USQCD_ColorVector_ScalarSource_ThreeSink, MILC's save_ksprop with QIO).

Checked: bitwise round trips in F and D; checksums verified on read (a flipped byte refused in one line); the
record XML and its fields; MILC's own files rewritten byte for byte in their binary and checksum records; and the
whole file against a byte layout built here from the LIME and SciDAC specifications (c-lime's lime_contents where
installed)."""
from __future__ import annotations

import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest

from lattice.io import (GaugeFileError, is_ksprop, lime, read_color_matrices, read_color_vector, read_field,
                        read_ksprop, write_color_matrices, write_color_vector, write_ksprop)
from lattice.io.scidac import xml_fields
from tests.lattice.test_io import fixture, one_line_error

SHAPE = (4, 2, 6, 4)              # (nt, nz, ny, nx): asymmetric, so a wrong axis order is seen


def field(shape, seed=5, single=False):
    """Random complex values; with ``single`` exactly representable in float32 (so an F round trip is bitwise)."""
    g = np.random.default_rng(seed)
    a = g.normal(size=shape) + 1j * g.normal(size=shape)
    if single:
        a = a.astype(np.complex64).astype(np.complex128)
    return a


def records(path):
    return [(r.type, lime.read_data(path, r)) for r in lime.scan(path)]


def private_record(path, index=0) -> dict:
    return xml_fields([d for t, d in records(path) if t == "scidac-private-record-xml"][index])


def flip_byte_in_binary(path, index=0):
    recs = [r for r in lime.scan(path) if r.type == "scidac-binary-data"]
    b = bytearray(path.read_bytes())
    b[recs[index].offset + 5] ^= 0x10
    path.write_bytes(bytes(b))


# ---------------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("precision", [32, 64])
def test_color_vector_round_trip_bitwise(tmp_path, precision):
    x = field(SHAPE + (3,), single=precision == 32)
    p = tmp_path / "v.scidac"
    sums = write_color_vector(p, x, precision, file_xml="file text", record_xml="solution")
    y = read_color_vector(p)
    assert y.dtype == np.complex128 and np.array_equal(x, y)
    a, info = read_field(p)
    assert info["checksums"]["ok"] and info["checksums"]["computed"] == sums and info["dims"] == (4, 6, 2, 4)
    p_ = "F" if precision == 32 else "D"
    assert private_record(p) == {"scidacRecord": "", "version": "1.0", "date": private_record(p)["date"],
                                 "globaldata": "0", "datatype": f"QDP_{p_}3_ColorVector", "precision": p_,
                                 "colors": "3", "typesize": str(6 * precision // 8), "datacount": "1"}
    assert dict(records(p))["scidac-record-xml"] == b"solution\0"
    assert dict(records(p))["scidac-file-xml"] == b"file text\0"


@pytest.mark.parametrize("precision", [32, 64])
@pytest.mark.parametrize("count", [4, 1])
def test_color_matrices_round_trip_bitwise(tmp_path, precision, count):
    a = field(SHAPE + (count, 3, 3), single=precision == 32)
    p = tmp_path / "fat.scidac"
    write_color_matrices(p, a, precision, record_xml="Fat links")
    b, info = read_field(p)
    assert np.array_equal(a, b) and info["datacount"] == count and info["checksums"]["ok"]
    f = private_record(p)
    assert (f["datatype"], f["typesize"], f["datacount"], f["colors"]) == (
        f"QDP_{'F' if precision == 32 else 'D'}3_ColorMatrix", str(18 * precision // 8), str(count), "3")
    if count == 4:
        assert np.array_equal(read_color_matrices(p), a)


@pytest.mark.parametrize("precision", [32, 64])
def test_ksprop_round_trip_bitwise_with_its_record_xml(tmp_path, precision):
    sol = field((3,) + SHAPE + (3,), seed=8, single=precision == 32)
    src = np.zeros(SHAPE, dtype=np.complex128)
    src[1, 0, 2, 3] = 1.0
    p = tmp_path / "prop.ksprop"
    written = write_ksprop(p, sol, src, precision, info="HISQ m=0.2 <lat & co>", source_info="point (3, 2, 0, 1)",
                           record_info="M^-1 source")
    s, so, info = read_ksprop(p)
    assert np.array_equal(s, sol) and np.array_equal(so, src) and is_ksprop(p)
    assert info["type"] == "USQCD_ColorVector_ScalarSource_ThreeSink" and info["precision"] == precision
    assert info["file_xml"]["version"] == "1.0" and info["file_xml"]["info"] == "HISQ m=0.2 <lat & co>"
    recs = records(p)
    assert [t for t, _ in recs] == (["scidac-private-file-xml", "scidac-file-xml"] + 4 * [
        "scidac-private-record-xml", "scidac-record-xml", "scidac-binary-data", "scidac-checksum"])
    assert recs[1][1].startswith(b'<?xml version="1.0" encoding="UTF-8"?><usqcdKSPropFile><version>1.0</version>'
                                 b"<type>USQCD_ColorVector_ScalarSource_ThreeSink</type>")
    p_ = "F" if precision == 32 else "D"
    src_private = private_record(p, 0)
    assert src_private["datatype"] == f"QDP_{p_}_Complex" and "colors" not in src_private        # QIO omits 0
    assert src_private["typesize"] == str(precision // 4) and src_private["datacount"] == "1"
    assert info["fields"][0]["record_xml"] == {"usqcdSourceInfo": "", "version": "1.0", "info": "point (3, 2, 0, 1)"}
    for c in range(3):
        assert private_record(p, c + 1)["datatype"] == f"QDP_{p_}3_ColorVector"
        assert info["fields"][c + 1]["record_xml"] == {"usqcdKSPropInfo": "", "version": "1.0", "color": str(c),
                                                       "info": "M^-1 source"}
        assert info["fields"][c + 1]["checksums"]["computed"] == written["colors"][c]
    assert info["fields"][0]["checksums"]["computed"] == written["source"]


def test_ksprop_colours_are_found_by_their_record_xml(tmp_path):
    """The solutions are placed by each record's usqcdKSPropInfo color, not by their order in the file."""
    sol = field((3,) + SHAPE + (3,), seed=2)
    p = tmp_path / "prop.ksprop"
    write_ksprop(p, sol)
    b = p.read_bytes()
    tags = [b"<color>0</color>", b"<color>1</color>", b"<color>2</color>"]
    for t in tags:
        assert b.count(t) == 1
    b = b.replace(tags[0], b"<color>X</color>").replace(tags[2], tags[0]).replace(b"<color>X</color>", tags[2])
    p.write_bytes(b)
    s, so, _ = read_ksprop(p)
    assert np.array_equal(s[0], sol[2]) and np.array_equal(s[2], sol[0]) and not so.any()


# ------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("kind", ["vector", "matrices", "ksprop"])
def test_flipped_byte_refused_in_one_line(tmp_path, kind):
    p = tmp_path / f"{kind}.scidac"
    if kind == "vector":
        write_color_vector(p, field(SHAPE + (3,)))
        read = read_color_vector
    elif kind == "matrices":
        write_color_matrices(p, field(SHAPE + (4, 3, 3)))
        read = read_color_matrices
    else:
        write_ksprop(p, field((3,) + SHAPE + (3,)))
        read = read_ksprop
    flip_byte_in_binary(p, index=2 if kind == "ksprop" else 0)
    with pytest.raises(GaugeFileError) as e:
        read(p)
    msg = one_line_error(e, p)
    assert "checksum" in msg.lower()
    assert read(p, ignore_checksum=True) is not None


def test_bad_input_refused_in_one_line(tmp_path):
    p = tmp_path / "x.scidac"
    with pytest.raises(GaugeFileError) as e:
        write_color_vector(p, np.zeros(SHAPE + (2,)))
    assert "(nt, nz, ny, nx, 3)" in one_line_error(e, p) and not p.exists()
    with pytest.raises(GaugeFileError) as e:
        write_ksprop(p, np.zeros((3,) + SHAPE + (3,)), precision=16)
    assert "use 32 or 64" in one_line_error(e, p) and not p.exists()
    write_color_vector(p, field(SHAPE + (3,)))
    assert not is_ksprop(p)
    with pytest.raises(GaugeFileError) as e:
        read_ksprop(p)
    assert "not a USQCD KS propagator" in one_line_error(e, p)


def test_hypercube_record_refused_in_one_line(tmp_path):
    """MILC writes a time-slice source as a QIO hypercube record (recordtype 2): refused, not misread."""
    p = tmp_path / "prop.ksprop"
    write_ksprop(p, field((3,) + SHAPE + (3,)))
    b = p.read_bytes()
    old = b"<globaldata>0</globaldata>"
    i = b.index(old)
    p.write_bytes(b[:i] + b"<globaldata>2</globaldata>" + b[i + len(old):])
    with pytest.raises(GaugeFileError) as e:
        read_ksprop(p)
    assert "hypercube" in one_line_error(e, p)


# ---------------------------------------------------------------------------------------------- MILC's files
@pytest.mark.parametrize("name,record", [("fat.l8", b"Fat links\0"), ("long.l8", None),
                                         ("colormatrix.mom.sample.l8", b"fermion force matrices\0")])
def test_milc_color_matrix_files_rewritten_byte_for_byte(tmp_path, name, record):
    """MILC's fat and long links and its momenta, written back in single precision: the same private record
    fields, binary record and QIO checksums."""
    src = fixture(name)
    a, info = read_field(src)
    theirs = dict(records(src))
    rec = (record or theirs["scidac-record-xml"]).rstrip(b"\0").decode()
    out = tmp_path / name
    sums = write_color_matrices(out, a, 32, record_xml=rec)
    ours = dict(records(out))
    assert list(ours) == list(theirs)
    for t in ("scidac-binary-data", "scidac-checksum", "scidac-record-xml", "scidac-private-file-xml"):
        assert ours[t] == theirs[t], t
    mine, milc = xml_fields(ours["scidac-private-record-xml"]), xml_fields(theirs["scidac-private-record-xml"])
    assert {k: v for k, v in mine.items() if k != "date"} == {k: v for k, v in milc.items() if k != "date"}
    assert (sums["suma"], sums["sumb"]) == (info["checksums"]["expected"]["suma"], info["checksums"]["expected"]["sumb"])


# ------------------------------------------------------------------------------------ the byte layout by spec
def rotl(w: int, r: int) -> int:
    return ((w << r) | (w >> (32 - r))) & 0xFFFFFFFF if r else w


def spec_binary_and_checksum(values, nbytes):
    """The binary record and (suma, sumb) of the site-major field ``values`` (nt, nz, ny, nx, ...) written site by
    site from the SciDAC description: sites in lexicographic order with x fastest, each site's complex numbers in
    row-major order as big-endian (re, im); per site r, crc = CRC-32 of its bytes, suma ^= rotl(crc, r % 29),
    sumb ^= rotl(crc, r % 31)."""
    nt, nz, ny, nx = values.shape[:4]
    fmt = ">f" if nbytes == 4 else ">d"
    out, suma, sumb, r = [], 0, 0, 0
    for t in range(nt):
        for z in range(nz):
            for y in range(ny):
                for x in range(nx):
                    site = b"".join(struct.pack(fmt, part) for c in values[t, z, y, x].ravel()
                                    for part in (c.real, c.imag))
                    crc = zlib.crc32(site) & 0xFFFFFFFF
                    suma ^= rotl(crc, r % 29)
                    sumb ^= rotl(crc, r % 31)
                    out.append(site)
                    r += 1
    return b"".join(out), suma, sumb


def spec_lime(messages) -> bytes:
    """A LIME file from its description: per record a 144-byte big-endian header (magic 0x456789ab, version 1,
    flags with MB = bit 15 on a message's first record and ME = bit 14 on its last, data length, type NUL-padded to
    128 bytes), then the data zero-padded to a multiple of 8."""
    out = b""
    for message in messages:
        for i, (rtype, data) in enumerate(message):
            flags = (0x8000 if i == 0 else 0) | (0x4000 if i == len(message) - 1 else 0)
            out += struct.pack(">IHHQ", 0x456789AB, 1, flags, len(data)) + rtype.encode().ljust(128, b"\0")
            out += data + b"\0" * (-len(data) % 8)
    return out


@pytest.mark.parametrize("precision", [32, 64])
def test_ksprop_file_matches_the_layout_of_the_specification(tmp_path, precision):
    """The whole file, byte for byte, against one built here from the LIME, SciDAC, QIO and USQCD KS-propagator
    descriptions (only the dates of the private record XML are taken from the file)."""
    nbytes = precision // 8
    sol = field((3,) + SHAPE + (3,), seed=4, single=True)
    src = field(SHAPE, seed=6, single=True)
    p = tmp_path / "prop.ksprop"
    write_ksprop(p, sol, src, precision, info="i", source_info="s", record_info="r")
    dates = [xml_fields(d)["date"] for t, d in records(p) if t == "scidac-private-record-xml"]
    head = '<?xml version="1.0" encoding="UTF-8"?>'
    P = "F" if precision == 32 else "D"

    def z(s):
        return (head + s).encode() + b"\0"

    def message(values, datatype, colors, typesize, record_xml, date):
        binary, suma, sumb = spec_binary_and_checksum(values, nbytes)
        colours = f"<colors>{colors}</colors>" if colors else ""
        return [("scidac-private-record-xml", z(f"<scidacRecord><version>1.0</version><date>{date}</date>"
                                                f"<globaldata>0</globaldata><datatype>{datatype}</datatype>"
                                                f"<precision>{P}</precision>{colours}<typesize>{typesize}</typesize>"
                                                f"<datacount>1</datacount></scidacRecord>")),
                ("scidac-record-xml", z(record_xml)), ("scidac-binary-data", binary),
                ("scidac-checksum", z(f"<scidacChecksum><version>1.0</version><suma>{suma:x}</suma>"
                                      f"<sumb>{sumb:x}</sumb></scidacChecksum>"))]

    messages = [[("scidac-private-file-xml", z("<scidacFile><version>1.1</version><spacetime>4</spacetime>"
                                               "<dims>4 6 2 4 </dims><volfmt>0</volfmt></scidacFile>")),
                 ("scidac-file-xml", z("<usqcdKSPropFile><version>1.0</version><type>"
                                       "USQCD_ColorVector_ScalarSource_ThreeSink</type><info>i</info>"
                                       "</usqcdKSPropFile>"))],
                message(src, f"QDP_{P}_Complex", 0, 2 * nbytes,
                        "<usqcdSourceInfo><version>1.0</version><info>s</info></usqcdSourceInfo>", dates[0])]
    for c in range(3):
        messages.append(message(sol[c], f"QDP_{P}3_ColorVector", 3, 6 * nbytes,
                                f"<usqcdKSPropInfo><version>1.0</version><color>{c}</color><info>r</info>"
                                "</usqcdKSPropInfo>", dates[c + 1]))
    assert p.read_bytes() == spec_lime(messages)


def test_lime_contents_lists_the_ksprop(tmp_path):
    """c-lime's own lime_contents reads the KS propagator's five messages."""
    from tests.lattice.test_io_formats import lime_contents_records

    tool = shutil.which("lime_contents")
    if tool is None:
        pytest.skip("c-lime's lime_contents is not installed (not on PATH; neither PyPI nor apt offers it): the layout "
                    "is checked against the specification by test_ksprop_file_matches_the_layout_of_the_specification")
    p = tmp_path / "prop.ksprop"
    write_ksprop(p, field((3,) + SHAPE + (3,)))
    out = subprocess.run([tool, str(p)], capture_output=True, text=True, timeout=60, check=True).stdout
    listed = lime_contents_records(out)
    assert [(t, n, mb, me) for _, _, t, n, mb, me in listed] == [(r.type, r.length, r.mb, r.me) for r in lime.scan(p)]
    assert sorted({m for m, *_ in listed}) == [1, 2, 3, 4, 5]
