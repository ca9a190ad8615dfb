"""Bad inputs refused at the door with one line naming the problem and the fix: damaged headers named as such (not
as truncated copies), checksum errors naming the CLI flag, non-physical gauge fields (NaN/inf, zero links, links
far from U(3)) and non-finite or out-of-range deck values (with their key and line)."""
from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from lattice import su3
from lattice.io import GaugeFileError, lime, read_gauge, write_gauge
from tests.lattice.test_io import write_old_64bit_milc


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


def test_damaged_xml_encoding_declaration_is_a_one_line_error(tmp_path):
    """Found by the fuzzer: encoding="TTF-8" made ElementTree raise LookupError."""
    p = tmp_path / "conf.ildg"
    write_gauge(p, _links(), "ildg")
    p.write_bytes(p.read_bytes().replace(b'encoding="UTF-8"', b'encoding="TTF-8"'))
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p)
    one_line(e, p)


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


# ------------------------------------------------------------------------------------- non-physical gauge fields
def _bad_field(kind: str):
    a = _links()
    if kind == "nan":
        a[1, 0, 1, 0, 2, 1, 1] = complex(np.nan, 0)
    elif kind == "inf":
        a[0, 1, 0, 1, 3, 0, 2] = complex(0, np.inf)
    elif kind == "zero":
        a[2, 1, 1, 0, 0] = 0
    elif kind == "scaled":
        a[3, 0, 0, 1, 1] *= 5
    return a


@pytest.mark.parametrize("kind,words", [("nan", "NaN or inf"), ("inf", "NaN or inf"),
                                        ("zero", "zero (not invertible)"), ("scaled", "not unitary")])
def test_non_physical_field_with_a_valid_checksum_is_refused(tmp_path, kind, words):
    p = tmp_path / "conf"
    write_old_64bit_milc(p, _bad_field(kind))                 # valid checksum over the bad values
    _, info = read_gauge(p)                                    # the format layer reads the links as stored
    assert info["checksums"]["ok"]
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p, check_links=True)
    msg = one_line(e, p)
    assert words in msg and "site (x, y, z, t)" in msg
    if kind in ("zero", "scaled"):
        assert "--force-reunitarize" in msg


def test_force_reunitarize_projects_scaled_links_and_refuses_zero_ones(tmp_path):
    p = tmp_path / "scaled"
    a = _bad_field("scaled")
    write_gauge(p, a, "nersc")
    u, info = read_gauge(p, check_links=True, force_reunitarize=True)
    assert info["forced_reunitarized"] == 1
    got = u.site_major()
    assert np.abs(got[3, 0, 0, 1, 1] - su3.reunitarize(a[3, 0, 0, 1, 1])).max() < 1e-14
    mask = np.ones(a.shape[:5], bool)
    mask[3, 0, 0, 1, 1] = False
    assert np.array_equal(got[mask], a[mask])                 # the unitary links are untouched
    q = tmp_path / "zero"
    write_gauge(q, _bad_field("zero"), "nersc")
    with pytest.raises(GaugeFileError) as e:
        read_gauge(q, check_links=True, force_reunitarize=True)
    assert "cannot be projected" in one_line(e, q)


def test_unitarity_tolerance_follows_the_stored_precision(tmp_path):
    """A deviation of 4e-6 is float32 rounding in a 32-bit file but damage in a 64-bit one."""
    a = _links() * (1 + 2e-6)                                   # U^dag U = (1 + 2e-6)^2: deviation 4e-6
    p32, p64 = tmp_path / "c32", tmp_path / "c64"
    write_gauge(p32, a, "ildg", precision=32)
    write_gauge(p64, a, "ildg", precision=64)
    read_gauge(p32, check_links=True)
    with pytest.raises(GaugeFileError) as e:
        read_gauge(p64, check_links=True)
    assert "tolerance 1e-06 of 64-bit" in one_line(e, p64)


@pytest.mark.parametrize("name", ["lat.sample.l4444", "lat.sample.inst", "lat.sample.l6666.hisq",
                                  "lat.sample.l4444.scidac", "lat.sample.l8888"])
def test_milc_samples_pass_the_link_check(name):
    from tests.conftest import fixture_path

    _, info = read_gauge(fixture_path(name), check_links=True)
    assert info["forced_reunitarized"] == 0


def test_init_measure_and_solve_refuse_a_non_physical_lattice(tmp_path):
    import argparse

    from hmc.cli import build_parser
    from hmc.measure import measure
    from hmc.run import init_run
    from hmc.solve import load_links

    bad = tmp_path / "scaled.lat"
    write_old_64bit_milc(bad, _bad_field("scaled"))
    deck = tmp_path / "d.toml"
    deck.write_text("[run]\ntrajectories = 1\n[lattice]\ndims = [2, 2, 2, 4]\n[gauge]\nbeta = 5.7\n"
                    "[integrator]\nsteps = 2\n")
    out = tmp_path / "run.h5"
    with pytest.raises(GaugeFileError):
        init_run(str(deck), str(out), from_lattice=str(bad), log=lambda *a: None)
    assert not out.exists()
    state = init_run(str(deck), str(out), from_lattice=str(bad), log=lambda *a: None, force_reunitarize=True)
    assert su3.unitarity_violation(state.links) < 1e-12
    args = argparse.Namespace(backend=None, ignore_checksum=False, beta=None)
    with pytest.raises(GaugeFileError):
        measure(str(bad), args)
    args.force_reunitarize = True
    assert measure(str(bad), args)["plaquette"] <= 3
    args = build_parser().parse_args(["solve", str(bad), "--action", "hisq", "--mass", "0.1"])
    with pytest.raises(GaugeFileError):
        load_links(args)
    args = build_parser().parse_args(["solve", str(bad), "--action", "hisq", "--mass", "0.1", "--force-reunitarize"])
    assert load_links(args)[2]["forced_reunitarized"] == 1


# ------------------------------------------------------------------------------------------ deck values
QUICK = """\
# a comment line
[run]
trajectories = 2

[lattice]
dims = [2, 2, 2, 4]

[gauge]
beta = 5.7

[integrator]
steps = 4
tau = 1.0
"""


@pytest.mark.parametrize("old,new,key,line", [
    ("beta = 5.7", "beta = inf", "[gauge] beta", 9),
    ("beta = 5.7", "beta = nan", "[gauge] beta", 9),
    ("beta = 5.7", "beta = -5.7", "[gauge] beta", 9),
    ("tau = 1.0", "tau = 0.0", "[integrator] tau", 13),
    ("tau = 1.0", "tau = -inf", "[integrator] tau", 13),
    ("steps = 4", "steps = -2", "[integrator] steps", 12),
    ("steps = 4", "steps = 3", "[integrator] steps", 12),
    ("trajectories = 2", "trajectories = -3", "[run] trajectories", 3),
    ("trajectories = 2", "trajectories = 0", "[run] trajectories", 3),
    ("beta = 5.7", "beta = 5.7\nu0 = inf\naction = 'symanzik'", "[gauge] u0", 10),
    ("tau = 1.0", "tau = 1.0\n\n[fermions]\nrationals = 'r'\ndyn_mass = [-0.01]\ndyn_flavors = [2]\n"
     "cgresid_md_fa_gr = [[1e-5, 1e-5, 1e-5]]", "[fermions] dyn_mass", 17),
    ("tau = 1.0", "tau = 1.0\n\n[fermions]\nrationals = 'r'\ndyn_mass = [0.01]\ndyn_flavors = [2]\n"
     "cgresid_md_fa_gr = [[1e-5, inf, 1e-5]]", "[fermions] cgresid_md_fa_gr", 19),
])
def test_out_of_range_deck_values_are_refused_with_key_and_line(tmp_path, old, new, key, line):
    from hmc.deck import DeckError, load

    p = tmp_path / "deck.toml"
    p.write_text(QUICK.replace(old, new))
    assert p.read_text().splitlines()[line - 1].startswith(key.split()[1])
    with pytest.raises(DeckError) as e:
        load(p)
    msg = one_line(e, p)
    assert f"line {line}: {key}" in msg


def test_key_line_finds_quoted_and_dotted_keys():
    from hmc.deck import key_line

    text = 'gauge.beta = 5\n[run]\n"seed" = 3\n[ integrator ]\n  steps=4 # x\n'
    assert key_line(text, "gauge", "beta") == 1
    assert key_line(text, "run", "seed") == 3
    assert key_line(text, "integrator", "steps") == 5
    assert key_line(text, "run", "steps") is None


@pytest.mark.parametrize("n", [-3, 0])
def test_run_refuses_a_non_positive_trajectory_count(tmp_path, n):
    from hmc.deck import DeckError
    from hmc.run import init_run, run

    deck = tmp_path / "d.toml"
    deck.write_text(QUICK)
    out = tmp_path / "r.h5"
    init_run(str(deck), str(out), log=lambda *a: None)
    before = out.read_bytes()
    with pytest.raises(DeckError) as e:
        run(str(out), n, log=lambda *a: None)
    assert f"--trajectories {n}" in str(e.value) and "\n" not in str(e.value)
    assert out.read_bytes() == before
