"""Round trips through an independent implementation, PyQUDA's pyquda_io (issue 20): our ILDG, NERSC (also with the
bare IEEE64 label), MILC and openQCD files read by it, its NERSC, MILC and openQCD files read by us; our SciDAC gauge
file and colour-matrix fields read through its LIME reader and SciDAC checksum; our USQCD KS propagator (MILC's
QIO source-sink pairs) read by its readQIOStaggeredPropagator.

pyquda_io ships in the PyQUDA-Utils source package and imports pyquda_comm, which ships only in PyQUDA's source
package (that one builds against a QUDA installation, so neither installs with pip here). The fixture takes the
two pinned source packages from the package index (``pip download``, no build) and puts their unpacked folders on
``sys.path``; without the index the tests skip, saying so. An installed pyquda_io is used as it is."""
from __future__ import annotations

import importlib
import math
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from lattice.io import (read_gauge, read_ksprop_pairs, read_site_major, write_color_matrices, write_gauge,
                        write_ksprop_pairs)
from tests.lattice.test_io_formats import relabel, su3_links

PYQUDA_SOURCES = ("pyquda==0.10.54", "pyquda-utils==0.10.54.post0")
# nx = nz: pyquda_io takes openQCD's header extents in reverse (N3, N2, N1, N0) as (Lx, Ly, Lz, Lt), which agrees
# with openQCD's (N0 = t, N1 = x, N2 = y, N3 = z) only then
PYQUDA_SHAPE = (6, 4, 2, 4)                      # nt nz ny nx
LATT = [4, 2, 4, 6]                              # pyquda's (Lx, Ly, Lz, Lt)


def _unpacked_sources(folder: Path) -> list[str]:
    """The folders of the pinned PyQUDA and PyQUDA-Utils source packages, downloaded into ``folder``."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
           "--timeout", "15", "--retries", "1", "-d", str(folder), *PYQUDA_SOURCES]     # no index: skip soon
    try:
        subprocess.run(cmd, capture_output=True, text=True, timeout=150, check=True)
    except subprocess.CalledProcessError as e:
        lines = (e.stderr or "").strip().splitlines() or ["no output"]
        pytest.skip(f"pyquda_io is not installed and pip could not download {' and '.join(PYQUDA_SOURCES)} "
                    f"from the package index ({lines[-1]}): install it to run these round trips")
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip download of {' and '.join(PYQUDA_SOURCES)} took over 150 s: no package index here")
    roots = []
    for archive in sorted(folder.glob("*.tar.gz")):
        with tarfile.open(archive) as t:
            t.extractall(folder, filter="data")
        roots.append(str(folder / archive.name[:-len(".tar.gz")]))
    return roots


@pytest.fixture(scope="module")
def io(tmp_path_factory):
    """pyquda_io, initialized for one process."""
    try:
        module = importlib.import_module("pyquda_io")
    except ImportError:
        sys.path[:0] = _unpacked_sources(tmp_path_factory.mktemp("pyquda"))
        try:
            module = importlib.import_module("pyquda_io")
        except ImportError as e:
            pytest.skip(f"pyquda_io from {' and '.join(PYQUDA_SOURCES)} does not import here ({e})")
    for name in ("ildg", "milc", "nersc", "openqcd", "chroma", "lime", "io_utils", "mpi_utils"):
        importlib.import_module(f"pyquda_io.{name}")
    module.init([1, 1, 1, 1])
    return module


def theirs(a: np.ndarray) -> np.ndarray:
    """Our site-major links (nt, nz, ny, nx, mu, 3, 3) in pyquda's order (mu, t, z, y, x, 3, 3)."""
    return np.ascontiguousarray(np.moveaxis(a, 4, 0))


def test_openqcd_against_pyquda_io(tmp_path, io):
    """pyquda_io reads our openQCD file as our links and writes the same data back (the header plaquette to
    rounding: it sums in another order)."""
    a = su3_links(PYQUDA_SHAPE)
    p = tmp_path / "conf.oqcd"
    write_gauge(p, a, "openqcd")
    latt, gauge = io.openqcd.readGauge(str(p))
    assert list(latt) == LATT
    assert np.array_equal(np.asarray(gauge), theirs(a))
    q = tmp_path / "pyquda.oqcd"
    io.openqcd.writeGauge(str(q), latt, gauge)
    ours, written = p.read_bytes(), q.read_bytes()
    assert ours[:16] == written[:16] and ours[24:] == written[24:]
    assert math.isclose(struct.unpack("<d", ours[16:24])[0], struct.unpack("<d", written[16:24])[0], rel_tol=1e-14)
    u, _ = read_gauge(q)
    assert np.array_equal(u.site_major(), a)


@pytest.mark.parametrize("fmt,opts,bare", [("ildg", {}, False), ("ildg", {"grid_metadata": True}, False),
                                           ("nersc", {"floating_point": "IEEE64BIG"}, False),
                                           ("nersc", {"floating_point": "IEEE64LITTLE"}, True),
                                           ("milc", {}, False)])
def test_our_files_read_by_pyquda_io(tmp_path, io, fmt, opts, bare):
    """pyquda_io reads our ILDG (also with Grid's records), NERSC (also relabelled with the bare IEEE64, which it takes as little-endian) and
    MILC files (checksums asserted by pyquda_io; it re-unitarizes MILC's single-precision links, to ~1e-7)."""
    a = su3_links(PYQUDA_SHAPE)
    p = tmp_path / f"conf.{fmt}"
    write_gauge(p, a, fmt, **opts)
    if bare:
        relabel(p, opts["floating_point"], "IEEE64")
    stored, _ = read_site_major(p)
    latt, gauge = getattr(io, fmt).readGauge(str(p))
    assert list(latt) == LATT
    tol = 1e-6 if fmt == "milc" else 0.0
    assert np.abs(np.asarray(gauge) - theirs(stored)).max() <= tol


def test_our_ildg_file_read_by_pyquda_io_as_a_qio_gauge(tmp_path, io):
    """Chroma's QIO gauge reader in pyquda_io checks our SciDAC private records and the scidac-checksum of the
    ildg-binary-data record."""
    a = su3_links(PYQUDA_SHAPE)
    p = tmp_path / "conf.ildg"
    write_gauge(p, a, "ildg")
    latt, gauge = io.chroma.readQIOGauge(str(p), checksum=True)
    assert list(latt) == LATT and np.array_equal(np.asarray(gauge), theirs(a))


@pytest.mark.parametrize("fmt", ["nersc", "milc"])
def test_pyquda_io_files_read_by_us(tmp_path, io, fmt):
    """Files pyquda_io writes (NERSC IEEE64LITTLE, MILC v5 single) read here with their checksums accepted."""
    a = su3_links(PYQUDA_SHAPE)
    p = tmp_path / f"pyquda.{fmt}"
    getattr(io, fmt).writeGauge(str(p), LATT, theirs(a))
    u, info = read_gauge(p)
    assert info["checksums"]["ok"]
    stored = a.astype(np.complex64).astype(np.complex128) if fmt == "milc" else a
    assert np.array_equal(u.site_major(), stored)


def binary_record(io, path: Path, shape: tuple, precision: int, index: int = 0) -> np.ndarray:
    """The scidac-binary-data record ``index`` of ``path`` as pyquda_io reads it (its LIME scan, big-endian lexical
    sites), its scidac-checksum checked by pyquda_io's checksumSciDAC."""
    lime = io.lime.Lime(str(path))
    offset = lime.records("scidac-binary-data")[index].offset
    nt, nz, ny, nx = shape[:4]
    data = io.mpi_utils.readMPIFile(str(path), f">c{precision // 4}", offset, shape, (3, 2, 1, 0))
    checksum = lime.loadXML("scidac-checksum", index)
    expected = (int(checksum.find("suma").text, 16), int(checksum.find("sumb").text, 16))
    assert io.io_utils.checksumSciDAC([nx, ny, nz, nt], data.reshape(nt * nz * ny * nx, -1)) == expected
    return data.astype("<c16")


@pytest.mark.parametrize("precision", [32, 64])
def test_our_scidac_gauge_file_through_pyquda_io(tmp_path, io, precision):
    a = su3_links(PYQUDA_SHAPE)
    p = tmp_path / "conf.scidac"
    write_gauge(p, a, "scidac", precision=precision)
    assert io.lime.Lime(str(p)).loadXML("scidac-private-record-xml").find("datacount").text == "4"
    data = binary_record(io, p, PYQUDA_SHAPE + (4, 3, 3), precision)
    stored = a.astype(np.complex64) if precision == 32 else a
    assert np.array_equal(data, stored)


def test_our_colour_matrix_field_through_pyquda_io(tmp_path, io):
    """Fat links as MILC's fat.l8 holds them: 4 colour matrices a site, single precision."""
    a = su3_links(PYQUDA_SHAPE, seed=5) * 0.3
    p = tmp_path / "fat.l8"
    write_color_matrices(p, a, precision=32)
    assert np.array_equal(binary_record(io, p, PYQUDA_SHAPE + (4, 3, 3), 32), a.astype(np.complex64))


@pytest.mark.parametrize("precision", [32, 64])
def test_our_ks_propagator_read_by_pyquda_io(tmp_path, io, precision):
    """MILC's QIO KS propagator of three colour-vector sources: pyquda_io's readQIOStaggeredPropagator reads the
    solutions (sink colour, source colour) as we wrote them, and we read them back."""
    rng = np.random.default_rng(11)
    sources = np.zeros((3,) + PYQUDA_SHAPE + (3,), complex)
    for c in range(3):
        sources[c, 0, 0, 0, 0, c] = 1.0
    solutions = rng.normal(size=sources.shape) + 1j * rng.normal(size=sources.shape)
    p = tmp_path / "prop.ks"
    write_ksprop_pairs(p, sources, solutions, precision=precision)
    latt, prop = io.milc.readQIOStaggeredPropagator(str(p))
    stored = solutions.astype(np.complex64) if precision == 32 else solutions
    assert list(latt) == LATT and np.array_equal(np.asarray(prop), np.moveaxis(stored, 0, -1))
    back_sources, back, _ = read_ksprop_pairs(p)
    assert np.array_equal(back, stored) and np.array_equal(back_sources, sources)
