"""Rational functions for the RHMC: MILC's file format, accuracy of MILC's approximations, our Remez algorithm.

Reference: ../shared/fixtures/milc/rationals.sample.su3_rhmc_hisq{,_f211,_f2111} (MILC's test inputs, made by its
remez-milc/poly4). docs/conventions.md 3.1.
"""
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from hmc.rational import (RationalApprox, RationalsError, approximation_error, check_masses, check_ordering,
                          error_extrema, flavor_content, naik_groups)
from hmc.rational_file import format_rationals, read_rationals, write_rationals
from hmc.remez import PseudofermionSpec, equioscillation, main, make_rationals, remez, remez_approx
from tests.conftest import ROOT, fixture_path

FILES = ["rationals.sample.su3_rhmc_hisq", "rationals.sample.su3_rhmc_hisq_f211",
         "rationals.sample.su3_rhmc_hisq_f2111"]
GENERATED = ROOT / "runs" / "rationals" / "rationals.su3_rhmc_hisq"
GENERATED_F211 = ROOT / "runs" / "rationals" / "rationals.su3_rhmc_hisq_f211"


def ulps(a: RationalApprox, b: RationalApprox) -> float:
    x = np.r_[a.res0, a.residues, a.poles]
    y = np.r_[b.res0, b.residues, b.poles]
    return float(np.max(np.abs(x - y) / np.spacing(np.abs(y))))


def distinct_approximations(pfs):
    """(index, pseudofermion) with the repeated ones (phi1..3 are identical) removed."""
    seen, out = set(), []
    for i, p in enumerate(pfs):
        key = tuple((ap.res0, tuple(ap.residues), tuple(ap.poles)) for ap in p.approximations)
        if key not in seen:
            seen.add(key)
            out.append((i, p))
    return out


# ----------------------------------------------------------------------------------------------------------------
# reading and writing
# ----------------------------------------------------------------------------------------------------------------

def test_read_su3_rhmc_hisq_layout():
    pfs = read_rationals(fixture_path(FILES[0]))
    assert len(pfs) == 4
    assert [p.naik_epsilon for p in pfs] == [0.0] * 4
    assert [(p.md.order, p.gr.order, p.fa.order) for p in pfs] == [(9, 11, 11)] + [(7, 9, 9)] * 3
    p0 = pfs[0]
    assert p0.md.y == (-2, -1, 3, 0) and p0.md.z == (4, 4, 4, 4)
    assert p0.gr.y == (2, 1, -3, 0) and p0.gr.z == (8, 8, 8, 8)
    assert p0.fa.y == (-2, -1, 3, 0) and p0.fa.z == (8, 8, 8, 8)
    assert p0.md.masses == (0.0018, 0.018, 0.2, 1.0)
    assert p0.md.res0 == 1.0000007752683888 and p0.md.residues[0] == 2.0448520940231502e-03
    assert p0.md.poles[0] == 1.4311334644016095e-05 and p0.md.dummy_pole == 99.9
    assert p0.exponents == {0.0018: Fraction(-1, 2), 0.018: Fraction(-1, 4), 0.2: Fraction(3, 4)}
    assert p0.flavors == {0.0018: 2, 0.018: 1, 0.2: -3}
    assert pfs[1].flavors == {0.2: 1}
    # MILC's range is written by poly4 in a comment; FA inherits GR's header
    for p in pfs:
        for ap in p.approximations:
            assert (ap.lo, ap.hi) == (1e-15, 90.0)
    assert (p0.md.error, p0.gr.error, p0.fa.error) == (7.142803e-07, 2.609214e-08, 2.609214e-08)
    assert flavor_content(pfs) == {0.0018: 2, 0.018: 1, 0.2: 0}
    assert naik_groups(pfs) == [(0.0, [0, 1, 2, 3])]


def test_read_charm_files_epsilon_groups():
    f211 = read_rationals(fixture_path(FILES[1]))
    assert [p.naik_epsilon for p in f211] == [0.0] * 4 + [-0.16875]     # the commented-out line is ignored
    assert naik_groups(f211) == [(0.0, [0, 1, 2, 3]), (-0.16875, [4])]
    assert f211[4].flavors == {0.5: 1}
    f2111 = read_rationals(fixture_path(FILES[2]))
    assert [p.naik_epsilon for p in f2111] == [0.0] * 4 + [-0.152048264210358, -0.271190134429433]
    assert len(naik_groups(f2111)) == 3


@pytest.mark.parametrize("name", FILES)
def test_round_trip(name, tmp_path):
    pfs = read_rationals(fixture_path(name))
    out = tmp_path / "r.txt"
    write_rationals(out, pfs, comment="round trip")
    again = read_rationals(out)
    assert len(again) == len(pfs)
    for a, b in zip(pfs, again):
        assert a.naik_epsilon == b.naik_epsilon
        for x, y in zip(a.approximations, b.approximations):
            assert x.res0 == y.res0 and x.dummy_pole == y.dummy_pole
            assert np.array_equal(x.residues, y.residues) and np.array_equal(x.poles, y.poles)
            assert (x.y, x.z, x.masses, x.lo, x.hi) == (y.y, y.z, y.masses, y.lo, y.hi)
    assert format_rationals(again) == format_rationals(pfs)


def test_call_evaluates_partial_fractions():
    ap = RationalApprox(0.5, [1.0, 2.0], [0.1, 3.0])
    x = np.geomspace(1e-6, 50, 12).reshape(3, 4)
    assert ap(x).shape == (3, 4)
    assert np.allclose(ap(x), 0.5 + 1.0 / (x + 0.1) + 2.0 / (x + 3.0), rtol=1e-15)
    assert ap(2.0) == pytest.approx(0.5 + 1 / 2.1 + 2 / 5)
    assert ap.order == 2


def _bad(text, tmp_path, match):
    p = tmp_path / "bad.rat"
    p.write_text(text)
    with pytest.raises(RationalsError, match=match) as e:
        read_rationals(p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg
    return msg


def test_errors_name_the_file_and_the_problem(tmp_path):
    text = fixture_path(FILES[1]).read_text()
    # epsilon groups must be contiguous with epsilon = 0 first
    first = text.replace("naik_term_epsilon 0\n", "naik_term_epsilon -0.1\n", 1)
    _bad(first, tmp_path, "epsilon = 0 first")
    pfs = read_rationals(fixture_path(FILES[1]))
    mixed = [pfs[0], pfs[4], pfs[1]]
    with pytest.raises(RationalsError, match="grouped by epsilon"):
        check_ordering(mixed)
    check_ordering([pfs[0], pfs[1], pfs[4]])
    # GR must approximate f^(-1/2) of MD's f
    lines = text.splitlines()
    i = lines.index("y_GR 2 1 -3 0")
    _bad("\n".join(lines[:i] + ["y_GR 2 1 -2 0"] + lines[i + 1:]), tmp_path, "GR exponent for mass 0.2")
    j = lines.index("m_FA 0.010000 0.050000 0.200000 99.900000")
    _bad("\n".join(lines[:j] + ["m_FA 0.010000 0.060000 0.200000 99.900000"] + lines[j + 1:]), tmp_path,
         "FA has masses")
    # structure
    _bad(text.replace("order_GR 11", "order_GX 11", 1), tmp_path, "expected 'order_GR'")
    _bad(text.replace("n_pseudo 5", "n_pseudo 6", 1), tmp_path, "only 5 pseudofermion")
    _bad(text.replace("n_pseudo 5", "n_pseudo 4", 1), tmp_path, "unexpected 'naik_term_epsilon'")
    _bad("\n".join(lines[:40]), tmp_path, "file ends")
    _bad(text.replace("res_MD 4.8285541379884007e-03", "res_MD 4.8285541379884007e-03x", 1), tmp_path,
         "not a number")
    _bad(text.replace("pole_MD 4.2133355802208354e-04", "pole_MD -4.2133355802208354e-04", 1), tmp_path,
         "non-positive shift")
    with pytest.raises(RationalsError, match="cannot read"):
        read_rationals(tmp_path / "missing.rat")


def test_masses_against_the_deck():
    pfs = read_rationals(fixture_path(FILES[0]))
    check_masses(pfs, [0.0018, 0.018], [2, 1])
    check_masses(pfs, [0.0018, 0.018])
    with pytest.raises(RationalsError, match="mass 0.0019 is not in") as e:
        check_masses(pfs, [0.0019, 0.018], [2, 1], where="deck vs rationals")
    assert "\n" not in str(e.value) and str(e.value).startswith("deck vs rationals:")
    with pytest.raises(RationalsError, match="mass 0.018 has 2 flavours but the rational functions give it 1"):
        check_masses(pfs, [0.0018, 0.018], [2, 2])
    with pytest.raises(RationalsError, match="mass 0.018 with 1 flavours, which is not a deck mass"):
        check_masses(pfs, [0.0018], [2])
    f211 = read_rationals(fixture_path(FILES[1]))
    check_masses(f211, [0.01, 0.05, 0.5], [2, 1, 1], naik_epsilons=[0, 0, -0.16875])
    with pytest.raises(RationalsError, match="mass 0.5 has naik epsilon -0.2"):
        check_masses(f211, [0.01, 0.05, 0.5], [2, 1, 1], naik_epsilons=[0, 0, -0.2])


# ----------------------------------------------------------------------------------------------------------------
# accuracy of MILC's approximations
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FILES)
def test_fixture_approximations_are_accurate(name):
    """Each MD/GR/FA of MILC's files approximates its f on [1e-15, 90] to the error poly4 printed, and
    equioscillates (2n+2 alternating extrema)."""
    pfs = read_rationals(fixture_path(name))
    for i, p in distinct_approximations(pfs):
        errs = p.check_accuracy(tol=1e-6)
        for ap in p.approximations:
            # poly4 prints the level E of the minimax GR (and of 1/MD's minimax); MD and FA are the inverses,
            # whose relative error is E/(1 -+ E); the double coefficients add ~1e-16 absolute
            assert errs[ap.tag] == pytest.approx(ap.error, rel=1e-3, abs=2e-15), (name, i, ap.tag)
            eq = equioscillation(ap)
            assert eq["extrema"] == eq["expected"] == 2 * ap.order + 2 and eq["alternates"], (name, i, ap.tag)
        prod = p.product_check(1e-15, 90.0)
        assert prod["GR^2*MD"] < 2.1 * errs["GR"] + 1.1 * errs["MD"]
        assert prod["FA^2/MD"] < 2.1 * errs["FA"] + 1.1 * errs["MD"]


def test_su3_rhmc_hisq_errors():
    pfs = read_rationals(fixture_path(FILES[0]))
    e0 = pfs[0].check_accuracy()
    e1 = pfs[1].check_accuracy()
    assert e0["MD"] == pytest.approx(7.1428e-7, rel=1e-4)
    assert e0["GR"] == pytest.approx(2.6092e-8, rel=1e-4) and e0["FA"] == pytest.approx(2.6092e-8, rel=1e-4)
    assert e1["MD"] == pytest.approx(2.3982e-7, rel=1e-4)
    assert e1["GR"] == pytest.approx(1.7002e-9, rel=1e-4) and e1["FA"] == pytest.approx(1.7002e-9, rel=1e-4)
    # the error grows quickly outside the range it was made for (the lowest pole is 1.4e-5)
    assert approximation_error(pfs[1].md, lo=90.0, hi=1e4) > 1e-4
    # explicit function and range
    f = lambda x: (x + 4 * 0.2**2) ** -0.25                                   # noqa: E731
    assert approximation_error(pfs[1].md, f, 1e-15, 90.0) == pytest.approx(e1["MD"], rel=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# Remez
# ----------------------------------------------------------------------------------------------------------------

def test_remez_low_order_equioscillates():
    """Order 6 on [1e-4, 90] for the 2+1 over Hasenbusch kernel: fast, equioscillating, error = levelled E."""
    t0 = time.perf_counter()
    terms = [(0.0018, Fraction(2, 4)), (0.018, Fraction(1, 4)), (0.2, Fraction(-3, 4))]
    r = remez(terms, 1e-4, 90.0, 6)
    assert r.converged and r.spread < 1e-15
    ext = [float(e) for _, e in r.extrema]
    assert len(ext) == 14 and all((ext[k] > 0) != (ext[k + 1] > 0) for k in range(13))
    ap = r.approx()
    eq = equioscillation(ap)
    assert eq["extrema"] == 14 and eq["alternates"] and eq["spread"] < 1e-8
    assert eq["max"] == pytest.approx(float(r.E), rel=1e-8)
    assert 1e-6 < float(r.E) < 1e-4
    inv = r.approx(inverse=True)
    assert inv.exponents == (Fraction(-1, 2), Fraction(-1, 4), Fraction(3, 4))
    assert approximation_error(inv) == pytest.approx(float(r.E), rel=1e-4)
    assert np.all(ap.poles > 0) and np.all(np.diff(ap.poles) > 0)
    assert time.perf_counter() - t0 < 60          # about 1.5 s on an idle machine


def test_remez_approx_metadata():
    ap = remez_approx([(0.0, Fraction(-1, 2))], 1e-3, 10.0, 5, tag="GR")
    assert ap.tag == "GR" and ap.order == 5 and ap.lo == 1e-3 and ap.hi == 10.0
    eq = ap.meta["equioscillation"]
    assert eq["extrema"] == 12 and eq["alternates"] and eq["spread"] < 1e-6
    assert ap.error == pytest.approx(ap.meta["levelled_error"], rel=1e-6)
    x = np.geomspace(1e-3, 10, 1000)
    assert np.max(np.abs(ap(x) * np.sqrt(x) - 1)) <= ap.error * (1 + 1e-9)


def test_remez_rejects_bad_input():
    with pytest.raises(ValueError):
        remez([(0.1, Fraction(0))], 1e-3, 1.0, 4)
    with pytest.raises(ValueError):
        remez([(0.1, Fraction(1, 2))], 1.0, 1e-3, 4)
    with pytest.raises(ValueError):
        remez([(0.1, Fraction(1, 2))], 1e-3, 1.0, 0)


def test_remez_reproduces_milc_phi1():
    """phi1 of su3_rhmc_hisq (orders 7/9 on MILC's [1e-15, 90]): every residue and pole within 1 ulp of poly4's."""
    ref = read_rationals(fixture_path(FILES[0]))[1]
    (mine,) = make_rationals([((1,), (0.2,), 0.0, (7, 9))], 1e-15, 90.0, pad_mass=1.0)
    for tag in ("MD", "GR", "FA"):
        assert mine[tag].order == ref[tag].order
        assert (mine[tag].y, mine[tag].z, mine[tag].masses) == (ref[tag].y, ref[tag].z, ref[tag].masses)
        assert ulps(mine[tag], ref[tag]) <= 1.0, tag
        assert mine[tag].error == pytest.approx(ref[tag].error, rel=1e-6)


@pytest.mark.slow
def test_remez_reproduces_milc_files():
    """All distinct pseudofermions of the three files (orders 9/11 for the 3-mass kernels): within 1 ulp."""
    cases = [(FILES[0], 0, ((2, 1, -3), (0.0018, 0.018, 0.2), 0.0, (9, 11)), 1.0),
             (FILES[1], 0, ((2, 1, -3), (0.01, 0.05, 0.2), 0.0, (9, 11)), 99.9),
             (FILES[1], 4, ((1,), (0.5,), -0.16875, (7, 9)), 99.9),
             (FILES[2], 5, ((1,), (0.7,), -0.271190134429433, (7, 9)), 99.9)]
    for name, k, spec, pad in cases:
        ref = read_rationals(fixture_path(name))[k]
        t0 = time.perf_counter()
        (mine,) = make_rationals([spec], 1e-15, 90.0, pad_mass=pad, check_order=False)
        dt = time.perf_counter() - t0
        for tag in ("MD", "GR", "FA"):
            assert ulps(mine[tag], ref[tag]) <= 1.0, (name, k, tag)
        assert mine.naik_epsilon == ref.naik_epsilon
        print(f"{name} phi{k}: {dt:.1f} s")


def test_make_rationals_write_read_and_cli(tmp_path):
    specs = [PseudofermionSpec((2, 1, -1), (0.01, 0.05, 0.2)),
             {"flavors": [1], "masses": [0.2]},
             ((1,), (0.5,), -0.2)]
    pfs = make_rationals(specs, 1e-4, 50.0, (4, 5), pad_mass=99.9)
    assert [p.md.order for p in pfs] == [4, 4, 4] and [p.gr.order for p in pfs] == [5, 5, 5]
    assert pfs[0].md.masses == (0.01, 0.05, 0.2, 99.9) and pfs[0].md.y == (-2, -1, 1, 0)
    check_masses(pfs, [0.01, 0.05, 0.5], [2, 1, 1], naik_epsilons=[0, 0, -0.2])
    out = tmp_path / "r.rat"
    write_rationals(out, pfs)
    back = read_rationals(out)
    assert [(p.md.lo, p.md.hi) for p in back] == [(1e-4, 50.0)] * 3
    errs = back[0].check_accuracy()
    assert errs["GR"] == pytest.approx(pfs[0].gr.error, rel=1e-6)
    with pytest.raises(RationalsError, match="epsilon = 0 first"):
        make_rationals([((1,), (0.5,), -0.2, (3, 3))], 1e-3, 10.0)
    # command line
    out2 = tmp_path / "cli.rat"
    assert main(["--pf", "1:0.2", "--pf", "1:0.5:-0.2:3,4", "--orders", "3", "4", "--lo", "1e-3", "--hi", "10",
                 "-o", str(out2)]) == 0
    cli = read_rationals(out2)
    assert [p.naik_epsilon for p in cli] == [0.0, -0.2] and cli[1].gr.order == 4
    assert "python -m hmc.remez" in out2.read_text().splitlines()[1]
    assert main(["--pf", "1:0.5:-0.2", "-o", str(tmp_path / "x.rat")]) == 2


# ----------------------------------------------------------------------------------------------------------------
# the deck-ready files in runs/rationals (made by our Remez, not copied)
# ----------------------------------------------------------------------------------------------------------------

def test_generated_su3_rhmc_hisq_file():
    pfs = read_rationals(GENERATED)
    assert len(pfs) == 4 and [(p.md.order, p.gr.order) for p in pfs] == [(9, 11)] + [(7, 9)] * 3
    check_masses(pfs, [0.0018, 0.018], [2, 1], where=str(GENERATED))
    assert "Generated by hisq-hmc's Remez" in GENERATED.read_text()
    e0 = pfs[0].md.error
    assert e0 == pytest.approx(7.1428e-7, rel=1e-4)
    ref_path = Path(fixture_path(FILES[0]))
    ref = read_rationals(ref_path)
    for a, b in zip(pfs, ref):
        for tag in ("MD", "GR", "FA"):
            assert ulps(a[tag], b[tag]) <= 1.0


def test_generated_f211_file():
    pfs = read_rationals(GENERATED_F211)
    check_masses(pfs, [0.01, 0.05, 0.5], [2, 1, 1], naik_epsilons=[0, 0, -0.16875], where=str(GENERATED_F211))
    ref = read_rationals(fixture_path(FILES[1]))
    for a, b in zip(pfs, ref):
        assert a.naik_epsilon == b.naik_epsilon
        for tag in ("MD", "GR", "FA"):
            assert ulps(a[tag], b[tag]) <= 1.0


def test_error_extrema_runs():
    pfs = read_rationals(GENERATED)
    ext = error_extrema(pfs[1].gr)
    assert len(ext) == 20
    assert ext[0][0] == pytest.approx(1e-15) and ext[-1][0] == pytest.approx(90.0)


def test_exchange_refuses_a_non_alternating_error_with_remez_error():
    """The exchange step's own failure is the RemezError that remez() catches to retry at higher precision (it was
    a NameError: remez_exchange.py used the name without defining or importing it)."""
    import mpmath as mp

    from hmc.remez import RemezError
    from hmc.remez_exchange import exchange_reference

    with pytest.raises(RemezError, match="does not alternate"):
        exchange_reference(lambda x: x - 2, [mp.mpf(3), mp.mpf(4), mp.mpf(5)], mp.mpf(1), mp.mpf(6))
