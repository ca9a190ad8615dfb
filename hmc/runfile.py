"""The run file (``trajectory.h5``): deck, current configuration, RNG state and history, written atomically.

Layout (docs/runfile.md, the schema written down; every dataset and history column carries its own ``units`` and
``description``, :mod:`hmc.runfile_schema`): ``/params`` (validated deck as JSON, and the TOML text it came from),
``/gauge`` (links in MILC's site-major order with their axis and direction order, dims and boundary conditions, and
trajectory, plaquette and SHA-256 attributes), ``/rng`` (seed and per-stream draw
counters: the whole state of the counter-based generator; with MILC's generators, ``/rng/milc`` holds their state,
:mod:`hmc.rngs`), ``/history`` (one dataset per column, one entry per trajectory; format version 1, files
written before the version was recorded, kept one compound dataset ``rows``), ``/comms`` (the resolved transport table), ``/params/files``
(texts the run needs besides the deck, e.g. its rational functions, copied in at ``hmc init`` so that the run file
does not depend on them staying where they were), ``/config`` (the run configuration of the run that wrote the file,
comms.config.RunConfig: one attribute per setting, its value as JSON; absent in files of older versions). Every
save writes a complete new file next to the old one, flushes it to disk and renames it over the old one, so a run
killed at any moment leaves the last complete checkpoint.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
from dataclasses import dataclass, field

import h5py
import numpy as np

from comms.config import ConfigError, RunConfig
from lattice.io.common import durable_replace, remove_stale_temporaries, temporary_name

from . import deck as deckmod
from . import runfile_schema as schema
from .runfile_open import DamagedHDF5, open_checked

FORMAT = "hisq-hmc run file"
#: 2: self-describing (attributes on every dataset, one dataset per history column of a fixed dtype, /gauge
#: plaquette); 1: the first layout (history as one compound dataset), also every file without the attribute
FORMAT_VERSION = 2


class RunFileError(ValueError):
    pass


@dataclass
class RunState:
    deck: dict
    deck_text: str
    links: np.ndarray                # (nt, nz, ny, nx, 4, 3, 3) complex128
    trajectory: int = 0              # trajectories completed
    rng: dict = field(default_factory=dict)
    history: list = field(default_factory=list)
    comms: list = field(default_factory=list)
    source: str = ""                 # where the starting configuration came from
    files: dict = field(default_factory=dict)   # name -> text (e.g. "rationals": the RHMC rational functions)
    config: RunConfig | None = None  # the run configuration (None: a file written before it was stored)
    plaquette: tuple = ()            # MILC's (ss, st) of ``links``: written as /gauge attributes
    format_version: int = FORMAT_VERSION        # of the file it was read from


def links_digest(links: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(links).tobytes()).hexdigest()


#: libver of every save: version-2 superblock and object headers, whose checksums libhdf5 verifies before parsing
LIBVER = ("v108", "latest")


def _fixed(text: str) -> np.ndarray:
    """A fixed-length UTF-8 string (HDF5 keeps variable-length ones in the global heap, which has no checksum:
    hmc.runfile_open)."""
    data = text.encode()
    return np.array(data, dtype=h5py.string_dtype("utf-8", max(1, len(data))))


def _attr(obj, name: str, value) -> None:
    obj.attrs[name] = _fixed(value) if isinstance(value, str) else value


def _text(value) -> str:
    """A string attribute as text: fixed-length ones read back as bytes, the variable-length ones of older files
    as str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _describe(obj, description: str, units: str = "") -> None:
    _attr(obj, "description", description)
    if units:
        _attr(obj, "units", units)


def _write_history(h, rows: list[dict]) -> None:
    """One dataset per column (``columns``: their order), each with its schema dtype, units and description."""
    _describe(h, ("one entry per trajectory of the run, in order; the datasets are the columns (their "
                              "order in attribute 'columns'), each with its units and description"))
    if not rows:
        _attr(h, "columns", "")
        return
    cols = schema.history_columns(rows)
    _attr(h, "columns", ",".join(cols))
    for name, values in cols.items():
        _, units, description = schema.history_column(name)
        _describe(h.create_dataset(name, data=values), description, units)


def _read_history(f, version: int, path: str) -> list[dict]:
    h = f["history"]
    if version == 1:                   # one compound dataset, a column's dtype that of its first value
        rows = _dataset(f, "history/rows", path) if "rows" in h else None
        return [] if rows is None else [{n: r[n].item() for n in rows.dtype.names} for r in rows]
    names = [n for n in _text(h.attrs["columns"]).split(",") if n]
    cols = {n: _dataset(f, f"history/{n}", path) for n in names}
    ntraj = len(cols[names[0]]) if names else 0
    return [{n: cols[n][i].item() for n in names} for i in range(ntraj)]


_save_count = 0


def _maybe_fault(stage: str, config: RunConfig | None):
    """Testing hook: the configuration's fault_inject (HMC_FAULT_INJECT=kill_during_checkpoint:N) kills this process
    halfway through the N-th save."""
    spec = config.fault_inject if config is not None else ""
    if spec.startswith("kill_during_checkpoint:") and stage == "half":
        if _save_count == int(spec.split(":")[1]):
            os.kill(os.getpid(), signal.SIGKILL)


def save(path, state: RunState) -> None:
    """Write ``state`` to ``path`` atomically and durably (PATH.tmp.PID, fsync, rename, fsync of the folder:
    :func:`lattice.io.common.durable_replace`)."""
    global _save_count
    _save_count += 1
    path = os.fspath(path)
    remove_stale_temporaries(path)
    tmp = temporary_name(path)
    try:
        with h5py.File(tmp, "w", libver=LIBVER) as f:
            _attr(f, "format", FORMAT)
            f.attrs["format_version"] = FORMAT_VERSION
            f.attrs["trajectory"] = state.trajectory
            _attr(f, "source", state.source)
            _describe(f, ("an HMC run of hisq-hmc: its deck (/params), current configuration (/gauge), "
                                      "generator state (/rng), history (/history) and halo transports (/comms); "
                                      "schema: docs/runfile.md"))
            par = f.create_group("params")
            _attr(par, "deck_json", json.dumps(state.deck, sort_keys=True))
            _describe(par, "the run's parameters: attribute deck_json is the validated deck (every key, defaults "
                           "filled), as JSON")
            _describe(par.create_dataset("deck_toml", data=_fixed(state.deck_text)),
                      schema.DATASET_DESCRIPTIONS["params/deck_toml"], "text (UTF-8 TOML)")
            if state.files:
                fg = par.create_group("files")
                for name, text in state.files.items():
                    _describe(fg.create_dataset(name, data=_fixed(text)), schema.DATASET_DESCRIPTIONS["params/files"],
                              "text")
            _write_gauge(f, state)
            f.flush()
            _maybe_fault("half", state.config)
            r = f.create_group("rng")
            r.attrs["seed"] = state.rng.get("seed", 0)
            _attr(r, "counters_json", json.dumps(state.rng.get("counters", {}), sort_keys=True))
            _describe(r, schema.DATASET_DESCRIPTIONS["rng"])
            if "milc" in state.rng:
                _write_state(r.create_group("milc"), state.rng["milc"])
            _write_history(f.create_group("history"), state.history)
            c = f.create_group("comms")
            _attr(c, "table_json", json.dumps(state.comms))
            if state.config is not None:
                cg = f.create_group("config")
                for name, value in state.config.to_record().items():
                    _attr(cg, name, json.dumps(value))
                _describe(cg, "the run configuration of the hmc run that wrote the file (comms.config.RunConfig): "
                              "one attribute per setting, its value as JSON; docs/configuration.md")
            _describe(c, "attribute table_json: the halo transport of every link between ranks, as resolved by the "
                         "last hmc run (JSON; [] on one rank)")
            f.flush()
        durable_replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _write_gauge(f, state: RunState) -> None:
    """/gauge/links and the attributes that make it readable without this code (docs/runfile.md)."""
    if len(state.plaquette) != 2:
        raise ValueError("RunState.plaquette must hold MILC's (ss, st) plaquette of its links")
    ss, st = (float(v) for v in state.plaquette)
    g = f.create_group("gauge")
    links = g.create_dataset("links", data=state.links)
    for k, v in schema.LINKS_ATTRS.items():
        _attr(links, k, v)
    nt, nz, ny, nx = state.links.shape[:4]
    links.attrs["dims"] = np.array([nx, ny, nz, nt], dtype=np.int64)
    _attr(g, "sha256", links_digest(state.links))
    g.attrs["trajectory"] = state.trajectory
    g.attrs["plaquette"] = (ss + st) / 6.0
    g.attrs["plaquette_ss"], g.attrs["plaquette_st"] = ss, st
    _describe(g, schema.GAUGE_ATTRS_DESCRIPTION)


def _file_version(f, path) -> int:
    """The format version: the attribute, or 1 for a file written before it was recorded; a newer one is refused."""
    if "format_version" not in f.attrs:
        return 1
    try:
        version = int(f.attrs["format_version"])
    except (TypeError, ValueError):
        version = 0
    if version > FORMAT_VERSION:
        raise RunFileError(f"{path} has run-file format version {version}, newer than this hmc reads (up to "
                           f"{FORMAT_VERSION}): upgrade hisq-hmc to read it")
    if version < 1:
        raise RunFileError(f"{path} has an invalid run-file format version {f.attrs['format_version']!r}: the file is "
                           "damaged; start a new run with 'hmc init'")
    return version


def open_file(path) -> h5py.File:
    """The run file opened for reading, in a way that cannot hang in libhdf5 (:mod:`hmc.runfile_open`)."""
    try:
        return open_checked(path)
    except DamagedHDF5 as e:
        raise RunFileError(f"{path} {e}: start from an earlier copy, or a new run with 'hmc init'") from None
    except OSError:
        raise RunFileError(f"{path} is not an HDF5 run file (truncated or foreign): create a new one with "
                           "'hmc init'") from None


def load(path) -> RunState:
    """Read and check a run file; any inconsistency is a one-line RunFileError naming the file. The temporary
    file of a save killed midway (its process dead) is removed first."""
    path = os.fspath(path)
    remove_stale_temporaries(path)
    if not os.path.exists(path):
        raise RunFileError(f"run file {path} does not exist: create it with 'hmc init DECK.toml -o {path}'")
    with open_file(path) as f:
        try:
            if _text(f.attrs.get("format", "")) != FORMAT:
                raise RunFileError(f"{path} is an HDF5 file but not a hisq-hmc run file: create one with 'hmc init'")
            version = _file_version(f, path)
            deck_text = _dataset(f, "params/deck_toml", path).decode()
            stored = json.loads(f["params"].attrs["deck_json"])
            links = _dataset(f, "gauge/links", path)
            digest = _text(f["gauge"].attrs["sha256"])
            traj = int(f.attrs["trajectory"])
            rng = {"seed": int(f["rng"].attrs["seed"]), "counters": json.loads(f["rng"].attrs["counters_json"])}
            if "milc" in f["rng"]:
                rng["milc"] = _read_state(f["rng/milc"])
            files = {k: _dataset(f, v.name, path).decode() for k, v in f["params/files"].items()} \
                if "files" in f["params"] else {}
            history = _read_history(f, version, path)
            plaq = tuple(float(f["gauge"].attrs[k]) for k in ("plaquette_ss", "plaquette_st")
                         if k in f["gauge"].attrs)
            comms = json.loads(f["comms"].attrs["table_json"])
            source = _text(f.attrs.get("source", ""))
            record = ({k: json.loads(v) for k, v in f["config"].attrs.items() if k != "description"}
                      if "config" in f else None)
        except RunFileError:
            raise
        except _DAMAGED as e:
            raise RunFileError(f"{path} is incomplete or damaged ({e}): start a new run with 'hmc init'") from None
    try:
        d = deckmod.loads(deck_text)
    except deckmod.DeckError as e:
        raise RunFileError(f"{path}: its stored deck no longer validates ({e})") from None
    if not _same_deck(d, stored):
        raise RunFileError(f"{path}: the stored deck and its validated parameters disagree: the file was edited; "
                           "start a new run")
    nx, ny, nz, nt = d["lattice"]["dims"]
    if links.shape != (nt, nz, ny, nx, 4, 3, 3):
        raise RunFileError(f"{path}: the stored configuration has shape {links.shape}, but the deck's lattice is "
                           f"{d['lattice']['dims']}: the file is inconsistent")
    if links_digest(links) != digest:
        raise RunFileError(f"{path}: the stored configuration does not match its SHA-256 digest: the file is "
                           "damaged; start from an earlier copy")
    if len(history) != traj:
        raise RunFileError(f"{path}: {traj} trajectories recorded but {len(history)} history rows: the file is "
                           "inconsistent")
    try:
        config = None if record is None else RunConfig.from_record(record)
    except ConfigError as e:
        raise RunFileError(f"{path}: its stored run configuration is not valid ({e}): start a new run") from None
    return RunState(d, deck_text, links, traj, rng, history, comms, source, files, config, plaq,
                    version)


# what h5py raises on damaged metadata or data (HDF5's errors come as OSError, KeyError, ValueError, TypeError or
# RuntimeError; a damaged string or attribute can come back as an object without .decode or .item)
_DAMAGED = (KeyError, OSError, ValueError, TypeError, RuntimeError, AttributeError, IndexError)


def _dataset(f, name: str, path: str):
    """``f[name][()]``, refused before reading when the dataset claims more bytes than the whole file holds (a
    damaged dataspace must not size an allocation)."""
    ds = f[name]
    claimed = ds.size * ds.dtype.itemsize
    if claimed > os.path.getsize(path):
        raise RunFileError(f"{path} is damaged: dataset {name} claims {claimed} bytes, more than the file's "
                           f"{os.path.getsize(path)}: start from an earlier copy")
    return ds[()]


def _same_deck(d: dict, stored: dict) -> bool:
    """The validated deck equals the stored one, except for keys added to the schema since the file was written,
    which must hold their defaults (so that run files of an older hmc still resume)."""
    if set(d) != set(stored):
        return False
    for section, keys in d.items():
        old = stored[section]
        if not isinstance(old, dict) or set(old) - set(keys):
            return False
        for name, value in keys.items():
            if name in old:
                if old[name] != value:
                    return False
            elif value != deckmod.SCHEMA[section][name].default:
                return False
    return True


def _write_state(group, st: dict) -> None:
    """A generator state (scalars and numpy arrays) into an HDF5 group: arrays as datasets, the rest as attributes."""
    _describe(group, "MILC's generator state: arrays as datasets, scalars as attributes (hmc/rngs.py)")
    for k, v in st.items():
        if isinstance(v, np.ndarray):
            _describe(group.create_dataset(k, data=v), schema.DATASET_DESCRIPTIONS["rng/milc"], "1")
        else:
            _attr(group, k, v)


def _read_state(group) -> dict:
    out = {k: v[()] for k, v in group.items()}
    for k, v in group.attrs.items():
        out[k] = v.decode() if isinstance(v, bytes) else (v.item() if isinstance(v, np.generic) else v)
    return out
