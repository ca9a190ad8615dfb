"""``hmc scaling report STUDY.h5``: the Markdown report and PNG plots of a strong-scaling study (:mod:`bench.scaling`).

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
from pathlib import Path

import numpy as np

from .common import lat_name
from .plots import plot_gain, plot_latency, plot_phases, plot_ratios, plot_speedup, plot_time
from .results import OP_TITLES, baseline, gain_pairs, halo_share, labels_of, lattices_of, load_study, solver_share

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
                         "about 140 us on an H200 whatever the transport (docs/halo-protocol.md, 'Several ranks on one GPU'); "
                         "rerun with --mps")
            out.append(text)
    elif ran_mps or mps.get("ran"):
        out.append(f"MPS: {_mps_text(meta)}; it matters only for GPU ranks sharing a GPU (this study has none)")
    return out


def hooks_text(meta) -> str:
    """The study hooks the whole study ran under (docs/halo-protocol.md 'Study hooks'), from the file's ``env_hooks``; empty when
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
    lines = _header_lines(study)
    for lat in lattices_of(study):
        lines += _lattice_lines(study, lat)
    lines += _listing_lines(study, plots)
    lines += _method_lines(study)
    return "\n".join(lines)


def _header_lines(study) -> list:
    """Machine, commit, command, study hooks, the transports, what was measured, the RHMC note and notes."""
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
    return lines


def _lattice_lines(study, lat) -> list:
    """The table of one lattice (times, speed-up, efficiency, shares, answers) and its transport ratios."""
    lines = []
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
    return lines


def _listing_lines(study, plots) -> list:
    """Failed and skipped configurations, the plots and the resolved transport tables."""
    lines = []
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
    return lines


def _method_lines(study) -> list:
    """How the times, phases and answers were measured (CPU; GPU when device events were used)."""
    lines = []
    lines += ["## Method", "",
              "Every configuration is one launch of `python -m bench.scaling.worker` under the launcher, with a "
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
                  "`bench.dslash_dist_cuda`: the dslash is `DslashRunner` (the full D, two hops and two "
                  "exchanges, on its own stream; one hop is reported), the CG iteration is the production CG's "
                  "(solvers.cg; with stream_gated its iterations replayed from CUDA graphs, scalars on the device, "
                  "global sums through the halo engine: solvers/krylov_graph.py), the halo exchange is the distributed hop's own "
                  "face exchange (pack kernel, transport, ghost buffer; checked against the global field). Times are "
                  "device events around the timed loop (the slowest rank's; the host wall times are stored beside "
                  "them as `wall_samples_s`). `+graph` rows replay the dslash and the CG iteration from CUDA graphs "
                  "(stream_gated with binary flags, docs/halo-protocol.md 'CUDA graphs'). Where the time goes: device events on "
                  "the operation's stream around each phase of every hop (`PhaseProfile`: pack kernel; post, the "
                  "sends enqueued: copy and signal; interior kernel; wait, the stream waiting for the halo: "
                  "transfer, signal/wait and unpack; exterior kernel), for the CG the device time outside the hops "
                  "(reductions and vector updates), for graph replays the replay's device time; host overhead is "
                  "the rest of the host wall time per operation (the GPU waiting for Python). The host time spent "
                  "in each phase is stored as `phases_host`. Answers: the gathered dslash output and CG solution "
                  "against the 1-rank run (fused kernel) to rounding: |D psi|^2 to 1e-12, the CG residual after the "
                  "fixed iteration count to 1e-8; their digests are reported.", ""]
    return lines


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
