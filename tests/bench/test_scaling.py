"""``hmc scaling``: the issue's small study end to end (4^4 and 8^4 on 1, 2 and 4 ranks, mpi and shm, halo, dslash
and CG: HDF5 layout, answers, report and plots; a forced failure, a grid that cannot split the lattice, recorded and
not fatal), resume, recorded failures and timeouts, --mps with a stand-in daemon, and one-line errors for what cannot
run. The RHMC operation: tests/bench/test_scaling_rhmc.py.

The studies launch mpiexec themselves (oversubscribed on two cores), each configuration with a timeout; few repeats
and 3 CG iterations keep the whole file near a minute on two cores.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.bench.scaling_helpers import MPIEXEC, _env, hmc, needs_mpi
from tests.conftest import ROOT

pytestmark = pytest.mark.mpi

h5py = pytest.importorskip("h5py")

TINY = ["--lattice", "4", "4", "4", "4", "--repeats", "2", "--min-time", "0.01", "--cg-iters", "3",
        "--halo-sizes", "2", "--timeout", "120"]


LATS = ("4x4x4x4", "8x8x8x8")
RUN = [f"l{lat}_n{n}_{t}" for lat in LATS for n, t in ((1, "serial"), (2, "mpi"), (2, "shm"), (4, "mpi"), (4, "shm"))]
FORCED = [f"l{lat}_n3_{t}_g1x1x1x3" for lat in LATS for t in ("mpi", "shm")]
STUDY = ["--lattice", "4^4", "--lattice", "8", "8", "8", "8", "--ranks", "1", "2", "4", "--grid", "1x1x1x3",
         "--transports", "mpi", "shm", "--what", "halo,dslash,cg"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The issue's CI study: 4^4 and 8^4 on 1, 2 and 4 ranks, mpi and shm, halo + dslash + cg; plus a forced
    failure: the explicit grid 1x1x1x3 cannot split either lattice (launched, fails in the worker, recorded)."""
    if MPIEXEC is None:
        pytest.skip("mpiexec is not on PATH")
    d = tmp_path_factory.mktemp("scaling")
    path = d / "study.h5"
    r = hmc(TINY[5:] + STUDY + ["-o", str(path)], timeout=240)
    assert r.returncode == 1, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"     # 1: some configuration failed
    return path, r


# ------------------------------------------------------------------------------------------------------------
# the study end to end

@needs_mpi
def test_study_file_structure(study):
    path, r = study
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == "hmc-scaling/1"
        for k in ("created", "updated", "git_commit", "machine", "launcher", "parameters", "transport_table",
                  "versions", "command", "mps", "graph"):
            assert k in f.attrs, k
        machine = json.loads(f.attrs["machine"])
        assert machine["cores"] >= 1 and machine["hostname"]
        params = json.loads(f.attrs["parameters"])
        assert params["what"] == ["halo", "dslash", "cg"] and params["repeats"] == 2 and params["cg_iters"] == 3
        assert json.loads(f.attrs["mps"])["asked"] is False and not f.attrs["graph"]
        table = json.loads(f.attrs["transport_table"])
        assert set(table) == {"serial", "mpi", "shm"}
        assert set(f["configs"]) == set(RUN + FORCED)
        for key in RUN:
            g = f["configs"][key]
            n = int(g.attrs["ranks"])
            assert g.attrs["status"] == "ok", (key, g.attrs["error"])
            assert bool(g.attrs["answers_agree"]), (key, g.attrs["answers_note"])
            for op in ("dslash", "cg"):
                s = g[op]["samples_s"][()]
                assert s.shape == (2,) and np.all(s > 0) and np.all(np.isfinite(s))
                assert g[op].attrs["min_s"] <= g[op].attrs["median_s"] <= g[op].attrs["max_s"]
                ph = g[op]["phases"]
                assert ph.shape == (n, 6) and np.all(ph[()] >= 0)
                assert list(ph.attrs["names"]) == ["halo_start", "halo_wait", "halo_finish", "local_shift",
                                                   "reductions", "compute"]
            assert g["cg"].attrs["iterations"] == 3
            serial = f["configs"][key.split("_n")[0] + "_n1_serial"]
            eff = g["dslash"].attrs["efficiency"]
            assert eff > 0 and np.isclose(eff * n * g["dslash"].attrs["median_s"],
                                          serial["dslash"].attrs["median_s"])
            assert g["dslash"].attrs["flops"] > 0
            if n == 1:
                assert list(g.attrs["grid"]) == [1, 1, 1, 1] and g["halo"].attrs["status"] == "n/a"
                continue
            t = g.attrs["transport"]
            lat = [int(x) for x in g.attrs["lattice"]]
            grid = [1, 1, 1, 2] if n == 2 else [1, 1, 2, 2]
            assert list(g.attrs["grid"]) == grid
            assert list(g.attrs["local_dims"]) == [L // p for L, p in zip(lat, grid)]
            assert g.attrs["links"] == t
            assert {row["transport"] for row in json.loads(g["transport_table"][()])} == {t}
            first = f"t-:1 {t}" if n == 2 else f"z-:1 {t}"
            assert f"rank 0 (0, 0, 0, 0): {first}" in g["transport_table_text"][()].decode()
            assert g["halo"].attrs["median_s"] > 0 and g["halo"].attrs["depth"] == min(3, min(
                L // p for L, p in zip(lat, grid) if p > 1))
            ph = g["dslash"]["phases"][()]
            assert np.all(ph[:, 0] > 0) and np.all(ph[:, 2] > 0)     # halo start and finish were timed
            assert g["cg"]["phases"][()][:, 4].min() > 0              # and the reductions
            note = g.attrs["answers_note"]
            assert "halo slabs correct" in note and "dslash bitwise" in note and "CG (exact sums) bitwise" in note
            lat_rows = g["latency"][()]
            assert lat_rows.shape == (1,) and lat_rows["bytes"][0] == 8 * 48 and lat_rows["one_way_us"][0] > 0
        for key in FORCED:                          # the forced failure: recorded with the worker's error
            g = f["configs"][key]
            assert g.attrs["status"] == "failed" and bool(g.attrs["explicit_grid"])
            assert "is not divisible by the 3 ranks of the process grid" in g.attrs["error"], g.attrs["error"]
            assert list(g.attrs["grid"]) == [1, 1, 1, 3] and not bool(g.attrs["answers_agree"])
        summary = f["summary"][()]
        assert len(summary) == len(RUN) + len(FORCED)
        ok = summary[summary["status"] == b"ok"]
        assert len(ok) == len(RUN) and np.all(ok["answers_agree"]) and np.all(ok["dslash_s"] > 0)
        assert np.all(summary[summary["status"] == b"failed"]["ranks"] == 3)


@needs_mpi
def test_study_progress_report_and_plots(study):
    path, r = study
    out = r.stdout
    assert "[ 1/14]" in out and "[14/14]" in out
    assert out.count("FAILED: CommsError: lattice extent") == 4
    # the study went on after the failures: the 4-rank runs come after them
    assert out.index("FAILED") < out.index("4 rank(s) mpi")
    assert "14 configuration(s) run, 4 failed, 0 skipped" in out
    rep = path.with_name("study_report")
    md = (rep / "report.md").read_text()
    assert "## 4x4x4x4" in md and "## 8x8x8x8" in md
    assert "| 2 | 1x1x1x2 | 4x4x4x2 | shm |" in md and "| 4* | 1x1x2x2 | 8x8x4x4 | mpi |" in md
    assert "shm/mpi" in md and "answers agree" in md
    table_rows = [l for l in md.splitlines() if l.startswith("| 1 |") or l.startswith("| 2 |")
                  or l.startswith("| 4* |") or l.startswith("| 4 |")]
    data_rows = [l for l in table_rows if " | serial | " in l or " | mpi | " in l or " | shm | " in l]
    assert len(data_rows) == len(RUN) and all(l.rstrip().endswith("| yes |") for l in data_rows)
    assert md.count("3 ranks, mpi: **failed**: CommsError: lattice extent") == 2
    for name in ("time_vs_ranks.png", "speedup_efficiency.png", "phases.png", "transport_ratios.png",
                 "latency.png"):
        p = rep / name
        assert p.exists() and p.stat().st_size > 10_000, name
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in md
    # the report command redraws it elsewhere, from the file alone
    other = path.parent / "elsewhere"
    r2 = subprocess.run([sys.executable, "-m", "hmc", "scaling", "report", str(path), "-o", str(other)],
                        capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=120)
    assert r2.returncode == 0, r2.stderr
    assert (other / "report.md").read_text() == md.replace(str(rep), str(other))
    assert (other / "phases.png").exists()


@needs_mpi
def test_resume_skips_what_the_file_holds(study, tmp_path):
    path, _ = study
    copy = tmp_path / "study.h5"
    shutil.copyfile(path, copy)
    with h5py.File(copy, "r") as f:
        before = {k: f["configs"][k].attrs["date"] for k in f["configs"]}
    # resume without the failing grid: everything is in the file, nothing runs
    r = hmc(TINY[5:] + STUDY[:-7] + STUDY[-5:] + ["-o", str(copy), "--resume", "--no-report"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("already in the file") == len(RUN)
    assert "0 configuration(s) run" in r.stdout
    with h5py.File(copy, "r") as f:
        assert {k: f["configs"][k].attrs["date"] for k in f["configs"]} == before
    # without --resume an existing file is not touched; other measurement options are refused on resume
    r = hmc(TINY + ["--ranks", "1", "--transports", "mpi", "-o", str(copy)])
    assert r.returncode == 2 and "exists: --resume continues that study, --force starts over" in r.stderr
    r = hmc(TINY[:-6] + ["--cg-iters", "7", "--ranks", "1", "--transports", "mpi", "-o", str(copy), "--resume"])
    assert r.returncode == 2 and "was measured with" in r.stderr and "cg_iters=3" in r.stderr


@needs_mpi
def test_failure_is_recorded_and_resume_retries_it(tmp_path):
    path = tmp_path / "s.h5"
    args = TINY + ["--ranks", "1", "--transports", "shm", "--what", "dslash", "-o", str(path), "--no-report"]
    r = hmc(args, env={"HMC_FAULT_INJECT": "scaling_fail:n1_serial"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED: InjectedFault: injected fault" in r.stdout
    with h5py.File(path, "r") as f:
        g = f["configs"]["l4x4x4x4_n1_serial"]
        assert g.attrs["status"] == "failed" and "injected fault" in g.attrs["error"]
    r = hmc(args + ["--resume"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "failed before: trying again" in r.stdout
    with h5py.File(path, "r") as f:
        g = f["configs"]["l4x4x4x4_n1_serial"]
        assert g.attrs["status"] == "ok" and g["dslash"].attrs["median_s"] > 0


@needs_mpi
def test_timeout_is_recorded_not_fatal(tmp_path):
    path = tmp_path / "t.h5"
    r = hmc(["--lattice", "4^4", "--ranks", "1", "--transports", "mpi", "--what", "dslash", "--timeout", "4",
             "-o", str(path)], env={"HMC_FAULT_INJECT": "scaling_hang:n1_serial"}, timeout=120)
    assert r.returncode == 1
    assert "FAILED: timed out after 4 s (--timeout)" in r.stdout
    with h5py.File(path, "r") as f:
        assert f["configs"]["l4x4x4x4_n1_serial"].attrs["status"] == "failed"
    md = (tmp_path / "t_report" / "report.md").read_text()
    assert "**failed**: timed out after 4 s" in md


FAKE_MPS = """#!/bin/sh
# a stand-in for nvidia-cuda-mps-control: -d starts (creates the control pipe), stdin commands answer
echo "$@" >> "$FAKE_MPS_LOG"
if [ "$1" = "-d" ]; then
  [ -n "$FAKE_MPS_FAIL" ] && { echo "An instance of this daemon is already running" >&2; exit 1; }
  : > "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0
fi
read cmd
echo "$cmd" >> "$FAKE_MPS_LOG"
case "$cmd" in
  get_server_list) [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] && echo 4242 ;;
  quit) rm -f "$CUDA_MPS_PIPE_DIRECTORY/control" ;;
esac
"""


@needs_mpi
def test_mps_is_started_for_the_study_recorded_and_stopped(tmp_path):
    """--mps with a stand-in control daemon (the real one needs a GPU): started once before the ranks, the ranks
    see its pipe folder, the server list is recorded, the daemon is told to quit, the report says so."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(FAKE_MPS)
    exe.chmod(0o755)
    log = tmp_path / "mps.log"
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_MPS_LOG": str(log)}
    path = tmp_path / "m.h5"
    r = hmc(TINY + ["--ranks", "1", "2", "--transports", "mpi", "--what", "dslash", "--mps", "-o", str(path)],
            env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mps: ran (control daemon started" in r.stdout
    calls = log.read_text().split()
    assert calls[0] == "-d" and calls.count("-d") == 1 and calls[-1] == "quit"
    with h5py.File(path, "r") as f:
        mps = json.loads(f.attrs["mps"])
        assert mps["asked"] and mps["ran"] and mps["servers"] == ["4242"]
        for key in ("l4x4x4x4_n1_serial", "l4x4x4x4_n2_mpi"):
            g = f["configs"][key]
            assert bool(g.attrs["mps"]) and g.attrs["mps_client"].endswith("pipe")
            assert g.attrs["mps_client"] == mps["pipe_directory"]
    assert not os.path.exists(mps["pipe_directory"])              # the private folder is gone
    md = (tmp_path / "m_report" / "report.md").read_text()
    assert "MPS" in md and "started by hmc scaling --mps" in md
    # a daemon that does not start is a one-line error, nothing runs
    r = hmc(TINY + ["--ranks", "1", "--transports", "mpi", "--what", "dslash", "--mps", "-o",
                    str(tmp_path / "n.h5")], env=dict(env, FAKE_MPS_FAIL="1"))
    assert r.returncode == 2 and r.stderr.startswith("hmc scaling: error: --mps: the CUDA MPS control daemon did "
                                                     "not start") and r.stderr.count("\n") == 1
    assert not (tmp_path / "n.h5").exists()


@needs_mpi
def test_gpu_operations_plumbing_on_the_cpu():
    """The worker's GPU operations driven on the CPU (tests/bench/scaling_gpu_plumbing.py: a stand-in CuPy with host
    clocks, the NumPy twin of the distributed hop through shm, a NumPy stand-in of DslashRunner, the production CG): the
    halo check passes, the device-event samples and the eight-phase split come out per rank, and the answers equal
    the 1-rank run's to rounding."""
    script = str(ROOT / "tests" / "bench" / "scaling_gpu_plumbing.py")
    out = {}
    for n in (1, 2):
        r = subprocess.run([MPIEXEC, "--oversubscribe", "-n", str(n), sys.executable, script, "shm"],
                           capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        out[n] = json.loads(r.stdout.strip().splitlines()[-1])
    one, two = out[1], out[2]
    from bench.scaling.worker_context import GPU_PHASES

    assert one["ops"]["halo"]["status"] == "n/a" and two["answers"]["halo_ok"] is True
    assert two["ops"]["halo"]["depth"] == 3 and two["ops"]["halo"]["dims"] == "t"
    for res, n in ((one, 1), (two, 2)):
        for op in ("dslash", "cg"):
            d = res["ops"][op]
            assert d["clock"] == "device events" and len(d["samples_s"]) == 2 and min(d["samples_s"]) > 0
            ph = np.asarray(d["phases"])
            assert d["phase_names"] == list(GPU_PHASES) and ph.shape == (n, 8) and ph.min() >= 0
            names = dict(zip(GPU_PHASES, ph.sum(axis=0)))
            assert names["graph"] == 0 and (names["interior"] > 0)
            if n == 2:
                assert names["pack"] > 0 and names["wait"] > 0 and names["exterior"] > 0
        assert res["ops"]["cg"]["phases"] and np.asarray(res["ops"]["cg"]["phases"])[:, 5].min() > 0  # reductions
    assert np.isclose(two["answers"]["dslash_norm2"], one["answers"]["dslash_norm2"], rtol=1e-12)
    assert np.isclose(two["answers"]["cg_residual"], one["answers"]["cg_residual"], rtol=1e-10)


# ------------------------------------------------------------------------------------------------------------
# errors and planning (no launch)

def _cli(args, capsys):
    from hmc.cli import main

    rc = main(["scaling"] + args)
    err = capsys.readouterr().err
    return rc, err


@pytest.mark.parametrize("args, message", [
    (["--transports", "mpi", "tcp"], "unknown transport 'tcp': use mpi, shm (CPU) or event, stream_gated (GPU)"),
    (["--transports", "shm", "--graph"], "--graph captures the stream_gated exchange in CUDA graphs"),
    (["--grid", "1x2x3"], "--grid 1x2x3: write PXxPYxPZxPT"),
    (["--what", "halo,mg"], "--what mg: hmc scaling does not time the multigrid solver yet"),
    (["--what", "dslash,fft"], "--what 'fft': unknown operation"),
    (["--lattice", "4", "4", "4"], "give four extents per lattice"),
    (["--lattice", "5", "4", "4", "4"], "every extent must be even"),
    (["--traj-steps", "3", "--what", "trajectory"], "Omelyan integrator takes two steps per cycle"),
    (["--traj-steps", "3", "--what", "rhmc"], "(and 3G1F too), give an even number"),
    (["--what", "rhmc,mg"], "use halo, dslash, cg, trajectory, rhmc"),
])
def test_bad_requests_are_one_line_errors(args, message, capsys, tmp_path):
    base = ["--lattice", "4", "4", "4", "4"] if "--lattice" not in args else []
    rc, err = _cli(base + args + ["-o", str(tmp_path / "x.h5")], capsys)
    assert rc == 2
    assert err.startswith("hmc scaling: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "x.h5").exists()


def test_graph_needs_the_distributed_gpu_module(capsys, tmp_path):
    """--graph without solvers/staggered_dist_cuda.py is a one-line error naming the module; with it, on a machine
    without a GPU, the stream_gated transport's own error."""
    from bench.scaling import plan as scaling

    rc, err = _cli(["--lattice", "4^4", "--transports", "mpi", "stream_gated", "--graph", "-o",
                    str(tmp_path / "g.h5")], capsys)
    assert rc == 2 and err.count("\n") == 1
    if scaling.graph_module_missing():
        assert "--graph needs solvers/staggered_dist_cuda.py" in err
    elif scaling.transport_unavailable("stream_gated"):
        assert "transport 'stream_gated' cannot run here" in err


def test_gpu_transports_say_why_they_cannot_run(capsys, tmp_path):
    from bench.scaling import plan as scaling

    for t in ("event", "stream_gated"):
        why = scaling.transport_unavailable(t)
        if why is None:
            pytest.skip("the GPU transports can run on this machine")
        rc, err = _cli(["--lattice", "4^4", "--transports", "mpi", t, "-o", str(tmp_path / "g.h5")], capsys)
        assert rc == 2 and f"transport {t!r} cannot run here: " in err and err.count("\n") == 1


def test_report_of_a_file_that_is_not_a_study(tmp_path, capsys):
    p = tmp_path / "other.h5"
    with h5py.File(p, "w") as f:
        f.attrs["format"] = "something else"
    rc, err = _cli(["report", str(p)], capsys)
    assert rc == 2 and "is not a results file of hmc scaling" in err
    rc, err = _cli(["report", str(tmp_path / "missing.h5")], capsys)
    assert rc == 2 and "no results file" in err


def test_a_registered_transport_is_planned_checked_and_reported():
    """The study asks comms.transport.registry: a host transport registered here (no other change) is accepted by
    --transports, planned with a graph row when it can be captured, ordered after the built-ins, paired in the
    stream-gated gain when no host drives it, and gets a row in the report's transport table."""
    from bench.scaling.common import ScalingError, cpu_transports, transport_notes
    from bench.scaling.plan import check_transports, graph_transports, plan
    from bench.scaling.results import gain_pairs
    from comms.transport import Capabilities, register, unregister

    with pytest.raises(ScalingError, match="unknown transport 'test_gate'"):
        check_transports(["mpi,test_gate"], graph=False)
    register("test_gate", Capabilities(graph_capture=True, host_driven=False), "tests.no_such_module")
    try:
        assert check_transports(["mpi,test_gate"], graph=False) == ["mpi", "test_gate"]
        assert "test_gate" in cpu_transports() and "test_gate" in graph_transports()
        cfgs = plan([(8, 8, 8, 8)], [2], ["mpi", "test_gate"], graph=True)
        assert [c.label for c in cfgs] == ["serial", "mpi", "test_gate", "test_gate+graph"]
        assert ("mpi", "test_gate") in gain_pairs(["mpi", "test_gate"])
        assert transport_notes("test_gate")["host_in_loop"] == "no" and transport_notes("test_gate")["device"] == "cpu"
    finally:
        unregister("test_gate")
    assert "test_gate" not in graph_transports()


def test_plan_lattices_and_launcher():
    from bench.scaling.common import parse_grids, parse_lattices
    from bench.scaling.launch import Launcher
    from bench.scaling.plan import Config, plan
    from bench.scaling.study import compare_answers

    assert parse_lattices([["16^4"], ["8x8x8x16"], ["4", "4", "4", "4", "8", "8", "8", "8"]]) == [
        (16,) * 4, (8, 8, 8, 16), (4,) * 4, (8,) * 4]
    cfgs = plan([(8, 8, 8, 8)], [4, 1, 2, 6], ["mpi", "shm"])
    assert [c.key for c in cfgs] == ["l8x8x8x8_n1_serial", "l8x8x8x8_n2_mpi", "l8x8x8x8_n2_shm", "l8x8x8x8_n4_mpi",
                                     "l8x8x8x8_n4_shm", "l8x8x8x8_n6_mpi", "l8x8x8x8_n6_shm"]
    by = {c.key: c for c in cfgs}
    assert by["l8x8x8x8_n4_shm"].grid == (1, 1, 2, 2) and by["l8x8x8x8_n4_shm"].local_dims == (8, 8, 4, 4)
    assert by["l8x8x8x8_n6_mpi"].skip and "6 ranks cannot split" in by["l8x8x8x8_n6_mpi"].skip
    assert Config((8,) * 4, 2, "stream_gated", graph=True).key == "l8x8x8x8_n2_stream_gated_graph"
    # explicit grids: replace the automatic one of their rank count, launched as given even if they cannot split
    cfgs = plan([(8, 8, 8, 8)], [1, 2, 4], ["mpi"], grids=parse_grids(["1x1x4x1", "1", "1", "1", "3"]))
    assert [c.key for c in cfgs] == ["l8x8x8x8_n1_serial", "l8x8x8x8_n2_mpi", "l8x8x8x8_n3_mpi_g1x1x1x3",
                                     "l8x8x8x8_n4_mpi_g1x1x4x1"]
    assert cfgs[2].skip is None and cfgs[2].local_dims is None and cfgs[3].local_dims == (8, 8, 2, 8)
    # --graph: one more row per graph-capable transport
    cfgs = plan([(8, 8, 8, 8)], [2], ["mpi", "event", "stream_gated"], graph=True)
    assert [c.label for c in cfgs] == ["serial", "mpi", "event", "stream_gated", "stream_gated+graph"]
    assert Launcher("srun -n {n} --mpi=pmix").command(4) == ["srun", "-n", "4", "--mpi=pmix"]
    assert Launcher("mpirun --bind-to core").command(2) == ["mpirun", "--bind-to", "core", "-n", "2"]
    ref = {"dslash_sha256": "a", "cg_exact_sha256": "b", "cg_residual": 0.5, "dslash_norm2": 2.0}
    assert compare_answers(ref, dict(ref, halo_ok=True))[0]
    agree, note = compare_answers(ref, dict(ref, dslash_sha256="c"))
    assert not agree and "dslash not bitwise" in note
    agree, note = compare_answers(ref, dict(ref, cg_residual=0.5 * (1 + 1e-6)))
    assert not agree and "CG residual rel. diff" in note
    # on a GPU the fast-sum CG residual only to GPU_CG_RESIDUAL_RTOL (rounding amplified by fixed iterations)
    assert compare_answers(ref, dict(ref, cg_residual=0.5 * (1 + 6.3e-4)), bitwise=False)[0]
    agree, note = compare_answers(ref, dict(ref, cg_residual=0.5 * 1.05), bitwise=False)
    assert not agree and "CG residual rel. diff 5.0e-02" in note


def test_report_of_gpu_transports_shows_the_stream_gated_gain(tmp_path):
    """The report path of the GPU transports, from stored results (no launch): the stream-gated gain against event
    and mpi per point, the CUDA-graph rows and their gain, the device-event phase split as stacked bars, and the note
    that the ranks share one GPU under MPS."""
    from bench.scaling.plan import Config
    from bench.scaling.study import Study
    from bench.scaling.report import write_report
    from bench.scaling.results import load_study
    from bench.scaling.worker_context import GPU_PHASES

    study = Study(tmp_path / "gpu.h5")
    study.create({"machine": {"hostname": "h", "cores": 16, "gpu": "1 x NVIDIA H200"}, "parameters": {
        "what": ["dslash", "cg"], "repeats": 3, "backend": "cupy"}, "graph": True,
        "mps": {"asked": True, "ran": True, "why": "control daemon started", "servers": ["777"]}})
    answers = {"dslash_sha256": "x", "dslash_norm2": 1.0, "cg_residual": 0.5}
    times = {"serial": 1.0, "mpi": 0.9, "event": 0.8, "stream_gated": 0.5, "stream_gated+graph": 0.25}
    rows = [(1, "serial", False)] + [(n, t, False) for n in (2, 4) for t in ("mpi", "event", "stream_gated")]
    rows += [(n, "stream_gated", True) for n in (2, 4)]
    for n, t, graph in rows:
        s = times[t + ("+graph" if graph else "")] * (1 if n == 1 else 2 / n)
        # GPU phases (device events): pack, post, interior, wait, exterior, reductions, graph, host_overhead
        ph = [0.0] * 6 + [0.9 * s, 0.1 * s] if graph else [0.1 * s, 0.1 * s, 0.3 * s, 0.2 * s, 0.1 * s, 0, 0, 0.2 * s]
        op = {"samples_s": [s, s * 1.1, s * 0.9], "wall_samples_s": [s] * 3, "reps": 1, "flops": 1e9,
              "phases": [ph] * n, "phases_host": [[0.0] * 8] * n, "phase_names": list(GPU_PHASES),
              "clock": "device events", "graph": graph}
        res = {"status": "ok", "backend": "cupy", "gpu": "NVIDIA H200", "grid": [1, 1, 1, n],
               "local_dims": [8, 8, 8, 8 // n], "links": "none" if n == 1 else t,
               "answers": dict(answers, halo_ok=True) if n > 1 else answers, "dslash_impl": "DistHop",
               "ops": {"dslash": op, "cg": dict(op, iterations=3)}}
        study.store(Config((8,) * 4, n, t, graph=graph, grid=(1, 1, 1, n)), res,
                    {"cores": 16, "oversubscribed": False, "mps": True, "mps_servers": "777"})
    out = write_report(study.path, tmp_path / "rep")
    md = open(out["markdown"]).read()
    assert "| 2 | 0.89 | 0.56 | 0.28 | 0.89 | 0.56 | 0.28 |" in md    # event, sg, sg+graph over mpi (dslash, cg)
    head = [l for l in md.splitlines() if l.startswith("| ranks | dslash: event/stream_gated")]
    assert head and head[0].count("/stream_gated+graph") == 6 and "dslash: stream_gated/stream_gated+graph" in head[0]
    # event/sg, mpi/sg, event/sg+graph, mpi/sg+graph, sg/sg+graph, per op, at 2 ranks
    assert "| 2 | 1.60 | 1.80 | 3.20 | 3.60 | 2.00 | 1.60 | 1.80 | 3.20 | 3.60 | 2.00 |" in md
    assert "| 2 | 1x1x1x2 | 8x8x8x4 | stream_gated+graph |" in md
    assert "these ranks share one GPU" in md and "all of them ran under MPS" in md and "777" in md
    names = [p.rsplit("/", 1)[-1] for p in out["plots"]]
    assert names == ["time_vs_ranks.png", "speedup_efficiency.png", "phases.png", "transport_ratios.png",
                     "stream_gated_gain.png"]                          # no halo op: no latency sweep
    loaded = load_study(study.path)
    d = [r for r in loaded["configs"] if r["key"] == "l8x8x8x8_n2_stream_gated_graph"][0]["ops"]["dslash"]
    assert d["phase_names"] == list(GPU_PHASES) and d["phases_host"].shape == (2, 8)
    with h5py.File(study.path, "r") as f:
        g = f["configs"]["l8x8x8x8_n4_stream_gated"]
        assert bool(g.attrs["answers_agree"]) and np.isclose(g["dslash"].attrs["speedup"], 1.0 / 0.25)
        assert f["configs"]["l8x8x8x8_n4_stream_gated_graph"].attrs["graph"]
        assert "device events" in g["dslash"]["phases"].attrs["clock"]


# ------------------------------------------------------------------------------------------------------------
def test_report_names_the_study_hooks():
    from bench.scaling.report import hooks_text

    text = hooks_text({"env_hooks": {"HMC_P2P_MASK": "8", "HMC_P2P_FAKE_CLIQUE": "2", "HMC_COMMS_TIMEOUT": "30"}})
    assert "`HMC_P2P_MASK=8`" in text and "`HMC_P2P_FAKE_CLIQUE=2`" in text and "TIMEOUT" not in text
    assert hooks_text({"env_hooks": {"HMC_P2P_MASK": "0", "HMC_COMMS_TIMEOUT": "30"}}) == hooks_text({}) == ""


def test_workers_rebuild_the_drivers_configuration():
    """The workers' environment carries the driver's run configuration (RunConfig.to_env()) less the grid, the
    partition and the transport, which each configuration's spec states; the worker's constructor rebuilds it."""
    import dataclasses

    from bench.scaling.launch import worker_env
    from comms.config import RunConfig

    cfg = RunConfig.resolve(cli={"grid": (1, 1, 1, 2), "transport": "shm"},
                            env={"HMC_P2P_MASK": "8", "HMC_COMMS_TIMEOUT": "7.5", "HMC_PARTITION": "t",
                                 "HMC_FAULT_INJECT": "scaling_fail:n2", "HMC_SCALING_TRACEBACK": "1"})
    env = worker_env(cfg, 3)
    got = RunConfig.resolve(env=env)
    assert got == dataclasses.replace(cfg, grid=None, partition="", transport=None)
    assert (got.p2p_mask, got.comms_timeout, got.fault_inject, got.scaling_traceback) == (8, 7.5, "scaling_fail:n2",
                                                                                          True)
    assert env["OMP_NUM_THREADS"] == "3" and env["PYTHONUNBUFFERED"] == "1"


def _keeping_figures(real_plt, figures):
    """pyplot, keeping each figure it makes in ``figures`` for the test to read."""
    class KeepFigures:
        def __getattr__(self, name):
            return getattr(real_plt, name)

        def subplots(self, *a, **k):
            fig, axes = real_plt.subplots(*a, **k)
            figures.append(fig)
            return fig, axes

    return KeepFigures


def test_speedup_legend_names_the_ideal_line_it_draws(tmp_path):
    """The speed-up panel's dotted line is the ideal n (not 1/n, which is the time plot's): its legend says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as real_plt

    from bench.scaling import plots

    lat = (4, 4, 4, 8)
    configs = [{"lattice": lat, "ranks": n, "status": "ok", "label": label, "transport": label,
                "ops": {"dslash": {"median_s": t, "min_s": t, "max_s": t}}}
               for n, label, t in ((1, "serial", 1.0), (2, "mpi", 0.6), (4, "mpi", 0.4))]
    figures = []
    KeepFigures = _keeping_figures(real_plt, figures)

    plots.plot_speedup({"configs": configs}, tmp_path / "s.png", KeepFigures())
    texts = [t.get_text() for lg in figures[0].legends for t in lg.get_texts()]
    assert "ideal n" in texts and "ideal 1/n" not in texts
    figures.clear()
    plots.plot_time({"configs": configs}, tmp_path / "t.png", KeepFigures())
    assert "ideal 1/n" in [t.get_text() for lg in figures[0].legends for t in lg.get_texts()]


def test_halo_axis_labels_and_ratio_headroom(tmp_path):
    """Issue 20's plot points: a halo panel spanning less than a decade (100-250 us) labels more than 100 and 200
    inside its range, and the transport-ratio panel's top lies above its highest point (nothing clipped)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as real_plt

    from bench.scaling import plots

    lat = (4, 4, 4, 8)
    times = {(1, "mpi"): 1.0e-4, (2, "mpi"): 1.3e-4, (4, "mpi"): 1.6e-4,
             (2, "shm"): 2.4e-4, (4, "shm"): 2.5e-4}
    configs = [{"lattice": lat, "ranks": n, "status": "ok", "label": label, "transport": label,
                "ops": {"halo": {"median_s": t, "min_s": t, "max_s": t}}} for (n, label), t in times.items()]
    figures = []
    KeepFigures = _keeping_figures(real_plt, figures)

    plots.plot_time({"configs": configs}, tmp_path / "t.png", KeepFigures())
    ax = figures[0].axes[0]
    lo, hi = ax.get_ylim()
    labels = [t.get_text() for t, v in zip(ax.get_yticklabels(), ax.get_yticks()) if lo <= v <= hi and t.get_text()]
    assert len(labels) >= 3, labels                                   # 100, 200 and at least one more
    figures.clear()
    assert plots.plot_ratios({"configs": configs}, tmp_path / "r.png", KeepFigures())
    ax = figures[0].axes[0]
    top = max(np.max(line.get_ydata()) for line in ax.get_lines() if len(line.get_ydata()) > 1)
    assert ax.get_ylim()[1] >= 1.03 * top, (ax.get_ylim(), top)
