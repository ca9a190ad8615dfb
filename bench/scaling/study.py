"""``hmc scaling``: a strong-scaling study as one command (docs/architecture.md "Command line", docs/halo-protocol.md "What to measure").

    hmc scaling --lattice 16 16 16 16 --ranks 1 2 4 8 --transports mpi shm --what halo,dslash,cg -o study.h5
    hmc --backend cupy scaling --lattice 16^4 --ranks 1 2 4 --transports mpi event stream_gated --graph --mps ...
    hmc --backend cupy scaling --lattice 32^4 --ranks 1 2 4 8 --transports event stream_gated --what rhmc ...
    hmc scaling report study.h5 [-o DIR]

For every lattice, the study runs one 1-rank configuration (the serial baseline and the reference answers; no halo,
so no transport) and then every (rank count, transport). Each configuration is one launch of
:mod:`bench.scaling.worker` under the launcher (``--launcher``, else ``$HMC_MPIEXEC``, else ``mpiexec``; ``{n}`` in
it is replaced by the rank count, and without ``{n}``, ``-n N`` is appended), with a wall-clock limit
(``--timeout``). The process grid is chosen as ``comms.choose_grid`` does it; a rank count that cannot split the
lattice into even local extents is recorded as *skipped* with the reason; ``--grid PXxPYxPZxPT`` gives a process grid
explicitly (it replaces the automatic one of its rank count and is launched as given: one that cannot split the
lattice fails in the worker and is recorded as failed). A configuration that fails or times out
is recorded as *failed* with its error, and the study goes on. Every result is stored at once in the HDF5 file
(written to a temporary copy and renamed: an interrupted study leaves a valid file), and ``--resume`` skips what the
file already holds (failed configurations are tried again).

GPU studies (``--backend cupy``, transports ``event`` / ``stream_gated`` / ``mpi``): the dslash, CG and halo go
through :mod:`solvers.staggered_dist_cuda` (DslashRunner, the production CG, the distributed hop's face exchange), timed with
device events, the phase split from device events (see :mod:`bench.scaling.worker`). ``--graph`` adds a row per
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

import json
import os
from lattice.io.common import durable_replace, temporary_name
import shutil

import numpy as np

from .common import FORMAT, PHASE_NAMES, ScalingError, lat_name
from .launch import _now
from .plan import Config


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
            if k == "cg_residual" and not bitwise:
                # on a GPU the fast-sum CG adds its partials in another order per decomposition, and 200 fixed CG
                # iterations on random links amplify that rounding: on the H200 (8x8x8x16, 2 ranks) 6.3e-4, the same
                # bits with and without peer sums and CUDA graphs, so a loose bound (a wrong sum moves it by O(1))
                tol = GPU_CG_RESIDUAL_RTOL
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
GPU_CG_RESIDUAL_RTOL = 1e-2


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
        ds.attrs["note"] = ("bench.halo.bench_halo: ring of the ranks along t, faces of L^3 sites; best of the "
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


