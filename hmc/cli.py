"""The ``hmc`` command line: init, run, info, measure, solve, spectrum, check; and the commands registered by the
packages above (``bench``, ``scaling``: :mod:`hmc.commands`)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from comms import CommsError
from comms.config import ConfigError, RunConfig
from comms.transport import names as transport_names
from lattice.backend import BackendError
from lattice.geometry import GeometryError

from .deck import DeckError
from .guard import EXIT_TERMINATED, Terminated
from .integrators import IntegratorError
from .progress import add_progress_arg, command_progress
from .runfile import RunFileError

USER_ERRORS = (DeckError, RunFileError, GeometryError, BackendError, CommsError, ConfigError, IntegratorError,
               FileNotFoundError)
EXIT_RUNTIME, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def _user_errors():
    errs = list(USER_ERRORS)
    from .milc.compare import MilcCheckError

    errs.append(MilcCheckError)
    try:
        from lattice.io import GaugeFileError

        errs.append(GaugeFileError)
    except ImportError:
        pass
    return tuple(errs) + _runtime_errors()


def _runtime_errors():
    """Failures of work that had started (exit 1), as opposed to bad input (exit 2): a solve that did not converge
    (also in an RHMC trajectory), a peer rank that stopped answering."""
    from comms import CommsTimeout
    from solvers.cg import SolverConvergenceError

    from .guard import StorageError

    return (SolverConvergenceError, CommsTimeout, StorageError)


def _exit_code(e) -> int:
    return EXIT_RUNTIME if isinstance(e, _runtime_errors()) else EXIT_USAGE


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, exit status 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def count(minimum: int):
    """An argparse type: an integer of at least ``minimum`` (a number of trajectories, repeats, ...)."""
    def parse(text):
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"{n} is not allowed: give an integer >= {minimum}")
        return n
    parse.__name__ = "count"
    return parse


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
    from . import __version__

    ap = _Parser(prog="hmc", description="HISQ/staggered HMC in Python, MILC conventions.")
    ap.add_argument("--version", action="version", version=f"hmc (hisq-hmc) {__version__}")
    ap.add_argument("--backend", choices=("numpy", "cupy", "auto"), default=None,
                    help="array backend (default: the deck's [run] backend if it states one, else $HMC_BACKEND, "
                         "else numpy)")
    ap.add_argument("--grid", type=int, nargs=4, metavar=("PX", "PY", "PZ", "PT"),
                    help="process grid under mpiexec (default: the deck's [lattice] grid if it states one, else "
                         "$HMC_GRID, else chosen from the rank count)")
    ap.add_argument("--transport", metavar="|".join(transport_names()),
                    help="halo transport (default: $HMC_P2P_TRANSPORT, else shm between ranks of a node)")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("init", help="create a run file from a deck (default: the embedded quick 4^4 deck)")
    p.add_argument("deck", nargs="?", help="TOML run deck (see runs/); omitted: the embedded quick deck")
    p.add_argument("-o", "--output", required=True, help="run file to create, e.g. trajectory.h5")
    p.add_argument("--from-lattice", metavar="FILE",
                   help="start from a stored configuration (MILC, NERSC, ILDG, SciDAC, openQCD) or a run file's "
                        "(RUN.h5, or RUN.h5:N for trajectory N kept with save_every)")
    p.add_argument("--rationals", metavar="FILE",
                   help="RHMC rational functions (MILC's format) instead of the deck's [fermions] rationals")
    p.add_argument("--ignore-checksum", action="store_true", help="read a lattice whose checksum does not match")
    p.add_argument("--force-reunitarize", action="store_true",
                   help="project links far from U(3) onto SU(3) instead of refusing the lattice")
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
    p.add_argument("--trajectories", type=int,           # >= 1: hmc.run.run refuses others, for every caller
                   help="how many trajectories to run now, >= 1 (default: up to the deck's total)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("info", help="parameters, history and how to continue a run file")
    p.add_argument("runfile")
    p.add_argument("--json", action="store_true")
    p.add_argument("--schedule", action="store_true", help="print the integrator schedule")

    p = sub.add_parser("measure", help="plaquette, link trace, Polyakov loop, checksums and gauge action of a lattice")
    p.add_argument("config", help="a lattice file (MILC, NERSC, ILDG, SciDAC, openQCD) or a run file (RUN.h5, "
                                  "RUN.h5:N)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--ignore-checksum", action="store_true")
    p.add_argument("--force-reunitarize", action="store_true",
                   help="project links far from U(3) onto SU(3) instead of refusing the lattice")
    _add_action_args(p)
    add_progress_arg(p)

    _add_export_parser(sub)

    from . import solve as _solve, spectrum as _spectrum  # light at import: solvers and force load on use

    _solve.add_parser(sub)
    _spectrum.add_parser(sub)

    _add_check_parser(sub)

    from .commands import add_provided_parsers  # bench, scaling: registered from above, never imported here

    add_provided_parsers(sub)
    return ap


def _add_check_parser(sub):
    p = sub.add_parser("check", help="regression suite: plaquette, actions, forces and a short trajectory against "
                                     "the references shipped in hmc/checks (or $HMC_CHECKS_DIR)")
    p.add_argument("references", nargs="*", help="reference names (default: all; --list shows them)")
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
    p.add_argument("--jobs", type=count(1), default=1, metavar="N",
                   help="--milc: run up to N cases at once (each in its own process; default 1)")
    add_progress_arg(p)


def _add_export_parser(sub):
    from . import export_links
    from .lattice_source import EXPORT_FORMATS

    p = sub.add_parser("export", help="write a run file's configuration as a MILC, NERSC, ILDG, SciDAC or openQCD "
                                      "gauge file")
    p.add_argument("runfile", help="the run file (RUN.h5, or RUN.h5:N for trajectory N)")
    p.add_argument("-o", "--output", required=True, help="the gauge file to write")
    p.add_argument("--format", required=True, choices=EXPORT_FORMATS,
                   help="milc: MILC v5 (single precision); nersc: 4D_SU3_GAUGE_3x3 IEEE64BIG; ildg: 64-bit ILDG; "
                        "scidac: 64-bit SciDAC (QIO); openqcd: openQCD (double)")
    p.add_argument("--trajectory", type=count(0), metavar="N", help="the trajectory whose configuration to write (the run "
                                                                "file keeps its latest; default: that one)")
    p.add_argument("--precision", type=int, choices=(32, 64), help="nersc, ildg and scidac: 32 or 64 bits (default "
                                                                   "64)")
    p.add_argument("--grid-metadata", action="store_true", help="ildg and scidac: also Grid's grid-format "
                   "(FieldMetaData) and FieldNormMetaData records, which Grid's reader checks")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")
    add_progress_arg(p)
    export_links.add_args(p)


def _export(args) -> int:
    from .lattice_source import export

    from .export_links import export_links

    with command_progress(2 + bool(args.links), "hmc export", not args.no_progress) as bar:
        bar.update(0, f"reading {args.runfile}")
        result = export_links(args, bar) if args.links else export(args.runfile, args.output, args.format,
                                                                   args.trajectory, args.precision, progress=bar,
                                                                   grid_metadata=args.grid_metadata)
        bar.update(bar.total, f"wrote {args.output}")
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.links:
        print(f"wrote {result['file']}: the {args.action} {args.links} links of {args.runfile} as a "
              f"{result['precision']}-bit SciDAC colour-matrix file")
    else:
        print(f"wrote {result['file']}: {result['format']}, the configuration of trajectory {result['trajectory']} "
              f"of {args.runfile}")
    return 0


def main(argv=None) -> int:
    """The ``hmc`` command: exit 0 on success, 1 when started work fails, 2 on bad input, 130 on Ctrl-C, 143 on
    SIGTERM."""
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        return _interrupted(None)
    try:
        _run_settings(args)
        return _dispatch(args)
    except BrokenPipeError:  # output piped into head: not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        return _interrupted(args)
    except Terminated:
        return _interrupted(args, "terminated (SIGTERM)", EXIT_TERMINATED)
    except _user_errors() as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        code = _exit_code(e)
        from comms import CommsTimeout, launched_size

        if launched_size() <= 1:
            print(f"hmc {args.command}: error: {msg}", file=sys.stderr)
            return code
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
        os._exit(code)


def _interrupted(args, what: str = "interrupted", code: int = EXIT_INTERRUPTED) -> int:
    """Ctrl-C (exit 130) or SIGTERM (exit 143): one line, no traceback. ``hmc run`` has abandoned the trajectory
    under way and written the last complete one (hmc.guard); saves are atomic. Under mpiexec rank 0 speaks and no
    rank waits in MPI_Finalize (a peer may be stuck in an exchange)."""
    command = f"hmc {args.command}" if args is not None else "hmc"
    note = ""
    if args is not None and args.command == "run":
        note = f"; {args.runfile} keeps its last complete trajectory: 'hmc run {args.runfile}' resumes"
    from comms import launched_size

    several = launched_size() > 1
    if not several or _rank() == 0:
        print(f"{chr(10) if sys.stderr.isatty() else ''}{command}: {what}{note}", file=sys.stderr, flush=True)
    if several:
        sys.stdout.flush()
        os._exit(code)
    return code


def _rank() -> int:
    from comms import world

    return world().rank


def _run_settings(args):
    """The settings the command line states (``args.settings``: they win over the deck and the environment) and the
    run configuration of a command without a deck (``args.run_config``, comms.config.RunConfig); built, and so
    checked, before anything runs. Commands with a deck (init, run, check) build theirs with the deck's values."""
    args.settings = {"backend": args.backend, "grid": tuple(args.grid) if args.grid else None,
                     "transport": args.transport}
    args.run_config = RunConfig.resolve(cli=args.settings)
    if args.transport:
        from comms.halo import check_transport_name

        check_transport_name(args.transport)


def _dispatch(args) -> int:
    if getattr(args, "run_command", None) is not None:       # a registered command (hmc.commands)
        return args.run_command(args)
    if args.command == "init" and args.milc:
        from .milc.runner import init_milc

        if args.deck is None or args.from_lattice or args.rationals:
            raise DeckError("hmc init --milc DECK -o RUN.h5: give the MILC deck; its reload_serial and "
                            "load_rhmc_params name the lattice and rational functions (no --from-lattice, --rationals)")
        init_milc(args.deck, args.output, args.build, args.search, args.force, args.backend, args.ignore_checksum,
                  precision=args.precision, settings=args.settings)
        return 0
    if args.command == "milc":
        from .milc.runner import run_milc

        run_milc(args.deck, args.output, args.build, args.search, args.force, args.backend,
                 show_progress=not args.no_progress, precision=args.precision, settings=args.settings)
        return 0
    if args.command == "init":
        from .run import init_run

        init_run(args.deck, args.output, args.from_lattice, args.force, args.ignore_checksum,
                 rationals=args.rationals, settings=args.settings, force_reunitarize=args.force_reunitarize)
        return 0
    if args.command == "run":
        from .run import run

        run(args.runfile, args.trajectories, show_progress=not args.no_progress, settings=args.settings)
        return 0
    if args.command == "info":
        from .info import info

        text = info(args.runfile, as_json=args.json, schedule=args.schedule)
        if _rank() == 0:                          # under mpiexec every rank reads the file; one prints
            print(text)
        return 0
    if args.command == "export":
        return _export(args)
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
        if args.milc:
            from .milc.runner import check_milc

            return 1 if check_milc(args.milc, args.references, args.search, args.out_dir, args.backend,
                                   args.test_out, launch=args.launch, show_progress=not args.no_progress,
                                   jobs=args.jobs) else 0
        return _check(args)
    if args.command in ("solve", "spectrum"):
        from . import solve, spectrum

        return (solve if args.command == "solve" else spectrum).cli(args)
    return 1


def _check(args) -> int:
    """hmc check: 1 on any failed value, and when there is no reference to run (a check that finds nothing fails)."""
    from . import check

    try:
        if args.list:
            print("\n".join(check.listing()))
            return 0
        return 1 if check.run_checks(args.references, args.update, settings=args.settings,
                                     show_progress=not args.no_progress) else 0
    except check.CheckError as e:
        print(f"hmc check: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
