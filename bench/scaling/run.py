"""Running a study: the planned configurations launched one after the other, each stored at once, with the
CUDA MPS daemon started, polled and stopped around them when asked; then the report."""
from __future__ import annotations

import os
import shlex
import sys
import time

import numpy as np

from .common import MEASUREMENT_KEYS, ScalingError, gpu_transports, lat_name, parse_grids, \
    parse_lattices, parse_what, transport_notes
from .launch import Launcher, git_info, launch, machine_info, versions, worker_env, _now
from .plan import _gpu_visible, check_transports, plan
from .study import Study
from .worker_context import RHMC_TAU


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
    config = args.run_config
    # a backend the command line or the environment states, else the one the transports need
    backend = config.backend if "backend" in config.stated else ("cupy" if set(transports) & set(gpu_transports())
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
    launcher = Launcher(args.launcher, config.mpiexec)
    todo = [c for c in configs if c.skip is None and done.get(c.key) not in ("ok",)]
    if todo:
        launcher.check(worker_env(config, args.threads))
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
    config = args.run_config
    git = git_info(config)
    machine = machine_info()
    header = {"git_commit": git["commit"], "git_dirty": git["dirty"], "machine": machine,
              "launcher": launcher.text, "launcher_version": launcher.version, "versions": versions(),
              "parameters": params,
              "transport_table": {t: transport_notes(t) for t in ["serial"] + transports},
              "env_hooks": {k: v for k, v in config.changed().items()
                            if k in ("HMC_P2P_MASK", "HMC_P2P_FAKE_CLIQUE", "HMC_COMMS_TIMEOUT")},
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
    env = mps.env(worker_env(config, args.threads))
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
        from .report import write_report

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

