"""MILC's sample-out comparison (ks_imp_rhmc/test/checklist, MILC's check scripts) for the tests of MILC's cases:
select a case's lines, then compare them field by field with its errtol file."""
import re


def select_lines(lines, first="WARMUPS", last="RUNNING", pattern="PBP|DG|PLAQ|ACTION|delta|G_LOOP"):
    """Drop lines containing ``warning`` (any case), ``time =`` or starting with ``#``; keep those from the first
    line matching ``first`` up to the one matching ``last``, and of them the ones matching ``pattern``. With
    ``first`` None, from the start."""
    kept = [l.rstrip("\n") for l in lines
            if "warning" not in l.lower() and "time =" not in l and not l.startswith("#")]
    out, on = [], first is None
    for l in kept:
        if not on and re.search(first, l):
            on = True
        if on and last and re.search(last, l):
            break
        if on and re.search(pattern, l):
            out.append(l)
    return out


def compare(got, want, tol):
    """MILC's field-by-field check: as many lines as the errtol file; a number passes when |got - want| <= the
    errtol number at the same place (``XXX`` skips the field, a tolerance line starting with ``XXXX`` skips the
    line); other fields must be equal. Returns (number of fields compared, worst |difference| / tolerance)."""
    assert len(got) == len(want) == len(tol), (len(got), len(want), len(tol))
    fields, worst = 0, 0.0
    for i, (g, w, t) in enumerate(zip(got, want, tol)):
        if t.startswith("XXXX"):
            continue
        gf, wf, tf = g.replace(",", " ").split(), w.replace(",", " ").split(), t.replace(",", " ").split()
        assert len(gf) == len(wf) == len(tf), f"line {i}: {g!r} / {w!r} / {t!r}"
        for a, b, c in zip(gf, wf, tf):
            if c == "XXX":
                continue
            fields += 1
            try:
                tv, bv = float(c), float(b)
            except ValueError:
                assert a == b, f"line {i}: {g!r} != {w!r}"
                continue
            d = abs(float(a) - bv)
            assert d <= tv, f"line {i}: {a} vs MILC's {b}: |difference| {d:.3e} > errtol {c} ({g!r})"
            if tv:
                worst = max(worst, d / tv)
    return fields, worst


def single_precision_format(line):
    """The line as MILC's single-precision build prints it (``g_measure``: PLAQ with %f, G_LOOP averages with %e;
    every other selected line has the same format in both builds), to compare a double-precision run with MILC's
    PRECISION 1 outputs."""
    if line.startswith("PLAQ:"):
        ss, st = line.split()[1:]
        return f"PLAQ:\t{float(ss):f}\t{float(st):f}"
    if line.startswith("G_LOOP:"):
        head, value, tail = line.split("\t")
        return f"{head}\t{float(value):e}\t{tail}"
    return line
