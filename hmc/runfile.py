"""The run file (``trajectory.h5``): deck, current configuration, RNG state and history, written atomically.

Layout (DESIGN.md): ``/params`` (validated deck as JSON, and the TOML text it came from), ``/gauge`` (links in
MILC's site-major order, with trajectory, plaquette and SHA-256 attributes), ``/rng`` (seed and per-stream draw
counters: the whole state of the counter-based generator; with MILC's generators, ``/rng/milc`` holds their state,
:mod:`hmc.rngs`), ``/history`` (one row per trajectory), ``/comms`` (the resolved transport table), ``/params/files``
(texts the run needs besides the deck, e.g. its rational functions, copied in at ``hmc init`` so that the run file
does not depend on them staying where they were). Every save writes a complete new file next to the old one,
flushes it to disk and renames it over the old one, so a run killed at any moment leaves the last complete
checkpoint.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
from dataclasses import dataclass, field

import h5py
import numpy as np

from lattice.io.common import durable_replace, remove_stale_temporaries, temporary_name

from . import deck as deckmod

FORMAT = "hisq-hmc run file"
FORMAT_VERSION = 1


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


def links_digest(links: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(links).tobytes()).hexdigest()


def _history_array(rows: list[dict]):
    if not rows:
        return None
    names = list(rows[0].keys())
    dtype = [(n, "f8") if isinstance(rows[0][n], float) else (n, "i8") for n in names]
    return np.array([tuple(r[n] for n in names) for r in rows], dtype=dtype)


_save_count = 0


def _maybe_fault(stage: str):
    """Testing hook: HMC_FAULT_INJECT=kill_during_checkpoint:N kills this process halfway through the N-th save."""
    spec = os.environ.get("HMC_FAULT_INJECT", "")
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
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["format_version"] = FORMAT_VERSION
            f.attrs["trajectory"] = state.trajectory
            f.attrs["source"] = state.source
            par = f.create_group("params")
            par.attrs["deck_json"] = json.dumps(state.deck, sort_keys=True)
            par.create_dataset("deck_toml", data=state.deck_text)
            if state.files:
                fg = par.create_group("files")
                for name, text in state.files.items():
                    fg.create_dataset(name, data=text)
            g = f.create_group("gauge")
            g.create_dataset("links", data=state.links)
            g.attrs["sha256"] = links_digest(state.links)
            g.attrs["trajectory"] = state.trajectory
            f.flush()
            _maybe_fault("half")
            r = f.create_group("rng")
            r.attrs["seed"] = state.rng.get("seed", 0)
            r.attrs["counters_json"] = json.dumps(state.rng.get("counters", {}), sort_keys=True)
            if "milc" in state.rng:
                _write_state(r.create_group("milc"), state.rng["milc"])
            h = f.create_group("history")
            arr = _history_array(state.history)
            if arr is not None:
                h.create_dataset("rows", data=arr)
            c = f.create_group("comms")
            c.attrs["table_json"] = json.dumps(state.comms)
            f.flush()
        durable_replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(path) -> RunState:
    """Read and check a run file; any inconsistency is a one-line RunFileError naming the file. The temporary
    file of a save killed midway (its process dead) is removed first."""
    path = os.fspath(path)
    remove_stale_temporaries(path)
    if not os.path.exists(path):
        raise RunFileError(f"run file {path} does not exist: create it with 'hmc init DECK.toml -o {path}'")
    try:
        f = h5py.File(path, "r")
    except OSError:
        raise RunFileError(f"{path} is not an HDF5 run file (truncated or foreign): create a new one with "
                           "'hmc init'") from None
    with f:
        try:
            if f.attrs.get("format") != FORMAT:
                raise RunFileError(f"{path} is an HDF5 file but not a hisq-hmc run file: create one with 'hmc init'")
            version = int(f.attrs.get("format_version", -1))
            if version != FORMAT_VERSION:
                raise RunFileError(f"{path} has run-file format version {version}, this hmc reads version "
                                   f"{FORMAT_VERSION}: use the hmc version that wrote it, or start a new run")
            deck_text = _dataset(f, "params/deck_toml", path).decode()
            stored = json.loads(f["params"].attrs["deck_json"])
            links = _dataset(f, "gauge/links", path)
            digest = f["gauge"].attrs["sha256"]
            traj = int(f.attrs["trajectory"])
            rng = {"seed": int(f["rng"].attrs["seed"]), "counters": json.loads(f["rng"].attrs["counters_json"])}
            if "milc" in f["rng"]:
                rng["milc"] = _read_state(f["rng/milc"])
            files = {k: _dataset(f, v.name, path).decode() for k, v in f["params/files"].items()} \
                if "files" in f["params"] else {}
            rows = _dataset(f, "history/rows", path) if "rows" in f["history"] else None
            comms = json.loads(f["comms"].attrs["table_json"])
            source = str(f.attrs.get("source", ""))
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
    history = [] if rows is None else [{n: r[n].item() for n in rows.dtype.names} for r in rows]
    if len(history) != traj:
        raise RunFileError(f"{path}: {traj} trajectories recorded but {len(history)} history rows: the file is "
                           "inconsistent")
    return RunState(d, deck_text, links, traj, rng, history, comms, source, files)


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
    for k, v in st.items():
        if isinstance(v, np.ndarray):
            group.create_dataset(k, data=v)
        else:
            group.attrs[k] = v


def _read_state(group) -> dict:
    out = {k: v[()] for k, v in group.items()}
    for k, v in group.attrs.items():
        out[k] = v.decode() if isinstance(v, bytes) else (v.item() if isinstance(v, np.generic) else v)
    return out
