"""The near-null space shared between masses (:class:`Subspace`) and the operators of every level for one mass
(:class:`Hierarchy`), docs/multigrid.md 6; :class:`.solver.MultigridInverse` builds and keeps them up to date."""
from __future__ import annotations

import numpy as np

from ..staggered import StaggeredMatrix
from . import timing
from .lattice import MultigridError
from .operators import Counter, FineStencil, KDBlocks, LevelOperator
from .params import MultigridParams
from .precision import CycleLevels
from .transfer import Transfer, galerkin

class Subspace:
    """The near-null vectors and transfers of every aggregation level, shared by the hierarchies of several masses
    of one operator D, and the rule that keeps them up to date when D's links change (docs/multigrid.md 6):

    * ``refresh_every = None`` (the default): every new set of links refreshes the vectors (``refresh_iters`` CG
      iterations from the kept vectors, then re-orthonormalized; QUDA's refresh);
    * ``refresh_every = N >= 1``: the vectors are refreshed on the first new links after N epochs (``new_epoch``:
      RHMC calls it once per trajectory) have begun since they were built or last refreshed; other new links only
      rebuild X^-1 and the coarse operators on the kept vectors and transfers (QUDA's thin update);
    * ``refresh_every = 0``: never refreshed, thin updates only.

    ``counts`` says how often each happened: "built", "refreshed", "updated" (thin) and "rebuilt" (another mass on
    the same links and vectors)."""

    def __init__(self, params: MultigridParams, refresh_every: int | None = None):
        if refresh_every is not None and (not isinstance(refresh_every, (int, np.integer)) or refresh_every < 0):
            raise MultigridError(f"refresh_every = {refresh_every!r}: a number >= 0 of epochs (trajectories) between "
                                 "refreshes of the near-null vectors (0: never), or None (every link update)")
        self.params = params
        self.refresh_every = refresh_every
        self.epochs = 0             # epochs begun since the vectors were built or last refreshed
        self.vectors = []           # per aggregation level: the batch of (unnormalized) near-null vectors
        self.transfers = []         # per aggregation level: Transfer
        self.links = None           # the link blocks the vectors belong to
        self.stencil = None         # the full-lattice links of those blocks (FineStencil), shared by the masses
        self.version = 0
        self.counts = {"built": 0, "refreshed": 0, "updated": 0, "rebuilt": 0}

    def new_epoch(self) -> None:
        """One more epoch (an RHMC trajectory) has begun: counts towards ``refresh_every``."""
        self.epochs += 1

    def on_new_links(self) -> str:
        """What new links do to the vectors under the rule: "built" (none yet), "refreshed" or "updated"."""
        if not self.vectors:
            return "built"
        every = self.refresh_every
        if every is None or (every > 0 and self.epochs >= every):
            return "refreshed"
        return "updated"


class Hierarchy:
    """The operators of every level for one mass, on the subspace's transfers."""

    def __init__(self, M: StaggeredMatrix, params: MultigridParams, stencil: FineStencil):
        self.M, self.params = M, params
        self.counters = [Counter() for _ in range(params.levels)]
        self.clocks = [timing.LevelClock() for _ in range(params.levels)]
        self.stencil = stencil
        self.kd = KDBlocks(stencil) if params.kd else None
        self.ops = [None, LevelOperator(M, stencil, self.kd, self.counters[1])]
        self.transfers = []
        self.lu = None
        self.cycle: CycleLevels | None = None
        self.version = -1

    def add_level(self, transfer: Transfer):
        l = len(self.ops)
        self.transfers.append(transfer)
        self.ops.append(galerkin(self.ops[-1], transfer, self.counters[l], level=l))

    def coarsest_mode(self):
        p = self.params
        op = self.ops[-1]
        unknowns = op.geom.volume * op.n
        if p.coarsest == "lu":
            return "lu"
        if p.coarsest == "auto" and unknowns <= p.lu_max_unknowns:
            return "lu"
        return "gcr"

    def factorize(self):
        """The levels in the preconditioner's precision (:class:`.precision.CycleLevels`) and the coarsest LU in
        that precision (``lu``)."""
        self.cycle = CycleLevels(self, self.params.precision)
        self.cycle.factorize(self.coarsest_mode())
        self.lu = self.cycle.lu
