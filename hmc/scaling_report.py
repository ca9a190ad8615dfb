"""``hmc scaling report STUDY.h5``: the Markdown report and PNG plots of a strong-scaling study (hmc.scaling).

Files written into the report folder (default: ``STUDY_report`` beside the results file):

* ``report.md``: machine, commit, method; per lattice a table (grid, local volume, transport, median times with
  their spread, GFLOP/s, speed-up and parallel efficiency against the 1-rank run, the halo share of the dslash,
  whether the answers agree with the 1-rank run; for the RHMC trajectory its speed-up, efficiency and the share of
  its multishift solves); the time ratios between transports at each point (and the
  stream-gated gain against ``event`` and ``mpi`` when those ran); failed and skipped configurations;
* ``time_vs_ranks.png``: time per operation against the rank count, one line per lattice and transport, with the
  spread over repeats and the ideal 1/n line from the 1-rank run;
* ``speedup_efficiency.png``: speed-up and parallel efficiency against the rank count;
* ``phases.png``: where the time goes (stacked bars per configuration; CPU, host clock: halo start/wait/finish,
  local shifts, reductions, compute; GPU, device events: pack, post, interior, wait, exterior, reductions, graph
  replay, host overhead; RHMC trajectory, its own timers: solves GR/FA/MD, fermion links, fermion force, gauge
  force, link updates, other);
* ``transport_ratios.png``: time of each transport over the time of ``mpi`` against the rank count;
* ``stream_gated_gain.png``: T(event)/T(stream_gated) and T(mpi)/T(stream_gated) against the rank count (and for
  the CUDA-graph rows, of the graph replays and stream_gated over its replays);
* ``latency.png``: one-way and round-trip halo latency against the message size (the latency sweep).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .scaling import FORMAT, PHASE_NAMES, ScalingError, lat_name

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
    order = {t: i for i, t in enumerate(["serial", "mpi", "shm", "event", "stream_gated", "stream_gated+graph"])}
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


# ------------------------------------------------------------------------------------------------------------
# text

def _t(s, unit) -> str:
    if s is None or not np.isfinite(s):
        return "-"
    return f"{s * {'us': 1e6, 'ms': 1e3, 's': 1.0}[unit]:.{3 if unit == 's' else 2}f}"


def _med(d, unit) -> str:
    if d is None:
        return "-"
    m = d["median_s"]
    spread = (d["max_s"] - d["min_s"]) / 2 / m * 100 if m > 0 else 0.0
    return f"{_t(m, unit)} ±{spread:.0f}%"


def _unit(values) -> str:
    v = [x for x in values if x is not None and np.isfinite(x)]
    if not v:
        return "ms"
    m = max(v)
    return "us" if m < 1e-3 else ("ms" if m < 2.0 else "s")


def notes(study) -> list:
    meta, out = study["meta"], []
    machine = meta.get("machine") or {}
    ncores = machine.get("cores")
    over = sorted({r["ranks"] for r in study["configs"] if r.get("oversubscribed") and r["status"] == "ok"})
    if over:
        out.append(f"this machine has {ncores} cores: the runs on {', '.join(map(str, over))} ranks oversubscribe "
                   "them (ranks time-slice the cores), so those times measure the sharing as much as the scaling")
    loads = [max(r["loadavg"]) for r in study["configs"] if r.get("loadavg") is not None and len(r["loadavg"])]
    if loads and ncores and max(loads) > ncores:
        out.append(f"the machine was busy during the study (1-minute load average up to {max(loads):.1f} on "
                   f"{ncores} cores): other work competed for the cores, so the times are noisy; the medians and "
                   "spreads over repeats show how much")
    out += gpu_sharing_notes(study)
    fell = [r for r in study["configs"] if r.get("gpu_path_error")]
    if fell:
        what = "; ".join(f"{lat_name(r['lattice'])} {r['ranks']} {r['label']}: {r['gpu_path_error']}" for r in fell)
        out.append(f"on {len(fell)} configuration(s) the device path (solvers.staggered_dist_cuda) failed and the "
                   f"host-driven path was timed instead: {what}")
    if str(meta.get("git_dirty")) in ("True", "1", "true"):
        out.append("the working tree had uncommitted changes when the study ran (commit "
                   f"{str(meta.get('git_commit', ''))[:10]} plus edits)")
    return out


def _gpu_count(machine) -> int | None:
    text = str(machine.get("gpu") or "")
    head = text.split(" x ", 1)[0].strip()
    return int(head) if head.isdigit() else None


def _mps_text(meta) -> str:
    mps = meta.get("mps") or {}
    servers = mps.get("servers") or []
    srv = f"; MPS server process {', '.join(map(str, servers))}" if servers else ""
    return f"the CUDA MPS control daemon was started by hmc scaling --mps for the study and stopped after it{srv}"


def gpu_sharing_notes(study) -> list:
    """Whether the GPU ranks shared one GPU, and whether MPS served them (per configuration, from the file)."""
    meta, out = study["meta"], []
    machine = meta.get("machine") or {}
    mps = meta.get("mps") or {}
    multi = [r for r in study["configs"] if r.get("backend") == "cupy" and r["status"] == "ok" and r["ranks"] > 1]
    ran_mps = [r for r in study["configs"] if str(r.get("mps")) == "True" and r["status"] == "ok"]
    if multi:
        n_gpu = _gpu_count(machine)
        gpus = machine.get("gpu") or str(multi[0].get("gpu") or "GPU")
        shared = sorted({r["ranks"] for r in multi if n_gpu is None or r["ranks"] > n_gpu})
        if shared:
            where = ("these ranks share one GPU" if n_gpu == 1 else
                     "where ranks outnumber GPUs, these ranks share one GPU")
            text = (f"the GPU runs on {', '.join(map(str, shared))} ranks put all their ranks on {gpus}: {where}, "
                    "so the times show the transports' latency and the cost of sharing, not more GPUs")
            under = [r for r in multi if str(r.get("mps")) == "True"]
            if len(under) == len(multi):
                text += f"; all of them ran under MPS ({_mps_text(meta)}), so the ranks' kernels run concurrently"
            elif under:
                text += (f"; {len(under)} of {len(multi)} ran under MPS ({_mps_text(meta)}), the others time-sliced "
                         "the GPU")
            elif "mps" not in meta:
                text += "; whether MPS served them is not recorded in this file (a study made before --mps)"
            else:
                text += ("; without MPS: the ranks time-slice the GPU, and every dependency between ranks costs "
                         "about 140 us on an H200 whatever the transport (COMMS.md, 'Several ranks on one GPU'); "
                         "rerun with --mps")
            out.append(text)
    elif ran_mps or mps.get("ran"):
        out.append(f"MPS: {_mps_text(meta)}; it matters only for GPU ranks sharing a GPU (this study has none)")
    return out


def hooks_text(meta) -> str:
    """The study hooks the whole study ran under (COMMS.md 'Study hooks'), from the file's ``env_hooks``; empty when
    none was set."""
    env = meta.get("env_hooks") or {}
    what = {"HMC_P2P_FAKE_CLIQUE": "links between cliques of that many consecutive ranks treated as unreachable: they "
                                   "fall back to MPI", "HMC_P2P_MASK": "peer-to-peer off in the masked dimensions "
                                   "(bits x=1, y=2, z=4, t=8): those links fall back to MPI"}
    parts = [f"`{k}={env[k]}` ({v})" for k, v in what.items() if str(env.get(k, "0")).strip() not in ("", "0")]
    return ("Study hooks set for every configuration: " + "; ".join(parts) + ". The resolved transport tables below "
            "show each link's transport.") if parts else ""


def rhmc_text(study) -> str:
    """What the rhmc operation is, with its integrator and the CG work of the 1-rank run (from the file)."""
    params = study["meta"].get("parameters") or {}
    d = next((r["ops"]["rhmc"] for r in study["configs"] if "rhmc" in r["ops"]), {})
    iters = d.get("cg_iterations")
    if isinstance(iters, str) and iters:
        iters = json.loads(iters)
    work = (f"; multishift CG iterations per trajectory GR {iters['gr']}, FA {iters['fa']}, MD {iters['md']}"
            if isinstance(iters, dict) else "")
    return (f"The RHMC trajectory is one HISQ 2+1+1 trajectory (ml/ms/mc 0.013/0.065/0.838, 5 pseudofermions of "
            f"runs/rationals/rationals.hisq211_b580; Symanzik beta 5.8 with the HISQ quark loops), 3G1F with "
            f"{d.get('steps', params.get('traj_steps', '?'))} steps, tau {d.get('tau', params.get('rhmc_tau', '?'))}, "
            f"tolerances MD 1e-8, FA/GR 1e-10, from a random near-unit start, Metropolis off{work}. One trajectory "
            "per timed loop; its phases are the trajectory's own timers (host clock: the solves of the heat bath, "
            "the actions and the force, the fermion link smearing, the fermion force without its solves, the gauge "
            "force, the link updates, the rest). Answers: H at the end and dH to 1e-10 of H, the plaquette to "
            "1e-12, the multishift CG iterations equal (GPU: within 2 + 1 %).")


def markdown(study, plots: list) -> str:
    meta = study["meta"]
    machine = meta.get("machine") or {}
    params = meta.get("parameters") or {}
    lats = lattices_of(study)
    lines = [f"# Strong-scaling study: {', '.join(lat_name(l) for l in lats)}", ""]
    lines.append(f"Measured {str(meta.get('created', ''))[:19].replace('T', ' ')} to "
                 f"{str(meta.get('updated', meta.get('created', '')))[:19].replace('T', ' ')} on "
                 f"`{machine.get('hostname', '?')}`: {machine.get('cpu') or 'CPU'} ({machine.get('cores', '?')} "
                 f"cores, {machine.get('memory_GiB', '?')} GiB), GPU: {machine.get('gpu', 'none')}"
                 f"{' (driver ' + machine['gpu_driver'] + ')' if machine.get('gpu_driver') else ''}. "
                 f"Launcher `{meta.get('launcher', '')}` ({meta.get('launcher_version', '')}). Commit "
                 f"`{str(meta.get('git_commit', ''))[:10]}`"
                 f"{' (modified)' if str(meta.get('git_dirty')) == 'True' else ''}"
                 f". Backend {params.get('backend', '?')}, {params.get('threads', 1)} thread(s) per rank.")
    if meta.get("command"):
        lines += ["", f"Command: `{meta['command']}`"]
    hooks = hooks_text(meta)
    if hooks:
        lines += ["", hooks]
    lines.append("")
    tt = meta.get("transport_table") or {}
    if tt:
        lines += ["| transport | data | completion signal | host in the loop? |", "| --- | --- | --- | --- |"]
        for t, d in tt.items():
            lines.append(f"| `{t}` | {d['data']} | {d['signal']} | {d['host_in_loop']} |")
        lines.append("")
    what = params.get("what", [])
    described = {
        "dslash": "the dslash is one parity of the HISQ operator (16 hops)",
        "cg": (f"the CG iteration is on the even-odd normal operator at m = {params.get('mass', '?')}, "
               f"{params.get('cg_iters', '?')} iterations per solve, the set-up amortized"),
        "halo": ("the halo exchange is one depth-3 exchange (less where the local extent is smaller) of a "
                 "colour-vector field over all partitioned dimensions"),
        "trajectory": "the trajectory is one pure-gauge HMC trajectory (Symanzik, Omelyan)",
    }
    ran = "; ".join(described[op] for op in what if op in described)
    lines.append(f"Operations: {', '.join(what)}. Each time is the median over {params.get('repeats', '?')} timed "
                 f"loops (± half the spread max-min over loops, in % of the median) of the slowest rank's time per "
                 f"operation; a loop lasts at least {params.get('min_time', '?')} s."
                 + (f" {ran[0].upper()}{ran[1:]}." if ran else "")
                 + " Speed-up and efficiency are against the 1-rank run (no halo) of the same lattice: "
                   "speed-up = T(1)/T(n), efficiency = speed-up/n.")
    if "rhmc" in what:
        lines.append("")
        lines.append(rhmc_text(study))
    lines.append("")
    for n in notes(study):
        lines.append(f"> Note: {n}.")
        lines.append("")
    for lat in lats:
        rows = [r for r in study["configs"] if r["lattice"] == lat]
        lines += [f"## {lat_name(lat)}", ""]
        ok = [r for r in rows if r["status"] == "ok"]
        hu = _unit([r["ops"]["halo"]["median_s"] for r in ok if "halo" in r["ops"]])
        du = _unit([r["ops"]["dslash"]["median_s"] for r in ok if "dslash" in r["ops"]])
        cu = _unit([r["ops"]["cg"]["median_s"] for r in ok if "cg" in r["ops"]])
        tu = _unit([r["ops"]["trajectory"]["median_s"] for r in ok if "trajectory" in r["ops"]])
        ru = _unit([r["ops"]["rhmc"]["median_s"] for r in ok if "rhmc" in r["ops"]])
        cols = ["ranks", "grid", "local", "transport", "links"]
        have = {op: any(op in r["ops"] for r in ok) for op in OP_TITLES}
        if have["halo"]:
            cols.append(f"halo {hu}")
        if have["dslash"]:
            cols += [f"dslash {du}", "GFLOP/s", "speed-up", "efficiency", "halo share"]
        if have["cg"]:
            cols += [f"CG it. {cu}", "CG speed-up", "CG eff."]
        if have["trajectory"]:
            cols += [f"trajectory {tu}", "traj. eff."]
        if have["rhmc"]:
            cols += [f"RHMC traj. {ru}", "RHMC speed-up", "RHMC eff.", "RHMC solver share"]
        cols += ["answers agree"]
        lines += ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
        for r in rows:
            if r["status"] != "ok":
                continue
            over = "*" if r.get("oversubscribed") else ""
            cells = [f"{r['ranks']}{over}", lat_name(r["grid"]), lat_name(r["local_dims"]), r["label"],
                     r.get("links") or "-"]
            ops = r["ops"]
            if have["halo"]:
                cells.append(_med(ops.get("halo"), hu))
            for op, unit, extra in (("dslash", du, True), ("cg", cu, False), ("trajectory", tu, False),
                                    ("rhmc", ru, False)):
                if not have[op]:
                    continue
                d = ops.get(op)
                cells.append(_med(d, unit))
                base = baseline(study, lat, op)
                sp = base / d["median_s"] if (d and base) else None
                if op == "dslash":
                    cells.append(f"{d['flops'] / d['median_s'] / 1e9:.2f}" if d and "flops" in d else "-")
                if op != "trajectory":
                    cells.append(f"{sp:.2f}" if sp else "-")
                cells.append(f"{sp / r['ranks']:.2f}" if sp else "-")
                if extra:
                    hs = halo_share(d) if d else None
                    cells.append(f"{100 * hs:.0f}%" if hs is not None and r["ranks"] > 1 else "-")
                if op == "rhmc":
                    ss = solver_share(d) if d else None
                    cells.append(f"{100 * ss:.0f}%" if ss is not None else "-")
            agree = r.get("answers_agree")
            cells.append(("yes" if str(agree) == "True" else "**no**") + ("" if str(agree) == "True" else
                                                                          f" ({r.get('answers_note', '')})"))
            lines.append("| " + " | ".join(cells) + " |")
        if any(r.get("oversubscribed") for r in ok):
            lines.append("")
            lines.append("\\* more ranks than cores (oversubscribed).")
        lines.append("")
        ratio = ratio_rows(study, lat)
        if ratio:
            lines += ratio
            lines.append("")
    bad = [r for r in study["configs"] if r["status"] != "ok"]
    if bad:
        lines += ["## Failed and skipped configurations", ""]
        for r in bad:
            why = r.get("error") or r.get("note") or ""
            lines.append(f"- {lat_name(r['lattice'])}, {r['ranks']} ranks, {r['label']}: **{r['status']}**: {why}")
        lines.append("")
    if plots:
        lines += ["## Plots", ""]
        for p in plots:
            name = Path(p).name
            lines += [f"![{name}]({name})", ""]
    tables = [r for r in study["configs"] if r["status"] == "ok" and r.get("transport_table_text")]
    if tables:
        lines += ["## Resolved transport tables", "", "```"]
        seen = set()
        for r in tables:
            t = r["transport_table_text"]
            if (r["label"], r["ranks"], t) in seen:
                continue
            seen.add((r["label"], r["ranks"], t))
            lines.append(f"{lat_name(r['lattice'])}, {r['label']}:")
            lines.append(t)
        lines += ["```", ""]
    lines += ["## Method", "",
              "Every configuration is one launch of `python -m hmc.scaling_worker` under the launcher, with a "
              "timeout. Times: the slowest rank's wall time of a loop of operations, per operation; median and "
              "spread over the timed loops. Where the time goes: one more loop with timers around the halo engine "
              "(`HaloEngine.start`: pack and post, for shm the copy into the peer's window and the signal; the "
              "engine's waits for a peer's signal or an MPI completion; `Exchange.finish` without those waits: "
              "unpack, credits and the first MPI completion tests, which under Open MPI's progress engine can "
              "yield the core), the rest of "
              "`Geometry.shift` (local roll), `Geometry.sum` (global reductions) and the remainder (compute); each "
              "bar shows the mean share over ranks applied to the median time. The CPU code does not overlap "
              "interior and exterior work, so there is no interior/exterior split. Answers: the dslash output and "
              "the CG solution (exact reductions) gathered and hashed, bitwise against the 1-rank run; the halo "
              "slabs checked against the global field.",
              ""]
    if any(d.get("clock") == "device events" for r in study["configs"] for d in r["ops"].values()):
        lines += ["On the GPU (rows with a CUDA hop: `dslash_impl` in the file) the operations go through "
                  "`solvers.staggered_dist_cuda`: the dslash is `DslashRunner` (the full D, two hops and two "
                  "exchanges, on its own stream; one hop is reported), the CG iteration is `DeviceCG` (scalars on "
                  "the device, global sums through the halo engine), the halo exchange is the distributed hop's own "
                  "face exchange (pack kernel, transport, ghost buffer; checked against the global field). Times are "
                  "device events around the timed loop (the slowest rank's; the host wall times are stored beside "
                  "them as `wall_samples_s`). `+graph` rows replay the dslash and the CG iteration from CUDA graphs "
                  "(stream_gated with binary flags, COMMS.md 'CUDA graphs'). Where the time goes: device events on "
                  "the operation's stream around each phase of every hop (`PhaseProfile`: pack kernel; post, the "
                  "sends enqueued: copy and signal; interior kernel; wait, the stream waiting for the halo: "
                  "transfer, signal/wait and unpack; exterior kernel), for the CG the device time outside the hops "
                  "(reductions and vector updates), for graph replays the replay's device time; host overhead is "
                  "the rest of the host wall time per operation (the GPU waiting for Python). The host time spent "
                  "in each phase is stored as `phases_host`. Answers: the gathered dslash output and CG solution "
                  "against the 1-rank run (fused kernel) to rounding: |D psi|^2 to 1e-12, the CG residual after the "
                  "fixed iteration count to 1e-8; their digests are reported.", ""]
    return "\n".join(lines)


GATED = ("stream_gated", "stream_gated+graph")


def gain_pairs(labels) -> list:
    """(slower, faster) label pairs of the stream-gated gain: event and mpi over stream_gated (and over its graph
    replays), and stream_gated over its graph replays; only pairs whose labels are in the study."""
    out = []
    for g in GATED:
        if g in labels:
            out += [(o, g) for o in ("event", "mpi") if o in labels]
    if all(g in labels for g in GATED):
        out.append(GATED)
    return out


def ratio_rows(study, lat) -> list:
    labels = labels_of(study)
    rows = [r for r in study["configs"] if r["lattice"] == lat and r["status"] == "ok" and r["ranks"] > 1]
    if len(labels) < 2 or not rows:
        return []
    ops = [op for op in OP_TITLES if any(op in r["ops"] for r in rows)]
    by = {(r["ranks"], r["label"]): r for r in rows}
    ranks = sorted({r["ranks"] for r in rows})

    def ratio(n, a, b, op):
        ra, rb = by.get((n, a)), by.get((n, b))
        if ra and rb and op in ra["ops"] and op in rb["ops"]:
            return f"{ra['ops'][op]['median_s'] / rb['ops'][op]['median_s']:.2f}"
        return "-"

    out = []
    others = [l for l in labels if l != "mpi"]
    if "mpi" in labels and others:
        head = ["ranks"] + [f"{op}: {l}/mpi" for op in ops for l in others]
        out += ["Time ratios against mpi (time of the transport over the time of mpi: below 1 it is faster):", "",
                "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for n in ranks:
            out.append("| " + " | ".join([str(n)] + [ratio(n, l, "mpi", op) for op in ops for l in others]) + " |")
        out.append("")
    pairs = gain_pairs(labels)
    if pairs:
        head = ["ranks"] + [f"{op}: {a}/{b}" for op in ops for a, b in pairs]
        out += ["Stream-gated gain (time of the other transport over the stream-gated time at the same point: above "
                "1 stream_gated is faster; `+graph`: the dslash and CG iterations replayed from CUDA graphs):", "",
                "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for n in ranks:
            out.append("| " + " | ".join([str(n)] + [ratio(n, a, b, op) for op in ops for a, b in pairs]) + " |")
        out.append("")
    return out[:-1] if out else out


def text_table(study) -> str:
    """A terminal table: one line per configuration (RHMC trajectory columns when the study has them)."""
    rh = any("rhmc" in r["ops"] for r in study["configs"])
    lines = [f"{'lattice':>12} {'ranks':>5} {'transport':<13} {'status':<8} {'halo':>10} {'dslash':>10} "
             f"{'cg/it':>10} {'eff.dslash':>10} {'eff.cg':>7}" + (f" {'rhmc':>10} {'eff.rhmc':>8}" if rh else "")
             + "  answers"]
    for r in study["configs"]:
        def t(op):
            d = r["ops"].get(op)
            if d is None:
                return "-"
            s = d["median_s"]
            return f"{s * 1e6:.1f}us" if s < 1e-3 else (f"{s * 1e3:.2f}ms" if s < 1 else f"{s:.2f}s")

        def eff(op):
            d, base = r["ops"].get(op), baseline(study, r["lattice"], op)
            return f"{base / d['median_s'] / r['ranks']:.2f}" if d and base else "-"

        ans = "" if r["status"] != "ok" else ("agree" if str(r.get("answers_agree")) == "True" else
                                               r.get("answers_note", ""))
        lines.append(f"{lat_name(r['lattice']):>12} {r['ranks']:>5} {r['label']:<13} {r['status']:<8} "
                     f"{t('halo'):>10} {t('dslash'):>10} {t('cg'):>10} {eff('dslash'):>10} {eff('cg'):>7}"
                     + (f" {t('rhmc'):>10} {eff('rhmc'):>8}" if rh else "") + f"  {ans}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# plots

def _series(study, lat, label, op):
    """(ranks, median, min, max) of one transport on one lattice, starting from the 1-rank run when there is one."""
    pts = []
    for r in study["configs"]:
        if r["lattice"] != lat or r["status"] != "ok" or op not in r["ops"]:
            continue
        if r["label"] == label or (r["transport"] == "serial" and op != "halo"):
            d = r["ops"][op]
            pts.append((r["ranks"], d["median_s"], d["min_s"], d["max_s"]))
    pts.sort()
    if not any(n > 1 for n, *_ in pts):
        return None
    return np.array(pts)


def _scale(op, values):
    m = np.nanmax(values) if len(values) else 1.0
    if op == "halo" or m < 1e-3:
        return 1e6, "us"
    if m < 2.0:
        return 1e3, "ms"
    return 1.0, "s"


def _legend_handles(lats, labels, plt):
    from matplotlib.lines import Line2D

    hs = [Line2D([], [], color=COLOURS.get(l, "grey"), lw=2, label=l) for l in labels]
    if len(lats) > 1:
        hs += [Line2D([], [], color="grey", ls=LINESTYLES[i % 4], marker=MARKERS[i % 4], label=lat_name(lat))
               for i, lat in enumerate(lats)]
    hs.append(Line2D([], [], color="grey", ls=(0, (1, 2)), lw=1, label="ideal 1/n"))
    return hs


def _log_y(ax):
    """Readable labels on a logarithmic y axis that may span less than a decade: ticks at 1, 2, 5 x 10^k."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _fraction(v) -> str:
    return f"{v:g}" if v >= 1 else f"1/{1 / v:g}"


def _bytes(v, _=None) -> str:
    return f"{v:g} B" if v < 1024 else (f"{v / 1024:g} KiB" if v < 1 << 20 else f"{v / (1 << 20):g} MiB")


def _panels(plt, n, w=4.6, h=4.2):
    """A figure of n panels, at most 3 per row; returns (fig, list of axes), spare axes hidden."""
    cols = n if n <= 3 else (2 if n == 4 else 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(w * cols, h * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _rank_axis(ax, ranks):
    ax.set_xscale("log", base=2)
    ax.set_xticks(ranks)
    ax.set_xticklabels([str(n) for n in ranks])
    ax.minorticks_off()
    ax.set_xlabel("ranks")


def plot_time(study, path, plt):
    lats, labels = lattices_of(study), labels_of(study)
    ops = [op for op in OP_TITLES if any(op in r["ops"] for r in study["configs"])]
    ranks = sorted({r["ranks"] for r in study["configs"] if r["status"] == "ok"})
    fig, axes = _panels(plt, len(ops))
    for ax, op in zip(axes, ops):
        allv = [r["ops"][op]["max_s"] for r in study["configs"] if op in r["ops"]]
        f, unit = _scale(op, np.array(allv))
        for i, lat in enumerate(lats):
            for label in labels:
                s = _series(study, lat, label, op)
                if s is None:
                    continue
                ax.errorbar(s[:, 0], s[:, 1] * f, yerr=[(s[:, 1] - s[:, 2]) * f, (s[:, 3] - s[:, 1]) * f],
                            color=COLOURS.get(label, "grey"), ls=LINESTYLES[i % 4], marker=MARKERS[i % 4], ms=5,
                            capsize=3, lw=1.6)
            base = baseline(study, lat, op)
            if base and op != "halo":
                n = np.array(ranks, dtype=float)
                ax.plot(n, base / n * f, color="grey", ls=(0, (1, 2)), lw=1)
        _log_y(ax)
        _rank_axis(ax, ranks)
        ax.set_ylabel(f"time per operation [{unit}]")
        ax.set_title(OP_TITLES[op])
        ax.grid(True, which="both", alpha=0.3)
    fig.legend(handles=_legend_handles(lats, labels, plt), loc="lower center", ncol=8, frameon=False)
    fig.suptitle("Strong scaling: time against rank count (median; bars: min-max over repeats)")
    fig.tight_layout(rect=(0, 0.08 if len(ops) <= 3 else 0.05, 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_speedup(study, path, plt):
    lats, labels = lattices_of(study), labels_of(study)
    ops = [op for op in SCALED_OPS if any(op in r["ops"] for r in study["configs"])]
    if not ops:
        return False
    ranks = sorted({r["ranks"] for r in study["configs"] if r["status"] == "ok"})
    fig, axes = plt.subplots(2, len(ops), figsize=(4.6 * len(ops), 7.4), squeeze=False)
    for j, op in enumerate(ops):
        sp_ax, ef_ax = axes[0][j], axes[1][j]
        top, low = 1.0, 1.0
        for i, lat in enumerate(lats):
            base = baseline(study, lat, op)
            if not base:
                continue
            for label in labels:
                s = _series(study, lat, label, op)
                if s is None:
                    continue
                sp = base / s[:, 1]
                kw = dict(color=COLOURS.get(label, "grey"), ls=LINESTYLES[i % 4], marker=MARKERS[i % 4], ms=5, lw=1.6)
                sp_ax.plot(s[:, 0], sp, **kw)
                ef_ax.plot(s[:, 0], sp / s[:, 0], **kw)
                top = max(top, float(np.max(sp / s[:, 0])))
                low = min(low, float(np.min(sp)))
        n = np.array(ranks, dtype=float)
        sp_ax.plot(n, n, color="grey", ls=(0, (1, 2)), lw=1)
        sp_ax.set_xscale("log", base=2)
        sp_ax.set_yscale("log", base=2)
        sp_ax.set_xticks(ranks)
        sp_ax.set_xticklabels([str(x) for x in ranks])
        lo = min(1.0, low)
        ticks = [2.0 ** k for k in range(int(np.floor(np.log2(lo))), int(np.ceil(np.log2(max(ranks)))) + 1)]
        sp_ax.set_yticks(ticks)
        sp_ax.set_yticklabels([_fraction(t) for t in ticks])
        sp_ax.set_ylim(ticks[0] / 1.3, ticks[-1] * 1.3)
        sp_ax.minorticks_off()
        sp_ax.set_ylabel("speed-up T(1)/T(n)")
        sp_ax.set_title(OP_TITLES[op])
        sp_ax.grid(True, alpha=0.3)
        ef_ax.axhline(1.0, color="grey", ls=(0, (1, 2)), lw=1)
        _rank_axis(ef_ax, ranks)
        ef_ax.set_ylim(0, max(1.15, top * 1.1))
        ef_ax.set_ylabel("parallel efficiency T(1)/(n T(n))")
        ef_ax.grid(True, alpha=0.3)
    fig.legend(handles=_legend_handles(lats, labels, plt), loc="lower center", ncol=8, frameon=False)
    fig.suptitle("Speed-up and parallel efficiency against the 1-rank run")
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_phases(study, path, plt):
    lats = lattices_of(study)
    ops = [op for op in OP_TITLES if any(op in r["ops"] and r["ops"][op].get("phases") is not None
                                         for r in study["configs"])]
    if not ops:
        return False
    width = max(4.2, 1.0 + 0.7 * _max_bars(study), 10.0 / len(ops))     # room for the title and the legend
    fig, axes = plt.subplots(len(lats), len(ops), figsize=(width * len(ops), 3.6 * len(lats) + 0.8),
                             squeeze=False)
    for i, lat in enumerate(lats):
        for j, op in enumerate(ops):
            ax = axes[i][j]
            rows = [r for r in study["configs"] if r["lattice"] == lat and op in r["ops"]
                    and r["ops"][op].get("phases") is not None]
            if not rows:
                ax.set_visible(False)
                continue
            f, unit = _scale(op, np.array([r["ops"][op]["median_s"] for r in rows]))
            x = np.arange(len(rows))
            bottom = np.zeros(len(rows))
            for ph in phase_order(study, op):
                h = np.array([phase_fractions(r["ops"][op]).get(ph, 0.0) * r["ops"][op]["median_s"] * f
                              for r in rows])
                ax.bar(x, h, bottom=bottom, color=PHASE_COLOURS.get(ph, "grey"), width=0.7,
                       label=PHASE_LABELS.get(ph, ph))
                bottom += h
            ax.set_xticks(x)
            ax.set_xticklabels([f"{r['ranks']}\n{r['label'].replace('stream_gated', 'sg')}" for r in rows],
                               fontsize=8)
            ax.set_ylabel(f"time per operation [{unit}]")
            ax.set_title(f"{lat_name(lat)}: {OP_TITLES[op]}", fontsize=10)
            ax.grid(True, axis="y", alpha=0.3)
    names = list(dict.fromkeys(p for op in ops for p in phase_order(study, op)))
    handles = [plt.Rectangle((0, 0), 1, 1, color=PHASE_COLOURS.get(p, "grey")) for p in names]
    wide = width * len(ops) >= 14
    ncol = (6 if wide else 3) if len(names) <= 6 else 4
    fig.legend(handles, [PHASE_LABELS.get(p, p) for p in names], loc="lower center", ncol=ncol, frameon=False,
               fontsize=9)
    fig.suptitle("Where the time goes (mean share over ranks of the instrumented loop, scaled to the median)")
    legend_in = 0.3 + 0.25 * -(-len(names) // ncol)
    fig.tight_layout(rect=(0, legend_in / (3.6 * len(lats) + 0.8), 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _max_bars(study):
    n = {}
    for r in study["configs"]:
        if r["status"] == "ok":
            n[r["lattice"]] = n.get(r["lattice"], 0) + 1
    return max(n.values()) if n else 1


def _plot_pair_ratios(study, path, plt, pairs, colour, ylabel, title, ncol, fontsize=None):
    """T(a)/T(b) against the rank count per operation, one line per (a, b) in ``pairs`` and lattice; the legend
    names each pair (``colour(pair)`` gives its colour) and, with several lattices, their line styles."""
    from matplotlib.lines import Line2D

    lats = lattices_of(study)
    ops = [op for op in OP_TITLES if any(op in r["ops"] for r in study["configs"] if r["ranks"] > 1)]
    fig, axes = _panels(plt, len(ops), 4.2, 3.8)
    ranks = sorted({r["ranks"] for r in study["configs"] if r["status"] == "ok" and r["ranks"] > 1})
    for ax, op in zip(axes, ops):
        for i, lat in enumerate(lats):
            by = {(r["ranks"], r["label"]): r["ops"][op]["median_s"] for r in study["configs"]
                  if r["lattice"] == lat and r["status"] == "ok" and op in r["ops"]}
            for a, b in pairs:
                pts = [(n, by[(n, a)] / by[(n, b)]) for n in ranks if (n, a) in by and (n, b) in by]
                if pts:
                    p = np.array(pts)
                    ax.plot(p[:, 0], p[:, 1], color=colour((a, b)), ls=LINESTYLES[i % 4],
                            marker=MARKERS[i % 4], ms=5, lw=1.6)
        ax.axhline(1.0, color="grey", lw=1, ls=(0, (1, 2)))
        _rank_axis(ax, ranks)
        ax.set_ylim(bottom=0)
        ax.set_ylabel(ylabel)
        ax.set_title(OP_TITLES[op])
        ax.grid(True, alpha=0.3)
    hs = [Line2D([], [], color=colour(pr), lw=2, label=f"{pr[0]} / {pr[1]}") for pr in pairs]
    if len(lats) > 1:
        hs += [Line2D([], [], color="grey", ls=LINESTYLES[i % 4], marker=MARKERS[i % 4], label=lat_name(lat))
               for i, lat in enumerate(lats)]
    fig.legend(handles=hs, loc="lower center", ncol=ncol, frameon=False, fontsize=fontsize)
    fig.suptitle(title)
    rows = -(-len(hs) // ncol)
    fig.tight_layout(rect=(0, 0.06 + 0.05 * rows if len(ops) <= 3 else 0.04 + 0.03 * rows, 1, 0.93))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_ratios(study, path, plt):
    """Each transport's time over mpi's against the rank count, per operation."""
    labels = labels_of(study)
    others = [l for l in labels if l != "mpi"]
    if "mpi" not in labels or not others:
        return False
    return _plot_pair_ratios(study, path, plt, [(l, "mpi") for l in others], lambda pr: COLOURS.get(pr[0], "grey"),
                             "time / time with mpi", "Transport ratio against mpi (below 1: faster than mpi)", 6)


PAIR_COLOURS = {("event", "stream_gated"): "tab:green", ("mpi", "stream_gated"): "tab:blue",
                ("event", "stream_gated+graph"): "tab:olive", ("mpi", "stream_gated+graph"): "tab:cyan",
                ("stream_gated", "stream_gated+graph"): "tab:purple"}


def plot_gain(study, path, plt):
    """The stream-gated gain T(other)/T(stream_gated) against the rank count, per operation: against event and mpi
    (and, with graph rows, of the graph replays)."""
    pairs = gain_pairs(labels_of(study))
    if not pairs:
        return False
    return _plot_pair_ratios(study, path, plt, pairs, lambda pr: PAIR_COLOURS.get(pr, "grey"),
                             "time of the other / stream-gated time",
                             "Stream-gated gain (above 1: stream_gated faster)", 4, fontsize=9)


def plot_latency(study, path, plt):
    """One-way and round-trip latency against message size, per (transport, ranks): the first lattice's runs (the
    sweep does not depend on the lattice)."""
    seen, series = set(), []
    for r in study["configs"]:
        if r["status"] != "ok" or r.get("latency") is None or (r["label"], r["ranks"]) in seen:
            continue
        seen.add((r["label"], r["ranks"]))
        series.append((r["label"], r["ranks"], r["latency"]))
    if not series:
        return False
    ranks = sorted({n for _, n, _ in series})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for label, n, lat in series:
        ls = LINESTYLES[ranks.index(n) % 4]
        for ax, col in zip(axes, ("one_way_us", "round_trip_us")):
            ax.plot(lat["bytes"], lat[col], color=COLOURS.get(label, "grey"), ls=ls, marker=MARKERS[ranks.index(n) % 4],
                    ms=5, lw=1.6, label=f"{label}, {n} ranks")
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    sizes = sorted({int(b) for _, _, lat in series for b in lat["bytes"]})
    for ax, title in zip(axes, ("one-way (one exchange)", "round trip (two dependent exchanges)")):
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_major_formatter(FuncFormatter(_bytes))
        ax.xaxis.set_minor_locator(NullLocator())
        _log_y(ax)
        ax.set_xlabel("bytes per face")
        ax.set_ylabel("time [us]")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8, frameon=False)
    fig.suptitle("Halo latency against message size (ring along t, complex128 3-vectors; best loop)")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(path, out_dir=None) -> dict:
    """Write report.md and the PNG plots; returns {"markdown", "plots", "notes", "table"}."""
    study = load_study(path)
    p = Path(path)
    out = Path(out_dir) if out_dir else p.with_name(p.stem + "_report")
    out.mkdir(parents=True, exist_ok=True)
    plots, extra_notes = [], []
    if any(r["status"] == "ok" for r in study["configs"]):
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            plt = None
            extra_notes.append("plots skipped: matplotlib is not installed (pip install matplotlib)")
        if plt is not None:
            plot_time(study, out / "time_vs_ranks.png", plt)
            plots.append(str(out / "time_vs_ranks.png"))
            for name, fn in (("speedup_efficiency.png", plot_speedup), ("phases.png", plot_phases),
                             ("transport_ratios.png", plot_ratios), ("stream_gated_gain.png", plot_gain),
                             ("latency.png", plot_latency)):
                if fn(study, out / name, plt):
                    plots.append(str(out / name))
    md = markdown(study, plots)
    for n in extra_notes:
        md += f"\n> Note: {n}.\n"
    (out / "report.md").write_text(md)
    return {"markdown": str(out / "report.md"), "plots": plots, "notes": notes(study) + extra_notes,
            "table": text_table(study)}
