"""Commands of ``hmc`` that live in packages above it (the benchmarks and studies of :mod:`bench`).

A *command provider* is a module with ``add_parsers(sub)``: it adds its sub-commands to the ``hmc`` sub-parsers
``sub`` and gives each the function that runs it with ``set_defaults(run_command=fn)`` (``fn(args) -> int``).
:func:`add_provided_parsers` finds the providers and calls them; :mod:`hmc.cli` then runs ``args.run_command``.

Why a registry and not an import: ``bench`` sits above ``hmc`` (comms <- lattice <- solvers, force <- hmc <- bench),
so ``hmc`` must not import it by name in its code; the provider registers itself instead. Two ways to find it, so
that both an installed project and a plain checkout work:

* installed (``pip install``): the entry points of the group ``hmc.commands`` (pyproject.toml,
  ``[project.entry-points."hmc.commands"]``), each naming a provider module;
* a checkout run as ``PYTHONPATH=. python3 -m hmc ...`` (the GPU machines have no install, so no entry points):
  the provider modules of :data:`CHECKOUT_PROVIDERS`, imported through importlib when a package of that name is
  importable from ``sys.path``; a missing one is simply absent (its commands are not offered).

A provider found both ways is added once.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util

ENTRY_POINT_GROUP = "hmc.commands"
CHECKOUT_PROVIDERS = ("bench.commands",)


def _importable(module: str) -> bool:
    """Whether ``module`` can be found on sys.path (its parent package is imported to look; nothing else is)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def provider_modules() -> list[str]:
    """Module names of the command providers: the entry points first, then those of a checkout."""
    names = [ep.value.split(":")[0] for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]
    names += [m for m in CHECKOUT_PROVIDERS if _importable(m)]
    return list(dict.fromkeys(names))


def add_provided_parsers(sub) -> list[str]:
    """Every provider's sub-commands added to ``sub``; returns the provider modules used."""
    used = provider_modules()
    for name in used:
        importlib.import_module(name).add_parsers(sub)
    return used
