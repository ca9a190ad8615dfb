"""hmc export: a run file's configuration as MILC, NERSC, ILDG, SciDAC and openQCD files, read back by lattice.io
(and their checksums accepted); hmc measure, solve and spectrum take the run file itself (RUN.h5, RUN.h5:N) as the
lattice; save_every keeps configurations beside the run file, and export --trajectory N reads them."""
import json

import numpy as np
import pytest

from hmc.cli import main
from hmc.runfile import load
from lattice.io import read_site_major
from lattice.io.common import plaquette_site_major
from tests.hmc.test_rhmc_mpi import launch, needs_mpi


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    """The quick deck (a hot start) after 2 trajectories: a configuration far from unit links."""
    path = str(tmp_path_factory.mktemp("export") / "r.h5")
    assert main(["init", "-o", path]) == 0
    assert main(["run", path, "--trajectories", "2", "--no-progress"]) == 0
    return path


def json_out(capsys, argv):
    capsys.readouterr()
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("fmt,precision,kind,tol", [
    ("milc", None, "milc-v5", 1e-7),          # MILC v5 is single precision
    ("nersc", None, "nersc", 0.0),
    ("nersc", 32, "nersc", 1e-7),
    ("ildg", None, "ildg", 0.0),
    ("ildg", 32, "ildg", 1e-7),
    ("scidac", None, "scidac", 0.0),
    ("scidac", 32, "scidac", 1e-7),
    ("openqcd", None, "openqcd", 0.0),
])
def test_export_round_trip(run_file, tmp_path, capsys, fmt, precision, kind, tol):
    out = str(tmp_path / f"lat.{fmt}")
    extra = ["--precision", str(precision)] if precision else []
    r = json_out(capsys, ["export", run_file, "-o", out, "--format", fmt, *extra])
    assert r["trajectory"] == 2 and r["format"] == fmt
    a, info = read_site_major(out)
    links = load(run_file).links
    assert info["format"] == kind and info["checksums"]["ok"] and tuple(info["dims"]) == (4, 4, 4, 4)
    assert np.abs(a - links).max() <= tol
    if tol == 0.0:
        assert np.array_equal(a, links)
    if fmt == "ildg":
        assert info["header"]["lfn"] == "lat.ildg"                  # ildg-data-lfn, which Grid requires
    m_file = json_out(capsys, ["measure", out])
    m_run = json_out(capsys, ["measure", run_file])
    assert abs(m_file["plaquette"] - m_run["plaquette"]) <= 1e-12 + 10 * tol


@pytest.mark.parametrize("fmt", ["ildg", "scidac"])
def test_export_grid_metadata(run_file, tmp_path, capsys, fmt):
    """--grid-metadata: Grid's FieldMetaData (trajectory as sequence_number) and FieldNormMetaData, checked on read."""
    from lattice.io import lime, read_gauge
    from lattice.io.grid_meta import parse
    out = str(tmp_path / f"lat.{fmt}")
    assert main(["export", run_file, "-o", out, "--format", fmt, "--grid-metadata", "--no-progress"]) == 0
    _, info = read_gauge(out)
    assert info["checksums"]["ok"] and info["grid_metadata"]["norm2"]
    g = parse(lime.read_data(out, lime.find(lime.scan(out), "grid-format")))
    assert g["sequence_number"] == "2" and g["ildg_lfn"] == ("lat.ildg" if fmt == "ildg" else "")
    assert abs(float(g["plaquette"]) - sum(load(run_file).plaquette) / 6) < 1e-12


def test_measure_run_file_reports_the_recorded_plaquette(run_file, capsys):
    st = load(run_file)
    for spec in (run_file, f"{run_file}:2"):
        r = json_out(capsys, ["measure", spec])
        assert r["format"] == "hisq-hmc run file"
        assert abs(r["check_plaq_ss"] - st.plaquette[0]) < 1e-13 and abs(r["check_plaq_st"] - st.plaquette[1]) < 1e-13


def test_solve_and_spectrum_take_a_run_file(run_file, tmp_path, capsys):
    """The same solve and correlator on the run file and on its exported ILDG copy (bitwise the same links)."""
    ildg = str(tmp_path / "lat.ildg")
    assert main(["export", run_file, "-o", ildg, "--format", "ildg"]) == 0
    links = ["--action", "hisq", "--mass", "0.5", "--tol", "1e-10"]
    a = json_out(capsys, ["solve", run_file, *links])
    b = json_out(capsys, ["solve", ildg, *links])
    assert a["converged"] and a["iters"] == b["iters"] and a["true_residual"] == b["true_residual"]
    c = json_out(capsys, ["spectrum", f"{run_file}:2", *links])
    d = json_out(capsys, ["spectrum", ildg, *links])
    assert c["correlator"] == d["correlator"]


@pytest.mark.parametrize("argv,words", [
    (["--trajectory", "1"], ["keeps the configuration of trajectory 2 only", "r.h5:2"]),
    (["--format", "milc", "--precision", "64"], ["single precision"]),
    (["--format", "openqcd", "--precision", "32"], ["double precision only"]),
    (["--format", "nersc", "--grid-metadata"], ["ILDG and SciDAC", "not nersc"]),
    (["--format", "scidac", "--grid-metadata", "--links", "fat"], ["drop it with --links"]),
])
def test_export_bad_input_is_one_line(run_file, tmp_path, capsys, argv, words):
    args = ["export", run_file, "-o", str(tmp_path / "x")] + (argv if "--format" in argv else argv + ["--format",
                                                                                                      "nersc"])
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hmc export: error:"), err
    for w in words:
        assert w in err[0], err[0]
    assert not (tmp_path / "x").exists()


def test_save_every_keeps_configurations_beside_the_run_file(tmp_path, capsys):
    """save_every = 2: trajectories 2 and 4 are kept as RUN.traj<N>.ildg beside the run file (exact 64-bit copies);
    export --trajectory 2 after trajectory 4 writes trajectory 2's links, and an unkept trajectory is refused."""
    from importlib.resources import files

    deck = files("hmc").joinpath("decks/quick4.toml").read_text().replace('start = "hot"',
                                                                          'start = "hot"\nsave_every = 2')
    (tmp_path / "d.toml").write_text(deck)
    run = str(tmp_path / "r.h5")
    assert main(["init", str(tmp_path / "d.toml"), "-o", run]) == 0
    assert main(["run", run, "--trajectories", "3", "--no-progress"]) == 0
    after2 = load(run)                        # checkpointed after 3: read trajectory 2's file before going on
    assert after2.trajectory == 3 and (tmp_path / "r.traj2.ildg").exists()
    assert not (tmp_path / "r.traj1.ildg").exists() and not (tmp_path / "r.traj3.ildg").exists()
    kept2, info = read_site_major(tmp_path / "r.traj2.ildg")
    assert info["format"] == "ildg" and info["header"]["lfn"] == "r.traj2.ildg" and info["checksums"]["ok"]
    assert main(["run", run, "--trajectories", "1", "--no-progress"]) == 0
    final = load(run)
    assert final.trajectory == 4
    assert np.array_equal(read_site_major(tmp_path / "r.traj4.ildg")[0], final.links)
    out = str(tmp_path / "t2.nersc")
    r = json_out(capsys, ["export", run, "--trajectory", "2", "-o", out, "--format", "nersc"])
    assert r["trajectory"] == 2
    assert np.array_equal(read_site_major(out)[0], kept2) and not np.array_equal(kept2, final.links)
    m = json_out(capsys, ["measure", f"{run}:2"])
    ss, st = plaquette_site_major(kept2)
    assert abs(m["check_plaq_ss"] - ss) < 1e-13 and abs(m["check_plaq_st"] - st) < 1e-13
    capsys.readouterr()
    assert main(["export", run, "--trajectory", "3", "-o", str(tmp_path / "t3"), "--format", "nersc"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "save_every = 2" in err[0] and "trajectories 2, 4; not 3" in err[0], err


@needs_mpi
def test_save_every_on_2_ranks_keeps_the_gathered_field(tmp_path):
    """On 2 ranks the kept file is written collectively (rank 0 writes the gathered lattice): it equals the run
    file's configuration of the same trajectory."""
    from importlib.resources import files

    deck = files("hmc").joinpath("decks/quick4.toml").read_text().replace('start = "hot"',
                                                                          'start = "hot"\nsave_every = 1')
    (tmp_path / "d.toml").write_text(deck)
    run = str(tmp_path / "r.h5")
    assert main(["init", str(tmp_path / "d.toml"), "-o", run]) == 0
    launch(2, ["-m", "hmc", "--grid", "1", "1", "1", "2", "run", run, "--trajectories", "1", "--no-progress"])
    assert np.array_equal(read_site_major(tmp_path / "r.traj1.ildg")[0], load(run).links)


def test_measure_says_which_links_its_plaquettes_are_of(run_file, tmp_path, capsys):
    """measure --json: check_plaquette is of the stored links, as NERSC's PLAQUETTE is (issue 20), and the result
    says which numbers are of stored and which of re-unitarized links."""
    out = str(tmp_path / "lat.nersc")
    assert main(["export", run_file, "-o", out, "--format", "nersc"]) == 0
    capsys.readouterr()
    head = open(out, "rb").read(4096).split(b"END_HEADER")[0].decode()
    stored = float(next(l.split("=")[1] for l in head.splitlines() if l.strip().startswith("PLAQUETTE")))
    m = json_out(capsys, ["measure", out])
    assert abs(m["check_plaquette"] - stored) < 1e-14
    assert abs(m["check_plaquette"] - (m["check_plaq_ss"] + m["check_plaq_st"]) / 6) < 1e-15
    said = " ".join(m["links"])
    assert all(k in said for k in ("check_plaquette", "plaquette", "link_trace", "polyakov_re"))
    assert any("as stored" in v for v in m["links"].values()) and any("re-unitarization" in v
                                                                      for v in m["links"].values())
