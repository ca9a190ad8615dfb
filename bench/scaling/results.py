"""A strong-scaling study read back from its HDF5 file (:func:`load_study`) and what the report and the plots both
ask of it: the lattices and labels, the 1-rank baseline, phase fractions and shares, the transport pairs of the
stream-gated gain, the titles, labels and colours."""
from __future__ import annotations

import json
import os

import numpy as np

from comms.halo import FALLBACK
from comms.transport import registry

from .common import FORMAT, PHASE_NAMES, ScalingError


OP_TITLES = {"halo": "halo exchange", "dslash": "dslash (one parity)", "cg": "CG iteration",
             "trajectory": "gauge trajectory", "rhmc": "RHMC trajectory (HISQ 2+1+1)"}
SCALED_OPS = ("dslash", "cg", "trajectory", "rhmc")       # the operations with a speed-up and efficiency
PHASE_LABELS = {"halo_start": "halo start (pack, send)", "halo_wait": "halo wait (signal / MPI)",
                "halo_finish": "halo finish (unpack, MPI tests)", "local_shift": "local shifts (roll)",
                "reductions": "global reductions (GPU: with the CG vector updates)", "compute": "compute",
                # GPU (device events)
                "pack": "pack (kernel)", "post": "post (transfer + signal enqueued)",
                "interior": "interior kernel", "wait": "wait (transfer, signal/wait, unpack)",
                "exterior": "exterior kernel", "graph": "graph replay (device)", "host_overhead": "host overhead",
                # RHMC trajectory (its own timers, host clock)
                "solver_gr": "solves: heat bath (GR)", "solver_fa": "solves: actions (FA)",
                "solver_md": "solves: force (MD)", "fermion_links": "fermion link smearing",
                "fermion_force": "fermion force (outer products, chain rule)", "gauge_force": "gauge force",
                "link_update": "link updates", "other": "other (momenta, actions, Metropolis)"}
PHASE_COLOURS = {"halo_start": "#4C72B0", "halo_wait": "#DD8452", "halo_finish": "#8172B3",
                 "local_shift": "#937860", "reductions": "#C44E52", "compute": "#55A868",
                 "pack": "#4C72B0", "post": "#64B5CD", "interior": "#55A868", "wait": "#DD8452",
                 "exterior": "#8C8C3C", "graph": "#8172B3", "host_overhead": "#B0B0B0",
                 "solver_gr": "#9ECAE1", "solver_fa": "#4292C6", "solver_md": "#08519C", "fermion_links": "#FDAE6B",
                 "fermion_force": "#E6550D", "gauge_force": "#74C476", "link_update": "#31A354", "other": "#BDBDBD"}
GPU_PHASE_ORDER = ("pack", "post", "interior", "wait", "exterior", "reductions", "graph", "host_overhead")
RHMC_PHASE_ORDER = ("solver_gr", "solver_fa", "solver_md", "fermion_links", "fermion_force", "gauge_force",
                    "link_update", "other")
HALO_PHASES = ("halo_start", "halo_wait", "halo_finish", "pack", "post", "wait")
COLOURS = {"serial": "black", "mpi": "tab:blue", "shm": "tab:orange", "event": "tab:green",
           "stream_gated": "tab:red", "stream_gated+graph": "tab:purple"}
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")


# ------------------------------------------------------------------------------------------------------------
# reading

def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def load_study(path) -> dict:
    import h5py

    if not os.path.exists(path):
        raise FileNotFoundError(f"no results file {path}")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ScalingError(f"cannot read {path}: {e}") from None
    with f:
        if _s(f.attrs.get("format")) != FORMAT:
            raise ScalingError(f"{path} is not a results file of hmc scaling")
        meta = {k: _s(v) for k, v in f.attrs.items()}
        for k in ("machine", "parameters", "transport_table", "versions", "env_hooks", "mps"):
            if isinstance(meta.get(k), str) and meta[k]:
                meta[k] = json.loads(meta[k])
        configs = []
        for key, g in f["configs"].items():
            rec = {k: _s(v) for k, v in g.attrs.items()}
            rec["key"] = key
            rec["lattice"] = tuple(int(x) for x in g.attrs["lattice"])
            rec["ranks"] = int(g.attrs["ranks"])
            rec["answers"] = json.loads(rec.get("answers") or "{}")
            for k in ("transport_table", "transport_table_text"):
                rec[k] = _s(g[k][()]) if k in g else ""
            rec["ops"] = {}
            for op in OP_TITLES:
                if op in g and g[op].attrs.get("status") == "ok":
                    og = g[op]
                    d = {k: _s(v) for k, v in og.attrs.items()}
                    d["samples"] = og["samples_s"][()]
                    d["phases"] = og["phases"][()] if "phases" in og else None
                    d["phase_names"] = ([_s(x) for x in og["phases"].attrs["names"]] if "phases" in og
                                        and "names" in og["phases"].attrs else list(PHASE_NAMES))
                    d["phases_host"] = og["phases_host"][()] if "phases_host" in og else None
                    rec["ops"][op] = d
            rec["latency"] = g["latency"][()] if "latency" in g else None
            configs.append(rec)
    order = {t: i for i, t in enumerate(["serial"] + [n + g for n in registry.names() for g in ("", "+graph")])}
    configs.sort(key=lambda r: (r["lattice"], r["ranks"], order.get(r["label"], 99), r["label"]))
    return {"meta": meta, "configs": configs, "path": str(path)}


def lattices_of(study) -> list:
    out = []
    for r in study["configs"]:
        if r["lattice"] not in out:
            out.append(r["lattice"])
    return out


def baseline(study, lat, op):
    for r in study["configs"]:
        if r["lattice"] == lat and r["transport"] == "serial" and op in r["ops"]:
            return r["ops"][op]["median_s"]
    return None


def phase_fractions(d) -> dict | None:
    """Mean over ranks of each phase's share of the instrumented time."""
    ph = d.get("phases")
    if ph is None or len(ph) == 0:
        return None
    ph = np.asarray(ph, dtype=float)
    tot = ph.sum(axis=1, keepdims=True)
    tot[tot == 0] = 1.0
    frac = (ph / tot).mean(axis=0)
    return dict(zip(d.get("phase_names") or PHASE_NAMES, frac))


def solver_share(d) -> float | None:
    """The share of the multishift solves (GR, FA, MD) in an RHMC trajectory."""
    fr = phase_fractions(d)
    if fr is None:
        return None
    return sum(fr.get(p, 0.0) for p in ("solver_gr", "solver_fa", "solver_md"))


def halo_share(d) -> float | None:
    """The share of the halo phases (CPU: start, wait, finish; GPU: pack, post, wait)."""
    fr = phase_fractions(d)
    if fr is None:
        return None
    return sum(fr.get(p, 0.0) for p in HALO_PHASES)


def phase_order(study, op) -> list:
    """The phase names of ``op`` over the study, CPU names first, then the GPU ones, each in its fixed order."""
    seen = set()
    for r in study["configs"]:
        d = r["ops"].get(op)
        if d and d.get("phases") is not None:
            seen.update(d.get("phase_names") or PHASE_NAMES)
    gpu = bool(seen & {"pack", "interior", "graph"})
    order = GPU_PHASE_ORDER + tuple(PHASE_NAMES) if gpu else tuple(PHASE_NAMES) + GPU_PHASE_ORDER
    return [p for p in dict.fromkeys(RHMC_PHASE_ORDER + order) if p in seen]


def labels_of(study) -> list:
    out = []
    for r in study["configs"]:
        if r["label"] != "serial" and r["label"] not in out:
            out.append(r["label"])
    return out



def gain_pairs(labels) -> list:
    """(slower, faster) label pairs of the stream-gated gain: the host-driven GPU transports and mpi (event, mpi)
    over each transport with no host in the loop (stream_gated) and over its graph replays, and that transport over
    its graph replays; only pairs whose labels are in the study. The roles come from the registered capabilities."""
    driven = registry.with_capabilities(gpu_buffers=True, host_driven=True) + (FALLBACK,)
    out = []
    for t in registry.with_capabilities(host_driven=False):
        gated = (t, t + "+graph")
        for g in gated:
            if g in labels:
                out += [(o, g) for o in driven if o in labels]
        if all(g in labels for g in gated):
            out.append(gated)
    return out


