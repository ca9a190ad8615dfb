"""MILC's rational-function file (``ks_imp_rhmc/load_rhmc_params.c``, written by ``remez-milc/poly4``): the reader
and the writer of :mod:`hmc.rational`'s approximations; the layout is described there."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Sequence

from .rational import NMASS, PseudofermionRational, RationalApprox, RationalsError, check_ordering


# ----------------------------------------------------------------------------------------------------------------
# Reader
# ----------------------------------------------------------------------------------------------------------------

_BOUNDS_RE = re.compile(r"Approximation bounds are\s*\[\s*([^,\]]+)\s*,\s*([^\]]+)\]")
_ERROR_RE = re.compile(r"error\s*=\s*([-+0-9.eE]+)")


class _Tokens:
    """(tag, values, line number) records of a MILC rationals file, with the comments seen before each."""

    def __init__(self, text: str, where: str):
        self.where = where
        self.items: list[tuple[str, list[str], int, dict]] = []
        meta: dict = {}
        for n, raw in enumerate(text.splitlines(), 1):
            line, _, comment = raw.partition("#")
            if comment:
                mb = _BOUNDS_RE.search(comment)
                if mb:
                    try:
                        meta = {"bounds": (float(mb.group(1)), float(mb.group(2)))}
                    except ValueError:
                        pass
                me = _ERROR_RE.search(comment)
                if me and "Converged" in comment:
                    try:
                        meta["error"] = float(me.group(1))
                    except ValueError:
                        pass
            words = line.split()
            if not words:
                continue
            self.items.append((words[0], words[1:], n, dict(meta)))
        self.pos = 0

    def take(self, tag: str, count: int | None = 1):
        if self.pos >= len(self.items):
            raise RationalsError(f"{self.where}: the file ends where '{tag}' was expected")
        t, vals, n, meta = self.items[self.pos]
        if t != tag:
            raise RationalsError(f"{self.where}: line {n}: expected '{tag}', found '{t}'")
        if count is not None and len(vals) != count:
            raise RationalsError(f"{self.where}: line {n}: '{tag}' needs {count} value(s), found {len(vals)}")
        self.pos += 1
        return vals, n, meta

    def number(self, tag, conv, count=1):
        vals, n, meta = self.take(tag, count)
        try:
            out = [conv(v) for v in vals]
        except ValueError:
            raise RationalsError(f"{self.where}: line {n}: '{tag}' has a value that is not a "
                                 f"{'integer' if conv is int else 'number'}: {' '.join(vals)}") from None
        if conv is float and not all(math.isfinite(v) for v in out):
            raise RationalsError(f"{self.where}: line {n}: '{tag}' has a non-finite value: {' '.join(vals)}")
        return (out if count != 1 else out[0]), n, meta


def _read_block(tk: _Tokens, tag: str, inherit: dict | None) -> tuple[RationalApprox, dict]:
    y, n, meta = tk.number(f"y_{tag}", int, NMASS)
    z, nz, _ = tk.number(f"z_{tag}", int, NMASS)
    if any(v <= 0 for v in z):
        raise RationalsError(f"{tk.where}: line {nz}: z_{tag} must be positive, got {z}")
    m, nm, _ = tk.number(f"m_{tag}", float, NMASS)
    if any(v < 0 for v in m):
        raise RationalsError(f"{tk.where}: line {nm}: m_{tag} must not be negative, got {m}")
    order, no, _ = tk.number(f"order_{tag}", int)
    if order < 1:
        raise RationalsError(f"{tk.where}: line {no}: order_{tag} must be at least 1, got {order}")
    res = [tk.number(f"res_{tag}", float)[0] for _ in range(order + 1)]
    pole = [tk.number(f"pole_{tag}", float)[0] for _ in range(order + 1)]
    if "bounds" not in meta and inherit:
        meta = inherit           # FA follows GR without its own "New rational function" header
    lo, hi = meta.get("bounds", (None, None))
    err = meta.get("error")
    return RationalApprox(res0=res[0], residues=res[1:], poles=pole[1:], y=y, z=z, masses=m, tag=tag, lo=lo, hi=hi,
                          error=err, dummy_pole=pole[0]), meta


def parse_rationals(text: str, where: str = "<rationals>", *, check: bool = True) -> list[PseudofermionRational]:
    tk = _Tokens(text, where)
    npseudo, n0, _ = tk.number("n_pseudo", int)
    if npseudo < 1:
        raise RationalsError(f"{where}: line {n0}: n_pseudo must be at least 1, got {npseudo}")
    pfs = []
    for i in range(npseudo):
        if tk.pos >= len(tk.items):
            raise RationalsError(f"{where}: n_pseudo is {npseudo} but the file has only {i} pseudofermion(s)")
        eps, _, _ = tk.number("naik_term_epsilon", float)
        md, _ = _read_block(tk, "MD", None)
        gr, gmeta = _read_block(tk, "GR", None)
        fa, _ = _read_block(tk, "FA", gmeta)
        pf = PseudofermionRational(eps, md, gr, fa)
        if check:
            pf.check_consistency(f"{where}: pseudofermion {i}")
        pfs.append(pf)
    if tk.pos < len(tk.items):
        t, _, n, _ = tk.items[tk.pos]
        raise RationalsError(f"{where}: line {n}: unexpected '{t}' after the {npseudo} pseudofermions of n_pseudo")
    if check:
        check_ordering(pfs, where)
    return pfs


def read_rationals(path, *, check: bool = True) -> list[PseudofermionRational]:
    """Read MILC's rational-function file; with ``check`` also the ordering rule and MD/GR/FA consistency."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise RationalsError(f"{p}: cannot read the rational-function file ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise RationalsError(f"{p}: not a rational-function file (byte {e.start} is not UTF-8 text): give the path "
                             "of MILC's text file of rational functions") from None
    return parse_rationals(text, str(p), check=check)


# ----------------------------------------------------------------------------------------------------------------
# Writer
# ----------------------------------------------------------------------------------------------------------------

def _num(v: float) -> str:
    return f"{float(v):.16e}"          # 17 significant digits: every double round-trips


def _short(v: float) -> str:
    return repr(float(v))              # shortest string that reads back to the same double


def format_block(ap: RationalApprox, tag: str) -> list[str]:
    y = list(ap.y) + [0] * (NMASS - len(ap.y))
    z = list(ap.z) + [z_pad(ap)] * (NMASS - len(ap.z))
    m = list(ap.masses) + [1.0] * (NMASS - len(ap.masses))
    if len(y) != NMASS:
        raise RationalsError(f"{tag}: MILC's format has {NMASS} (y, z, m) entries, this approximation has {len(ap.y)}")
    lines = [f"# Rational function for {tag}",
             f"y_{tag} " + " ".join(str(v) for v in y),
             f"z_{tag} " + " ".join(str(v) for v in z),
             f"m_{tag} " + " ".join(_short(v) for v in m),
             f"order_{tag} {ap.order}", ""]
    lines += [f"res_{tag} {_num(ap.res0)}"] + [f"res_{tag} {_num(v)}" for v in ap.residues] + [""]
    lines += [f"pole_{tag} {_short(ap.dummy_pole)}"] + [f"pole_{tag} {_num(v)}" for v in ap.poles] + [""]
    return lines


def z_pad(ap: RationalApprox) -> int:
    return ap.z[0] if ap.z else 4


def _header(ap: RationalApprox) -> list[str]:
    out = ["# New rational function"]
    if ap.lo is not None and ap.hi is not None:
        out.append(f"# Approximation bounds are [{ap.lo:e},{ap.hi:e}]")
    out.append(f"# Degree of the approximation is ({ap.order},{ap.order})")
    out.append(f"# Approximating the function {ap.describe()}")
    if ap.error is not None:
        out.append(f"# Converged, error = {ap.error:e}")
    return out


def format_rationals(pfs: Sequence[PseudofermionRational], comment: str | None = None) -> str:
    check_ordering(pfs, "format_rationals")
    lines = []
    if comment:
        lines += [f"# {c}" if c else "#" for c in comment.splitlines()]
    lines += [f"n_pseudo {len(pfs)}", ""]
    for pf in pfs:
        lines += [f"naik_term_epsilon {_short(pf.naik_epsilon)}", ""]
        lines += _header(pf.md) + [""] + format_block(pf.md, "MD")
        lines += _header(pf.gr) + [""] + format_block(pf.gr, "GR")
        lines += format_block(pf.fa, "FA")
    return "\n".join(lines) + "\n"


def write_rationals(path, pfs: Sequence[PseudofermionRational], comment: str | None = None) -> None:
    """Write MILC's rational-function format (readable by MILC's load_rhmc_params and by read_rationals)."""
    text = format_rationals(pfs, comment)
    from lattice.io.common import atomic_write

    with atomic_write(path) as f:
        f.write(text.encode())
