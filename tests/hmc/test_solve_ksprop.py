"""``hmc solve --ksprop``: the three source colours of a point source solved and written as MILC's save_ksprop
writes them with QIO (a USQCD KS propagator, USQCD_ColorVector_ScalarSource_ThreeSink), and read back by
``--check`` and ``--source``."""
import json

import numpy as np
import pytest

from hmc.cli import main
from lattice.io import read_color_vector, read_ksprop
from tests.conftest import fixture_path
from tests.hmc.test_rhmc_mpi import launch, needs_mpi
from tests.hmc.test_solve_spectrum import one_line_error, run_json


def base():
    return ["solve", str(fixture_path("lat.sample.l4444")), "--action", "hisq", "--mass", "0.2",
            "--point", "1", "2", "3", "1"]


@pytest.mark.parametrize("precision", [64, 32])
def test_ksprop_holds_the_three_colour_solves(tmp_path, capsys, precision):
    prop = str(tmp_path / "prop.ksprop")
    r = run_json(capsys, base() + ["--ksprop", "--out", prop, "--out-precision", str(precision)])
    assert r["out"]["format"] == "usqcd-ksprop" and r["out"]["precision"] == precision
    assert r["converged"] and [s["color"] for s in r["solves"]] == [0, 1, 2]
    assert r["source"] == {"kind": "point", "site": [1, 2, 3, 1], "colors": [0, 1, 2]}
    sol, src, info = read_ksprop(prop)
    assert info["precision"] == precision and "HISQ" in info["file_xml"]["info"]
    assert src[1, 3, 2, 1] == 1 and np.count_nonzero(src) == 1                  # (t, z, y, x) of (1, 2, 3, 1)
    for c in range(3):
        one = str(tmp_path / f"x{c}.scidac")
        run_json(capsys, base() + ["--color", str(c), "--out", one])
        x = read_color_vector(one)
        if precision == 64:
            assert np.array_equal(sol[c], x)                                    # the same solve, bitwise
        else:
            assert np.array_equal(sol[c], x.astype(np.complex64).astype(np.complex128))
        assert info["fields"][c + 1]["record_xml"]["color"] == str(c)
        r1 = run_json(capsys, base() + ["--color", str(c), "--check", prop])    # one colour of the propagator
        assert r1["check"]["rel_diff"] < (1e-14 if precision == 64 else 1e-7)
    r3 = run_json(capsys, base() + ["--ksprop", "--check", prop, "--out", str(tmp_path / "again.ksprop")])
    assert r3["check"]["rel_diff"] < (1e-14 if precision == 64 else 1e-7)
    # its scalar source as the source: the same propagator
    r4 = run_json(capsys, ["solve", str(fixture_path("lat.sample.l4444")), "--action", "hisq", "--mass", "0.2",
                           "--source", prop, "--ksprop", "--check", prop, "--out", str(tmp_path / "p2.ksprop")])
    assert r4["source"]["kind"] == "file" and r4["check"]["rel_diff"] < (1e-14 if precision == 64 else 1e-7)


def test_ksprop_text_output(tmp_path, capsys):
    prop = str(tmp_path / "prop.ksprop")
    assert main(base() + ["--ksprop", "--out", prop]) == 0
    out = capsys.readouterr().out
    assert "colours 0, 1, 2 (a KS propagator)" in out and "USQCD KS propagator, 3 source colours, 64-bit" in out


def test_ksprop_bad_input_in_one_line(tmp_path, capsys):
    vec = str(tmp_path / "x.scidac")
    run_json(capsys, base() + ["--out", vec])
    one_line_error(capsys, base() + ["--ksprop"], "--ksprop", "--out FILE")
    one_line_error(capsys, base() + ["--ksprop", "--out", str(tmp_path / "p.npy")], "not .npy")
    lat = str(fixture_path("lat.sample.l4444"))
    one_line_error(capsys, ["solve", lat, "--action", "hisq", "--mass", "0.2", "--random", "3", "--ksprop", "--out",
                            str(tmp_path / "p")], "scalar source", "--random")
    one_line_error(capsys, base() + ["--ksprop", "--out", str(tmp_path / "p"), "--check", vec], "KS propagator")
    one_line_error(capsys, ["solve", lat, "--action", "hisq", "--mass", "0.2", "--source", vec, "--ksprop", "--out",
                            str(tmp_path / "p")], "not a USQCD KS propagator")


@needs_mpi
def test_ksprop_on_two_ranks_is_the_one_rank_propagator(tmp_path, capsys):
    """Under mpiexec the three solutions are gathered to rank 0, which writes the file: the same propagator as one
    process writes (to rounding: the decomposed operator sums in another order), checksums accepted, progress and
    result printed once."""
    one, two = str(tmp_path / "one.ksprop"), str(tmp_path / "two.ksprop")
    run_json(capsys, base() + ["--ksprop", "--out", one])
    out = launch(2, ["-m", "hmc", "--grid", "1", "1", "1", "2", *base(), "--ksprop", "--out", two, "--json"])
    r = json.loads(out)
    assert r["out"]["format"] == "usqcd-ksprop" and r["converged"]
    (s1, src1, _), (s2, src2, info) = read_ksprop(one), read_ksprop(two)
    assert np.array_equal(src1, src2) and all(f["checksums"]["ok"] for f in info["fields"])
    assert np.abs(s1 - s2).max() <= 1e-13 * np.abs(s1).max()
