"""The superaccumulator twin (comms/superacc.py) against comms.reduce's exact sum, bitwise, and its independence
of how the values are split into parts and in which order the parts' records are added."""
from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from comms import reduce as R
from comms import superacc as S

MAX = sys.float_info.max
TINY = 5e-324                                # the smallest subnormal
MIN_NORMAL = sys.float_info.min


def bits(x: float) -> int:
    return int(np.float64(x).view(np.int64))


def reference(a) -> float | None:
    """comms.reduce's correctly rounded sum, None where it overflows (Python's int / int raises there)."""
    try:
        return R.combine([R.exact_parts(np.asarray(a, dtype=np.float64))])
    except OverflowError:
        return None


def assert_matches_reduce(a):
    got = S.to_float(S.accumulate(np.asarray(a, dtype=np.float64)))
    ref = reference(a)
    if ref is None:
        assert np.isinf(got), f"an overflowing sum must round to +-inf, got {got!r}"
    else:
        assert bits(got) == bits(ref), f"superaccumulator {got!r} != comms.reduce {ref!r}"
    return got


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
scaled = st.builds(lambda m, e: float(np.ldexp(m, e)), st.floats(-1.0, 1.0), st.integers(-1080, 1023))
value_lists = st.lists(st.one_of(finite, scaled, st.sampled_from([0.0, -0.0, TINY, -TINY, MAX, -MAX])),
                       min_size=1, max_size=300)


@settings(max_examples=300, deadline=None)
@given(value_lists)
def test_random_values_match_reduce(values):
    assert_matches_reduce(values)


@settings(max_examples=200, deadline=None)
@given(value_lists, st.lists(st.integers(0, 300), max_size=8), st.randoms(use_true_random=False))
def test_any_split_and_order_gives_the_same_record(values, cuts, rnd):
    a = np.asarray(values, dtype=np.float64)
    edges = sorted({min(c, a.size) for c in cuts} | {0, a.size})
    parts = [a[lo:hi] for lo, hi in zip(edges[:-1], edges[1:])]
    rnd.shuffle(parts)
    whole = S.accumulate(a)
    split = S.add(*[S.accumulate(p) for p in parts])
    assert np.array_equal(split, whole)
    assert bits(S.to_float(split)) == bits(S.to_float(whole))


@pytest.mark.parametrize("values", [
    [TINY], [-TINY], [TINY] * 7, [MIN_NORMAL - TINY, TINY], [MIN_NORMAL, -TINY], [TINY * 3, -TINY],
    [1.0], [-0.0], [0.0, -0.0], [MAX], [-MAX], [MAX, -MAX, 1.0], [MAX, MAX * 2 ** -53],
    [1.0, 2.0 ** -53], [1.0, 2.0 ** -53, TINY], [1.0 + 2.0 ** -52, 2.0 ** -53], [1.0, -2.0 ** -54],
    [1e300, 1.0, -1e300], [1e308, -1e308, TINY], [2.0 ** 1023, 2.0 ** 1023 * (1 - 2.0 ** -53)],
], ids=lambda v: repr(v)[:40])
def test_edge_cases_match_reduce(values):
    assert_matches_reduce(values)


def test_cancellation_to_exactly_zero_is_plus_zero():
    rng = np.random.default_rng(5)
    a = rng.standard_normal(1000) * np.exp2(rng.integers(-1070, 1000, 1000))
    got = S.to_float(S.accumulate(np.concatenate([a, -a[::-1]])))
    assert bits(got) == bits(0.0) == bits(reference(np.concatenate([a, -a])))


def test_mixed_signs_and_magnitudes():
    rng = np.random.default_rng(6)
    for _ in range(20):
        a = rng.standard_normal(500) * np.exp2(rng.integers(-1074, 1020, 500).astype(float))
        assert_matches_reduce(a)
        assert bits(S.to_float(S.accumulate(-a))) == bits(-S.to_float(S.accumulate(a)))


def test_overflow_rounds_to_inf_where_reduce_raises():
    assert reference([MAX, MAX]) is None
    assert S.to_float(S.accumulate(np.array([MAX, MAX]))) == float("inf")
    assert S.to_float(S.accumulate(np.array([-MAX, -MAX, MAX * 2 ** -60]))) == float("-inf")
    # the sum just below the rounding boundary of the largest double stays finite
    assert S.to_float(S.accumulate(np.array([MAX, MAX * 2 ** -54 * (1 - 2 ** -52)]))) == MAX


def test_a_million_values_in_parts():
    rng = np.random.default_rng(7)
    a = rng.standard_normal(10 ** 6) ** 2 * np.exp2(rng.integers(-40, 40, 10 ** 6))
    whole = S.accumulate(a)
    assert bits(S.to_float(whole)) == bits(R.exact_sum(a))
    parts = np.array_split(a, 13)
    recs = [S.accumulate(p) for p in parts]
    assert np.array_equal(S.add(*recs[::-1]), whole)


def test_float32_values_are_widened_exactly():
    a = np.random.default_rng(8).standard_normal(4096).astype(np.float32)
    assert bits(S.to_float(S.accumulate(a))) == bits(R.exact_sum(a.astype(np.float64)))


def test_non_finite_values_set_flags_that_survive_addition():
    inf, nan = float("inf"), float("nan")
    assert S.to_float(S.accumulate(np.array([1.0, inf]))) == inf
    assert S.to_float(S.accumulate(np.array([-inf, 1.0]))) == -inf
    assert np.isnan(S.to_float(S.accumulate(np.array([nan, 1.0]))))
    pos, neg, one = (S.accumulate(np.array(v)) for v in ([inf], [-inf], [1.0]))
    assert S.to_float(S.add(one, pos)) == inf == R.combine([R.exact_parts([1.0]), R.exact_parts([inf])])
    assert np.isnan(S.to_float(S.add(pos, one, neg)))
    assert np.isnan(R.combine([R.exact_parts([inf]), R.exact_parts([-inf])]))


def test_records_are_normalised_and_unique():
    rec = S.accumulate(np.array([1.0, -3.5e-300, 2.0 ** 70]))
    assert ((rec[:S.NLIMBS - 1] >= 0) & (rec[:S.NLIMBS - 1] < 2 ** 32)).all()
    assert rec.dtype == np.int64 and rec.shape == (S.WIDTH,)
    assert np.array_equal(rec, S.add(S.accumulate(np.array([2.0 ** 70, 1.0])), S.accumulate(np.array([-3.5e-300]))))


def test_bad_input_is_refused():
    with pytest.raises(TypeError, match="real float array"):
        S.accumulate(np.ones(3, dtype=complex))
    with pytest.raises(ValueError, match="at least one record"):
        S.add()
