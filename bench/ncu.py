"""Where a GPU run's time goes kernel by kernel, from Nsight Compute's CSV (the device machines have ``ncu`` but no
Nsight Systems): every kernel launch of the profiled region with its duration, summed by kernel name.

    ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --page raw \\
        --log-file run.csv python3 ...         # the program brackets its region by cupy.cuda.profiler.start/stop
    python3 -m bench.ncu run.csv [--top 30]

Kernel nodes of a replayed CUDA graph are profiled one by one (ncu's default ``--graph-profiling node``), so a
captured solver's kernels are counted as if launched. ncu serializes the kernels: the durations are each kernel's
own time, without the overlap or the launch gaps of the real run (their sum is a floor of the region's time, the
difference to its wall time is what launches and the host cost). Both CSV pages are read: ``raw`` (one row a
launch, a column per metric, a row of units under the header) and ``details`` (a row per launch and metric)."""
from __future__ import annotations

import argparse
import csv
import io
import sys
from dataclasses import dataclass

METRIC = "gpu__time_duration.sum"
#: seconds per unit of the durations ncu prints
UNITS = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3, "second": 1.0,
         "s": 1.0}


@dataclass(frozen=True)
class KernelTime:
    name: str
    launches: int
    total_s: float

    @property
    def mean_us(self) -> float:
        return 1e6 * self.total_s / self.launches


def _number(text: str) -> float:
    return float(text.replace(",", "").strip())


def _seconds(value: str, unit: str) -> float:
    try:
        return _number(value) * UNITS[unit.strip()]
    except KeyError:
        raise ValueError(f"unknown duration unit {unit!r} in the ncu CSV: expected one of {', '.join(UNITS)}") from None


def launches(text: str) -> list[tuple[str, float]]:
    """(kernel name, seconds) of every launch in ncu's CSV ``text`` (either page; lines ncu writes beside the table,
    ``==PROF==`` and the like, are skipped)."""
    rows = list(csv.reader(io.StringIO("\n".join(line for line in text.splitlines()
                                                 if line.strip() and not line.startswith("==")))))
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if head is None:
        raise ValueError("no 'Kernel Name' column: not an ncu CSV (run ncu with --csv, and --log-file for the file)")
    cols = {c: k for k, c in enumerate(rows[head])}
    name = cols["Kernel Name"]
    body = rows[head + 1:]
    if METRIC in cols:                                               # the raw page
        at, unit = cols[METRIC], "nsecond"
        if body and not body[0][name].strip():                       # the units row
            unit, body = body[0][at], body[1:]
        return [(r[name], _seconds(r[at], unit)) for r in body if len(r) > at]
    if "Metric Name" not in cols:
        raise ValueError(f"the ncu CSV has neither a {METRIC} column nor 'Metric Name': profile with --metrics {METRIC}")
    m, u, v = cols["Metric Name"], cols["Metric Unit"], cols["Metric Value"]
    return [(r[name], _seconds(r[v], r[u])) for r in body if len(r) > v and r[m] == METRIC]


def by_kernel(pairs) -> list[KernelTime]:
    """The launches summed by kernel name, the largest total first."""
    acc: dict[str, list] = {}
    for name, s in pairs:
        a = acc.setdefault(name, [0, 0.0])
        a[0] += 1
        a[1] += s
    return sorted((KernelTime(n, c, t) for n, (c, t) in acc.items()), key=lambda k: -k.total_s)


def table(kernels: list[KernelTime], top: int = 30) -> str:
    """A text table of the ``top`` kernels: launches, total ms, mean us, share of the profiled kernel time."""
    total = sum(k.total_s for k in kernels) or 1.0
    lines = [f"{'kernel':60s} {'launches':>9s} {'total ms':>10s} {'mean us':>9s} {'share':>6s}"]
    for k in kernels[:top]:
        short = k.name if len(k.name) <= 60 else k.name[:57] + "..."
        lines.append(f"{short:60s} {k.launches:9d} {1e3 * k.total_s:10.3f} {k.mean_us:9.2f} "
                     f"{100 * k.total_s / total:5.1f}%")
    rest = kernels[top:]
    if rest:
        lines.append(f"{f'({len(rest)} other kernels)':60s} {sum(k.launches for k in rest):9d} "
                     f"{1e3 * sum(k.total_s for k in rest):10.3f} {'':9s} "
                     f"{100 * sum(k.total_s for k in rest) / total:5.1f}%")
    lines.append(f"{'all kernels':60s} {sum(k.launches for k in kernels):9d} {1e3 * total:10.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="ncu's CSV (--csv --log-file FILE)")
    ap.add_argument("--top", type=int, default=30, help="kernels listed (the rest summed in one line)")
    args = ap.parse_args(argv)
    try:
        with open(args.csv, encoding="utf-8", errors="replace") as f:
            kernels = by_kernel(launches(f.read()))
    except (OSError, ValueError) as exc:
        print(f"bench.ncu: {exc}", file=sys.stderr)
        return 2
    if not kernels:
        print(f"bench.ncu: no kernel launches in {args.csv}: was the region between cupy.cuda.profiler.start() and "
              "stop() reached (ncu --profile-from-start off)?", file=sys.stderr)
        return 1
    print(table(kernels, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
