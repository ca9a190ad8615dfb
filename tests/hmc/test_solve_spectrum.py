"""``hmc solve`` and ``hmc spectrum`` against MILC's reference outputs (docs/conventions.md 4.1, 4.3).

* ``ks_imp_utilities/test/check_ks_invert``: asqtad, u0 0.502, mass 0.1, antiperiodic time, lat.sample.l8 and the
  source ksvector.src.sample.l8; ksvector.ans.Minv.sample.l8 holds M^-1 src and ksvector.ans.MdaggerMinv.sample.l8
  (M^dag M)^-1 src on both parities (single precision).
* ``ks_spectrum``: HISQ point-source pion correlators on lat.sample.l4448.gf (periodic) and lat.sample.l8888.
"""
import json

import numpy as np
import pytest

from hmc.cli import main
from tests.conftest import fixture_path


def run_json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def one_line_error(capsys, argv, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hmc {argv[0]}: error:"), err
    for w in words:
        assert w in err[0], err[0]
    return err[0]


ASQTAD_L8 = ["--action", "asqtad", "--u0", "0.502", "--mass", "0.1", "--time-bc", "antiperiodic"]


@pytest.mark.parametrize("operator,answer,reunit,limit", [
    ("M", "ksvector.ans.Minv.sample.l8", "--no-reunitarize", 2e-7),          # measured 1.12e-7
    ("M", "ksvector.ans.Minv.sample.l8", "--reunitarize", 2e-7),             # measured 1.14e-7
    ("MdagM", "ksvector.ans.MdaggerMinv.sample.l8", "--no-reunitarize", 1e-7),  # measured 5.0e-8
])
def test_solve_reproduces_check_ks_invert(capsys, operator, answer, reunit, limit):
    """MILC's answer files are single precision: agreement to ~1e-7 relative (the stored answers themselves solve
    M x = src only to 8e-8)."""
    lat, src, ans = (str(fixture_path(n)) for n in ("lat.sample.l8", "ksvector.src.sample.l8", answer))
    r = run_json(capsys, ["solve", lat, *ASQTAD_L8, "--source", src, "--operator", operator, "--tol", "1e-12",
                          reunit, "--check", ans])
    assert r["converged"] and r["true_residual"] <= 1e-12
    assert r["iters"] > 0 and r["time_s"] > 0 and r["gflops"] > 0
    assert r["full_residual"] < 1e-9
    assert r["check"]["rel_diff"] < limit and r["check"]["max_rel_diff"] < 2 * limit, r["check"]


def test_solve_out_files_and_check_round_trip(tmp_path, capsys):
    """--out writes a SciDAC colour vector (read back by lattice.io) or .npy; --check on it gives 0; the text
    output names iterations, residual, time and GFLOP/s."""
    from lattice.io import read_color_vector

    lat = str(fixture_path("lat.sample.l4444"))
    scidac, npy = str(tmp_path / "x.scidac"), str(tmp_path / "x.npy")
    base = ["solve", lat, "--action", "hisq", "--mass", "0.2", "--point", "1", "2", "3", "1", "--color", "2"]
    r = run_json(capsys, base + ["--out", scidac])
    assert r["out"]["format"] == "scidac" and r["source"] == {"kind": "point", "site": [1, 2, 3, 1], "color": 2}
    x = read_color_vector(scidac)
    assert x.shape == (4, 4, 4, 4, 3)
    r2 = run_json(capsys, base + ["--solver", "mixed", "--out", npy, "--check", scidac])
    assert r2["check"]["rel_diff"] < 1e-9 and r2["precision"] == "single/double"
    assert np.abs(np.load(npy) - x).max() < 1e-9 * np.abs(x).max()
    r3 = run_json(capsys, base + ["--check", npy])
    assert r3["check"]["rel_diff"] < 1e-9
    # M x = b: the point source comes back
    assert main(base) == 0
    text = capsys.readouterr().out
    for word in ("iterations", "true residual", "GFLOP/s", " s,"):
        assert word in text
    r4 = run_json(capsys, ["solve", lat, "--action", "hisq", "--mass", "0.2", "--random", "7",
                           "--operator", "MdagM"])
    assert r4["converged"] and r4["full_residual"] < 1e-9 and len(r4["solves"]) == 2


def test_color_vector_writer_matches_milc_file(tmp_path):
    """Writing MILC's source in single precision reproduces its binary record and QIO checksums."""
    from lattice.io import lime, read_color_vector, write_color_vector
    from lattice.io.scidac import read_field

    path = fixture_path("ksvector.src.sample.l8")
    src = read_color_vector(path)
    out = tmp_path / "src.l8"
    sums = write_color_vector(out, src, precision=32, record_xml="source color vector field")
    assert (sums["suma"], sums["sumb"]) == (0x18c175b6, 0xadc0f9ee)
    ours = {r.type: r for r in lime.scan(out)}
    theirs = {r.type: r for r in lime.scan(path)}
    assert list(ours) == list(theirs)
    for t in ("scidac-binary-data", "scidac-record-xml"):
        assert lime.read_data(out, ours[t]) == lime.read_data(path, theirs[t])
    a, info = read_field(out)
    assert info["checksums"]["ok"] and info["datatype"] == "QDP_F3_ColorVector"
    write_color_vector(out, src * (1 + 1e-9j), precision=64)
    assert np.array_equal(read_color_vector(out), src * (1 + 1e-9j))


# MILC ks_spectrum, docs/conventions.md 4.3
KAON5_L4448 = {
    "0.05": [9.715229e-05, 4.619954e-05, 4.720820e-05, 3.425617e-05, 2.959002e-05, 2.138899e-05, 2.852638e-05,
             3.737071e-05],
    "0.02": [1.145110e-04, 7.652691e-05, 7.597605e-05, 6.675119e-05, 4.706535e-05, 4.307549e-05, 4.190508e-05,
             6.089643e-05],
}
PION_L8888 = [2.793146e-01, 6.301089e-02, 1.830683e-02, 1.090211e-02, 3.832617e-03, 1.024369e-02, 1.623110e-02,
              6.151892e-02]


def last_digit(ref):
    """One unit of the last digit MILC printed (%e with 6 decimals)."""
    ref = np.asarray(ref)
    return 10.0 ** (np.floor(np.log10(np.abs(ref))) - 6)


@pytest.mark.parametrize("mass", ["0.05", "0.02"])
def test_spectrum_point_kaon5_l4448_periodic(capsys, mass):
    """ks_spectrum_hisq.periodic: HISQ, eps 0, periodic time, norm 0.000244141 (the input's rounded 1/4096)."""
    lat = str(fixture_path("lat.sample.l4448.gf"))
    r = run_json(capsys, ["spectrum", lat, "--action", "hisq", "--mass", mass, "--eps", "0", "--time-bc", "periodic",
                          "--norm", "0.000244141", "--tol", "1e-12"])
    c, ref = np.array(r["correlator"]), np.array(KAON5_L4448[mass])
    assert len(c) == 8 and r["reunitarized"]
    assert np.abs(c / ref - 1).max() < 1e-6                       # measured 2.2e-7 (m 0.05), 2.4e-7 (m 0.02)
    assert (np.abs(c - ref) / last_digit(ref)).max() <= 0.5      # the printed digits (measured <= 0.48)


def test_spectrum_point_pion_l8888(capsys):
    """ks_spectrum_eigcg_hisq: lat.sample.l8888, antiperiodic, u0 1, norm 1, m 0.01; MILC's tolerance 2e-6."""
    lat = str(fixture_path("lat.sample.l8888"))
    r = run_json(capsys, ["spectrum", lat, "--action", "hisq", "--mass", "0.01", "--u0", "1", "--norm", "1",
                          "--solver", "mixed"])
    c = np.array(r["correlator"])
    assert np.abs(c / np.array(PION_L8888) - 1).max() < 2e-6      # measured 4.3e-7
    assert all(s["converged"] for s in r["solves"]) and len(r["solves"]) == 3


def test_spectrum_origin_matches_solves(capsys, tmp_path):
    """C(t) from a source at (1, 0, 2, 3) equals norm * sum_x,a,b |x_b(x, t + 3)|^2 built from three ``hmc solve``
    point solves written with --out; the text output lists C(t) for t = 0..nt-1."""
    lat = str(fixture_path("lat.sample.l4444"))
    links = [lat, "--action", "asqtad", "--u0", "0.8", "--mass", "0.3", "--tol", "1e-12"]
    r = run_json(capsys, ["spectrum", *links, "--origin", "1", "0", "2", "3", "--norm", "0.5"])
    dens = 0.0
    for b in range(3):
        out = str(tmp_path / f"x{b}.npy")
        run_json(capsys, ["solve", *links, "--point", "1", "0", "2", "3", "--color", str(b), "--out", out])
        dens = dens + (np.abs(np.load(out)) ** 2).sum(axis=(1, 2, 3, 4))
    expect = 0.5 * np.roll(dens, -3)
    assert np.abs(np.array(r["correlator"]) / expect - 1).max() < 1e-12
    assert main(["spectrum", *links]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split()[0] for ln in lines[-4:]] == ["0", "1", "2", "3"]


@pytest.mark.parametrize("argv,words", [
    (["--mass", "0"], ["--mass", "positive"]),
    (["--mass", "-0.1"], ["--mass"]),
    (["--mass", "0.1", "--tol", "0"], ["--tol"]),
    (["--mass", "0.1", "--action", "asqtad", "--eps", "0.1"], ["--eps", "asqtad"]),
    (["--mass", "0.1", "--point", "9", "0", "0", "0"], ["outside"]),
    (["--mass", "0.1", "--source", "/nonexistent/src"], ["no such file"]),
    (["--mass", "0.1", "--check", "CHECK_WRONG_DIMS"], ["shape"]),
])
def test_solve_bad_input_is_one_line(capsys, argv, words):
    lat = str(fixture_path("lat.sample.l4444"))
    argv = [a if a != "CHECK_WRONG_DIMS" else str(fixture_path("ksvector.src.sample.l8")) for a in argv]
    if "--action" not in argv:
        argv = argv + ["--action", "hisq"]
    one_line_error(capsys, ["solve", lat] + argv, *words)


def test_bad_files_are_one_line(capsys, tmp_path):
    bad = tmp_path / "junk"
    bad.write_bytes(b"not a lattice")
    one_line_error(capsys, ["solve", str(tmp_path / "missing"), "--action", "hisq", "--mass", "0.1"], "missing")
    one_line_error(capsys, ["spectrum", str(bad), "--action", "hisq", "--mass", "0.1"], str(bad))
    # a solve that runs and does not converge is a runtime failure: exit status 1, still one line
    assert main(["spectrum", str(fixture_path("lat.sample.l4444")), "--action", "hisq", "--mass", "0.1",
                 "--maxiter", "3"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hmc spectrum: error:") and "did not converge" in err[0], err
