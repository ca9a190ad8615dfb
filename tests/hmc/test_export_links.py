"""hmc export --links fat|long: the fermion links of a configuration as the SciDAC colour-matrix files MILC writes
(fat.l8, long.l8), checked byte for byte against MILC's own, and from a run file."""
import numpy as np
import pytest

from hmc.cli import main
from lattice.io import lime, read_color_matrices, read_field
from tests.conftest import fixture_path


def records(path):
    return {r.type: lime.read_data(path, r) for r in lime.scan(path)}


@pytest.mark.parametrize("which", ["fat", "long"])
def test_asqtad_links_of_lat_sample_l8_are_milcs_files(tmp_path, capsys, which):
    """MILC's check_ks_invert files: asqtad, u0 0.502, antiperiodic time, from lat.sample.l8 as stored, single
    precision: the binary record and the QIO checksums are MILC's, byte for byte."""
    out = tmp_path / f"{which}.l8"
    assert main(["export", str(fixture_path("lat.sample.l8")), "-o", str(out), "--format", "scidac", "--links", which,
                 "--action", "asqtad", "--u0", "0.502", "--no-reunitarize", "--precision", "32"]) == 0
    assert f"asqtad {which} links" in capsys.readouterr().out
    ours, milc = records(out), records(fixture_path(f"{which}.l8"))
    assert list(ours) == list(milc)
    for t in ("scidac-private-file-xml", "scidac-binary-data", "scidac-checksum"):
        assert ours[t] == milc[t], t
    assert ours["scidac-record-xml"] == f"{which.capitalize()} links".encode() + b"\0"
    _, info = read_field(out)
    assert info["datatype"] == "QDP_F3_ColorMatrix" and info["datacount"] == 4 and info["checksums"]["ok"]


def test_hisq_links_of_a_run_file(tmp_path, capsys):
    """From a run file, in double precision: the links the HISQ operator uses, bitwise."""
    from force.hisq_links import hisq_links
    from hmc.lattice_source import read_lattice

    run = str(tmp_path / "t.h5")
    assert main(["init", "-o", run]) == 0
    out = str(tmp_path / "long.scidac")
    assert main(["export", run, "-o", out, "--format", "scidac", "--links", "long", "--eps", "-0.1"]) == 0
    capsys.readouterr()
    u, _ = read_lattice(run, reunitarize=True)
    expected = np.moveaxis(np.asarray(hisq_links(u, eps=-0.1).long), 0, 4)
    assert np.array_equal(read_color_matrices(out), expected)


def test_bad_options_in_one_line(tmp_path, capsys):
    lat = str(fixture_path("lat.sample.l4444"))
    for argv, word in ((["--format", "nersc", "--links", "fat"], "--format scidac"),
                       (["--format", "scidac", "--links", "fat", "--action", "asqtad", "--eps", "0.1"], "Naik"),
                       (["--format", "scidac", "--links", "fat", "--u0", "-1"], "positive")):
        assert main(["export", lat, "-o", str(tmp_path / "x"), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("hmc export: error:") and word in err[0], err
        assert not (tmp_path / "x").exists()
