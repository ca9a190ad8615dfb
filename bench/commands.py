"""The ``hmc bench ...`` and ``hmc scaling ...`` commands, registered with ``hmc`` as a command provider
(:mod:`hmc.commands`: entry point group ``hmc.commands``, or found by name in a checkout). Parsing here is light:
each command imports its module when it runs."""
from __future__ import annotations

import argparse
import json

from comms.transport import registry
from hmc.cli import count


def add_parsers(sub) -> None:
    from .scaling.cli import add_parser as add_scaling

    add_scaling(sub)
    sub.choices["scaling"].set_defaults(run_command=_run_scaling)
    p = sub.add_parser("bench", help="benchmarks (commands, not tests)")
    bsub = p.add_subparsers(dest="bench", required=True)
    _add_gauge(bsub)
    _add_fat_vjp(bsub)
    _add_halo(bsub)
    _add_dslash(bsub)
    _add_mg(bsub)
    _add_rhmc(bsub)
    _add_precision(bsub)
    _add_smear(bsub)
    _add_suite(bsub)


def _add_gauge(bsub):
    b = bsub.add_parser("gauge", help="gauge force and pure-gauge trajectory time per site")
    b.add_argument("--lattice", type=int, nargs=4, default=[8, 8, 8, 8], metavar=("NX", "NY", "NZ", "NT"))
    b.add_argument("--action", choices=("wilson", "symanzik"), default="symanzik")
    b.add_argument("--repeat", type=count(1), default=5)
    b.add_argument("--site-tiles", nargs="+", default=[], metavar="TY,TZ,TT",
                   help="on a GPU, also time the staple-sharing force with these site tiles of its thread order "
                        "(force.gauge_force_cuda.SITE_TILE; 1,1,1 is lexicographic)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(run_command=_run_gauge)


def _add_fat_vjp(bsub):
    b = bsub.add_parser("fat-vjp", help="one HISQ fat-link chain-rule evaluation: per-direction vs staged kernels")
    b.add_argument("--lattice", type=int, nargs=4, default=[8, 8, 8, 8], metavar=("NX", "NY", "NZ", "NT"))
    b.add_argument("--coeffs", choices=("level2", "fat7", "asqtad"), default="level2")
    b.add_argument("--repeat", type=count(1), default=5)
    b.add_argument("--json", action="store_true")
    b.set_defaults(run_command=_run_fat_vjp)


def _add_halo(bsub):
    b = bsub.add_parser("halo", help="halo latency and bandwidth per transport and face size (run under mpiexec)")
    b.add_argument("--transport", dest="bench_transport", default="mpi,shm",
                   help=f"transports to measure, comma-separated: {registry.described()}, the GPU ones with their "
                        "faces on the device; default mpi,shm")
    b.add_argument("--sizes", type=count(1), nargs="+", default=[2, 4, 8, 16], metavar="L",
                   help="face sizes: L^3 sites (default: 2 4 8 16)")
    b.add_argument("--element", choices=("matrix", "vector"), default="matrix",
                   help="per-site data: 3x3 complex128 matrices (144 B) or 3-vectors (48 B)")
    b.add_argument("--min-time", type=float, default=0.3, help="seconds per measurement loop")
    b.add_argument("--json", action="store_true")
    b.set_defaults(run_command=_run_halo)


def _add_dslash(bsub):
    b = bsub.add_parser("dslash", help="HISQ dslash rate and bandwidth, CG iteration time, mixed vs double CG; "
                                       "under mpiexec (or with --grid): the distributed GPU Dslash and CG iteration "
                                       "per transport")
    b.add_argument("--lattice", type=int, nargs=4, default=[8, 8, 8, 8], metavar=("NX", "NY", "NZ", "NT"))
    b.add_argument("--precision", choices=("single", "double", "half", "half-naik"), default="double",
                   help="the hop's precision (half: single-precision fields, links in 16 bits; half-naik: the Naik "
                        "links only; solvers.half_links)")
    b.add_argument("--repeat", type=count(1), default=20)
    b.add_argument("--json", action="store_true")
    b.add_argument("--local", type=count(2), nargs="+", metavar="L", help="distributed: local volumes L^4 per rank")
    b.add_argument("--transports", help="distributed: transports, comma-separated (default: --transport, else "
                                        "mpi and every GPU transport)")
    b.add_argument("--graph", action="store_true", help="distributed: also the graph-captured stream-gated D and CG "
                                                        "iteration")
    b.add_argument("--reps", type=count(1), default=100, help="distributed: calls per timing block")
    b.add_argument("--out", help="distributed: write the rows as JSON here")
    b.set_defaults(run_command=_run_dslash)


def _add_mg(bsub):
    from . import mg

    b = bsub.add_parser("mg", help="KD multigrid against mixed-precision CG at the lightest mass on one device "
                                   "(JSON and Markdown per lattice)",
                        description=mg.__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    mg.add_arguments(b, backend=False)
    b.set_defaults(run_command=_run_mg)


def _add_precision(bsub):
    from . import precision

    b = bsub.add_parser("precision", help="a mixed-precision solver setting against double: the same seed, the "
                        "physics compared, reversibility", description=precision.__doc__.split("\n\n")[0])
    precision.add_arguments(b)
    b.set_defaults(run_command=_run_precision)


def _add_rhmc(bsub):
    from . import rhmc

    b = bsub.add_parser("rhmc", help="HISQ 2+1+1 RHMC trajectories of a production deck on one L^4 lattice: the "
                                     "per-phase times of each trajectory, the Dslash share of the solves and "
                                     "each phase's floor and the fraction of it reached",
                        description=rhmc.__doc__.split("\n\n")[0])
    rhmc.add_arguments(b)
    b.set_defaults(run_command=_run_rhmc)


def _add_smear(bsub):
    from . import smear

    b = bsub.add_parser("smear", help="one HISQ fat-link build on one GPU: the per-direction staple kernels "
                                      "against the staged ones (time, difference, bandwidth)",
                        description=smear.__doc__.split("\n\n")[0])
    smear.add_arguments(b)
    b.set_defaults(run_command=_run_smear)


def _add_suite(bsub):
    b = bsub.add_parser("suite", help="run a named device suite of bench/suites.toml (steps under mpiexec, MPS, "
                                      "timeouts; results under the suite's output folder)",
                        description="Run a named device suite of bench/suites.toml (the file's format: the "
                                    "docstring of bench/suite.py).")
    b.add_argument("name", nargs="?", help="suite name (omitted: list the suites)")
    b.add_argument("--dry-run", action="store_true", help="print each step's command, environment and output "
                                                          "folder without running anything")
    b.add_argument("--file", help="suites file (default: bench/suites.toml)")
    b.add_argument("--set", nargs="+", metavar="VAR=VALUE", help="suite variables (see the suite's vars)")
    b.add_argument("--out", help="results folder (default: the suite's)")
    b.add_argument("--steps", metavar="PATTERNS", help="only the steps whose names match these glob patterns, "
                                                      "comma-separated (e.g. 'smoke*,bench*')")
    b.add_argument("--python", default=None, help="Python interpreter of the steps (default: this one)")
    b.set_defaults(run_command=_run_suite)


def _rank() -> int:
    from comms import world

    return world().rank


def _run_scaling(args) -> int:
    from .scaling.cli import cli

    return cli(args)


def _print_result(args, result) -> int:
    if args.json:
        print(json.dumps(result, indent=2))
    return 0


def _run_gauge(args) -> int:
    from .gauge import bench_gauge

    return _print_result(args, bench_gauge(args))


def _run_fat_vjp(args) -> int:
    from .fat_vjp import bench_fat_vjp

    return _print_result(args, bench_fat_vjp(args))


def _run_dslash(args) -> int:
    from .dslash import bench_dslash

    return _print_result(args, bench_dslash(args))


def _run_halo(args) -> int:
    from comms.halo import check_transport_name

    from .halo import bench_halo, format_rows

    transports = [t.strip() for t in args.bench_transport.split(",") if t.strip()]
    for t in transports:
        check_transport_name(t)
    rows = bench_halo(transports, args.sizes, args.element, args.min_time)
    if _rank() == 0:
        print(json.dumps(rows, indent=2) if args.json else format_rows(rows))
    return 0


def _run_mg(args) -> int:
    from . import mg

    return mg.main_terminable(args=mg.finish_args(args))


def _run_precision(args) -> int:
    from .precision import bench_precision

    return bench_precision(args)


def _run_rhmc(args) -> int:
    from .rhmc import bench_rhmc

    return bench_rhmc(args)


def _run_smear(args) -> int:
    from .smear import bench_smear

    return _print_result(args, bench_smear(args))


def _run_suite(args) -> int:
    from .suite import cli

    return cli(args)
