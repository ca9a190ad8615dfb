"""MILC's regression comparison, as ``make check`` in MILC's application test folders does it.

MILC's ``check.pl`` reads the folder's ``checklist``; for each ``exec`` line (executable, precision, compiler macro,
input case, patterns) it runs ``EXEC < PREFIX.sample-in > PREFIX.test-out`` (PREFIX = ``exec.case.prec``, or
``exec.prec`` for case ``-``) and compares the two outputs (``Make_test_template``, ``headtail.pl``,
``diffn3.pl``):

1. noise: output lines containing ``warning`` (any case) or ``time =``, or starting with ``#``, are dropped
   (MILC drops them from the test output only; they never fall inside the compared region of its sample outputs,
   and the same selection on both sides is what a user can check);
2. region (``headtail.pl PAT1 PAT2 ... [SELECT=RE]``): lines are copied from the first one matching PAT1 up to and
   including the next one matching PAT2, then the next pair of patterns takes over; with ``SELECT=RE`` only the
   copied lines matching the regular expression RE are kept;
3. fields (``diffn3.pl``): the two selections and the ``.errtol`` file must have the same number of lines; each
   line is split at blanks and tabs, and field by field (over the longer of the two lines) a field passes when its
   tolerance is ``XXX``, or when the numbers differ by at most the tolerance (``|a - b| <= tol``, both read as
   Perl reads a number: the leading numeric part, else 0) and, where the sample's field is not a number, the two
   fields are the same text. An errtol line starting with ``XXXX`` skips the whole line. A number may end in ``,``
   or ``)``.
"""
from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

NOISE_WORD = re.compile("warning", re.IGNORECASE)


class MilcCheckError(ValueError):
    pass


@dataclass(frozen=True)
class Case:
    """One ``exec`` line of a checklist."""

    executable: str
    precision: str
    macro: str
    input_case: str
    patterns: tuple           # (start, stop, start, stop, ...) region patterns
    select: str | None        # SELECT= regular expression, or None
    line: int = 0             # its line in the checklist

    @property
    def prefix(self) -> str:
        """MILC's file prefix: ``exec.prec`` or ``exec.case.prec``."""
        if self.input_case == "-":
            return f"{self.executable}.{self.precision}"
        return f"{self.executable}.{self.input_case}.{self.precision}"


def parse_checklist(text: str, where: str = "checklist") -> list[Case]:
    """The ``exec`` lines of a MILC checklist (check.pl: a line containing ``#`` is a comment; the patterns are the
    rest of the line, split as the shell splits them)."""
    cases = []
    for n, line in enumerate(text.splitlines(), 1):
        if "#" in line or not line.strip():
            continue
        words = line.split(None, 5)
        if words[0] in ("extra-output", "extra-target"):
            raise MilcCheckError(f"{where}: line {n}: {words[0]} lines are not supported (only exec lines)")
        if words[0] != "exec" or len(words) < 6:
            raise MilcCheckError(f"{where}: line {n}: expected 'exec EXECUTABLE PRECISION MACRO CASE PATTERNS', got "
                                 f"{line.strip()!r}")
        _, exe, prec, macro, case, rest = words
        try:
            pats = shlex.split(rest)
        except ValueError as e:
            raise MilcCheckError(f"{where}: line {n}: patterns {rest.strip()!r}: {e}") from None
        select = None
        if pats and "SELECT" in pats[-1]:
            select = pats.pop().replace("SELECT=", "", 1)
        if not pats or len(pats) % 2:
            raise MilcCheckError(f"{where}: line {n}: region patterns come in pairs (start, stop), got {pats}")
        cases.append(Case(exe, prec, macro, case, tuple(pats), select, n))
    return cases


def read_checklist(folder) -> list[Case]:
    path = Path(folder) / "checklist"
    if not path.exists():
        raise MilcCheckError(f"{path} does not exist: give MILC's test folder (it holds checklist, *.sample-in, "
                             "*.sample-out, *.errtol)")
    return parse_checklist(path.read_text(), str(path))


def drop_noise(lines) -> list[str]:
    """Step 1: without lines containing ``warning`` (any case) or ``time =``, or starting with ``#``."""
    return [s for s in lines if not (NOISE_WORD.search(s) or "time =" in s or s.startswith("#"))]


def select_lines(lines, patterns, select: str | None = None) -> list[str]:
    """Step 2, ``headtail.pl``: the regions between pattern pairs, filtered by ``select``."""
    pats = list(patterns)
    start_re, stop_re = re.compile(pats.pop(0)), re.compile(pats.pop(0))
    sel = re.compile(select) if select is not None else None
    out, inside = [], False
    for s in lines:
        if start_re.search(s):
            inside = True
        if not inside:
            continue
        if sel is None or sel.search(s):
            out.append(s)
        if stop_re.search(s):
            if not pats:
                break
            inside = False
            start_re, stop_re = re.compile(pats.pop(0)), re.compile(pats.pop(0))
    return out


def milc_selection(lines, case: Case) -> list[str]:
    """Steps 1 and 2 for one case."""
    return select_lines(drop_noise(lines), case.patterns, case.select)


_PERL_NUMBER = re.compile(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)")
_PERL_SPECIAL = re.compile(r"\s*([+-]?)(inf(?:inity)?|nan)", re.IGNORECASE)
_IS_NUMBER = (re.compile(r"[+-]?\d+"), re.compile(r"[+-]?\d+(\.\d*)?"), re.compile(r"[+-]?\d+(\.\d*)?[eEdDg][+-]?\d+"))


def perl_number(s: str | None) -> float:
    """The number Perl reads from a string in arithmetic: its leading numeric part (inf, nan too), else 0."""
    if s is None:
        return 0.0
    m = _PERL_NUMBER.match(s)
    if m:
        return float(m.group(1))
    m = _PERL_SPECIAL.match(s)
    if m:
        return float(m.group(1) + m.group(2))
    return 0.0


def is_number(s: str | None) -> bool:
    """diffn3's test: an integer, fixed or scientific number, optionally followed by one ``,`` or ``)``."""
    if s is None:
        return False
    if s[-1:] in (",", ")"):
        s = s[:-1]
    return any(r.fullmatch(s) for r in _IS_NUMBER)


def split_fields(line: str) -> list[str]:
    """Perl's ``split(/[ \\t\\n]+/, line)``: a leading empty field is kept, trailing empty fields are dropped."""
    fields = re.split(r"[ \t\n]+", line)
    while fields and fields[-1] == "":
        fields.pop()
    return fields


@dataclass
class FieldFailure:
    line: int                 # 1-based line of the selection
    field: int                # 1-based field
    test: str | None
    sample: str | None
    tol: str | None
    diff: float

    def describe(self) -> str:
        return (f"line {self.line} field {self.field}: test {self.test!r} sample {self.sample!r} diff "
                f"{self.diff:.2g} tol {self.tol}")


@dataclass
class Comparison:
    """The outcome of step 3 for one case."""

    lines: int = 0                     # lines compared (errtol lines starting XXXX are not)
    fields: int = 0                    # fields compared (XXX fields are not)
    failures: list = field(default_factory=list)
    worst: float = 0.0                 # largest |a - b| / tol over fields with a positive numeric tolerance
    worst_at: str = ""
    error: str | None = None           # a whole-file failure (line counts differ)
    failed_lines: list = field(default_factory=list)   # (test line, sample line) of each differing line

    @property
    def ok(self) -> bool:
        return self.error is None and not self.failures

    @property
    def failure_count(self) -> int:
        return len(self.failures) + (self.error is not None)


def _field_fails(a, b, tol_text) -> tuple[bool, float]:
    """diffn3's rule for one field: (fails, |a - b|); ``b`` is the field of the shorter line."""
    diff = abs(perl_number(a) - perl_number(b))
    textual = not is_number(b) or b == "nan" or a == "nan"
    fails = (textual and a != b) or diff > perl_number(tol_text)
    return fails, diff


def compare_lines(test: list[str], sample: list[str], errtol: list[str]) -> Comparison:
    """Step 3 (``diffn3.pl``) on two selections and the errtol lines."""
    out = Comparison()
    if not len(test) == len(sample) == len(errtol):
        out.error = (f"line counts differ: test {len(test)}, sample {len(sample)}, errtol {len(errtol)} (MILC's "
                     "diffn3: 'File line counts must match')")
        return out
    for n, (t, s, e) in enumerate(zip(test, sample, errtol), 1):
        tols = split_fields(e)
        if tols and tols[0] == "XXXX":
            continue
        out.lines += 1
        ft, fs = split_fields(t), split_fields(s)
        long, short = (fs, ft) if len(fs) > len(ft) else (ft, fs)
        bad = False
        for i, a in enumerate(long):
            tol = tols[i] if i < len(tols) else None
            if tol == "XXX":
                continue
            out.fields += 1
            b = short[i] if i < len(short) else None
            fails, diff = _field_fails(a, b, tol)
            tol_num = perl_number(tol)
            if tol_num > 0 and is_number(b) and not math.isnan(diff) and diff / tol_num > out.worst:
                out.worst, out.worst_at = diff / tol_num, f"line {n} field {i + 1}"
            if fails:
                bad = True
                ta, sb = (a, b) if long is ft else (b, a)
                out.failures.append(FieldFailure(n, i + 1, ta, sb, tol, diff))
        if bad:
            out.failed_lines.append((t, s))
    return out


def compare_outputs(test_text: str, sample_text: str, errtol_text: str, case: Case) -> Comparison:
    """Steps 1-3: a test output against a sample output under the case's patterns and errtol file."""
    return compare_lines(milc_selection(test_text.splitlines(), case), milc_selection(sample_text.splitlines(), case),
                         errtol_text.splitlines())


def format_table(rows) -> str:
    """rows: (case name, Comparison, (wall, CPU seconds) or None). MILC's verdict per case, one line each."""
    head = (f"{'case':26s} {'lines':>5s} {'fields':>6s} {'fail':>4s} {'worst diff/tol':>14s} {'wall/s':>7s} "
            f"{'cpu/s':>6s}  result")
    out = [head, "-" * len(head)]
    for name, c, secs in rows:
        t = f"{'':7s} {'':6s}" if secs is None else f"{secs[0]:7.1f} {secs[1]:6.1f}"
        word = "ok" if c.ok else "FAIL"
        out.append(f"{name:26s} {c.lines:5d} {c.fields:6d} {c.failure_count:4d} {c.worst:14.3g} {t}  {word}")
    return "\n".join(out)


def failure_report(name: str, c: Comparison, limit: int = 12) -> list[str]:
    """What failed in one case: the whole-file error, or the first ``limit`` field failures."""
    if c.error:
        return [f"{name}: {c.error}"]
    out = [f"{name}: {f.describe()}" for f in c.failures[:limit]]
    if len(c.failures) > limit:
        out.append(f"{name}: ... {len(c.failures) - limit} more")
    return out
