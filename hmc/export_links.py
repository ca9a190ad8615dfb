"""``hmc export CONFIG --links fat|long``: the fermion links of a configuration as a SciDAC colour-matrix file, the
file MILC writes of its fat and long links (``fat.l8``, ``long.l8``: QDP_F3_ColorMatrix, datacount 4, directions
x, y, z, t, record XML "Fat links" / "Long links"; docs/formats.md).

The links are those the Dirac operator uses (:class:`force.hisq_links.FermionLinks`): KS phases and the time
boundary condition folded in, tadpole factors in the coefficients (docs/conventions.md 1.3-1.6), as in MILC's
files. CONFIG is a gauge file (MILC, NERSC, ILDG, SciDAC, openQCD) or a run file (RUN.h5, RUN.h5:N).
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from .runfile import RunFileError as ExportLinksError     # bad options of an export: one line, exit status 2

LINKS = ("fat", "long")


def add_args(p) -> None:
    """The options of ``--links`` on the ``hmc export`` parser."""
    g = p.add_argument_group("fermion links (--links: CONFIG may be any lattice file, or a run file)")
    g.add_argument("--links", choices=LINKS, help="write the fat or long links of --action instead of the gauge "
                                                  "field, as MILC's fat.l8 / long.l8 (--format scidac)")
    g.add_argument("--action", choices=("hisq", "asqtad"), default="hisq", help="--links: HISQ or asqtad")
    g.add_argument("--u0", type=float, default=None, help="--links: tadpole factor of asqtad (default 1)")
    g.add_argument("--eps", type=float, default=0.0, help="--links: Naik epsilon of HISQ (default 0)")
    g.add_argument("--time-bc", choices=("antiperiodic", "periodic"), default="antiperiodic",
                   help="--links: fermion boundary condition in time (default antiperiodic)")
    g.add_argument("--reunitarize", action=argparse.BooleanOptionalAction, default=True,
                   help="--links: re-unitarize the stored links first, as MILC in double precision (default); "
                        "--no-reunitarize uses them as stored")


def export_links(args, progress=None) -> dict:
    """Write the --links of args.runfile (a lattice or run file) to args.output; returns what was written."""
    from force.hisq_links import asqtad_links, hisq_links
    from lattice.io import write_color_matrices

    from .lattice_source import read_lattice, split_spec

    if getattr(args, "grid_metadata", False):
        raise ExportLinksError("--grid-metadata describes a gauge field (Grid's FieldMetaData): drop it with --links")
    if args.format != "scidac":
        raise ExportLinksError(f"--links writes a SciDAC colour-matrix file: give --format scidac, not "
                               f"{args.format}")
    if args.action == "asqtad" and args.eps != 0.0:
        raise ExportLinksError(f"--eps {args.eps:g}: the Naik epsilon belongs to HISQ; asqtad has none")
    if args.u0 is not None and not args.u0 > 0:
        raise ExportLinksError(f"--u0 {args.u0:g}: the tadpole factor must be positive")
    path, at = split_spec(args.runfile)
    if args.trajectory is not None and at is not None and args.trajectory != at:
        raise ExportLinksError(f"{args.runfile} and --trajectory {args.trajectory} disagree: give one of them")
    spec = f"{path}:{args.trajectory}" if args.trajectory is not None else args.runfile
    if os.path.abspath(args.output) == os.path.abspath(path):
        raise ExportLinksError(f"-o {args.output} is the input itself: give another output file")
    u, info = read_lattice(spec, backend=getattr(args, "backend", None), reunitarize=args.reunitarize,
                           config=getattr(args, "run_config", None), check_links=True)
    if progress is not None:
        progress.step(f"{args.action} {args.links} links")
    if args.action == "hisq":
        fl = hisq_links(u, eps=args.eps, time_bc=args.time_bc)
        what = f"HISQ eps {args.eps:g}"
    else:
        fl = asqtad_links(u, 1.0 if args.u0 is None else args.u0, args.time_bc)
        what = f"asqtad u0 {1.0 if args.u0 is None else args.u0:g}"
    links = fl.fat if args.links == "fat" else fl.long
    site_major = u.geom.gather(np.moveaxis(u.geom.backend.to_numpy(links), 0, 4))
    if progress is not None:
        progress.step(f"writing {args.output}")
    precision = args.precision or 64
    file_xml = (f"hisq-hmc {args.links} links: {what}, {args.time_bc} time, KS phases folded in, from "
                f"{os.path.abspath(path)} ({info.get('format')}, {'re-unitarized' if args.reunitarize else 'as stored'})")
    result = {"file": args.output, "format": "scidac", "links": args.links, "action": args.action,
              "precision": precision, "trajectory": info.get("trajectory")}
    if site_major is not None:
        sums = write_color_matrices(args.output, site_major, precision, file_xml=file_xml,
                                    record_xml=f"{args.links.capitalize()} links")
        result["written"] = sums
    return result
