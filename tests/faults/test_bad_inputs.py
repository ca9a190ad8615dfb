"""Bad inputs refused at the door with one line naming the problem and the fix: damaged headers named as such (not
as truncated copies), checksum errors naming the CLI flag."""
from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from lattice import su3
from lattice.io import GaugeFileError, lime, read_gauge, write_gauge


def _links(dims=(2, 2, 2, 4), seed=3):
    nx, ny, nz, nt = dims
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(nt, nz, ny, nx, 4, 3, 3)) + 1j * rng.normal(size=(nt, nz, ny, nx, 4, 3, 3))
    return su3.reunitarize(a)


def one_line(excinfo, path) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg and os.fspath(path) in msg
    return msg


@pytest.mark.parametrize("kind", ["milc", "nersc"])
def test_flipped_dimension_byte_is_a_damaged_header_not_a_truncated_copy(tmp_path, kind):
    p = tmp_path / f"conf.{kind}"
    write_gauge(p, _links(), kind)
    b = bytearray(p.read_bytes())
    if kind == "milc":
        b[16] ^= 0x08                                     # nt 4 -> 12
    else:
        at = b.index(b"DIMENSION_4 = 4")
        b[at + len("DIMENSION_4 = ")] = ord("8")
    p.write_bytes(bytes(b))
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p)
    msg = one_line(e, p)
    assert "damaged" in msg and "truncated" not in msg and "incomplete" not in msg
    # a copy cut mid-site is still called truncated
    q = tmp_path / "short"
    write_gauge(q, _links(), kind)
    q.write_bytes(q.read_bytes()[:-100])
    with pytest.raises(GaugeFileError) as e:
        read_gauge(q)
    assert "truncated" in one_line(e, q) and "incomplete" in str(e.value)


def test_flipped_lime_length_is_a_damaged_record_header(tmp_path):
    p = tmp_path / "conf.ildg"
    write_gauge(p, _links(), "ildg")
    rec = next(r for r in lime.scan(p) if r.type == "ildg-binary-data")
    b = bytearray(p.read_bytes())
    b[rec.offset - lime.HEADER_BYTES + 8] ^= 0x01         # the length's top byte: 2^56 more bytes
    p.write_bytes(bytes(b))
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p)
    msg = one_line(e, p)
    assert "record header is damaged" in msg and "truncated" not in msg


@pytest.mark.parametrize("kind", ["milc", "nersc", "ildg"])
def test_checksum_error_names_the_cli_flag(tmp_path, kind):
    p = tmp_path / "conf"
    write_gauge(p, _links(), kind)
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x01                              # a data byte
    p.write_bytes(bytes(b))
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p)
    msg = one_line(e, p)
    assert "--ignore-checksum" in msg and "ignore_checksum" not in msg

