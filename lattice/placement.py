"""Execution placement: where a geometry's lattice lives, and which implementation of a kernel serves it.

One rule, :func:`placement_of`, says where the lattice of a geometry lives (``geom.placement``):

* ``ARRAY``: NumPy arrays; the array code (the NumPy twins) runs.
* ``WHOLE``: the whole lattice on one GPU of a one-rank run: one rank on the grid's communicator, no partitioned
  dimension; kernels index the local array with periodic wrap.
* ``DISTRIBUTED``: a GPU rank of a run over several ranks, or a partitioned dimension: neighbours across a
  partitioned dimension come through a halo exchange. A one-rank sub-grid of a split grid
  (:func:`solvers.multigrid.split_grid_solve`) is one: its rank is part of a distributed run, so it gets the
  distributed kernels (the staggered hop's DistHop, the padded or array gauge force). Its local array is still the
  whole lattice (:func:`holds_whole_lattice`), so a kernel that only needs that (the unpadded HISQ smearing and
  force kernels) registers on ``DISTRIBUTED`` too with that as its ``fits``.

``PADDED`` is a placement an implementation claims, not one a geometry has: the single-GPU kernels run on links
halo-padded by a depth (:meth:`lattice.Geometry.padded`); it serves a ``DISTRIBUTED`` geometry whose partitioned
local extents hold that depth (:func:`padding_fits`).

Implementations register with :func:`implements` under a kernel name and one or more placements; :func:`lookup`
returns, for a geometry, the first implementation along its chain (:data:`CHAIN`: the geometry's own placement,
then ``PADDED`` for a distributed one, then ``ARRAY``) whose run-configuration switch is on and whose ``fits``
predicate accepts the call's context; several implementations on one placement are tried by descending
``priority`` (a newer kernel registered ahead of the one it may replace, each behind its own switch). Every name has an ``ARRAY`` implementation, the twin the others are tested
against. Switches are fields of :class:`comms.config.RunConfig` (``hisq_kernels``, ...) read from the geometry's
configuration; :func:`set_switch` overrides one for every caller (tests, timings). Kernels that touch one site or
link at a time and take bare arrays use :func:`local_placement` in place of a geometry.
"""
from __future__ import annotations

import enum
from contextlib import contextmanager
from dataclasses import dataclass


class Placement(enum.Enum):
    ARRAY = "array"
    WHOLE = "whole"
    DISTRIBUTED = "distributed"
    PADDED = "padded"


#: the placements tried, in order, for a geometry of each placement
CHAIN = {
    Placement.ARRAY: (Placement.ARRAY,),
    Placement.WHOLE: (Placement.WHOLE, Placement.ARRAY),
    Placement.DISTRIBUTED: (Placement.DISTRIBUTED, Placement.PADDED, Placement.ARRAY),
}


def placement_of(geom) -> Placement:
    """Where ``geom``'s lattice lives (module docstring): from its backend and its grid's current context."""
    if not geom.backend.is_gpu:
        return Placement.ARRAY
    if holds_whole_lattice(geom) and geom.grid.comm.size == 1:
        return Placement.WHOLE
    return Placement.DISTRIBUTED


def holds_whole_lattice(geom) -> bool:
    """Whether ``geom``'s local array is the whole lattice: no partitioned dimension in its grid's current context
    (a ``WHOLE`` geometry, or a one-rank sub-grid of a split grid), so kernels may wrap periodically inside it."""
    return not any(geom.grid.partitioned)


def local_placement(a) -> Placement:
    """Where a site-local kernel (one thread per site or link, no neighbours) runs for the array ``a``: ``ARRAY``
    for a NumPy array, ``WHOLE`` for a device array (such a kernel sees any array as a whole lattice)."""
    return Placement.WHOLE if type(a).__module__.startswith("cupy") else Placement.ARRAY


def padding_fits(geom, depth: int) -> bool:
    """Whether links padded by ``depth`` serve ``geom``: a partitioned grid whose partitioned local extents hold the
    padding (a thinner one, e.g. a local extent of 1, keeps the array path)."""
    parts = [mu for mu in range(4) if geom.grid.partitioned[mu]]
    return bool(parts) and all(geom.local_dims[mu] >= depth for mu in parts)


def pads_on_gpu(geom, depth: int) -> bool:
    """Whether the ``PADDED`` placement with ``depth`` serves ``geom``: a distributed GPU geometry that
    :func:`padding_fits`."""
    return padding_fits(geom, depth) and placement_of(geom) is Placement.DISTRIBUTED


# --- switches -------------------------------------------------------------------------------------------------

_OVERRIDES: dict = {}        # switch -> bool, for every caller (set_switch)


def set_switch(switch: str, on: bool | None) -> bool | None:
    """Switch the implementations gated by ``switch`` (a RunConfig field) on or off for every caller, whatever the
    configuration says; None: as configured again. Returns the previous override, to restore it with."""
    old = _OVERRIDES.pop(switch, None)
    if on is not None:
        _OVERRIDES[switch] = bool(on)
    return old


def switch_on(switch: str | None, config) -> bool:
    """Whether ``switch`` is on: the override of :func:`set_switch`, else the configuration's field (``config``
    None: the environment's configuration, built now)."""
    if switch is None:
        return True
    if switch in _OVERRIDES:
        return _OVERRIDES[switch]
    if config is None:
        from comms.config import RunConfig

        config = RunConfig.from_environment()
    return bool(getattr(config, switch))


# --- registry -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Implementation:
    fn: object
    placement: Placement
    switch: str | None = None
    fits: object = None          # fits(geom, **ctx) -> bool, or None: always
    depth: object = None         # PADDED: the padding, an int or depth(**ctx)
    priority: int = 0            # among the implementations on one placement, the higher is tried first

    def serves(self, geom, config, ctx) -> bool:
        if not switch_on(self.switch, config):
            return False
        if self.placement is Placement.PADDED:
            depth = self.depth(**ctx) if callable(self.depth) else self.depth
            if not padding_fits(geom, depth):
                return False
        return self.fits is None or bool(self.fits(geom, **ctx))


_REGISTRY: dict = {}         # name -> {Placement: [Implementation, ...] by descending priority}
_EXCLUDED: set = set()       # placements skipped by lookup (without)


def implements(name: str, *placements: Placement, switch: str | None = None, fits=None, depth=None,
               priority: int = 0):
    """Decorator: the function implements kernel ``name`` on each of ``placements``. ``switch``: the RunConfig
    field that turns it off; ``fits(geom, **ctx)``: whether it serves this call; ``depth`` (PADDED only, required):
    the halo depth, an int or ``depth(**ctx)``; ``priority``: the order among implementations on one placement
    (higher first; two on one placement need different priorities)."""
    if not placements:
        raise ValueError(f"implements({name!r}): name at least one Placement")
    if (Placement.PADDED in placements) != (depth is not None):
        raise ValueError(f"implements({name!r}): a PADDED implementation, and only one, takes depth=")

    def register(fn):
        table = _REGISTRY.setdefault(name, {})
        for p in dict.fromkeys(placements):        # an alias named beside its member registers once
            held = table.get(p, [])
            same = [i for i in held if i.priority == priority]
            if same or (p is Placement.ARRAY and held):
                raise ValueError(f"kernel {name!r} already has an implementation on {p.value}: "
                                 f"{(same or held)[0].fn.__qualname__}")
            new = Implementation(fn, p, switch, fits, depth, priority)
            table[p] = sorted(held + [new], key=lambda i: -i.priority)
        return fn
    return register


def _where(geom):
    if isinstance(geom, Placement):
        return geom, None, None
    return placement_of(geom), geom, getattr(geom, "config", None)


def choose(name: str, geom, config=None, **ctx) -> Implementation:
    """The implementation of ``name`` that serves ``geom`` (a geometry, or a :class:`Placement` from
    :func:`local_placement` with the run configuration ``config``) for a call with context ``ctx``."""
    table = _REGISTRY.get(name)
    if table is None:
        raise KeyError(f"no kernel named {name!r}: import the module that registers it (known: "
                       f"{', '.join(sorted(_REGISTRY))})")
    where, g, cfg = _where(geom)
    cfg = cfg if config is None else config
    for p in CHAIN[where]:
        if p in _EXCLUDED:
            continue
        for impl in table.get(p, ()):
            if p is Placement.ARRAY or impl.serves(g, cfg, ctx):
                return impl
    raise KeyError(f"kernel {name!r} has no array implementation: register one with "
                   f"@implements({name!r}, Placement.ARRAY)")


def lookup(name: str, geom, config=None, **ctx):
    """The function that implements ``name`` for ``geom`` and this call (:func:`choose`)."""
    return choose(name, geom, config, **ctx).fn


@contextmanager
def without(*placements: Placement):
    """Within the block, :func:`lookup` skips ``placements`` (e.g. PADDED, to time the array path)."""
    if Placement.ARRAY in placements:
        raise ValueError("the array implementation cannot be excluded: it is the one every lookup ends at")
    added = set(placements) - _EXCLUDED
    _EXCLUDED.update(added)
    try:
        yield
    finally:
        _EXCLUDED.difference_update(added)
