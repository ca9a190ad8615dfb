"""The lattice argument of ``hmc measure``, ``solve``, ``spectrum`` and ``export``: a gauge file (MILC, NERSC, ILDG,
SciDAC, openQCD) or a run file, ``RUN.h5`` (its configuration) or ``RUN.h5:N`` (trajectory N's: the latest, which the
run file holds, or one kept beside it with the deck's ``save_every``, docs/runfile.md)."""
from __future__ import annotations

import os
import re

from lattice.io import GaugeFileError, gauge_from_site_major, read_gauge, write_gauge
from lattice.io.common import plaquette_site_major

from . import runfile
from .kept_configs import kept_path, kept_trajectories, read_kept

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
EXPORT_FORMATS = ("milc", "nersc", "ildg", "scidac", "openqcd")


def split_spec(spec) -> tuple[str, int | None]:
    """``RUN.h5:N`` -> (``RUN.h5``, N); anything else (an existing path with a colon too) -> (spec, None)."""
    spec = os.fspath(spec)
    m = re.fullmatch(r"(.+):(\d+)", spec)
    if m and not os.path.exists(spec) and os.path.exists(m.group(1)):
        return m.group(1), int(m.group(2))
    return spec, None


def is_hdf5(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(8) == HDF5_SIGNATURE
    except OSError:
        return False


def run_file_configuration(path: str, trajectory: int | None = None):
    """(site-major links, info as :func:`lattice.io.read_gauge` gives it) of a run file's configuration."""
    st = runfile.load(path)
    if trajectory is not None and trajectory != st.trajectory:
        return _kept_configuration(path, st, trajectory)
    nt, nz, ny, nx = st.links.shape[:4]
    info = {"format": "hisq-hmc run file", "path": path, "dims": (nx, ny, nz, nt), "precision": 64,
            "trajectory": st.trajectory, "checksums": {"sha256": runfile.links_digest(st.links), "ok": True},
            "plaquette": list(st.plaquette), "name": st.deck["run"]["name"]}
    return st.links, info


def _kept_configuration(path: str, st, trajectory: int):
    """(links, info) of trajectory ``trajectory``'s configuration kept beside the run file (deck's save_every)."""
    kept = kept_trajectories(path, st.deck, st.trajectory)
    if trajectory not in kept:
        if not st.deck["run"].get("save_every"):
            raise runfile.RunFileError(f"{path} keeps the configuration of trajectory {st.trajectory} only, not "
                                       f"{trajectory}: give {path} or {path}:{st.trajectory}")
        listed = ", ".join(map(str, kept[-8:])) or "none yet"
        raise runfile.RunFileError(f"{path} keeps trajectory {st.trajectory} and, beside it (save_every = "
                                   f"{st.deck['run']['save_every']}), trajectories {listed}; not {trajectory}: give "
                                   f"one of those")
    a, file_info = read_kept(path, trajectory)
    if a.shape != st.links.shape:
        raise runfile.RunFileError(f"{kept_path(path, trajectory)} holds a {'x'.join(map(str, file_info['dims']))} "
                                   f"lattice, not the run's: it belongs to another run; remove or rename it")
    info = {"format": "hisq-hmc run file", "path": path, "dims": file_info["dims"], "precision": 64,
            "trajectory": trajectory, "checksums": file_info["checksums"], "kept_file": kept_path(path, trajectory),
            "plaquette": list(plaquette_site_major(a)), "name": st.deck["run"]["name"]}
    return a, info


def read_lattice(spec, geom=None, backend=None, ignore_checksum: bool = False, reunitarize: bool = False,
                 config=None, check_links: bool = False, force_reunitarize: bool = False):
    """(GaugeField, info) of a gauge file or a run file (``RUN.h5`` or ``RUN.h5:N``), as :func:`read_gauge`."""
    path, trajectory = split_spec(spec)
    if not is_hdf5(path):
        if trajectory is not None:
            raise GaugeFileError(f"{spec}: ':{trajectory}' picks a trajectory of a run file, and {path} is not one; "
                                 f"give {path} alone")
        return read_gauge(path, geom=geom, backend=backend, ignore_checksum=ignore_checksum, reunitarize=reunitarize,
                          config=config, check_links=check_links, force_reunitarize=force_reunitarize)
    a, info = run_file_configuration(path, trajectory)
    return gauge_from_site_major(path, a, info, geom, backend, reunitarize, config)


def export(spec: str, out: str, fmt: str, trajectory: int | None = None, precision: int | None = None,
           progress=None, grid_metadata: bool = False) -> dict:
    """Write a run file's configuration as a MILC v5 (single precision, as MILC writes), NERSC
    (4D_SU3_GAUGE_3x3, IEEE64BIG or with precision 32 IEEE32BIG), ILDG (64-bit unless precision 32, with its
    ildg-data-lfn), SciDAC (64-bit unless precision 32) or openQCD (64-bit only) file, through
    :func:`lattice.io.write_gauge`; returns what was written. ``progress`` (hmc.progress.Progress of 2 steps) is
    told when the reading is done. ``grid_metadata`` (ildg and scidac): also Grid's grid-format FieldMetaData and
    FieldNormMetaData records, with the trajectory as Grid's sequence_number and the deck's name as its ensemble_id
    (:mod:`lattice.io.grid_meta`, docs/formats.md)."""
    path, at = split_spec(spec)
    if grid_metadata and fmt not in ("ildg", "scidac"):
        raise runfile.RunFileError(f"--grid-metadata writes Grid's records of ILDG and SciDAC files: give --format "
                                   f"ildg or scidac, not {fmt}")
    if trajectory is not None and at is not None and trajectory != at:
        raise runfile.RunFileError(f"{spec} and --trajectory {trajectory} disagree: give one of them")
    if fmt == "milc" and precision not in (None, 32):
        raise runfile.RunFileError("MILC v5 files are single precision (precision 64 is an extension other codes do "
                                   "not read): drop --precision, or export as nersc, ildg, scidac or openqcd")
    if fmt == "openqcd" and precision not in (None, 64):
        raise runfile.RunFileError("openQCD files are double precision only: drop --precision, or export as nersc, "
                                   "ildg or scidac")
    a, info = run_file_configuration(path, at if trajectory is None else trajectory)
    if progress is not None:
        progress.step(f"writing {out}")
    if os.path.abspath(out) == os.path.abspath(path):
        raise runfile.RunFileError(f"-o {out} is the run file itself: give another output file")
    options = {}
    if fmt == "nersc":
        options = {"floating_point": "IEEE32BIG" if precision == 32 else "IEEE64BIG",
                   "ensemble_id": re.sub(r"\s+", "_", info["name"]), "sequence_number": info["trajectory"]}
    elif fmt in ("ildg", "scidac"):
        options = {"precision": precision or 64,
                   "info": f"{info['name']}: trajectory {info['trajectory']} of {os.path.abspath(path)}"}
        if fmt == "ildg":
            options["lfn"] = os.path.basename(out)
        if grid_metadata:
            options["grid_metadata"] = {"sequence_number": info["trajectory"], "ensemble": info["name"]}
    written = write_gauge(out, a, fmt, **options)
    return {"file": out, "format": fmt, "trajectory": info["trajectory"], "written": written}
