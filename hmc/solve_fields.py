"""The fields of ``hmc solve`` and ``hmc spectrum``: sources (a file, a point, noise, a KS propagator's scalar
source), references, the comparison with them and the solution files (a SciDAC colour vector, a USQCD KS
propagator of three source colours, or .npy; lattice.io, docs/formats.md). Every field is a whole-lattice array cut
to this rank's block; files are written by rank 0 from the gathered field."""
from __future__ import annotations

import math
import os

import numpy as np


class SolveError(ValueError):
    """Bad input to ``hmc solve`` / ``hmc spectrum`` (one-line message, exit status 2)."""


def read_vector(path, geom, what: str, color: int = 0):
    """A global colour-vector field from a SciDAC file or a .npy array, cut to this rank's block, on the backend.
    From a USQCD KS propagator: its scalar source in colour ``color`` (``what`` "source"), else its solution of
    colour ``color``."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise SolveError(f"{path}: no such file ({what})")
    if os.path.isdir(path):
        raise SolveError(f"{path} is a folder, not a {what} file: name the SciDAC or .npy file in it")
    if path.endswith(".npy"):
        try:
            a = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise SolveError(f"{path}: not a readable .npy array ({e})") from None
    else:
        from lattice.io import is_ksprop, read_color_vector, read_ksprop

        if is_ksprop(path):
            solutions, scalar, _ = read_ksprop(path)
            a = scalar[..., None] * np.eye(3)[color] if what == "source" else solutions[color]
        else:
            a = read_color_vector(path)
    nx, ny, nz, nt = geom.dims
    want = (nt, nz, ny, nx, 3)
    if tuple(a.shape) != want:
        raise SolveError(f"{path}: {what} has shape {tuple(a.shape)}, but the lattice needs {want} "
                         "(nt, nz, ny, nx, colour)")
    if not np.iscomplexobj(a):
        a = a.astype(np.complex128)
    return geom.xp.asarray(np.ascontiguousarray(geom.local_part(a), dtype=np.complex128))


def _check_site(geom, site) -> tuple:
    x, y, z, t = (int(c) for c in site)
    for c, n, name in zip((x, y, z, t), geom.dims, "xyzt"):
        if not 0 <= c < n:
            raise SolveError(f"point source {name} = {c} lies outside the lattice (0 <= {name} < {n})")
    return x, y, z, t


def point_source(geom, site, color: int = 0):
    """1 at colour ``color`` of the global site (x, y, z, t), 0 elsewhere; this rank's block."""
    x, y, z, t = _check_site(geom, site)
    if color not in (0, 1, 2):
        raise SolveError(f"colour {color}: use 0, 1 or 2")
    xp = geom.xp
    src = xp.zeros(geom.shape + (3,), dtype=np.complex128)
    (ox, oy, oz, ot), (lx, ly, lz, lt) = geom.offset, geom.local_dims
    if ox <= x < ox + lx and oy <= y < oy + ly and oz <= z < oz + lz and ot <= t < ot + lt:
        src[t - ot, z - oz, y - oy, x - ox, color] = 1.0
    return src


def random_source(geom, seed: int):
    from lattice.rng import CounterRNG

    g = CounterRNG(int(seed)).gaussian("hmc-solve-source", geom.site_ids(), 6).reshape(geom.shape + (3, 2))
    return (g[..., 0] + 1j * g[..., 1]).astype(np.complex128)


def make_source(geom, args):
    """(source field, description) from --source / --point / --random (default: point, colour 0, origin)."""
    if args.source:
        desc = {"kind": "file", "path": args.source}
        if is_ksprop_file(args.source):
            desc["color"] = args.color
        return read_vector(args.source, geom, "source", args.color), desc
    if args.random is not None:
        return random_source(geom, args.random), {"kind": "random", "seed": args.random}
    site = tuple(args.point) if args.point else (0, 0, 0, 0)
    return point_source(geom, site, args.color), {"kind": "point", "site": list(site), "color": args.color}


def compare(geom, x, ref) -> dict:
    """|x - ref|/|ref| (MILC's check) and max_site,colour |x - ref| / max |ref|, global."""
    from solvers import norm2

    xp = geom.xp
    d = x - ref
    nref = norm2(geom, ref)
    rel = math.sqrt(norm2(geom, d) / nref) if nref > 0 else math.inf
    mx = geom.grid.max(float(xp.abs(d).max()))
    mr = geom.grid.max(float(xp.abs(ref).max()))
    return {"rel_diff": rel, "max_abs_diff": mx, "max_rel_diff": mx / mr if mr > 0 else math.inf}




def is_ksprop_file(path) -> bool:
    from lattice.io import is_ksprop

    return not os.fspath(path).endswith(".npy") and os.path.exists(path) and is_ksprop(path)


def ksprop_sources(geom, args):
    """(the sources of colours 0, 1, 2 on this rank's block, the global scalar source (nt, nz, ny, nx), its
    description) of ``--ksprop``: the point source of ``--point`` (default the origin) or the scalar source of the
    KS propagator ``--source``, times the unit vector of each colour (MILC's C1V3 propagator)."""
    if args.random is not None:
        raise SolveError("--ksprop needs a scalar source: a point (--point X Y Z T) or a KS propagator's (--source "
                         "FILE), not --random")
    nx, ny, nz, nt = geom.dims
    if args.source:
        if not is_ksprop_file(args.source):
            raise SolveError(f"--ksprop --source {args.source}: a KS propagator's scalar source is needed, and this "
                             "is not a USQCD KS propagator (give --point, or drop --ksprop)")
        from lattice.io import read_ksprop

        _, scalar, _ = read_ksprop(args.source)
        if scalar is None or scalar.shape != (nt, nz, ny, nx):
            raise SolveError(f"{args.source}: its scalar source does not fit the {nx}x{ny}x{nz}x{nt} lattice")
        desc = {"kind": "file", "path": args.source}
    else:
        site = _check_site(geom, args.point or (0, 0, 0, 0))
        scalar = np.zeros((nt, nz, ny, nx), dtype=np.complex128)
        scalar[site[3], site[2], site[1], site[0]] = 1.0
        desc = {"kind": "point", "site": list(site)}
    local = np.ascontiguousarray(geom.local_part(scalar))
    sources = [geom.xp.asarray(local[..., None] * np.eye(3)[c]) for c in range(3)]
    return sources, scalar, dict(desc, colors=[0, 1, 2])


def write_solution(path: str, geom, xs: list, precision: int, scalar=None, file_info: str = "",
                   record_info: str = "") -> dict | None:
    """Write the solution(s) ``xs`` (this rank's blocks; three, one per source colour, with the ``scalar`` source
    of a KS propagator) gathered on rank 0: .npy (one field), a SciDAC colour vector or a USQCD KS propagator.
    Collective; returns what rank 0 wrote, None on the other ranks."""
    from lattice.io import write_color_vector, write_ksprop
    from lattice.io.common import atomic_write

    gathered = [geom.gather(x) for x in xs]
    if gathered[0] is None:
        return None
    if path.endswith(".npy"):
        with atomic_write(path) as f:
            np.save(f, gathered[0])
        return {"path": path, "format": "npy"}
    if scalar is None:
        sums = write_color_vector(path, gathered[0], precision, file_xml=file_info, record_xml=record_info)
        return {"path": path, "format": "scidac", "precision": precision,
                "checksums": {"suma": f"{sums['suma']:x}", "sumb": f"{sums['sumb']:x}"}}
    sums = write_ksprop(path, np.stack(gathered), scalar, precision, info=file_info, record_info=record_info,
                        source_info="scalar source of the propagator")
    return {"path": path, "format": "usqcd-ksprop", "precision": precision,
            "checksums": [{"suma": f"{c['suma']:x}", "sumb": f"{c['sumb']:x}"} for c in sums["colors"]]}
