"""Configurations kept beside a run file: with ``save_every = N`` in the deck's [run], the configuration after every
N-th trajectory is written as an ILDG file (64-bit, exact; ildg-data-lfn, usqcdInfo and scidac-checksum, readable
by MILC, Grid, Chroma and PyQUDA) next to the run file, as MILC's ``save_serial`` every N and Grid's checkpointer
keep theirs. The run file itself holds only the latest configuration (docs/runfile.md); ``hmc export RUN.h5
--trajectory N``, ``RUN.h5:N`` and :func:`hmc.lattice_source.run_file_configuration` read the kept ones.

Files are written when their trajectory completes, before the checkpoint that records it: a run killed in
between leaves a file that the resumed run writes again.
"""
from __future__ import annotations

import os

from lattice.io import read_site_major, write_gauge


def kept_path(run_path, trajectory: int) -> str:
    """``RUN.h5`` -> ``RUN.traj<N>.ildg`` beside it (``RUN`` without its ``.h5``)."""
    run_path = os.fspath(run_path)
    stem = run_path[:-3] if run_path.endswith(".h5") else run_path
    return f"{stem}.traj{trajectory}.ildg"


def keeps(deck: dict, trajectory: int) -> bool:
    every = deck["run"].get("save_every", 0)
    return bool(every) and trajectory > 0 and trajectory % every == 0


def write_kept(run_path, u, trajectory: int, name: str) -> dict:
    """Write the GaugeField ``u`` (collective over its ranks) as trajectory ``trajectory``'s kept file."""
    out = kept_path(run_path, trajectory)
    return write_gauge(out, u, "ildg", precision=64, lfn=os.path.basename(out),
                       info=f"{name}: trajectory {trajectory} of {os.path.abspath(os.fspath(run_path))}")


def kept_trajectories(run_path, deck: dict, latest: int) -> list[int]:
    """The trajectories up to ``latest`` whose kept files exist."""
    every = deck["run"].get("save_every", 0)
    if not every:
        return []
    return [n for n in range(every, latest + 1, every) if os.path.exists(kept_path(run_path, n))]


def read_kept(run_path, trajectory: int):
    """(site-major links, info) of a kept file, its checksums verified (lattice.io)."""
    return read_site_major(kept_path(run_path, trajectory))
