"""The run file describes itself (docs/runfile.md): a reader with only h5py, NumPy and the schema document loads the
configuration and reproduces the recorded plaquette; old files (version 1) stay readable, newer ones are refused."""
import json
import subprocess
import sys

import h5py
import numpy as np
import pytest

from tests.conftest import ROOT

READER = ROOT / "tests" / "hmc" / "runfile_reader.py"


def hmc(args, cwd, env):
    r = subprocess.run([sys.executable, "-m", "hmc", *args], capture_output=True, text=True, cwd=cwd, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def independent_read(path, cwd):
    """runfile_reader.py in isolated mode (-I: no PYTHONPATH, no script folder on sys.path) from ``cwd``."""
    r = subprocess.run([sys.executable, "-I", str(READER), str(path)], capture_output=True, text=True, cwd=cwd,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("ntraj", [0, 3])
def test_reader_without_the_project_reproduces_the_plaquette(tmp_path, cli_env, ntraj):
    hmc(["init", "-o", "r.h5"], tmp_path, cli_env)                       # the quick deck: a hot start
    if ntraj:
        hmc(["run", "r.h5", "--trajectories", str(ntraj), "--no-progress"], tmp_path, cli_env)
    got = independent_read(tmp_path / "r.h5", tmp_path)
    assert got["version"] == 2 and got["undescribed"] == []
    assert got["trajectory"] == got["gauge_trajectory"] == ntraj
    ss, st, plaq = got["recorded"]
    assert abs(got["ss"] - ss) < 1e-12 and abs(got["st"] - st) < 1e-12 and abs(got["plaquette"] - plaq) < 1e-12
    if ntraj:
        assert plaq > 0.1                                    # thermalizing: a plaquette that tells axes apart
        last = got["history_last"]
        assert last["traj"] == ntraj and got["history_lengths"] == [ntraj] * len(got["history_lengths"])
        assert (last["plaq_ss"], last["plaq_st"]) == (ss, st)
        assert got["dtypes"]["f_start"] == got["dtypes"]["f_end"] == "float64"     # not its first value's int
        assert got["dtypes"]["traj"] == got["dtypes"]["accepted"] == "int64"


def test_reading_the_axes_wrongly_is_detected(tmp_path, cli_env):
    """The attributes are what the reader follows: reversing axis_order (x,y,z,t read as t,z,y,x) changes the
    plaquette, so the recorded value catches the mistake the issue describes."""
    hmc(["init", "-o", "r.h5"], tmp_path, cli_env)
    hmc(["run", "r.h5", "--trajectories", "2", "--no-progress"], tmp_path, cli_env)
    with h5py.File(tmp_path / "r.h5", "a") as f:
        f["gauge/links"].attrs["axis_order"] = "x,y,z,t,mu,row,col"
    got = independent_read(tmp_path / "r.h5", tmp_path)
    assert abs(got["ss"] - got["recorded"][0]) > 1e-3


def _as_version_1(path):
    """Rewrite a run file in the first layout: no format_version attribute, /history one compound dataset whose
    field dtypes follow the first row (as the first hmc wrote it), no schema attributes or /gauge plaquette."""
    with h5py.File(path, "a") as f:
        del f.attrs["format_version"]
        h = f["history"]
        names = [c for c in h.attrs["columns"].decode().split(",") if c]      # fixed-length: bytes
        cols = {n: h[n][()] for n in names}
        for n in names:
            del h[n]
        first = {n: cols[n][0].item() for n in names}
        first["f_start"] = first["f_end"] = 0                  # pure gauge: ints in the old files
        dtype = [(n, "f8") if isinstance(first[n], float) else (n, "i8") for n in names]
        rows = np.array([tuple(cols[n][i] for n in names) for i in range(len(cols[names[0]]))], dtype=dtype)
        h.create_dataset("rows", data=rows)
        for k in list(h.attrs):
            del h.attrs[k]
        for k in ("plaquette", "plaquette_ss", "plaquette_st"):
            del f["gauge"].attrs[k]


def test_version_1_files_stay_readable(tmp_path, cli_env):
    from hmc.runfile import load

    hmc(["init", "-o", "r.h5"], tmp_path, cli_env)
    hmc(["run", "r.h5", "--trajectories", "2", "--no-progress"], tmp_path, cli_env)
    new = load(tmp_path / "r.h5")
    _as_version_1(tmp_path / "r.h5")
    old = load(tmp_path / "r.h5")
    assert old.format_version == 1 and old.trajectory == 2 and np.array_equal(old.links, new.links)
    assert [{k: float(v) for k, v in r.items()} for r in old.history] == \
           [{k: float(v) for k, v in r.items()} for r in new.history]
    assert "format version 1" in hmc(["info", "r.h5"], tmp_path, cli_env).stdout
    r = hmc(["run", "r.h5", "--trajectories", "1", "--no-progress"], tmp_path, cli_env)
    assert "format version 1" in r.stdout and "rewritten as version 2" in r.stdout
    got = independent_read(tmp_path / "r.h5", tmp_path)
    assert got["version"] == 2 and got["trajectory"] == 3 and got["undescribed"] == []
    assert abs(got["ss"] - got["recorded"][0]) < 1e-12


def test_newer_version_is_refused_in_one_line(tmp_path, cli_env):
    hmc(["init", "-o", "r.h5"], tmp_path, cli_env)
    with h5py.File(tmp_path / "r.h5", "a") as f:
        f.attrs["format_version"] = 3
    for cmd in ("run", "info"):
        r = subprocess.run([sys.executable, "-m", "hmc", cmd, "r.h5"], capture_output=True, text=True, cwd=tmp_path,
                           env=cli_env, timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1, r.stderr
        assert "format version 3, newer than this hmc reads" in lines[0] and "upgrade" in lines[0]


def test_every_history_column_is_described():
    """The columns an RHMC run with PBP measurements writes all have a schema entry (none falls back to the
    'not described' entry), with the dtype docs/runfile.md states."""
    from hmc.rhmc import RHMCStats
    from hmc.runfile_schema import history_column

    names = ["traj", "warmup", "accepted", "dH", "exp_mdH", "xrandom", "g_start", "h_start", "f_start", "g_end",
             "h_end", "f_end", "plaq_ss", "plaq_st", "ploop_re", "ploop_im", "link_trace", "time_total",
             "time_links", "time_force_gauge", "time_force_fermion", "time_momenta", "time_refresh", "time_actions",
             "time_reunitarize", "time_monitor"] + list(RHMCStats().totals())
    names += [f"pbp1_{k}" for k in ("re_even", "re_odd", "im_even", "im_odd", "faction", "iters")]
    doc = (ROOT / "docs" / "runfile.md").read_text()
    for n in names:
        dtype, units, description = history_column(n)
        assert "not described" not in description and units, n
        assert dtype == ("i8" if n in ("traj", "warmup", "accepted", "fermion_link_builds", "pbp1_iters")
                         or n.startswith(("cg_", "solves_", "graph_", "shift_")) else "f8"), n
    for n in ("traj", "dH", "f_start", "plaq_ss", "time_total", "fermion_link_builds", "time_momenta", "time_refresh",
              "graph_captures", "graph_replays", "shift_updates_md", "shift_slots_md"):
        assert f"`{n}`" in doc


def test_run_resumed_from_a_file_without_a_newer_column(tmp_path, cli_env):
    """A run file written by an hmc that did not record a column (here: the trajectory's time outside the molecular
    dynamics) resumes: the new column holds NaN for the old trajectories, the old columns keep their values."""
    from hmc.runfile import load

    hmc(["init", "-o", "r.h5"], tmp_path, cli_env)
    hmc(["run", "r.h5", "--trajectories", "1", "--no-progress"], tmp_path, cli_env)
    with h5py.File(tmp_path / "r.h5", "a") as f:           # as an older hmc wrote it
        cols = f["history"].attrs["columns"]
        cols = (cols.decode() if isinstance(cols, bytes) else cols).split(",")
        assert "time_momenta" in cols and f["history/time_momenta"][0] >= 0
        del f["history/time_momenta"]
        f["history"].attrs["columns"] = ",".join(c for c in cols if c != "time_momenta")
    first = load(tmp_path / "r.h5").history[0]
    assert "time_momenta" not in first
    hmc(["run", "r.h5", "--trajectories", "1", "--no-progress"], tmp_path, cli_env)
    st = load(tmp_path / "r.h5")
    assert st.trajectory == 2 and np.isnan(st.history[0]["time_momenta"]) and st.history[1]["time_momenta"] >= 0
    assert st.history[0]["plaq_ss"] == first["plaq_ss"] and st.history[0]["traj"] == 1
