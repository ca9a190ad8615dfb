"""``hmc info``: what a run file holds and how to continue it."""
from __future__ import annotations

import json
import math

import numpy as np

from . import runfile
from .assemble import make_monomials, make_schedule
from .integrators import describe, force_evaluations


def blocked_mean(x: np.ndarray, nblocks: int = 10) -> tuple[float, float | None]:
    """Mean and its error from ``nblocks`` consecutive blocks (which absorbs autocorrelations shorter than a
    block); the plain standard error when there are fewer values than blocks; no error (None) from one value."""
    x = np.asarray(x, dtype=float)
    if len(x) < 2:
        return float(x.mean()), None
    if len(x) < 2 * nblocks:
        return float(x.mean()), float(x.std(ddof=1) / np.sqrt(len(x)))
    n = len(x) // nblocks * nblocks
    b = x[len(x) - n:].reshape(nblocks, -1).mean(axis=1)
    return float(x.mean()), float(b.std(ddof=1) / np.sqrt(nblocks))


def info(path: str, as_json: bool = False, schedule: bool = False) -> str:
    st = runfile.load(path)
    d = st.deck
    hist = st.history
    summary = {
        "file": path, "name": d["run"]["name"], "lattice": d["lattice"]["dims"], "grid": d["lattice"]["grid"],
        "gauge": d["gauge"], "integrator": d["integrator"], "seed": d["run"]["seed"], "source": st.source,
        "trajectories_done": st.trajectory, "trajectories_planned": d["run"]["trajectories"],
        "config": None if st.config is None else st.config.to_record(),
        "format_version": st.format_version,
    }
    measured = [r for r in hist if not r["warmup"]]
    if measured:
        acc = np.array([r["accepted"] for r in measured], dtype=float)
        emdh = np.array([r["exp_mdH"] for r in measured])
        plaq = np.array([(r["plaq_ss"] + r["plaq_st"]) / 6.0 for r in measured])
        mean, err = blocked_mean(plaq)
        summary.update({
            "plaquette_mean": mean, "plaquette_err": err, "measured_trajectories": len(measured),
            "acceptance": float(acc.mean()),
            "exp_mdH_mean": float(emdh.mean()),
            "exp_mdH_err": float(emdh.std(ddof=1) / np.sqrt(len(emdh))) if len(emdh) > 1 else None,
            "last_plaquette": float(plaq[-1]),
        })
    if as_json:
        summary["history"] = hist
        if schedule:
            sch = make_schedule(d, make_monomials(d, st.files))
            summary["schedule"] = {"force_evaluations": force_evaluations(sch),
                                   "operations": describe(sch).splitlines()}
        return json.dumps(_finite(summary), indent=2, allow_nan=False)
    lines = [f"{path}: {d['run']['name']}",
             f"  lattice {'x'.join(map(str, d['lattice']['dims']))}, grid {'x'.join(map(str, d['lattice']['grid']))},"
             f" start: {st.source}",
             f"  gauge: {d['gauge']}",
             f"  integrator: {d['integrator']['scheme']}, steps {d['integrator']['steps']}, tau {d['integrator']['tau']}",
             f"  trajectories: {st.trajectory} done of {d['run']['trajectories']} planned",
             "  run configuration: " + (st.config.describe() if st.config is not None else "not recorded")]
    if st.format_version < runfile.FORMAT_VERSION:
        lines.append(f"  run-file format version {st.format_version} (an older hmc's layout; files without a version "
                     f"are version 1): readable, rewritten as version {runfile.FORMAT_VERSION} by the next hmc run")
    if measured:
        lines.append(f"  acceptance {summary['acceptance']:.3f}, <exp(-dH)> = {summary['exp_mdH_mean']:.4f}"
                     + (f" +- {summary['exp_mdH_err']:.4f}" if summary["exp_mdH_err"] is not None else "")
                     + f", last plaquette (ReTr/3) {summary['last_plaquette']:.8f}")
        lines.append(f"  <plaquette> (ReTr/3, {len(measured)} trajectories after {len(hist) - len(measured)} warmups) "
                     f"= {summary['plaquette_mean']:.6f}"
                     + (f" +- {summary['plaquette_err']:.6f}" if summary["plaquette_err"] is not None else ""))
    if hist:
        lines.append("  traj  acc        dH      plaq_ss      plaq_st")
        for r in hist[-10:]:
            lines.append(f"  {r['traj']:4d}  {r['accepted']:3d}  {r['dH']:+.2e}  {r['plaq_ss']:.8f}  {r['plaq_st']:.8f}")
    left = d["run"]["trajectories"] - st.trajectory
    lines.append(f"  continue: hmc run {path}" + ("" if left > 0 else " --trajectories N"))
    if schedule:
        mon = make_monomials(d, st.files)
        sch = make_schedule(d, mon)
        lines.append(f"  schedule ({force_evaluations(sch)} force evaluations):")
        lines += ["    " + l for l in describe(sch).splitlines()]
    return "\n".join(lines)


def _finite(x):
    """``x`` with every non-finite float (an exp(-dH) that overflowed, a missing error) as None: JSON has no NaN."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
