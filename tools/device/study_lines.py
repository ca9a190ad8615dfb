"""One line per (study file, configuration, operation) of the `hmc scaling` study files a device script left:
the median time, the solver CUDA graphs' launches and captures per rank, and why the timed trajectories captured
(solvers.krylov_graph capture_reason: the WHY lines).

    python3 tools/device/study_lines.py DIR 'rhmc*.h5' rhmc [cg ...]
"""
import json
import sys
from pathlib import Path


def main(folder, pattern, ops):
    try:
        import h5py
    except ImportError:
        return
    for f in sorted(Path(folder).glob(pattern)):
        with h5py.File(f, "r") as h:
            for name, g in h["configs"].items():
                for op in ops:
                    if op not in g:
                        continue
                    a = g[op].attrs
                    line = f"STUDY {f.stem} {name} {op}: median {a['median_s'] * 1e6:.1f} us"
                    gr = json.loads(a["graphs"]) if "graphs" in a else None
                    if gr:
                        per = [dict(zip(gr["names"], r)) for r in gr["per_rank"]]
                        line += (f", per rank captures {[int(p['graph_captures']) for p in per]}, launches "
                                 f"{[int(p['graph_replays']) for p in per]}")
                    print(line)
                    for rank, why in enumerate((gr or {}).get("reasons") or []):
                        for k, n in sorted(why.items()):
                            print(f"    WHY rank {rank}: {n} x {k}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
