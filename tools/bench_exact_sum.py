"""Time the device exact sums (lattice/exact_sum_cuda.py) against plain CuPy sums, per reduction, on half-lattice
colour fields ((V/2, 3) complex) of 16^4 and 32^4. Run on the device machine::

    PYTHONPATH=. python3 tools/bench_exact_sum.py [--dims 16 32] [--reps 200]

Prints microseconds per reduction two ways: "launched" (a Python launch per reduction, timed with CUDA events
over --reps back-to-back calls) and "graph" (the same --reps calls captured once in a CUDA graph and replayed, so
the launch cost of Python is gone and what is left is the device's). Rows: exact |a|^2 rounded by the reduction's
last block (one rank), exact (|a|^2, Re<a, b>) likewise, the same pair followed by the rounding kernel over 4 rank
records (the many-rank path without its exchange), and the plain sums cupy.vdot(a, a).real and
(a.real * a.real + a.imag * a.imag).sum().
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from comms import superacc  # noqa: E402
from lattice import get_backend  # noqa: E402
from lattice.exact_sum_cuda import ExactReducer, accumulator, round_records  # noqa: E402


def cases(be, reducer, a, b):
    """name -> a callable that enqueues one reduction on the current stream."""
    xp = be.xp
    out1, res1 = accumulator(xp, 1), xp.zeros(1)
    out2, res2 = accumulator(xp, 2), xp.zeros(2)
    accs = xp.zeros((4, 2, superacc.WIDTH), dtype=np.int64)

    def pair_4_ranks():
        reducer.norm2_redot(a, b, accs[0])
        round_records(be, accs, res2)

    return {
        "exact |a|^2": lambda: reducer.norm2(a, out1, res1),
        "exact (|a|^2, Re<a,b>)": lambda: reducer.norm2_redot(a, b, out2, res2),
        "exact pair + round 4 records": pair_4_ranks,
        "cupy vdot(a, a).real": lambda: xp.vdot(a, a).real,
        "cupy (re*re + im*im).sum()": lambda: (a.real * a.real + a.imag * a.imag).sum(),
    }


def time_launched(xp, fn, reps: int) -> float:
    start, stop = xp.cuda.Event(), xp.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return xp.cuda.get_elapsed_time(start, stop) * 1e3 / reps


def time_graph(xp, fn, reps: int) -> float | None:
    stream = xp.cuda.Stream(non_blocking=True)
    with stream:
        try:
            stream.begin_capture()
            for _ in range(reps):
                fn()
            graph = stream.end_capture()
        except Exception:                                   # a CuPy routine that cannot be captured
            try:
                stream.end_capture()
            except Exception:
                pass
            return None
        graph.launch(stream)
        stream.synchronize()
        start, stop = xp.cuda.Event(), xp.cuda.Event()
        start.record(stream)
        graph.launch(stream)
        stop.record(stream)
        stop.synchronize()
    return xp.cuda.get_elapsed_time(start, stop) * 1e3 / reps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[16, 32], help="lattice extents L of L^4 (default 16 32)")
    ap.add_argument("--reps", type=int, default=200, help="reductions per timing (default 200)")
    args = ap.parse_args(argv)
    be = get_backend("cupy")
    xp = be.xp
    reducer = ExactReducer(be)
    rng = np.random.default_rng(1)
    print(f"{'L^4':>5} {'dtype':>10} {'what':<30} {'launched us':>12} {'graph us':>10} blocks")
    for L in args.dims:
        shape = (L ** 4 // 2, 3)
        for dtype in (np.complex128, np.complex64):
            a, b = (xp.asarray((rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype))
                    for _ in range(2))
            for name, fn in cases(be, reducer, a, b).items():
                for _ in range(5):
                    fn()                                    # compile, load, warm up
                xp.cuda.Device().synchronize()
                launched = time_launched(xp, fn, args.reps)
                graph = time_graph(xp, fn, args.reps)
                gtext = "-" if graph is None else f"{graph:.1f}"
                print(f"{L:>5} {np.dtype(dtype).name:>10} {name:<30} {launched:>12.1f} {gtext:>10} "
                      f"{reducer.blocks(a.size)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
