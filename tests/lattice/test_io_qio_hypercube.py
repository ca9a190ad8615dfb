"""QIO hypercube records (recordtype 2: a field on a sub-block of the lattice, e.g. MILC's source on one time slice):
read into the whole lattice (zeros outside), checked against a file built here from QIO's description
(qio/lib/dml/dml_utils.c: the hypercube's sites in lexicographic order, x fastest; each site's CRC-32 rotated by
its rank in the whole lattice; qio/lib/qioxml.c: the private record XML), and written so (a KS propagator whose
source lives on one time slice). Global records and damaged bounds are refused in one line."""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from lattice.io import GaugeFileError, read_field, read_gauge, read_ksprop, write_ksprop
from lattice.io.scidac import xml_fields
from tests.lattice.test_io import one_line_error
from tests.lattice.test_io_qio_fields import SHAPE, field, records, rotl, spec_lime

DIMS = (4, 6, 2, 4)                        # (nx, ny, nz, nt) of SHAPE
HEAD = '<?xml version="1.0" encoding="UTF-8"?>'


def z(s: str) -> bytes:
    return (HEAD + s).encode() + b"\0"


def spec_hypercube(values, lower, upper, nbytes=8):
    """The binary record and (suma, sumb) of the sites lower..upper (inclusive, (x, y, z, t)) of the whole-lattice
    field ``values`` (nt, nz, ny, nx, ...), site by site from QIO's description."""
    nx, ny, nz, _ = DIMS
    fmt = ">f" if nbytes == 4 else ">d"
    out, suma, sumb = [], 0, 0
    for t in range(lower[3], upper[3] + 1):
        for zz in range(lower[2], upper[2] + 1):
            for y in range(lower[1], upper[1] + 1):
                for x in range(lower[0], upper[0] + 1):
                    site = b"".join(struct.pack(fmt, part) for c in np.ravel(values[t, zz, y, x])
                                    for part in (c.real, c.imag))
                    r = x + nx * (y + ny * (zz + nz * t))          # the rank in the whole lattice
                    crc = zlib.crc32(site) & 0xFFFFFFFF
                    suma ^= rotl(crc, r % 29)
                    sumb ^= rotl(crc, r % 31)
                    out.append(site)
    return b"".join(out), suma, sumb


def spec_record(values, lower, upper, datatype="QDP_D3_ColorVector", colors=3, typesize=48, record="v",
                date="Tue Dec  1 00:00:00 2026 UTC", kind="<recordtype>2</recordtype>", datacount=1):
    binary, suma, sumb = spec_hypercube(values, lower, upper)
    bounds = (f"<spacetime>4</spacetime><hyperlower>{''.join(f'{v} ' for v in lower)}</hyperlower>"
              f"<hyperupper>{''.join(f'{v} ' for v in upper)}</hyperupper>")
    colours = f"<colors>{colors}</colors>" if colors else ""
    return [("scidac-private-record-xml", z(f"<scidacRecord><version>1.1</version><date>{date}</date>{kind}{bounds}"
                                            f"<datatype>{datatype}</datatype><precision>D</precision>{colours}"
                                            f"<typesize>{typesize}</typesize><datacount>{datacount}</datacount>"
                                            "</scidacRecord>")),
            ("scidac-record-xml", z(record)), ("scidac-binary-data", binary),
            ("scidac-checksum", z(f"<scidacChecksum><version>1.0</version><suma>{suma:x}</suma><sumb>{sumb:x}</sumb>"
                                  "</scidacChecksum>"))]


FILE_MESSAGE = [("scidac-private-file-xml", z("<scidacFile><version>1.1</version><spacetime>4</spacetime>"
                                              "<dims>4 6 2 4 </dims><volfmt>0</volfmt></scidacFile>")),
                ("scidac-file-xml", z("<title>hypercube</title>"))]


@pytest.mark.parametrize("lower,upper", [((1, 2, 0, 3), (3, 4, 1, 3)),       # a block within one time slice
                                         ((0, 0, 0, 1), (3, 5, 1, 2)),       # two whole time slices
                                         ((2, 5, 1, 0), (2, 5, 1, 0))])      # one site
def test_hypercube_record_built_from_the_description_is_read(tmp_path, lower, upper):
    v = field(SHAPE + (1, 3), seed=8)
    p = tmp_path / "cube.scidac"
    p.write_bytes(spec_lime([FILE_MESSAGE, spec_record(v, lower, upper)]))
    a, info = read_field(p)
    inside = tuple(slice(lo, up + 1) for lo, up in zip(lower[::-1], upper[::-1]))
    expected = np.zeros_like(v)
    expected[inside] = v[inside]
    assert a.shape == v.shape and np.array_equal(a, expected)
    assert info["hypercube"] == {"lower": lower, "upper": upper} and info["checksums"]["ok"]


def test_damaged_hypercube_records_are_refused_in_one_line(tmp_path):
    v = field(SHAPE + (1, 3), seed=8)
    lower, upper = (1, 2, 0, 3), (3, 4, 1, 3)
    p = tmp_path / "cube.scidac"
    good = spec_record(v, lower, upper)

    def edited(i, old, new):         # the record message with one record's data edited, framed again
        return [FILE_MESSAGE, [(t, d.replace(old, new, 1) if k == i else d) for k, (t, d) in enumerate(good)]]

    cases = {
        "checksum": edited(2, good[2][1][:8], bytes(8)),
        "outside the 4x6x2x4 lattice": edited(0, b"<hyperupper>3 4 1 3 ", b"<hyperupper>3 6 1 3 "),
        "without readable hyperlower": edited(0, b"<hyperlower>1 2 0 3 </hyperlower>", b""),
        "global record": edited(0, b"<recordtype>2</recordtype>", b"<recordtype>1</recordtype>"),
        "expected 864 for the hypercube": edited(2, good[2][1][-48:], b""),
    }
    for words, messages in cases.items():
        p.write_bytes(spec_lime(messages))
        with pytest.raises(GaugeFileError) as e:
            read_field(p)
        assert words in one_line_error(e, p), words
    gauge = field(SHAPE + (4, 3, 3), seed=3)
    p.write_bytes(spec_lime([FILE_MESSAGE, spec_record(gauge, lower, upper, "QDP_D3_ColorMatrix", 3, 144,
                                                       datacount=4)]))
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p)
    assert "hypercube record" in one_line_error(e, p) and "not a gauge field" in str(e.value)


def test_ksprop_with_a_time_slice_source_round_trip_and_layout(tmp_path):
    """write_ksprop(source_slice=t0) writes the source as a hypercube record of time slice t0, byte for byte as
    the description; read_ksprop gives it back on the whole lattice, zero off the slice."""
    sol = field((3,) + SHAPE + (3,), seed=4)
    src = field(SHAPE, seed=6)
    p = tmp_path / "prop.ksprop"
    write_ksprop(p, sol, src, 64, source_info="s", source_slice=2)
    date = xml_fields([d for t, d in records(p) if t == "scidac-private-record-xml"][0])["date"]
    theirs = spec_record(src[..., None], (0, 0, 0, 2), (3, 5, 1, 2), "QDP_D_Complex", 0, 16,
                         "<usqcdSourceInfo><version>1.0</version><info>s</info></usqcdSourceInfo>", date)
    assert records(p)[2:6] == theirs
    solutions, source, info = read_ksprop(p)
    assert np.array_equal(solutions, sol)
    expected = np.zeros_like(src)
    expected[2] = src[2]
    assert np.array_equal(source, expected) and all(f["checksums"]["ok"] for f in info["fields"])
    with pytest.raises(GaugeFileError) as e:
        write_ksprop(tmp_path / "bad.ksprop", sol, src, source_slice=4)
    assert "hypercube bounds" in one_line_error(e, tmp_path / "bad.ksprop")
