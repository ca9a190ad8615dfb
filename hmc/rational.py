"""Rational approximations for the RHMC (docs/conventions.md 3.1); their file: :mod:`hmc.rational_file`.

Every approximation has MILC's partial-fraction form

    r(x) = res0 + sum_{l=1..order} res_l / (x + pole_l)

and approximates f(x) = prod_i (x + 4 m_i^2)^(y_i/z_i) on the even-site operator A = -D_eo D_oe (massless; the
masses sit inside f, the multishift CG solves (A + pole_l)^-1). Each pseudofermion carries three of them:

* MD (force):           r_MD ~ f            e.g. y = (-2, -1, 3, 0), z = 4
* GR (heat bath):       r_GR ~ f^(-1/2)     e.g. y = ( 2,  1,-3, 0), z = 8
* FA (action):          r_FA ~ f^(+1/2)     e.g. y = (-2, -1, 3, 0), z = 8

File format (MILC ``ks_imp_rhmc/load_rhmc_params.c``, written by ``remez-milc/poly4``)::

    n_pseudo N
    naik_term_epsilon e              # then, for each tag T in MD, GR, FA:
    y_T y1 y2 y3 y4
    z_T z1 z2 z3 z4
    m_T m1 m2 m3 m4
    order_T n
    res_T r0        (n+1 lines; res[0] is the constant term)
    pole_T 99.9     (n+1 lines; pole[0] is a dummy)

``#`` starts a comment. Pseudofermions are grouped by epsilon, epsilon = 0 first. poly4 writes the approximation
range in a comment (``# Approximation bounds are [1.000000e-15,9.000000e+01]``); the reader keeps it as metadata.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Iterable, Sequence

import numpy as np

TAGS = ("MD", "GR", "FA")
NMASS = 4                      # MILC's NMASS: every approximation lists four (y, z, m) triples
DUMMY_POLE = 99.9              # pole[0] in MILC's files


class RationalsError(ValueError):
    """A problem with a rational-function file or with its agreement with the run deck (one line)."""


# ----------------------------------------------------------------------------------------------------------------
# One approximation
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class RationalApprox:
    """r(x) = res0 + sum_l residues[l]/(x + poles[l]) ~ f(x) = prod_i (x + 4 m_i^2)^(y_i/z_i).

    ``poles`` and ``residues`` exclude MILC's entry 0 (the constant res0 and the dummy pole 99.9).
    ``lo``/``hi`` is the range it was made for, ``error`` the maximum relative error found there (when known).
    """

    res0: float
    residues: np.ndarray
    poles: np.ndarray
    y: tuple[int, ...] = ()
    z: tuple[int, ...] = ()
    masses: tuple[float, ...] = ()
    tag: str = ""
    lo: float | None = None
    hi: float | None = None
    error: float | None = None
    dummy_pole: float = DUMMY_POLE
    meta: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        self.res0 = float(self.res0)
        self.residues = np.asarray(self.residues, dtype=np.float64).reshape(-1)
        self.poles = np.asarray(self.poles, dtype=np.float64).reshape(-1)
        if self.residues.shape != self.poles.shape:
            raise ValueError(f"{len(self.residues)} residues but {len(self.poles)} poles")
        self.y = tuple(int(v) for v in self.y)
        self.z = tuple(int(v) for v in self.z)
        self.masses = tuple(float(v) for v in self.masses)
        if not (len(self.y) == len(self.z) == len(self.masses)):
            raise ValueError(f"y, z and masses must have the same length (got {len(self.y)}, {len(self.z)}, "
                             f"{len(self.masses)})")
        if any(v == 0 for v in self.z):
            raise ValueError("z (the exponent denominators) must be non-zero")

    # -- evaluation ------------------------------------------------------------------------------------------
    @property
    def order(self) -> int:
        return int(self.poles.size)

    @property
    def shifts(self) -> np.ndarray:
        """The multishift CG's shifts sigma_l = pole_l (solves (A + sigma_l)^-1)."""
        return self.poles

    def __call__(self, x):
        """r(x) on a scalar or numpy array (any shape)."""
        xa = np.asarray(x, dtype=np.float64)
        out = np.full(xa.shape, self.res0)
        for r, p in zip(self.residues, self.poles):
            out = out + r / (xa + p)
        return out if out.ndim else float(out)

    def eval_mp(self, x):
        """r(x) in mpmath arithmetic at the current precision, the coefficients taken as exact."""
        import mpmath as mp

        x = mp.mpf(x)
        s = mp.mpf(self.res0)
        for r, p in zip(self.residues, self.poles):
            s += mp.mpf(float(r)) / (x + mp.mpf(float(p)))
        return s

    # -- the function approximated ------------------------------------------------------------------------------
    @property
    def exponents(self) -> tuple[Fraction, ...]:
        """y_i/z_i as exact fractions, one per mass."""
        return tuple(Fraction(a, b) for a, b in zip(self.y, self.z))

    def terms(self) -> list[tuple[float, Fraction]]:
        """(mass, exponent) for the factors that matter (exponent != 0)."""
        return [(m, e) for m, e in zip(self.masses, self.exponents) if e != 0]

    def target(self, x):
        """f(x) = prod_i (x + 4 m_i^2)^(y_i/z_i) on numpy arrays (or mpmath numbers)."""
        return target_function(self.terms())(x)

    def target_mp(self, x):
        return target_function(self.terms())(x, mp=True)

    def describe(self) -> str:
        parts = [f"(x+4*{m:g}^2)^({e})" for m, e in self.terms()] or ["1"]
        return " ".join(parts)

    def with_meta(self, **kw) -> "RationalApprox":
        return replace(self, **kw)


def target_function(terms: Sequence[tuple[float, Fraction | float]]):
    """f(x) = prod (x + 4 m^2)^e for a list of (mass, exponent); call f(x) (numpy) or f(x, mp=True) (mpmath).

    The masses are taken as the doubles they are (as MILC's poly4 does: 4*m*m in high precision of the double m).
    """
    terms = [(float(m), Fraction(e) if not isinstance(e, float) else e) for m, e in terms]

    def f(x, mp: bool = False):
        if mp:
            import mpmath

            x = mpmath.mpf(x)
            y = mpmath.mpf(1)
            for m, e in terms:
                ee = mpmath.mpf(e.numerator) / e.denominator if isinstance(e, Fraction) else mpmath.mpf(e)
                y *= (x + 4 * mpmath.mpf(m) ** 2) ** ee
            return y
        if type(x).__module__.startswith("mpmath"):
            return f(x, mp=True)          # an mpf passed without mp=True
        xa = np.asarray(x, dtype=np.float64)
        y = np.ones_like(xa)
        for m, e in terms:
            y = y * (xa + 4.0 * m * m) ** float(e)
        return y if y.ndim else float(y)

    f.terms = terms
    return f


# ----------------------------------------------------------------------------------------------------------------
# Accuracy
# ----------------------------------------------------------------------------------------------------------------

def _rel_err_np(approx, f, x):
    return approx(x) / f(x) - 1.0


def error_extrema(approx: RationalApprox, f=None, lo: float | None = None, hi: float | None = None, *,
                  points: int = 4000, refine: bool = True, dps: int = 30) -> list[tuple[float, float]]:
    """The extrema (x, e(x)) of the relative error e = r/f - 1 over [lo, hi], one per run of constant sign, in
    increasing x (for a minimax approximation of order n: 2n+2 of them, alternating, all of size E).

    A log-spaced grid (plus both ends) is split into runs where e keeps its sign (runs whose largest |e| is below
    1e-6 of the overall largest are rounding noise around a zero and are dropped); the largest |e| of each run is
    then, with ``refine``, polished by a golden-section search in log x with r and f evaluated in mpmath (``dps``
    digits, the stored double coefficients taken as exact): these are the true errors of the approximation as
    stored, not double-precision noise.
    """
    lo, hi, f = _resolve_range(approx, f, lo, hi)
    x = np.unique(np.concatenate([[lo, hi], np.geomspace(lo, hi, points)]))
    e = _rel_err_np(approx, f, x)
    a = np.abs(e)
    top = float(a.max())
    sign = np.sign(e)
    cuts = np.flatnonzero(sign[1:] != sign[:-1]) + 1
    runs = [r for r in np.split(np.arange(len(x)), cuts) if a[r].max() > 1e-6 * top]
    idx = [int(r[np.argmax(a[r])]) for r in runs]
    if not refine:
        return [(float(x[i]), float(e[i])) for i in idx]
    import mpmath as mp

    out = []
    with mp.workdps(dps):
        def err(xx):
            fx = f(xx, mp=True) if _accepts_mp(f) else mp.mpf(float(f(float(xx))))
            return approx.eval_mp(xx) / fx - 1

        for i in idx:
            a0, b0 = x[max(i - 1, 0)], x[min(i + 1, len(x) - 1)]
            xm, em = _golden_max(err, a0, b0, x[i])
            out.append((float(xm), float(em)))
    return out


def approximation_error(approx: RationalApprox, f=None, lo: float | None = None, hi: float | None = None, *,
                        points: int = 4000, refine: bool = True) -> float:
    """max |r(x)/f(x) - 1| over [lo, hi] (log grid, then the extrema polished in mpmath).

    ``f`` defaults to the approximation's own target prod (x + 4 m^2)^(y/z); ``lo``/``hi`` default to the range
    stored with it (from the file's ``# Approximation bounds`` comment or from the Remez run).
    """
    ext = error_extrema(approx, f, lo, hi, points=points, refine=refine)
    return max(abs(e) for _, e in ext)


def _accepts_mp(f) -> bool:
    return hasattr(f, "terms")


def _resolve_range(approx, f, lo, hi):
    if f is None:
        if not approx.y:
            raise ValueError("no function given and the approximation carries no (y, z, m) metadata")
        f = target_function(approx.terms())
    lo = approx.lo if lo is None else lo
    hi = approx.hi if hi is None else hi
    if lo is None or hi is None:
        raise ValueError("the approximation range is unknown: pass lo and hi")
    if not (0 < lo < hi):
        raise ValueError(f"bad range [{lo}, {hi}]")
    return float(lo), float(hi), f


def _golden_max(err, a, b, x0, iters: int = 40, tol: float = 1e-8):
    """Maximize |err| on [a, b] (golden section in log x); returns (x, err(x)) at the best point seen."""
    import mpmath as mp

    la, lb = mp.log(mp.mpf(a)), mp.log(mp.mpf(b))
    best = (mp.mpf(x0), err(mp.mpf(x0)))
    for xe in (mp.mpf(a), mp.mpf(b)):
        ee = err(xe)
        if abs(ee) > abs(best[1]):
            best = (xe, ee)
    if b <= a * (1 + 1e-15):
        return best
    g = (mp.sqrt(5) - 1) / 2
    c = lb - g * (lb - la)
    d = la + g * (lb - la)
    fc, fd = abs(err(mp.exp(c))), abs(err(mp.exp(d)))
    for _ in range(iters):
        if fc > fd:
            lb, d, fd = d, c, fc
            c = lb - g * (lb - la)
            fc = abs(err(mp.exp(c)))
        else:
            la, c, fc = c, d, fd
            d = la + g * (lb - la)
            fd = abs(err(mp.exp(d)))
        if lb - la < tol:
            break
    xm = mp.exp((la + lb) / 2)
    em = err(xm)
    if abs(em) > abs(best[1]):
        best = (xm, em)
    return best


# ----------------------------------------------------------------------------------------------------------------
# One pseudofermion
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class PseudofermionRational:
    """The three approximations of one pseudofermion and its Naik epsilon (its epsilon group)."""

    naik_epsilon: float
    md: RationalApprox
    gr: RationalApprox
    fa: RationalApprox

    def __post_init__(self):
        self.naik_epsilon = float(self.naik_epsilon)
        self.md.tag, self.gr.tag, self.fa.tag = "MD", "GR", "FA"

    def __getitem__(self, tag: str) -> RationalApprox:
        return {"MD": self.md, "GR": self.gr, "FA": self.fa}[tag.upper()]

    @property
    def approximations(self) -> tuple[RationalApprox, RationalApprox, RationalApprox]:
        return self.md, self.gr, self.fa

    # -- the action kernel f = r_MD's target ------------------------------------------------------------------
    @property
    def exponents(self) -> dict[float, Fraction]:
        """The action kernel f(x) = prod (x + 4 m^2)^e as {mass: e} (MD's exponents; zero exponents dropped,
        equal masses merged)."""
        out: dict[float, Fraction] = {}
        for m, e in self.md.terms():
            out[m] = out.get(m, Fraction(0)) + e
        return {m: e for m, e in out.items() if e != 0}

    @property
    def flavors(self) -> dict[float, Fraction]:
        """Flavour content {mass: n_f}: det(M^dag M)^(n_f/4) per mass, i.e. n_f = -4 e (2 light flavours: e=-1/2)."""
        return {m: -4 * e for m, e in self.exponents.items()}

    @property
    def masses(self) -> tuple[float, ...]:
        return tuple(self.exponents)

    def kernel(self, x, power: Fraction | float = 1):
        """f(x)^power on numpy arrays: power 1 for MD, -1/2 for GR, +1/2 for FA."""
        return target_function([(m, e * Fraction(power)) for m, e in self.exponents.items()])(x)

    # -- checks ---------------------------------------------------------------------------------------------
    def check_consistency(self, where: str = "") -> None:
        """GR ~ f^(-1/2), FA ~ f^(+1/2), MD ~ f: the exponents of the three blocks must agree mass by mass.

        Raises RationalsError with one line naming the pseudofermion/where and the mismatch.
        """
        pre = f"{where}: " if where else ""
        md = self.exponents
        for tag, power in (("GR", Fraction(-1, 2)), ("FA", Fraction(1, 2))):
            got: dict[float, Fraction] = {}
            for m, e in self[tag].terms():
                got[m] = got.get(m, Fraction(0)) + e
            got = {m: e for m, e in got.items() if e != 0}
            want = {m: e * power for m, e in md.items()}
            if set(got) != set(want):
                raise RationalsError(f"{pre}{tag} has masses {_fmt_masses(got)} but MD has {_fmt_masses(want)}: "
                                     f"{tag} must approximate f^({power}) of the same masses")
            for m in want:
                if got[m] != want[m]:
                    raise RationalsError(f"{pre}{tag} exponent for mass {m:g} is {got[m]} but MD's is {md[m]}: "
                                         f"{tag} must approximate f^({power}), i.e. exponent {want[m]}")
        for ap in self.approximations:
            if ap.order < 1:
                raise RationalsError(f"{pre}{ap.tag} has order {ap.order}; it must be at least 1")
            if np.any(~np.isfinite(ap.poles)) or np.any(ap.poles <= 0):
                bad = ap.poles[~(ap.poles > 0)]
                raise RationalsError(f"{pre}{ap.tag} has a non-positive shift {bad[0]!r}: the multishift CG needs "
                                     f"poles > 0")
            if not (np.all(np.isfinite(ap.residues)) and math.isfinite(ap.res0)):
                raise RationalsError(f"{pre}{ap.tag} has a non-finite residue")

    def check_accuracy(self, lo: float | None = None, hi: float | None = None, *, tol: float | None = None,
                       where: str = "") -> dict[str, float]:
        """Relative errors {tag: max|r/f - 1|} on [lo, hi] (the stored range by default). With ``tol``, raise
        RationalsError (one line) when one exceeds it."""
        errs = {ap.tag: approximation_error(ap, lo=lo, hi=hi) for ap in self.approximations}
        if tol is not None:
            for tag, e in errs.items():
                if not e <= tol:
                    pre = f"{where}: " if where else ""
                    raise RationalsError(f"{pre}{tag} approximation has relative error {e:.3e} > {tol:.1e} on "
                                         f"[{lo if lo is not None else self[tag].lo}, "
                                         f"{hi if hi is not None else self[tag].hi}]")
        return errs

    def product_check(self, lo: float, hi: float, points: int = 2000) -> dict[str, float]:
        """Consistency of the three functions with each other: max |r_GR^2 r_MD - 1| and |r_FA^2 / r_MD - 1|."""
        x = np.geomspace(lo, hi, points)
        md, gr, fa = self.md(x), self.gr(x), self.fa(x)
        return {"GR^2*MD": float(np.max(np.abs(gr * gr * md - 1))),
                "FA^2/MD": float(np.max(np.abs(fa * fa / md - 1)))}


#: the stored doubles of a minimax approximation miss its levelled error by rounding (a few 1e-3 relative for the
#: 1e-13 ones), and the error is printed with 7 digits: the stated error times this is its bound
ERROR_SLACK = 1.1
#: MILC's approximation range, used when a file does not state its own: it covers the spectrum of A = -D_eo D_oe
#: with room to spare (the largest eigenvalue is ~19 on a cold start and ~28 on Haar-random links)
DEFAULT_RANGE = (1e-15, 90.0)


def check_error_bounds(pfs: Sequence[PseudofermionRational], max_error: float,
                       where: str = "rational functions") -> list[dict]:
    """Every approximation's max relative error |r/f - 1| on its range (the file's ``Approximation bounds``, else
    DEFAULT_RANGE; log grid of 4000 points, double precision) against its bound: the error the file states
    (poly4's ``Converged ..., error = E``, times ERROR_SLACK) when it states one, else ``max_error``; a stated
    error above ``max_error`` is itself too large. Returns one row per approximation; raises RationalsError (one
    line naming the pseudofermion, the approximation and the numbers) at the first that fails."""
    rows = []
    for k, pf in enumerate(pfs):
        for ap in pf.approximations:
            lo = ap.lo if ap.lo is not None else DEFAULT_RANGE[0]
            hi = ap.hi if ap.hi is not None else DEFAULT_RANGE[1]
            err = approximation_error(ap, lo=lo, hi=hi, refine=False)
            name = f"pseudofermion {k} (naik epsilon {pf.naik_epsilon:g}) {ap.tag} approximation of {ap.describe()}"
            if ap.error is not None and ap.error > max_error:
                raise RationalsError(f"{where}: {name} states a relative error {ap.error:.3e}, above "
                                     f"max_rational_error {max_error:.1e}: use a higher order (python -m hmc.remez) "
                                     "or raise [fermions] max_rational_error")
            if ap.error is not None:
                bound, why = ERROR_SLACK * ap.error, f"{ERROR_SLACK:g} x the file's stated error {ap.error:.3e}"
            else:
                bound, why = max_error, "max_rational_error (the file states no error)"
            if not err <= bound:
                raise RationalsError(f"{where}: {name} has relative error {err:.3e} on [{lo:g}, {hi:g}], above its "
                                     f"bound {bound:.3e} ({why}): the residues or poles are wrong; regenerate the "
                                     "file (python -m hmc.remez)")
            rows.append({"pseudofermion": k, "tag": ap.tag, "error": err, "bound": bound, "lo": lo, "hi": hi})
    return rows


def _fmt_masses(d) -> str:
    return "{" + ", ".join(f"{m:g}: {e}" for m, e in sorted(d.items())) + "}"


# ----------------------------------------------------------------------------------------------------------------
# The list of pseudofermions: ordering rule and the deck's masses
# ----------------------------------------------------------------------------------------------------------------

def check_ordering(pfs: Sequence[PseudofermionRational], where: str = "rational functions") -> None:
    """Pseudofermions must be grouped by Naik epsilon (each epsilon one contiguous run), epsilon = 0 first."""
    if not pfs:
        raise RationalsError(f"{where}: no pseudofermions")
    if pfs[0].naik_epsilon != 0.0:
        raise RationalsError(f"{where}: the first pseudofermion has naik_term_epsilon {pfs[0].naik_epsilon!r}; "
                             f"pseudofermions must be grouped by epsilon with epsilon = 0 first")
    seen: list[float] = []
    for i, p in enumerate(pfs):
        if seen and p.naik_epsilon == seen[-1]:
            continue
        if p.naik_epsilon in seen:
            raise RationalsError(f"{where}: pseudofermion {i} has naik_term_epsilon {p.naik_epsilon!r} after another "
                                 f"epsilon group; pseudofermions must be grouped by epsilon (epsilon = 0 first)")
        seen.append(p.naik_epsilon)


def naik_groups(pfs: Sequence[PseudofermionRational]) -> list[tuple[float, list[int]]]:
    """[(epsilon, [pseudofermion indices])] in file order (MILC's n_naiks, eps_naik, n_pseudo_naik)."""
    out: list[tuple[float, list[int]]] = []
    for i, p in enumerate(pfs):
        if out and out[-1][0] == p.naik_epsilon:
            out[-1][1].append(i)
        else:
            out.append((p.naik_epsilon, [i]))
    return out


def flavor_content(pfs: Iterable[PseudofermionRational]) -> dict[float, Fraction]:
    """Total flavours per mass over all pseudofermions (Hasenbusch masses cancel to 0)."""
    tot: dict[float, Fraction] = {}
    for p in pfs:
        for m, nf in p.flavors.items():
            tot[m] = tot.get(m, Fraction(0)) + nf
    return tot


def _same_mass(a: float, b: float) -> bool:
    # poly4 prints masses with %f (6 decimals): accept that rounding
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=5e-7)


def check_masses(pfs: Sequence[PseudofermionRational], masses: Sequence[float], flavors: Sequence[float] | None = None,
                 *, naik_epsilons: Sequence[float] | None = None, where: str = "rational functions") -> None:
    """Compare the rational functions with the deck's dynamical masses (MILC's dyn_mass/dyn_flavors).

    Every deck mass must appear with its number of flavours (summed over pseudofermions), every other mass in the
    file must cancel (Hasenbusch-type ratios), and, with ``naik_epsilons``, each deck mass must sit in pseudofermions
    of that epsilon. Raises RationalsError with one line naming the mismatch.
    """
    content = flavor_content(pfs)
    if flavors is not None and len(flavors) != len(masses):
        raise RationalsError(f"{where}: the deck gives {len(masses)} masses but {len(flavors)} flavour numbers")
    have = ", ".join(f"{m:g} ({_fmt_nf(nf)} flavours)" for m, nf in sorted(content.items())) or "none"
    used = set()
    for i, m in enumerate(masses):
        match = [mm for mm in content if _same_mass(mm, float(m))]
        if not match:
            raise RationalsError(f"{where}: the deck's mass {m:g} is not in the rational functions (they carry {have})")
        used.update(match)
        nf = sum(content[mm] for mm in match)
        if flavors is not None and nf != Fraction(flavors[i]).limit_denominator(1000):
            raise RationalsError(f"{where}: the deck's mass {m:g} has {flavors[i]:g} flavours but the rational "
                                 f"functions give it {_fmt_nf(nf)}")
        if naik_epsilons is not None:
            eps = float(naik_epsilons[i])
            for j, p in enumerate(pfs):
                if any(_same_mass(mm, float(m)) for mm in p.exponents) and p.naik_epsilon != eps:
                    raise RationalsError(f"{where}: the deck's mass {m:g} has naik epsilon {eps!r} but pseudofermion "
                                         f"{j} carries it with naik_term_epsilon {p.naik_epsilon!r}")
    for mm, nf in sorted(content.items()):
        if mm not in used and nf != 0:
            raise RationalsError(f"{where}: the rational functions carry mass {mm:g} with {_fmt_nf(nf)} flavours, "
                                 f"which is not a deck mass (only masses whose flavours cancel may be extra)")


def _fmt_nf(nf: Fraction) -> str:
    return str(nf.numerator) if nf.denominator == 1 else str(nf)
