"""``hmc scaling`` on the command line: its parser (registered as a command of ``hmc`` by :mod:`bench.commands`)
and its entry; ``python -m bench.scaling.cli ...`` is the same as ``hmc scaling ...``."""
from __future__ import annotations

import argparse
import sys

from .common import DEFAULT_WHAT, ScalingError, cpu_transports, gpu_transports
from .worker_context import RHMC_TAU


# ------------------------------------------------------------------------------------------------------------
# command line

def add_parser(sub) -> None:
    p = sub.add_parser(
        "scaling", help="strong-scaling study over rank counts and transports: HDF5 results, plots and a report",
        description="Run a strong-scaling study (each configuration launched under mpiexec with a timeout), store "
                    "every timing with its metadata in HDF5, then write a Markdown report and PNG plots. "
                    "'hmc scaling report STUDY.h5' redraws the report from the file.")
    p.add_argument("--lattice", nargs="+", action="append", metavar="N",
                   help="lattice extents NX NY NZ NT (several lattices: repeat --lattice, or give 8 numbers...; "
                        "'8x8x8x16' and '16^4' are accepted too)")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4], metavar="N",
                   help="rank counts (default 1 2 4); the 1-rank baseline always runs")
    # dest differs from the global --grid (the run configuration's grid, for every ProcessGrid of this process)
    p.add_argument("--grid", dest="study_grids", nargs="+", default=[], metavar="PXxPYxPZxPT",
                   help="explicit process grids (e.g. 1x1x2x2), run as given beside the automatic grids of --ranks "
                        "(replacing the automatic one of the same rank count); a grid that does not split a lattice "
                        "fails in the worker and is recorded as failed")
    p.add_argument("--transports", nargs="+", default=list(cpu_transports()), metavar="T",
                   help=f"halo transports: {' '.join(cpu_transports())} (CPU) {' '.join(gpu_transports())} (GPU); "
                        f"default {' '.join(cpu_transports())}")
    p.add_argument("--graph", action="store_true",
                   help="GPU transports: also time the dslash and CG iterations captured in CUDA graphs (one more "
                        "row per graph-capable transport; needs solvers/staggered_dist_cuda.py)")
    p.add_argument("--mps", action="store_true",
                   help="GPU ranks sharing a GPU: start the CUDA MPS control daemon for the study (private pipe "
                        "folder), stop it at the end, record whether it ran")
    p.add_argument("--what", nargs="+", default=[",".join(DEFAULT_WHAT)], metavar="OPS",
                   help="operations, comma-separated: halo, dslash, cg, trajectory (pure-gauge HMC), rhmc (one "
                        "short HISQ 2+1+1 RHMC trajectory, one per timed loop: slow) (mg: not yet); "
                        "default halo,dslash,cg")
    p.add_argument("--repeats", type=int, default=5, help="timed loops per operation (median and spread; default 5)")
    p.add_argument("--min-time", type=float, default=0.2,
                   help="seconds a timed loop should last at least (operations per loop chosen from it; default 0.2)")
    p.add_argument("--cg-iters", type=int, default=20, help="fixed CG iteration count (default 20)")
    p.add_argument("--mass", type=float, default=0.01, help="quark mass of the CG operator (default 0.01)")
    p.add_argument("--halo-sizes", type=int, nargs="*", default=[2, 4, 8, 16], metavar="L",
                   help="latency sweep: faces of L^3 sites (default 2 4 8 16; none: no sweep)")
    p.add_argument("--traj-steps", type=int, default=4,
                   help=f"integrator steps (even) of the 'trajectory' (Omelyan) and 'rhmc' (3G1F, tau {RHMC_TAU:g}) "
                        "operations (default 4)")
    p.add_argument("--threads", type=int, default=1, help="threads per rank (OMP/OpenBLAS/MKL; default 1)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one configuration may take (default 1800)")
    p.add_argument("--launcher", help="launch command, '{n}' = rank count (default $HMC_MPIEXEC, else mpiexec; "
                                      "Open MPI's --oversubscribe is added when ranks exceed the cores)")
    p.add_argument("-o", "--output", metavar="STUDY.h5", help="results file")
    p.add_argument("--resume", action="store_true", help="continue the study in the file: skip what it holds")
    p.add_argument("--force", action="store_true", help="start over, replacing an existing results file")
    p.add_argument("--report-dir", metavar="DIR", help="report folder (default: STUDY_report beside the file)")
    p.add_argument("--no-report", action="store_true", help="do not write the report and plots at the end")
    rs = p.add_subparsers(dest="scaling_command", title="redraw the report of a study", metavar="report")
    r = rs.add_parser("report", help="Markdown report and PNG plots from a results file")
    r.add_argument("study", help="results file (HDF5) of hmc scaling")
    r.add_argument("-o", "--output-dir", metavar="DIR", help="report folder (default: STUDY_report beside the file)")


def cli(args) -> int:
    try:
        if getattr(args, "scaling_command", None) == "report":
            from .report import write_report

            out = write_report(args.study, args.output_dir)
            print(f"hmc scaling report: {out['markdown']}")
            for p in out["plots"]:
                print(f"  {p}")
            for n in out["notes"]:
                print(f"  note: {n}")
            return 0
        from .run import run_study

        return run_study(args)
    except ScalingError as e:
        print(f"hmc scaling: error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"hmc scaling: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nhmc scaling: interrupted; the results file holds every finished configuration (--resume goes on)",
              file=sys.stderr)
        return 130


def main(argv=None) -> int:
    """``python -m bench.scaling.cli ...`` (the same as ``hmc scaling ...``)."""
    ap = argparse.ArgumentParser(prog="hmc")
    ap.add_argument("--backend", default=None)
    sub = ap.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = ap.parse_args(argv)
    from comms.config import RunConfig

    args.run_config = RunConfig.resolve(cli={"backend": args.backend})     # as hmc's command line builds it
    return cli(args)


if __name__ == "__main__":
    sys.exit(main())
