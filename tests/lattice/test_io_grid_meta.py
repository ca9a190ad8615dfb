"""Grid's metadata records (lattice.io.grid_meta, issue 20): grid-format (FieldMetaData) and FieldNormMetaData
written by our ILDG and SciDAC writers on request, where Grid's IldgWriter puts them, with the values Grid's
IldgReader checks (plaquette and link trace as Grid's avgPlaquette / linkTrace, computed here independently; norm2;
dimensions x y z t; floating point), and checked on read: a changed value is a one-line error, a file as Grid
writes it (6 significant digits, checksums 0) passes, the default files hold no Grid record."""
from __future__ import annotations

import numpy as np
import pytest

from lattice.io import GaugeFileError, grid_meta, lime, read_gauge, read_site_major, write_gauge
from tests.lattice.test_io import one_line_error
from tests.lattice.test_io_formats import su3_links

SHAPE = (4, 2, 6, 4)              # nt nz ny nx: a swapped axis changes the dimension list and the plaquette
GRID_ILDG_ORDER = [["grid-format", "FieldNormMetaData", "scidac-private-file-xml", "scidac-file-xml"],
                   ["scidac-private-record-xml", "scidac-record-xml", "ildg-format", "ildg-data-lfn",
                    "ildg-binary-data", "FieldNormMetaData", "scidac-checksum"]]


def grid_plaquette_and_link_trace(a):
    """Grid's avgPlaquette (sum over sites and the 6 planes of Re tr U_mu(x) U_nu(x+mu) U_mu(x+nu)^+ U_nu(x)^+,
    over V 6 Nc) and linkTrace (Re sum tr U over V 4 Nc), of site-major links (t, z, y, x, mu = x y z t)."""
    axis = {0: 3, 1: 2, 2: 1, 3: 0}
    total = 0.0
    for mu in range(4):
        for nu in range(mu + 1, 4):
            umu, unu = a[..., mu, :, :], a[..., nu, :, :]
            p = (umu @ np.roll(unu, -1, axis[mu]) @ np.roll(umu, -1, axis[nu]).conj().swapaxes(-1, -2)
                 @ unu.conj().swapaxes(-1, -2))
            total += np.trace(p, axis1=-2, axis2=-1).real.sum()
    vol = np.prod(a.shape[:4])
    return total / (vol * 6 * 3), np.trace(a, axis1=-2, axis2=-1).real.sum() / (vol * 4 * 3)


def messages(path):
    out = []
    for r in lime.scan(path):
        if r.mb:
            out.append([])
        out[-1].append(r.type)
    return out


def grid_fields(path, which="grid-format"):
    return grid_meta.parse(lime.read_data(path, lime.find(lime.scan(path), which)))


@pytest.mark.parametrize("fmt,precision", [("ildg", 64), ("ildg", 32), ("scidac", 64)])
def test_grid_records_hold_what_grid_checks(tmp_path, fmt, precision):
    a = su3_links(SHAPE)
    p = tmp_path / f"conf.{fmt}"
    sums = write_gauge(p, a, fmt, precision=precision, grid_metadata={"sequence_number": 12, "ensemble": "e1"})
    if fmt == "ildg":
        assert messages(p) == GRID_ILDG_ORDER
    else:
        assert messages(p)[0][:2] == ["grid-format", "FieldNormMetaData"]
    stored, _ = read_site_major(p)
    plaq, linktr = grid_plaquette_and_link_trace(stored)
    g = grid_fields(p)
    assert list(g) == list(grid_meta.FIELDS)                          # every FieldMetaData member, in Grid's order
    assert g["dimension"] == ["4", "6", "2", "4"] and g["boundary"] == ["PERIODIC"] * 4 and g["nd"] == "4"
    assert g["floating_point"] == f"IEEE{precision}BIG" and g["data_type"] == "4D_SU3_GAUGE_3x3"
    assert abs(float(g["plaquette"]) - plaq) < 1e-14 and abs(float(g["link_trace"]) - linktr) < 1e-14
    assert (int(g["scidac_checksuma"]), int(g["scidac_checksumb"])) == (sums["suma"], sums["sumb"])
    assert g["sequence_number"] == "12" and g["ensemble_id"] == g["ensemble_label"] == "e1"
    assert g["ildg_lfn"] == ("conf.ildg" if fmt == "ildg" else "")
    norm = float(grid_fields(p, "FieldNormMetaData")["norm2"])
    assert abs(norm - 12 * np.prod(SHAPE)) < 1e-9 * norm                 # |U|^2 = 3 per SU(3) link, 4 links
    u, info = read_gauge(p)
    assert np.array_equal(u.site_major(), stored)
    assert set(info["grid_metadata"]) == {"dimension", "floating_point", "plaquette", "link_trace",
                                          "scidac_checksuma", "scidac_checksumb", "norm2"}


def test_default_files_hold_no_grid_record(tmp_path):
    p = tmp_path / "conf.ildg"
    write_gauge(p, su3_links(SHAPE), "ildg")
    assert not {"grid-format", "FieldNormMetaData"} & {r.type for r in lime.scan(p)}
    assert read_gauge(p)[1]["grid_metadata"] is None


def _rewrite(path, old: str, new: str):
    b = path.read_bytes()
    assert len(old) == len(new) and b.count(old.encode()) == 1, old
    path.write_bytes(b.replace(old.encode(), new.encode()))


@pytest.mark.parametrize("field,change,message", [
    ("plaquette", lambda v: f"{float(v) + 2e-5:.15e}", "plaquette mismatch"),
    ("link_trace", lambda v: f"{float(v) - 2e-5:.15e}", "link_trace mismatch"),
    ("floating_point", lambda v: "IEEE32BIG", "floating_point mismatch"),
    ("scidac_checksuma", lambda v: str(int(v) ^ 1).rjust(len(v), "1"), "scidac_checksuma mismatch"),
])
def test_a_changed_grid_value_is_caught(tmp_path, field, change, message):
    a = su3_links(SHAPE)
    p = tmp_path / "conf.ildg"
    write_gauge(p, a, "ildg", grid_metadata=True)
    v = grid_fields(p)[field]
    _rewrite(p, f"<{field}>{v}</{field}>", f"<{field}>{change(v)}</{field}>")
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p)
    assert f"Grid's metadata {message}" in one_line_error(e, p)
    u, _ = read_gauge(p, ignore_checksum=True)
    assert np.array_equal(u.site_major(), a)


def test_changed_dimension_and_norm_are_caught(tmp_path):
    p = tmp_path / "conf.scidac"
    write_gauge(p, su3_links(SHAPE), "scidac", grid_metadata=True)
    _rewrite(p, "<elem>6</elem>", "<elem>3</elem>")
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p)
    assert "Grid's metadata dimension mismatch: the file says 4 3 2 4" in one_line_error(e, p)
    write_gauge(p, su3_links(SHAPE), "scidac", grid_metadata=True)
    v = grid_fields(p, "FieldNormMetaData")["norm2"]
    b = p.read_bytes().replace(f"<norm2>{v}</norm2>".encode(), f"<norm2>{float(v) * 1.0001:.15e}</norm2>".encode())
    p.write_bytes(b)
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p)
    assert "FieldNormMetaData norm2 mismatch" in one_line_error(e, p)


def test_a_file_as_grid_writes_it_passes(tmp_path):
    """Grid prints doubles with 6 significant digits and writes its header before the data (checksums 0); its
    SciDAC field records leave plaquette and link_trace 0: within Grid's 1e-5, or not given."""
    a = su3_links(SHAPE)
    p = tmp_path / "conf.ildg"
    write_gauge(p, a, "ildg", grid_metadata=True)
    g = grid_fields(p)
    for key in ("plaquette", "link_trace"):
        _rewrite(p, f"<{key}>{g[key]}</{key}>", f"<{key}>{float(g[key]):.6g}</{key}>".ljust(len(g[key]) + 2 * len(key) + 5))
    for key in ("scidac_checksuma", "scidac_checksumb"):
        _rewrite(p, f"<{key}>{g[key]}</{key}>", f"<{key}>0</{key}>".ljust(len(g[key]) + 2 * len(key) + 5))
    info = read_gauge(p)[1]["grid_metadata"]
    assert abs(info["plaquette"][0] - info["plaquette"][1]) < 1e-5 and "scidac_checksuma" not in info
    _rewrite(p, f"<plaquette>{float(g['plaquette']):.6g}</plaquette>",
             "<plaquette>0</plaquette>".ljust(len(f"{float(g['plaquette']):.6g}") + 23))
    assert "plaquette" not in read_gauge(p)[1]["grid_metadata"]
