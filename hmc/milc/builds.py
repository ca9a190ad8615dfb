"""MILC's ks_imp_rhmc executables as the project's deck settings.

A MILC input deck does not say which algorithm runs it: the executable does, through the compiler macros of its
``Make_template`` target (``ks_imp_rhmc/Make_template``; the HISQ targets take ``HISQ_OPTIONS`` from the
Makefile, whose default is INT_3G1F). This table is the one place where a build becomes deck values; a value the
deck schema does not know yet (an integrator or fermion variant still to come) fails validation with its one-line
error naming the key.

* ``fermion``: ``[fermions] action``; ``unitarization_group``: ``[fermions] unitarization_group`` of HISQ (u3:
  ``hisq/hisq_u3_action.h``, su3: ``hisq/hisq_su3_action.h``, omitted: the deck's default); ``quark_loops``: ``[gauge] quark_loops`` (``symanzik_1loop_hisq_action.h``
  is "hisq", ``symanzik_1loop_action.h`` "asqtad");
* ``scheme``: ``[integrator] scheme`` (INT_3G1F, INT_LEAPFROG, INT_OMELYAN as those builds run them);
* ``metropolis``: the ``-DHMC`` macro (without it the trajectory ends with MILC's ``CHECK: delta S`` line and no
  accept/reject: RHMD);
* ``naik``: whether the deck gives ``naik_term_epsilon`` per PBP mass (HISQ builds);
* ``rng``: MILC's generator of the sample outputs' era (:mod:`hmc.rngs`);
* ``spectrum``: the deck has su3_spectrum_hisq's spectrum block instead of the PBP masses.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..deck import DeckError


@dataclass(frozen=True)
class Build:
    name: str
    fermion: str
    quark_loops: str
    scheme: str
    metropolis: bool
    naik: bool = True
    rng: str = "milc"
    unitarization_group: str | None = None
    spectrum: bool = False


BUILDS = {b.name: b for b in (
    Build("su3_rhmc_hisq", "hisq", "hisq", "3g1f", True),
    Build("su3_rhmd_hisq", "hisq", "hisq", "3g1f", False),
    # hisq/hisq_su3_action.h: the HISQ links' unitarization projects on SU(3) instead of U(3); its sample output is
    # from MILC of May 2009 (the generator before OLD_GAUSSRAND was retired)
    Build("su3_rhmc_hisq_su3", "hisq", "hisq", "3g1f", True, rng="milc_old", unitarization_group="su3"),
    Build("su3_leapfrog", "asqtad", "asqtad", "milc_leapfrog", False, naik=False),
    Build("su3_omelyan_rhmc", "asqtad", "asqtad", "milc_omelyan", True, naik=False),
    # -DSPECTRUM without -DHMC (RHMD: CHECK: delta S); its sample output is from MILC of May 2009
    Build("su3_spectrum_hisq", "hisq", "hisq", "3g1f", False, spectrum=True, rng="milc_old"),
)}
DEFAULT = "su3_rhmc_hisq"


def build_for(name: str | None, deck_name: str | None = None) -> Build:
    """The build ``name``; without one, the build whose name starts the deck's file name (MILC's test decks are
    called BUILD[.CASE].PREC.sample-in), else su3_rhmc_hisq."""
    if name is not None:
        if name not in BUILDS:
            raise DeckError(f"unknown MILC build {name!r}: use one of {', '.join(BUILDS)}")
        return BUILDS[name]
    if deck_name:
        stem = deck_name.rsplit("/", 1)[-1]
        for b in sorted(BUILDS, key=len, reverse=True):
            if stem == b or stem.startswith(b + "."):
                return BUILDS[b]
    return BUILDS[DEFAULT]
