"""The PNG plots of a scaling report (matplotlib's pyplot is passed in: :func:`bench.scaling.report.write_report`
chooses the Agg backend): time against ranks, speed-up and efficiency, phases, transport ratios, the stream-gated
gain and the halo latency."""
from __future__ import annotations

import numpy as np

from .common import lat_name
from .results import COLOURS, LINESTYLES, MARKERS, OP_TITLES, PHASE_COLOURS, PHASE_LABELS, SCALED_OPS, baseline, \
    gain_pairs, labels_of, lattices_of, phase_fractions, phase_order


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


def _legend_handles(lats, labels, plt, ideal="ideal 1/n"):
    """Transport colours, lattice line styles (several lattices) and the dotted ideal line, labelled ``ideal``: the
    time plots draw T(1)/n, the speed-up plot n."""
    from matplotlib.lines import Line2D

    hs = [Line2D([], [], color=COLOURS.get(l, "grey"), lw=2, label=l) for l in labels]
    if len(lats) > 1:
        hs += [Line2D([], [], color="grey", ls=LINESTYLES[i % 4], marker=MARKERS[i % 4], label=lat_name(lat))
               for i, lat in enumerate(lats)]
    hs.append(Line2D([], [], color="grey", ls=(0, (1, 2)), lw=1, label=ideal))
    return hs


def _log_y(ax):
    """Readable labels on a logarithmic y axis (call it after plotting): ticks at 1, 2, 5 x 10^k, and on an axis
    spanning less than a decade also at 1.5, 2.5, 3, 4, 6 and 8 x 10^k (100 to 250 had only 100 and 200)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    dense = lo > 0 and hi / lo < 10.0
    subs = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0) if dense else (1.0, 2.0, 5.0)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
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
    fig.legend(handles=_legend_handles(lats, labels, plt, ideal="ideal n"), loc="lower center", ncol=8,
               frameon=False)
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
        top = 1.0
        for i, lat in enumerate(lats):
            by = {(r["ranks"], r["label"]): r["ops"][op]["median_s"] for r in study["configs"]
                  if r["lattice"] == lat and r["status"] == "ok" and op in r["ops"]}
            for a, b in pairs:
                pts = [(n, by[(n, a)] / by[(n, b)]) for n in ranks if (n, a) in by and (n, b) in by]
                if pts:
                    p = np.array(pts)
                    top = max(top, float(p[:, 1].max()))
                    ax.plot(p[:, 0], p[:, 1], color=colour((a, b)), ls=LINESTYLES[i % 4],
                            marker=MARKERS[i % 4], ms=5, lw=1.6)
        ax.axhline(1.0, color="grey", lw=1, ls=(0, (1, 2)))
        _rank_axis(ax, ranks)
        ax.set_ylim(0, 1.1 * top)                 # from 0, with room above the highest marker (none clipped)
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

