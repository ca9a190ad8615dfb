"""Remez algorithm in high precision (mpmath) for the RHMC's rational functions.

It finds the best (n, n) rational approximation r = p/q in *relative* error to

    f(x) = prod_i (x + 4 m_i^2)^(y_i/z_i)       on [lo, hi],

i.e. the r whose relative error e(x) = r(x)/f(x) - 1 equioscillates at 2n+2 points with the smallest level E, and
converts it to MILC's partial fractions r(x) = res0 + sum_l res_l/(x + pole_l) (for these Stieltjes-type functions
the poles, and the zeros, are real and negative: pole_l > 0 in MILC's sign).

This is the problem MILC's ``ks_imp_rhmc/remez-milc/poly4`` solves with M. Clark's AlgRemez (GMP, 65-75 digits,
interpolation at the zeros of the error with a slow step-size rule; thousands of iterations). Here the standard
linear-system Remez iteration is used instead: at the reference points x_i

    p(x_i) - f(x_i) q(x_i) = (-1)^i E f(x_i) q(x_i),     q(0) = 1,

solved for (p, q, E) by iterating on the q multiplying E, then the reference is exchanged for the 2n+2 extrema of
e(x) (one between each pair of consecutive zeros of e, and at the ends), until the extrema agree to ``tol``
(relative spread). The initial reference is Chebyshev extrema in u = log(x + c), c the smallest 4 m^2 in f (or lo),
so the points crowd where f varies. The minimax approximation is unique: converged to a spread of 1e-15 it agrees
with AlgRemez's (which stops at a spread of 1e-15) to the precision of its double-precision output.

``make_rationals`` builds the MD/GR/FA triple of each pseudofermion exactly as poly4 does: MD is the *inverse* of the
minimax approximation to f_MD^-1 = prod (x+4m^2)^(+nf/4), GR the minimax approximation to prod (x+4m^2)^(+nf/8)
and FA its inverse (so |relative error of MD| equioscillates only to first order in E: |e| = E/(1 +- E)).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Mapping, Sequence


from .rational import (NMASS, PseudofermionRational, RationalApprox, RationalsError, check_ordering,
                       error_extrema, target_function)
from .remez_exchange import RemezError, exchange_reference


# ----------------------------------------------------------------------------------------------------------------
# Result
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class RemezResult:
    """A converged (or last) Remez iterate: r = p/q in the scaled variable s = x/hi, with the reference."""

    terms: list                      # [(mass, Fraction exponent)] of f
    lo: float
    hi: float
    order: int
    num: list                        # mpf coefficients of p(s), constant first
    den: list                        # mpf coefficients of q(s), constant first (den[0] = 1)
    E: object                        # levelled error (mpf)
    reference: list                  # the 2n+2 points x_i (mpf)
    extrema: list                    # [(x, e(x))] of the last exchange (mpf)
    spread: float                    # (max|e| - min|e|)/max|e| over the extrema
    iterations: int
    seconds: float
    dps: int
    converged: bool
    history: list = field(default_factory=list)

    # -- partial fractions --------------------------------------------------------------------------------------
    def partial_fractions(self, inverse: bool = False):
        """(res0, residues, poles) as mpf, MILC's sign (r = res0 + sum res/(x + pole)); of 1/r with ``inverse``."""
        import mpmath as mp

        with mp.workdps(self.dps):
            hi = mp.mpf(self.hi)
            # polynomials in x: p(x) = sum a_j (x/hi)^j
            a = [c / hi ** j for j, c in enumerate(self.num)]
            b = [c / hi ** j for j, c in enumerate(self.den)]
            if inverse:
                a, b = b, a
            res0 = a[-1] / b[-1]
            roots = _polyroots_asc(b, maxsteps=400, extraprec=4 * self.dps, error=False)
            out_res, out_pole = [], []
            db = [j * b[j] for j in range(1, len(b))]
            for z in roots:
                if abs(mp.im(z)) > mp.mpf(10) ** (-self.dps // 3) * (1 + abs(z)):
                    raise RemezError(f"complex pole {mp.nstr(z, 8)}: the approximation has no real partial fractions")
                z = mp.re(z)
                pz = _polyval_asc(a, z)
                dq = _polyval_asc(db, z)
                out_res.append(pz / dq)
                out_pole.append(-z)
            order = sorted(range(len(out_pole)), key=lambda k: out_pole[k])
            return res0, [out_res[k] for k in order], [out_pole[k] for k in order]

    def approx(self, inverse: bool = False, tag: str = "", y=None, z=None, masses=None) -> RationalApprox:
        """The RationalApprox (double coefficients) of r ~ f, or of 1/r ~ 1/f with ``inverse``."""
        res0, res, poles = self.partial_fractions(inverse)
        if y is None:
            y, z, masses = _yzm_from_terms(self.terms, inverse)
        ap = RationalApprox(float(res0), [float(v) for v in res], [float(v) for v in poles], y=y, z=z,
                            masses=masses, tag=tag, lo=self.lo, hi=self.hi)
        for p in ap.poles:
            if not p > 0:
                raise RemezError(f"pole {p!r} is not positive: the approximation does not suit the multishift CG")
        return ap


def _yzm_from_terms(terms, inverse=False):
    y, z, m = [], [], []
    for mass, e in terms:
        e = -e if inverse else e
        y.append(e.numerator)
        z.append(e.denominator)
        m.append(mass)
    return tuple(y), tuple(z), tuple(m)


# ----------------------------------------------------------------------------------------------------------------
# The iteration
# ----------------------------------------------------------------------------------------------------------------

def _as_terms(func) -> list:
    """[(mass, Fraction)] from [(mass, exponent)] or a RationalApprox-like object with terms()."""
    if hasattr(func, "terms") and callable(func.terms):
        func = func.terms()
    out = []
    for m, e in func:
        e = Fraction(e).limit_denominator(10**6) if not isinstance(e, Fraction) else e
        if e != 0:
            out.append((float(m), e))
    if not out:
        raise ValueError("f(x) is constant (all exponents zero): nothing to approximate")
    return out


def _default_dps(order: int, lo: float, hi: float, terms=()) -> int:
    """Working digits: the monomial system in s = x/hi is badly conditioned, the more so the wider the range seen by
    f (hi over the smallest of lo and 4 m^2). AlgRemez used 65-75 digits for n = 7..11 with masses."""
    scale = min([4.0 * m * m for m, _ in terms if m > 0] or [lo])
    decades = math.log10(hi / max(lo, scale))
    return int(max(40, 30 + 4 * order, 20 + 0.6 * order * decades))


def remez(func, lo: float, hi: float, order: int, *, tol: float = 1e-15, dps: int | None = None,
          max_iter: int = 60, verbose: bool = False) -> RemezResult:
    """Best (order, order) relative-error rational approximation to f = prod (x + 4 m^2)^e on [lo, hi].

    ``func``: [(mass, exponent)] (exponent a Fraction, an int ratio or a float) or a RationalApprox whose target is
    used. Stops when the relative spread of the 2n+2 error extrema is below ``tol`` (AlgRemez: 1e-15).
    """
    import mpmath as mp

    terms = _as_terms(func)
    n = int(order)
    if n < 1:
        raise ValueError("order must be at least 1")
    if not (0 < lo < hi):
        raise ValueError(f"bad range [{lo}, {hi}]")
    auto = dps is None
    dps = dps or _default_dps(n, lo, hi, terms)
    t0 = time.perf_counter()
    try:
        return _remez(terms, lo, hi, n, tol, dps, max_iter, verbose, t0)
    except RemezError:
        if not auto:
            raise
        if verbose:
            print(f"remez: retrying with {2 * dps} digits")
        return _remez(terms, lo, hi, n, tol, 2 * dps, max_iter, verbose, t0)


def _remez(terms, lo, hi, n, tol, dps, max_iter, verbose, t0) -> RemezResult:
    import mpmath as mp

    with mp.workdps(dps):
        F = target_function(terms)
        mlo, mhi = mp.mpf(lo), mp.mpf(hi)

        def f(x):
            return F(x, mp=True)

        result = None
        for attempt, mode in enumerate(("scale", "full", "uniform")):
            try:
                result = _iterate(terms, f, mlo, mhi, n, _initial_reference(terms, mlo, mhi, n, mode), tol, max_iter,
                                  verbose)
            except RemezError as e:
                if verbose:
                    print(f"remez: initial reference '{mode}' failed ({e})")
                if attempt == 2:
                    raise
                continue
            if result.converged:
                break
        result.lo, result.hi, result.dps = float(lo), float(hi), dps
        result.seconds = time.perf_counter() - t0
    return result


def _initial_reference(terms, lo, hi, n, mode):
    """2n+2 points: Chebyshev extrema (or uniform points) in u = log(x + c), c the smallest 4 m^2 (at least lo),
    over [lo, hi] or, for mode 'scale' when f -> 1 at large x, over [lo, 30 x the largest 4 m^2]."""
    import mpmath as mp

    scales = [4 * mp.mpf(m) ** 2 for m, _ in terms if m > 0]
    c = max(min(scales or [lo]), lo)
    top = hi
    if mode == "scale" and sum(e for _, e in terms) == 0 and scales:
        top = min(hi, 30 * max(scales))
    ua, ub = mp.log(lo + c), mp.log(top + c)
    N = 2 * n + 2
    ref = []
    for k in range(N):
        if mode == "uniform":
            u = ua + (ub - ua) * k / (N - 1)
        else:
            u = (ua + ub) / 2 - (ub - ua) / 2 * mp.cos(mp.pi * k / (N - 1))
        ref.append(mp.exp(u) - c)
    ref[0], ref[-1] = lo, hi
    if not all(ref[k] < ref[k + 1] for k in range(N - 1)):
        raise RemezError("initial reference points are not increasing")
    return ref


def _iterate(terms, f, mlo, mhi, n, ref, tol, max_iter, verbose) -> RemezResult:
    import mpmath as mp

    history = []
    E = mp.mpf(0)
    num = den = None
    spread = mp.inf
    extrema = []
    converged = False
    it = 0
    for it in range(1, max_iter + 1):
        num, den, E = _solve_reference(ref, f, n, mhi, den, rtol=min(mp.mpf(spread) ** 2, mp.mpf("1e-2")))
        err = _error_function(num, den, f, mhi)
        extrema = exchange_reference(err, ref, mlo, mhi)
        mags = [abs(e) for _, e in extrema]
        spread = (max(mags) - min(mags)) / max(mags)
        history.append((float(abs(E)), float(max(mags)), float(spread)))
        if verbose:
            print(f"remez it {it}: E = {mp.nstr(abs(E), 12)}, max|e| = {mp.nstr(max(mags), 12)}, "
                  f"spread = {mp.nstr(spread, 3)}")
        if spread < tol:
            converged = True
            break
        ref = [x for x, _ in extrema]
    return RemezResult(terms=terms, lo=float(mlo), hi=float(mhi), order=n, num=num, den=den, E=abs(E),
                       reference=ref, extrema=extrema, spread=float(spread), iterations=it, seconds=0.0,
                       dps=mp.mp.dps, converged=converged, history=history)


def _solve_reference(ref, f, n, hi, den_prev, rtol=None):
    """Solve p(s_i) - f_i q(s_i) = sigma_i E f_i q(s_i) for (p, q, E), iterating on the q multiplying E until E
    changes by less than rtol (relative; at least half the working digits once the exchange has converged)."""
    import mpmath as mp

    s = [x / hi for x in ref]
    fv = [f(x) for x in ref]
    N = len(ref)
    sig = [(-1) ** i for i in range(N)]
    powers = [[si ** j for j in range(n + 1)] for si in s]

    def qval(den, i):
        return mp.fsum(den[j] * powers[i][j] for j in range(n + 1))

    qold = [qval(den_prev, i) if den_prev is not None else mp.mpf(1) for i in range(N)]
    E_old = None
    for _ in range(40):
        A = mp.matrix(N, N)
        B = mp.matrix(N, 1)
        for i in range(N):
            for j in range(n + 1):
                A[i, j] = powers[i][j]
            for j in range(1, n + 1):
                A[i, n + j] = -fv[i] * powers[i][j]
            A[i, 2 * n + 1] = -sig[i] * fv[i] * qold[i]
            B[i] = fv[i]
        sol = _solve(A, B, N)
        num = [sol[j] for j in range(n + 1)]
        den = [mp.mpf(1)] + [sol[n + j] for j in range(1, n + 1)]
        E = sol[2 * n + 1]
        qnew = [qval(den, i) for i in range(N)]
        if any(q <= 0 for q in qnew):
            raise RemezError("the denominator changes sign inside the interval (a pole in [lo, hi])")
        floor = mp.mpf(10) ** (-(mp.mp.dps // 2))
        if E_old is not None and abs(E - E_old) <= abs(E) * max(rtol if rtol is not None else 0, floor):
            break
        qold, E_old = qnew, E
    return num, den, E


def _solve(A, B, N):
    """Gaussian elimination with column equilibration and partial pivoting (no singularity threshold: the
    monomial columns differ by many orders of magnitude, which mpmath's lu_solve mistakes for singularity)."""
    import mpmath as mp

    scale = []
    for j in range(N):
        m = max(abs(A[i, j]) for i in range(N))
        if m == 0:
            raise RemezError("singular Remez system (a zero column)")
        scale.append(m)
    M = [[A[i, j] / scale[j] for j in range(N)] + [B[i]] for i in range(N)]
    for k in range(N):
        p = max(range(k, N), key=lambda i: abs(M[i][k]))
        if M[p][k] == 0:
            raise RemezError("singular Remez system")
        M[k], M[p] = M[p], M[k]
        piv = M[k][k]
        for i in range(k + 1, N):
            fct = M[i][k] / piv
            if fct:
                row_i, row_k = M[i], M[k]
                for j in range(k, N + 1):
                    row_i[j] -= fct * row_k[j]
    x = [mp.mpf(0)] * N
    for i in range(N - 1, -1, -1):
        acc = M[i][N] - mp.fsum(M[i][j] * x[j] for j in range(i + 1, N))
        x[i] = acc / M[i][i]
    return [x[j] / scale[j] for j in range(N)]


def _polyval_asc(c, x):
    """sum_j c[j] x^j by Horner's rule (coefficients in ascending order, whatever mpmath's convention)."""
    acc = 0
    for coef in reversed(c):
        acc = acc * x + coef
    return acc


def _polyroots_asc(c, **kw):
    """Roots of sum_j c[j] x^j: mpmath >= 1.4 takes ascending coefficients with asc=True (descending is
    deprecated there), mpmath 1.3 only descending ones."""
    import inspect

    import mpmath as mp

    if "asc" in inspect.signature(mp.polyroots).parameters:
        return mp.polyroots(list(c), asc=True, **kw)
    return mp.polyroots(list(reversed(c)), **kw)


def _error_function(num, den, f, hi):
    import mpmath as mp

    def e(x):
        s = x / hi
        return _polyval_asc(num, s) / (_polyval_asc(den, s) * f(x)) - 1

    return e


def equioscillation(ap: RationalApprox, lo: float | None = None, hi: float | None = None) -> dict:
    """How well ap's relative error equioscillates: extrema count (expected 2n+2), alternation, spread."""
    ext = error_extrema(ap, lo=lo, hi=hi)
    mags = [abs(e) for _, e in ext]
    alt = all((ext[k][1] > 0) != (ext[k + 1][1] > 0) for k in range(len(ext) - 1))
    return {"extrema": len(ext), "expected": 2 * ap.order + 2, "alternates": alt,
            "max": max(mags), "min": min(mags), "spread": (max(mags) - min(mags)) / max(mags)}


def remez_approx(func, lo: float, hi: float, order: int, *, inverse: bool = False, tag: str = "", **kw
                 ) -> RationalApprox:
    """Run the Remez algorithm and return the RationalApprox of r ~ f (or of 1/r ~ 1/f with ``inverse``), with
    ``error`` its achieved maximum relative error (measured on the double coefficients) and ``meta`` the Remez
    summary and the equioscillation check."""
    res = remez(func, lo, hi, order, **kw)
    if not res.converged:
        raise RemezError(f"no convergence in {res.iterations} iterations (spread {res.spread:.2e})")
    ap = res.approx(inverse=inverse, tag=tag)
    eq = equioscillation(ap)
    ap.error = eq["max"]
    ap.meta = {"levelled_error": float(res.E), "iterations": res.iterations, "seconds": res.seconds,
               "dps": res.dps, "spread": res.spread, "equioscillation": eq}
    return ap


@dataclass(frozen=True)
class PseudofermionSpec:
    """One pseudofermion as poly4 takes it: flavour numbers and masses (MD kernel f = prod (x+4m^2)^(-nf/4)).

    E.g. the su3_rhmc_hisq test's phi0 is flavors (2, 1, -3), masses (0.0018, 0.018, 0.2): 2 light + 1 strange over
    3 flavours of mass 0.2; its phi1..3 are flavors (1,), masses (0.2,).
    """

    flavors: tuple
    masses: tuple
    naik_epsilon: float = 0.0
    orders: tuple | None = None      # (MD order, GR/FA order); None: make_rationals' orders

    @classmethod
    def coerce(cls, spec) -> "PseudofermionSpec":
        if isinstance(spec, cls):
            return spec
        if isinstance(spec, Mapping):
            return cls(tuple(spec["flavors"]), tuple(float(m) for m in spec["masses"]),
                       float(spec.get("naik_epsilon", 0.0)),
                       tuple(spec["orders"]) if spec.get("orders") is not None else None)
        flavors, masses, *rest = spec
        return cls(tuple(flavors), tuple(float(m) for m in masses), *(rest[:2]))


def make_rationals(pseudofermions: Sequence, lo: float = 1e-15, hi: float = 90.0, orders: tuple = (9, 11), *,
                   pad_mass: float = 1.0, tol: float = 1e-15, dps: int | None = None, verbose: bool = False,
                   check_order: bool = True) -> list[PseudofermionRational]:
    """MD, GR and FA approximations for each pseudofermion, as MILC's poly4 makes them.

    ``pseudofermions``: PseudofermionSpec, mappings {"flavors", "masses", "naik_epsilon", "orders"} or tuples
    (flavors, masses[, naik_epsilon[, orders]]). ``orders`` = (MD order, GR/FA order) unless a spec has its own.
    Each approximation list is padded to MILC's four (y, z, m) entries with y = 0 and ``pad_mass``.
    Per pseudofermion: A1 = minimax of prod (x+4m^2)^(+nf/4), MD = 1/A1; A2 = minimax of prod (x+4m^2)^(+nf/8),
    GR = A2, FA = 1/A2. With ``check_order`` the list must follow MILC's rule (grouped by epsilon, epsilon 0 first).
    """
    out = []
    for k, spec in enumerate(pseudofermions):
        sp = PseudofermionSpec.coerce(spec)
        if len(sp.flavors) != len(sp.masses):
            raise ValueError(f"pseudofermion {k}: {len(sp.flavors)} flavour numbers but {len(sp.masses)} masses")
        if len(sp.masses) > NMASS:
            raise ValueError(f"pseudofermion {k}: MILC's format holds at most {NMASS} masses")
        o_md, o_gr = sp.orders or orders
        nf = [int(v) for v in sp.flavors] + [0] * (NMASS - len(sp.flavors))
        ms = [float(m) for m in sp.masses] + [float(pad_mass)] * (NMASS - len(sp.masses))
        t1 = [(m, Fraction(v, 4)) for v, m in zip(nf, ms)]
        t2 = [(m, Fraction(v, 8)) for v, m in zip(nf, ms)]
        r1 = remez(t1, lo, hi, o_md, tol=tol, dps=dps, verbose=verbose)
        r2 = remez(t2, lo, hi, o_gr, tol=tol, dps=dps, verbose=verbose)
        for r in (r1, r2):
            if not r.converged:
                raise RemezError(f"pseudofermion {k}: order {r.order} Remez did not converge "
                                 f"(spread {r.spread:.2e} after {r.iterations} iterations)")
        md = r1.approx(inverse=True, tag="MD", y=tuple(-v for v in nf), z=(4,) * NMASS, masses=tuple(ms))
        gr = r2.approx(inverse=False, tag="GR", y=tuple(nf), z=(8,) * NMASS, masses=tuple(ms))
        fa = r2.approx(inverse=True, tag="FA", y=tuple(-v for v in nf), z=(8,) * NMASS, masses=tuple(ms))
        md.error, gr.error, fa.error = float(r1.E), float(r2.E), float(r2.E)
        for ap, r in ((md, r1), (gr, r2), (fa, r2)):
            ap.meta = {"levelled_error": float(r.E), "iterations": r.iterations, "seconds": r.seconds,
                       "dps": r.dps, "spread": r.spread}
        pf = PseudofermionRational(sp.naik_epsilon, md, gr, fa)
        pf.check_consistency(f"pseudofermion {k}")
        out.append(pf)
    if check_order:
        check_ordering(out, "make_rationals")
    return out


# ----------------------------------------------------------------------------------------------------------------
# Command line: python -m hmc.remez --pf 2,1,-3:0.0018,0.018,0.2 --pf 1:0.2 ... -o rationals.file
# ----------------------------------------------------------------------------------------------------------------

def _parse_pf(text: str) -> PseudofermionSpec:
    """'FLAVORS:MASSES[:EPS[:MDORDER,GRORDER]]', e.g. '2,1,-3:0.0018,0.018,0.2' or '1:0.5:-0.16875'."""
    parts = text.split(":")
    if len(parts) < 2 or len(parts) > 4:
        raise ValueError(f"bad pseudofermion '{text}': use FLAVORS:MASSES[:EPS[:MDORDER,GRORDER]]")
    fl = tuple(int(v) for v in parts[0].split(","))
    ms = tuple(float(v) for v in parts[1].split(","))
    eps = float(parts[2]) if len(parts) > 2 and parts[2] else 0.0
    orders = tuple(int(v) for v in parts[3].split(",")) if len(parts) > 3 else None
    return PseudofermionSpec(fl, ms, eps, orders)


def main(argv=None) -> int:
    import argparse
    import sys

    from .rational import approximation_error
    from .rational_file import write_rationals

    ap = argparse.ArgumentParser(prog="python -m hmc.remez",
                                 description="Make MILC-format RHMC rational functions (MD, GR, FA per pseudofermion) "
                                             "with a high-precision Remez algorithm, as MILC's poly4 does.")
    ap.add_argument("--pf", action="append", required=True, metavar="FLAVORS:MASSES[:EPS[:MD,GR]]",
                    help="one pseudofermion, in file order (group by epsilon, epsilon 0 first), e.g. "
                         "2,1,-3:0.0018,0.018,0.2 (MD kernel prod (x+4m^2)^(-nf/4))")
    ap.add_argument("--orders", nargs=2, type=int, default=(9, 11), metavar=("MD", "GRFA"))
    ap.add_argument("--lo", type=float, default=1e-15)
    ap.add_argument("--hi", type=float, default=90.0)
    ap.add_argument("--pad-mass", type=float, default=1.0, help="mass written for unused entries (y = 0)")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    try:
        specs = [_parse_pf(t) for t in args.pf]
        t0 = time.perf_counter()
        pfs = make_rationals(specs, args.lo, args.hi, tuple(args.orders), pad_mass=args.pad_mass,
                             verbose=args.verbose)
    except (ValueError, RemezError, RationalsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cmd = "python -m hmc.remez " + " ".join(f"--pf {t}" for t in args.pf) + \
        f" --orders {args.orders[0]} {args.orders[1]} --lo {args.lo:g} --hi {args.hi:g} --pad-mass {args.pad_mass:g}"
    write_rationals(args.output, pfs, comment=f"Generated by hisq-hmc's Remez (hmc/remez.py):\n  {cmd}")
    for k, pf in enumerate(pfs):
        errs = ", ".join(f"{a.tag} order {a.order} error {approximation_error(a):.3e}" for a in pf.approximations)
        print(f"pseudofermion {k} (eps {pf.naik_epsilon:g}): {errs}")
    print(f"wrote {args.output} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
