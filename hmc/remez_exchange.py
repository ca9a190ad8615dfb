"""The exchange step of the Remez algorithm (hmc/remez.py): the zeros and extrema of the relative error
e(x) = r(x)/f(x) - 1, found in u = log x with mpmath's working precision (bisection-safeguarded secant for the zeros,
Brent's parabolic minimisation for the extrema)."""
from __future__ import annotations


class RemezError(RuntimeError):
    """The Remez iteration failed (no alternation, a pole inside the interval, or no convergence)."""


def exchange_reference(err, ref, lo, hi):
    """The 2n+2 extrema of err: zeros between consecutive reference points, one extremum per zero-bounded piece."""
    import mpmath as mp

    vals = [err(x) for x in ref]
    for i in range(len(ref) - 1):
        if vals[i] * vals[i + 1] >= 0:
            raise RemezError("the error does not alternate at the reference points")
    zeros = [_zero(err, ref[i], ref[i + 1], vals[i], vals[i + 1]) for i in range(len(ref) - 1)]
    bounds = [lo] + zeros + [hi]
    out = []
    for i in range(len(bounds) - 1):
        x, v = _extremum(err, bounds[i], bounds[i + 1], ref[i], vals[i], is_lo=(i == 0), is_hi=(i == len(bounds) - 2))
        out.append((x, v))
    return out


def _zero(err, a, b, fa, fb, rtol=None):
    """Zero of err in (a, b) by the Illinois method in log x."""
    import mpmath as mp

    la, lb = mp.log(a), mp.log(b)
    side = 0
    rtol = rtol or mp.mpf(10) ** (-12)
    for _ in range(200):
        lc = (la * fb - lb * fa) / (fb - fa)
        fc = err(mp.exp(lc))
        if fc == 0:
            return mp.exp(lc)
        if fc * fb < 0:
            la, fa = lb, fb
            lb, fb = lc, fc
            side = 0
        else:
            lb, fb = lc, fc
            if side == 1:
                fa /= 2
            side = 1
        if abs(lb - la) < rtol * (1 + abs(lb)):
            break
    return mp.exp(lb)


def _brent_min(fun, a, b, tol):
    """Brent's minimization (golden section with parabolic steps) of fun on [a, b]; returns the abscissa."""
    import mpmath as mp

    cgold = (3 - mp.sqrt(5)) / 2
    x = w = v = a + cgold * (b - a)
    fx = fw = fv = fun(x)
    d = e = mp.mpf(0)
    for _ in range(200):
        m = (a + b) / 2
        tol1 = tol * (1 + abs(x))
        tol2 = 2 * tol1
        if abs(x - m) <= tol2 - (b - a) / 2:
            break
        use_golden = True
        if abs(e) > tol1:
            r = (x - w) * (fx - fv)
            q = (x - v) * (fx - fw)
            p = (x - v) * q - (x - w) * r
            q = 2 * (q - r)
            if q > 0:
                p = -p
            q = abs(q)
            if abs(p) < abs(q * e / 2) and p > q * (a - x) and p < q * (b - x):
                e, d = d, p / q
                u = x + d
                if u - a < tol2 or b - u < tol2:
                    d = tol1 if m >= x else -tol1
                use_golden = False
        if use_golden:
            e = (b - x) if x < m else (a - x)
            d = cgold * e
        u = x + (d if abs(d) >= tol1 else (tol1 if d > 0 else -tol1))
        fu = fun(u)
        if fu <= fx:
            if u >= x:
                a = x
            else:
                b = x
            v, fv, w, fw, x, fx = w, fw, x, fx, u, fu
        else:
            if u < x:
                a = u
            else:
                b = u
            if fu <= fw or w == x:
                v, fv, w, fw = w, fw, u, fu
            elif fu <= fv or v == x or v == w:
                v, fv = u, fu
    return x


def _extremum(err, a, b, x0, f0, is_lo=False, is_hi=False):
    """Extremum of |err| on [a, b] (its sign is that of err(x0)): Brent's method in log x; the ends of the whole
    interval are candidates too."""
    import mpmath as mp

    sgn = 1 if f0 > 0 else -1

    def g(lx):
        return sgn * err(mp.exp(lx))

    la, lb = mp.log(a), mp.log(b)
    best_x, best_v = x0, f0
    for xe, flag in ((a, is_lo), (b, is_hi)):
        if flag:
            v = err(xe)
            if sgn * v > sgn * best_v:
                best_x, best_v = xe, v
    lm = _brent_min(lambda u: -g(u), la, lb, mp.mpf(10) ** (-9))
    v = sgn * g(lm)
    if sgn * v > sgn * best_v:
        best_x, best_v = mp.exp(lm), v
    return best_x, best_v


# ----------------------------------------------------------------------------------------------------------------
# Approximations as MILC builds them
# ----------------------------------------------------------------------------------------------------------------
