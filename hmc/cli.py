"""The ``hmc`` command line: init, run, info, measure, bench."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from comms import CommsError
from lattice.backend import BackendError
from lattice.geometry import GeometryError

from .deck import DeckError
from .integrators import IntegratorError
from .runfile import RunFileError

USER_ERRORS = (DeckError, RunFileError, GeometryError, BackendError, CommsError, IntegratorError, FileNotFoundError)


def _user_errors():
    errs = list(USER_ERRORS)
    from .milc.compare import MilcCheckError

    errs.append(MilcCheckError)
    try:
        from lattice.io import GaugeFileError

        errs.append(GaugeFileError)
    except ImportError:
        pass
    return tuple(errs)


def _add_action_args(p):
    p.add_argument("--beta", type=float, help="gauge coupling beta = 10/g^2 (MILC normalization)")
    p.add_argument("--u0", type=float, default=1.0, help="tadpole factor u0 (Symanzik only)")
    p.add_argument("--gauge-action", choices=("wilson", "symanzik"), default="symanzik")
    p.add_argument("--quark-loops", choices=("none", "asqtad", "asqtad_nf", "hisq"), default="none")
    p.add_argument("--nf", type=int, default=0, help="number of dynamical flavours in the quark-loop terms")


def _add_milc_args(p):
    p.add_argument("--search", action="append", default=[], metavar="DIR",
                   help="folder where the deck's reload_serial and load_rhmc_params files are found by name when "
                        "they are not where the deck says (repeatable)")
    p.add_argument("--build", help="the MILC executable the deck is for (default: from the deck's file name, else "
                                   "su3_rhmc_hisq): su3_rhmc_hisq, su3_rhmd_hisq, su3_rhmc_hisq_su3, su3_leapfrog, "
                                   "su3_omelyan_rhmc, su3_spectrum_hisq")
    p.add_argument("--precision", type=int, choices=(1, 2), default=2,
                   help="MILC's build precision whose output formats to print (1: single, PLAQ %%f and G_LOOP %%e; "
                        "the arithmetic stays double)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="hmc", description="HISQ/staggered HMC in Python, MILC conventions.")
    ap.add_argument("--backend", choices=("numpy", "cupy", "auto"), default=None,
                    help="array backend (default: $HMC_BACKEND or the deck's)")
    ap.add_argument("--grid", type=int, nargs=4, metavar=("PX", "PY", "PZ", "PT"),
                    help="process grid under mpiexec (default: the deck's, or chosen from the rank count)")
    ap.add_argument("--transport", metavar="mpi|shm|event|stream_gated",
                    help="halo transport (default: $HMC_P2P_TRANSPORT, else shm between ranks of a node)")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("init", help="create a run file from a deck (default: the embedded quick 4^4 deck)")
    p.add_argument("deck", nargs="?", help="TOML run deck (see runs/); omitted: the embedded quick deck")
    p.add_argument("-o", "--output", required=True, help="run file to create, e.g. trajectory.h5")
    p.add_argument("--from-lattice", metavar="FILE", help="start from a stored configuration (MILC, NERSC, ILDG, SciDAC)")
    p.add_argument("--rationals", metavar="FILE",
                   help="RHMC rational functions (MILC's format) instead of the deck's [fermions] rationals")
    p.add_argument("--ignore-checksum", action="store_true", help="read a lattice whose checksum does not match")
    p.add_argument("--force", action="store_true", help="overwrite an existing run file")
    p.add_argument("--milc", action="store_true", help="DECK is a MILC ks_imp_rhmc input deck (as for hmc milc)")
    _add_milc_args(p)

    p = sub.add_parser("milc", help="run a MILC ks_imp_rhmc input deck unchanged, printing MILC's output lines")
    p.add_argument("deck", help="MILC input deck (- reads standard input)")
    p.add_argument("-o", "--output", help="run file (default: the deck's name with .h5); resumed when it holds a "
                                          "run of the same deck")
    p.add_argument("--force", action="store_true", help="start over even if the run file exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_milc_args(p)

    p = sub.add_parser("run", help="run or resume the trajectories a run file describes")
    p.add_argument("runfile")
    p.add_argument("--trajectories", type=int, help="how many trajectories to run now (default: up to the deck's total)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("info", help="parameters, history and how to continue a run file")
    p.add_argument("runfile")
    p.add_argument("--json", action="store_true")
    p.add_argument("--schedule", action="store_true", help="print the integrator schedule")

    p = sub.add_parser("measure", help="plaquette, link trace, Polyakov loop, checksums and gauge action of a lattice")
    p.add_argument("config", help="a lattice file (MILC, NERSC, ILDG, SciDAC)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--ignore-checksum", action="store_true")
    _add_action_args(p)

    from . import solve as _solve, spectrum as _spectrum  # light at import: solvers and force load on use

    _solve.add_parser(sub)
    _spectrum.add_parser(sub)

    from . import scaling as _scaling  # hmc scaling: strong-scaling studies (hmc/scaling.py)

    _scaling.add_parser(sub)

    p = sub.add_parser("check", help="regression suite: plaquette, actions, forces and a short trajectory against "
                                     "the references in runs/checks")
    p.add_argument("references", nargs="*", help="reference names (default: all in runs/checks)")
    p.add_argument("--update", action="store_true", help="write new reference values (printed old and new)")
    p.add_argument("--list", action="store_true", help="list the references")
    p.add_argument("--milc", metavar="DIR", help="MILC's regression suite instead: run the cases of DIR/checklist "
                                                 "(REFERENCES: case names, e.g. su3_rhmc_hisq.2) and compare with "
                                                 "MILC's sample outputs under their errtol files")
    p.add_argument("--search", action="append", default=[], metavar="DIR",
                   help="--milc: more folders where the decks' lattices and rational functions are found by name")
    p.add_argument("--test-out", metavar="FILE", help="--milc: compare this output of one case instead of running it")
    p.add_argument("--out-dir", metavar="DIR", help="--milc: keep the outputs and run files here")
    p.add_argument("--launch", metavar="CMD", help="--milc: command that starts each run, as MILC's LAUNCH, e.g. "
                                                   "'mpiexec -n 2' (--grid and --transport reach the runs)")

    p = sub.add_parser("bench", help="benchmarks (commands, not tests)")
    bsub = p.add_subparsers(dest="bench", required=True)
    b = bsub.add_parser("gauge", help="gauge force and pure-gauge trajectory time per site")
    b.add_argument("--lattice", type=int, nargs=4, default=[8, 8, 8, 8], metavar=("NX", "NY", "NZ", "NT"))
    b.add_argument("--action", choices=("wilson", "symanzik"), default="symanzik")
    b.add_argument("--repeat", type=int, default=5)
    b.add_argument("--json", action="store_true")
    b = bsub.add_parser("halo", help="halo latency and bandwidth per transport and face size (run under mpiexec)")
    b.add_argument("--transport", dest="bench_transport", default="mpi,shm",
                   help="transports to measure, comma-separated: mpi,shm (CPU) or mpi,event,stream_gated (GPU, "
                        "faces on the device); default mpi,shm")
    b.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8, 16], metavar="L",
                   help="face sizes: L^3 sites (default: 2 4 8 16)")
    b.add_argument("--element", choices=("matrix", "vector"), default="matrix",
                   help="per-site data: 3x3 complex128 matrices (144 B) or 3-vectors (48 B)")
    b.add_argument("--min-time", type=float, default=0.3, help="seconds per measurement loop")
    b.add_argument("--json", action="store_true")
    b = bsub.add_parser("dslash", help="HISQ dslash rate and bandwidth, CG iteration time, mixed vs double CG; "
                                       "under mpiexec (or with --grid): the distributed GPU Dslash and CG iteration "
                                       "per transport")
    b.add_argument("--lattice", type=int, nargs=4, default=[8, 8, 8, 8], metavar=("NX", "NY", "NZ", "NT"))
    b.add_argument("--precision", choices=("single", "double"), default="double")
    b.add_argument("--repeat", type=int, default=20)
    b.add_argument("--json", action="store_true")
    b.add_argument("--local", type=int, nargs="+", metavar="L", help="distributed: local volumes L^4 per rank")
    b.add_argument("--transports", help="distributed: transports, comma-separated (default: --transport, else "
                                        "mpi,event,stream_gated)")
    b.add_argument("--graph", action="store_true", help="distributed: also the graph-captured stream-gated D and CG "
                                                        "iteration")
    b.add_argument("--reps", type=int, default=100, help="distributed: calls per timing block")
    b.add_argument("--out", help="distributed: write the rows as JSON here")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _comms_options(args)
        return _dispatch(args)
    except BrokenPipeError:  # output piped into head: not an error
        sys.stderr.close()
        return 0
    except _user_errors() as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        from comms import CommsTimeout, launched_size

        if launched_size() <= 1:
            print(f"hmc {args.command}: error: {msg}", file=sys.stderr)
            return 2
        # Several ranks. Bad input fails alike everywhere: rank 0 says so and exits at once, and the launcher ends
        # the others. A rank whose error rank 0 does not share (a timeout waiting for a peer) speaks for itself.
        # Never wait in MPI_Finalize: a peer may be stuck in an exchange.
        if _rank() == 0 or isinstance(e, CommsTimeout):
            print(f"hmc {args.command}: error: {msg}", file=sys.stderr, flush=True)
            if isinstance(e, CommsTimeout):
                time.sleep(1.0)        # let the other neighbours of a stalled rank report too
        else:
            time.sleep(2.0)            # ended by the launcher meanwhile when rank 0 had the same error
            print(f"hmc {args.command}: error: rank {_rank()}: {msg}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2)


def _rank() -> int:
    from comms import world

    return world().rank


def _comms_options(args):
    """--grid and --transport reach every ProcessGrid through the environment (HMC_GRID, HMC_P2P_TRANSPORT)."""
    if args.grid:
        os.environ["HMC_GRID"] = " ".join(map(str, args.grid))
    if args.transport:
        from comms.halo import check_transport_name

        check_transport_name(args.transport)
        os.environ["HMC_P2P_TRANSPORT"] = args.transport


def _dispatch(args) -> int:
    if args.command == "init" and args.milc:
        from .milc.runner import init_milc

        if args.deck is None or args.from_lattice or args.rationals:
            raise DeckError("hmc init --milc DECK -o RUN.h5: give the MILC deck; its reload_serial and "
                            "load_rhmc_params name the lattice and rational functions (no --from-lattice, --rationals)")
        init_milc(args.deck, args.output, args.build, args.search, args.force, args.backend, args.ignore_checksum,
                  precision=args.precision)
        return 0
    if args.command == "milc":
        from .milc.runner import run_milc

        run_milc(args.deck, args.output, args.build, args.search, args.force, args.backend,
                 show_progress=not args.no_progress, precision=args.precision)
        return 0
    if args.command == "init":
        from .run import init_run

        init_run(args.deck, args.output, args.from_lattice, args.force, args.ignore_checksum, args.backend,
                 rationals=args.rationals)
        return 0
    if args.command == "run":
        from .run import run

        run(args.runfile, args.trajectories, args.backend, show_progress=not args.no_progress)
        return 0
    if args.command == "info":
        from .info import info

        print(info(args.runfile, as_json=args.json, schedule=args.schedule))
        return 0
    if args.command == "measure":
        from .measure import measure

        result = measure(args.config, args)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            for k, v in result.items():
                print(f"{k}: {v}")
        return 0
    if args.command == "check":
        from . import check

        if args.milc:
            from .milc.runner import check_milc

            return 1 if check_milc(args.milc, args.references, args.search, args.out_dir, args.backend,
                                   args.test_out, launch=args.launch) else 0
        if args.list:
            print("\n".join(check.available()))
            return 0
        return 1 if check.run_checks(args.references, args.update, args.backend) else 0
    if args.command in ("solve", "spectrum"):
        from . import solve, spectrum

        return (solve if args.command == "solve" else spectrum).cli(args)
    if args.command == "scaling":
        from . import scaling

        return scaling.cli(args)
    if args.command == "bench" and args.bench == "halo":
        from comms.bench import bench_halo, format_rows
        from comms.halo import check_transport_name

        transports = [t.strip() for t in args.bench_transport.split(",") if t.strip()]
        for t in transports:
            check_transport_name(t)
        rows = bench_halo(transports, args.sizes, args.element, args.min_time)
        if _rank() == 0:
            print(json.dumps(rows, indent=2) if args.json else format_rows(rows))
        return 0
    if args.command == "bench":
        from . import bench

        result = {"gauge": bench.bench_gauge, "dslash": bench.bench_dslash}[args.bench](args)
        if args.json:
            print(json.dumps(result, indent=2))
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
