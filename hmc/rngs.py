"""The random numbers of a run: the counter-based Philox streams, or MILC's own generators (docs/conventions.md 3.3).

``[run] rng`` in the deck picks one:

* ``philox`` (:class:`lattice.CounterRNG`): named streams keyed by global site index; the state is one draw counter
  per stream. Momenta come from the stream "momenta", pseudofermion sources from "pseudofermions", the Metropolis
  number from "metropolis"; the order of the draws does not matter.
* ``milc`` (:class:`MilcStreams`): MILC's per-site generators (``SITERAND``) seeded with iseed = seed, and its node
  generator for the accept/reject number, so that MILC's trajectories are reproduced number for number. At each
  site MILC draws ``ranmom`` first (4 directions x 4 complex Gaussians), then, on even sites, 3 complex Gaussians
  per pseudofermion in file order (``grsource_rhmc.c``); :func:`hmc.trajectory.hmc_trajectory` draws the momenta
  before it refreshes the pseudofermions for that reason. The state (7 + 1 words per site, and the node
  generator) goes into the run file's ``/rng``.
* ``milc_old``: the same with the generator of MILC before ``OLD_GAUSSRAND`` was retired (MILC's 2009 outputs, e.g.
  ``su3_rhmc_hisq.f211.2.sample-out``; :mod:`lattice.milc_rng`, ``variant="old"``).

Every function here takes either kind; ``draw_momenta`` and ``pseudofermion_sources`` return local site arrays of
the geometry (each rank keeps the whole MILC state and draws every site, then keeps its own block, so that the
numbers and the stored state do not depend on the decomposition).
"""
from __future__ import annotations

import math

import numpy as np

from lattice import CounterRNG
from lattice.milc_rng import MilcRNG, even_sites

from .momenta import random_momenta

KINDS = ("philox", "milc", "milc_old")
_VARIANT = {"milc": "current", "milc_old": "old"}


class MilcStreams:
    """MILC's generators for an HMC run on a lattice of ``dims`` (nx, ny, nz, nt)."""

    def __init__(self, seed: int, dims, variant: str = "current", milc: MilcRNG | None = None):
        self.milc = milc if milc is not None else MilcRNG(int(seed), dims=tuple(dims), variant=variant)
        self.kind = "milc_old" if self.milc.variant == "old" else "milc"

    @property
    def seed(self) -> int:
        return self.milc.seed

    def _global_to_local(self, geom, a):
        """A global array in MILC's site order (volume, ...) as this rank's site array (nt, nz, ny, nx, ...)."""
        if tuple(self.milc.dims) != tuple(geom.dims):
            raise ValueError(f"MILC generators were made for a {self.milc.dims} lattice, not {geom.dims}")
        nx, ny, nz, nt = geom.dims
        return geom.xp.asarray(np.ascontiguousarray(geom.local_part(a.reshape((nt, nz, ny, nx) + a.shape[1:]))))

    def momenta(self, geom):
        """MILC's ``ranmom``: P as (4, nt, nz, ny, nx, 3, 3), traceless anti-Hermitian, <Tr P^dag P / 2> = 4."""
        p = self._global_to_local(geom, self.milc.ranmom())              # (nt, nz, ny, nx, 4, 3, 3)
        return geom.xp.ascontiguousarray(geom.xp.moveaxis(p, 4, 0))

    def pseudofermion_sources(self, geom, n: int) -> list:
        """MILC's heat-bath Gaussians for ``n`` pseudofermions (file order): fields (nt, nz, ny, nx, 3) on the even
        sites (zero on odd ones), density exp(-|g|^2) per complex component."""
        even = even_sites(tuple(geom.dims))
        g = self.milc.grsource(n, even)                                   # (n, n_even, 3)
        out = []
        for k in range(n):
            full = np.zeros((geom.volume, 3), dtype=np.complex128)
            full[even] = g[k]
            out.append(self._global_to_local(geom, full))
        return out

    def global_uniform(self, stream: str = "metropolis") -> float:
        """The node generator's next number (MILC's ``xrandom`` for the accept/reject test)."""
        return self.milc.node_uniform()

    def state(self) -> dict:
        return {"seed": self.seed, "counters": {}, "milc": self.milc.state()}

    def copy(self) -> "MilcStreams":
        return MilcStreams(self.seed, self.milc.dims, milc=MilcRNG.from_state(self.milc.state()))


def make_rng(kind: str, seed: int, dims):
    """A fresh generator of the deck's kind (``[run] rng``)."""
    if kind == "philox":
        return CounterRNG(seed)
    if kind in _VARIANT:
        return MilcStreams(seed, dims, _VARIANT[kind])
    raise ValueError(f"unknown random-number generator {kind!r}: use one of {', '.join(KINDS)}")


def rng_from_state(kind: str, state: dict, dims):
    """The generator stored in a run file (``RunState.rng``), positioned exactly where it stopped."""
    if kind == "philox":
        return CounterRNG(state["seed"], state.get("counters", {}))
    if "milc" not in state:
        raise ValueError("the run file's /rng has no MILC generator state, but the deck asks for rng = "
                         f"{kind!r}: start a new run with 'hmc init'")
    return MilcStreams(state["seed"], dims, milc=MilcRNG.from_state(state["milc"]))


def copy_rng(rng):
    """An independent copy that draws the same numbers (for probes that must not advance the run's streams)."""
    if isinstance(rng, CounterRNG):
        return CounterRNG(rng.seed, dict(rng.counters))
    return rng.copy()


def draw_momenta(geom, rng):
    """Gaussian momenta P (4, nt, nz, ny, nx, 3, 3) from either kind of generator."""
    if hasattr(rng, "momenta"):
        return rng.momenta(geom)
    return random_momenta(geom, rng)


def pseudofermion_sources(geom, rng, n: int) -> list:
    """``n`` complex Gaussian fields on the even sites, density exp(-|g|^2) (each real part has variance 1/2),
    zero on the odd sites: the heat-bath sources of the pseudofermions, in file order."""
    if hasattr(rng, "pseudofermion_sources"):
        return rng.pseudofermion_sources(geom, n)
    xp = geom.xp
    w = rng.gaussian("pseudofermions", geom.site_ids(), 6 * n).reshape(geom.shape + (n, 3, 2))
    even = (geom.parity() == 0)[..., None]
    scale = 1.0 / math.sqrt(2.0)
    return [xp.ascontiguousarray((w[..., k, :, 0] + 1j * w[..., k, :, 1]) * scale * even) for k in range(n)]
