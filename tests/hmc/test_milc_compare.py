"""MILC's regression comparison (hmc.milc.compare): selection of lines and the field-by-field errtol test, on
hand-made outputs (no fixtures needed)."""
import pytest

from hmc.milc.compare import (Case, MilcCheckError, compare_lines, compare_outputs, drop_noise, is_number,
                              parse_checklist, perl_number, select_lines, split_fields)

CASE = Case("su3_rhmc_hisq", "2", "-", "-", ("delta", "RUNNING"), "PBP|DG|PLAQ|ACTION|delta|G_LOOP")

SAMPLE = """\
ACTION: g,h,f = 1.9e4 1.0 2.0 3.0
PLAQ:\t1.0\t2.0
ACCEPT: delta S = -1.521986e-05
PLAQ:\t1.8590262183356623\t1.8640148066269224
P_LOOP:\t3.168290e-01\t-1.508247e-02
G_LOOP:  0  0  4   \t1.8723154402539106e+00\t( 0 1 7 6  )
# PBP: a comment
ACTION time = 3
PBP: mass 1.800000e-03     1.334656e-02  -1.000056e-02  -4.706674e-02  -4.706668e-02 ( 1 of 1 )
FACTION: mass = 1.800000e-03,  1.496519e+00 ( 1 of 1 )
RUNNING COMPLETED
PLAQ:\t9.0\t9.0
"""
ERRTOL = """\
ACCEPT: delta S = 0.02
PLAQ: 8e-07 2e-06
G_LOOP: 0 0 0 9e-07 ( 0 0 0 0 )
PBP: mass 2e-08 8e-08 6e-08 5e-08 2e-08 ( 0 of 0 )
FACTION: mass = 2e-08 3e-08 ( 0 of 0 )
"""


def run(test, sample=SAMPLE, errtol=ERRTOL, case=CASE):
    return compare_outputs(test, sample, errtol, case)


def test_selection_region_select_and_noise():
    sel = select_lines(drop_noise(SAMPLE.splitlines()), CASE.patterns, CASE.select)
    assert [s.split()[0] for s in sel] == ["ACCEPT:", "PLAQ:", "G_LOOP:", "PBP:", "FACTION:"]
    # without SELECT every line of the region, up to and including the stop line
    sel = select_lines(SAMPLE.splitlines(), ("delta", "RUNNING"))
    assert sel[0].startswith("ACCEPT") and sel[-1] == "RUNNING COMPLETED" and len(sel) == 9
    # several pattern pairs, as headtail.pl
    lines = ["a", "START 1", "x", "STOP", "y", "BEGIN", "z", "END", "w"]
    assert select_lines(lines, ("START", "STOP", "BEGIN", "END")) == ["START 1", "x", "STOP", "BEGIN", "z", "END"]
    assert drop_noise(["ok", "# c", "WARNING: x", "a Warning b", "CG time = 3", "keep # this"]) == ["ok", "keep # this"]


def test_identical_output_passes_and_counts():
    c = run(SAMPLE)
    assert c.ok and c.lines == 5 and c.failure_count == 0
    assert c.fields == sum(len(split_fields(s)) for s in ERRTOL.splitlines())
    assert c.worst == 0.0


def test_field_within_and_beyond_tolerance():
    inside = SAMPLE.replace("-1.521986e-05", "-1.521986e-02")       # |diff| 0.0152 <= 0.02
    c = run(inside)
    assert c.ok and 0.7 < c.worst < 0.77
    beyond = SAMPLE.replace("-1.521986e-05", "-3.000000e-02")       # 0.03 > 0.02
    c = run(beyond)
    assert not c.ok and c.failure_count == 1
    f = c.failures[0]
    assert (f.line, f.field) == (1, 5) and f.test == "-3.000000e-02" and f.sample == "-1.521986e-05"
    assert c.worst > 1.0


def test_numbers_with_comma_and_integer_fields():
    c = run(SAMPLE.replace("mass = 1.800000e-03,", "mass = 1.900000e-03,"))
    assert not c.ok and c.failures[0].field == 4 and c.failures[0].line == 5
    # the number before the comma is read as a number: 1e-9 off passes a 2e-8 tolerance
    c = run(SAMPLE.replace("mass = 1.800000e-03,", "mass = 1.8000000001e-03,"))
    assert c.ok
    # "( 1 of 1 )" has tolerance 0: an integer that changes fails
    c = run(SAMPLE.replace("1.496519e+00 ( 1 of 1 )", "1.496519e+00 ( 2 of 1 )"))
    assert not c.ok and c.failures[0].field == 7


def test_text_fields_must_match():
    c = run(SAMPLE.replace("ACCEPT: delta S", "REJECT: delta S"))
    assert not c.ok and c.failures[0].field == 1
    c = run(SAMPLE.replace("PBP: mass 1.8", "PBP: mass! 1.8"))
    assert not c.ok


def test_xxx_field_and_xxxx_line_are_skipped():
    beyond = SAMPLE.replace("-1.521986e-05", "-3.000000e-02")
    c = run(beyond, errtol=ERRTOL.replace("delta S = 0.02", "delta S = XXX"))
    assert c.ok and c.fields == run(SAMPLE).fields - 1
    bad = beyond.replace("PLAQ:\t1.859", "PLAQ:\t1.959")
    c = run(bad, errtol="XXXX\n" + "\n".join(ERRTOL.splitlines()[1:]).replace("PLAQ: 8e-07", "XXXX 8e-07") + "\n")
    assert c.ok and c.lines == 3


def test_line_count_mismatch_fails():
    short = SAMPLE.replace("G_LOOP:  0  0  4", "X_LOOP:  0  0  4")       # one selected line fewer
    c = run(short)
    assert not c.ok and c.error and "line counts differ" in c.error and c.failure_count == 1
    c = compare_lines(["a 1"], ["a 1"], ["a 0", "b 0"])
    assert not c.ok


def test_longer_line_fails():
    c = run(SAMPLE.replace("( 0 1 7 6  )", "( 0 1 7 6 5 )"))
    assert not c.ok


def test_perl_numbers():
    assert perl_number("1.5e-3,") == 1.5e-3 and perl_number("abc") == 0.0 and perl_number(None) == 0.0
    assert perl_number(".5") == 0.5 and perl_number("-2x") == -2.0
    assert is_number("1.0,") and is_number("3)") and is_number("-1.2e+05") and not is_number(".5")
    assert not is_number("(") and not is_number(None)
    assert split_fields(" OK a\tb  ") == ["", "OK", "a", "b"]


def test_checklist_parsing():
    text = """# Executable  precision  add-macro input-case  pattern1 pattern2

exec su3_leapfrog      1      -         -          WARMUPS RUNNING 'SELECT=PBP|DG|PLAQ|ACTION|delta|G_LOOP'
exec su3_rhmc_hisq     2      -         f211       delta   RUNNING 'SELECT=PBP|DG'
"""
    a, b = parse_checklist(text)
    assert a.prefix == "su3_leapfrog.1" and a.patterns == ("WARMUPS", "RUNNING")
    assert a.select == "PBP|DG|PLAQ|ACTION|delta|G_LOOP"
    assert b.prefix == "su3_rhmc_hisq.f211.2" and b.select == "PBP|DG" and b.line == 4
    with pytest.raises(MilcCheckError, match="line 1"):
        parse_checklist("exec su3 1 - - WARMUPS\n")
