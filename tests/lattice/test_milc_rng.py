"""MILC's per-site random numbers (docs/conventions.md 3.3): exact reproduction, vectorization, state, statistics."""
import json
import math

import numpy as np
import pytest

from lattice.milc_rng import (MilcRNG, PRNArray, ahmat, ahmat_mag_sq, even_sites, momentum_action, odd_sites, site_coords,
                              site_index)
from tests.conftest import ROOT

REFERENCE = ROOT / "runs" / "references" / "su3_rhmc_hisq.2.json"
REFERENCE_F211 = ROOT / "runs" / "references" / "su3_rhmc_hisq.f211.2.json"
DIMS = (6, 6, 6, 6)


# ----------------------------------------------------------------------------------------------------------------
# an independent scalar transcription of generic/ranstuff.c and libraries/gaussrand.c (Python integers)
# ----------------------------------------------------------------------------------------------------------------

class ScalarPRN:
    def __init__(self, seed, index, old=False):
        self.old = old
        a = (69607 + 8 * index) & 0xFFFFFFFF
        s = seed & 0xFFFFFFFF
        self.r = []
        for _ in range(7):
            s = (a * s + 12345) & 0xFFFFFFFF
            self.r.append((s >> 8) & 0xFFFFFF)
        s = (a * s + 12345) & 0xFFFFFFFF
        if old:
            self.ic, self.mult = s, (100005 + 8 * index) & 0xFFFFFFFF
        else:
            self.ic = s - (1 << 32) if s >= 1 << 31 else s         # int -> 64-bit: sign extension
            self.ic &= (1 << 64) - 1
            self.mult = 100000005 + 8 * index
        self.gset = None

    def myrand(self):
        r0, r1, r2, r3, r4, r5, r6 = self.r
        t = (((r5 >> 7) | (r6 << 17)) ^ ((r4 >> 1) | (r5 << 23))) & 0xFFFFFF
        self.r = [t, r0, r1, r2, r3, r4, r5]
        if self.old:
            self.ic = (self.ic * self.mult + 12345) & 0xFFFFFFFF
            return (t ^ ((self.ic >> 8) & 0xFFFFFF)) / float(1 << 24)
        self.ic = (self.ic * self.mult + 12345) & ((1 << 64) - 1)
        return (t ^ ((self.ic >> 40) & 0xFFFFFF)) / float(1 << 24)

    def pair(self):
        while True:
            v1 = 2.0 * self.myrand() - 1.0
            v2 = 2.0 * self.myrand() - 1.0
            r = v1 * v1 + v2 * v2
            if r < 1.0:
                break
        fac = math.sqrt(-math.log(r) / r)
        return v2 * fac, v1 * fac

    def complex_gaussian(self):
        return complex(*self.pair())

    def gaussian(self):
        if not self.old:
            return self.pair()[0]
        if self.gset is None:
            a, b = self.pair()
            self.gset = b
            return a
        v, self.gset = self.gset, None
        return v


# ----------------------------------------------------------------------------------------------------------------

def test_node_prn_first_number():
    """docs/conventions.md 3.3: the first myrand of node_prn for iseed 86658 on 6^4 (node 0) is 0.04078."""
    rng = MilcRNG(86658, 1296)
    x = rng.node_uniform()
    assert abs(x - 0.04078) < 5e-6
    assert x == 0.04078167676925659
    assert x == ScalarPRN(86658, 1296).myrand()
    # node_prn is initialize_prn(iseed, volume + node)
    assert MilcRNG(86658, 1296, node=3).node_uniform() == ScalarPRN(86658, 1299).myrand()


@pytest.mark.parametrize("variant", ["current", "old"])
def test_vectorized_equals_scalar(variant):
    old = variant == "old"
    V = 1296
    picks = [0, 1, 7, 215, 1000, 1295]
    rng = MilcRNG(86658, V, variant=variant)
    refs = {i: ScalarPRN(86658, i, old) for i in picks}
    for _ in range(40):
        u = rng.uniform(picks)
        assert list(u) == [refs[i].myrand() for i in picks]
    # complex Gaussians with the rejection loop iterating only on the rejecting sites; order of sites irrelevant
    for _ in range(30):
        order = picks[::-1] if _ % 2 else picks
        z = rng.complex_gaussian(order)
        assert list(z) == [complex(*refs[i].pair()) if not old else complex(refs[i].gaussian(), refs[i].gaussian())
                           for i in order]
    g = rng.gaussian(picks)
    assert list(g) == [refs[i].gaussian() for i in picks]
    g = rng.gaussian(picks[:3])                     # old: the cached halves of these three are used now
    assert list(g) == [refs[i].gaussian() for i in picks[:3]]
    # untouched sites are untouched
    assert rng.uniform([2])[0] == ScalarPRN(86658, 2, old).myrand()


def test_rejection_loop_is_per_site():
    """Sites that reject draw more uniforms than their neighbours; each site's stream stays its own."""
    rng = MilcRNG(1234, 500)
    rng.complex_gaussian()
    counts, refs = [], []
    for i in range(500):
        ref = ScalarPRN(1234, i)
        n = 0
        while True:
            n += 2
            v1, v2 = 2 * ref.myrand() - 1, 2 * ref.myrand() - 1
            if v1 * v1 + v2 * v2 < 1:
                break
        counts.append(n)
        refs.append(ref)
        assert rng.sites.r[0, i] == ref.r[0]
    assert max(counts) > 2 and min(counts) == 2      # some sites rejected, others did not
    assert rng.uniform([0, 499]).tolist() == [refs[0].myrand(), refs[499].myrand()]


def test_decomposition_independence():
    """Drawing the lattice in two parts (any order) gives each site the numbers of one draw over all sites."""
    a = MilcRNG(86658, dims=DIMS)
    b = MilcRNG(86658, dims=DIMS)
    Pa = a.ranmom()
    half1, half2 = np.arange(648, 1296), np.arange(0, 648)
    Pb = np.empty_like(Pa)
    Pb[half1] = b.ranmom(half1)
    Pb[half2] = b.ranmom(half2)
    assert np.array_equal(Pa, Pb)
    assert np.array_equal(a.grsource(2), b.grsource(2))


def test_state_save_restore(tmp_path):
    for variant in ("current", "old"):
        rng = MilcRNG(99, dims=(4, 4, 4, 4), variant=variant)
        rng.ranmom()
        rng.gaussian(np.arange(0, 256, 3))            # old: leaves cached halves on some sites
        rng.node_uniform()
        st = rng.state()
        np.savez(tmp_path / "s.npz", **st)
        loaded = dict(np.load(tmp_path / "s.npz"))
        a = (rng.grsource(2), rng.gaussian(np.arange(256)), rng.node_uniform())
        for src in (st, loaded):
            other = MilcRNG.from_state(src)
            b = (other.grsource(2), other.gaussian(np.arange(256)), other.node_uniform())
            assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
        rng.set_state(st)
        c = (rng.grsource(2), rng.gaussian(np.arange(256)), rng.node_uniform())
        assert np.array_equal(a[0], c[0]) and np.array_equal(a[1], c[1]) and a[2] == c[2]


def test_ranmom_is_milcs_rand_ahmat():
    """P from (r38, m01, m02, m12) per direction, in that order, with MILC's diagonal."""
    rng = MilcRNG(86658, dims=DIMS)
    sites = [0, 5, 1295]
    P = rng.ranmom(sites)
    s3 = math.sqrt(1.0 / 3.0)
    for k, i in enumerate(sites):
        ref = ScalarPRN(86658, i)
        for d in range(4):
            r38, m01, m02, m12 = (ref.complex_gaussian() for _ in range(4))
            assert P[k, d, 0, 0] == 1j * (r38.real + s3 * r38.imag)
            assert P[k, d, 1, 1] == 1j * (-r38.real + s3 * r38.imag)
            assert P[k, d, 2, 2] == 1j * (-2.0 * s3 * r38.imag)
            assert (P[k, d, 0, 1], P[k, d, 0, 2], P[k, d, 1, 2]) == (m01, m02, m12)
            assert P[k, d, 1, 0] == -np.conj(m01)
    assert np.allclose(P + np.conj(np.swapaxes(P, -1, -2)), 0, atol=0)
    assert np.max(np.abs(np.trace(P, axis1=-2, axis2=-1))) < 1e-15


def test_milc_su3_rhmc_hisq_numbers():
    """h and the four GRSOURCE sums of MILC's su3_rhmc_hisq.2 sample output, digit for digit."""
    rng = MilcRNG(86658, dims=DIMS)
    h = momentum_action(rng.ranmom(), DIMS)
    g = rng.grsource(4)
    assert g.shape == (4, 648, 3)
    assert f"{h:.14e}" == "-8.03775303465063e+01"
    sums = [f"{np.sum(np.abs(x) ** 2):.10e}" for x in g]
    assert sums == ["1.9636750556e+03", "1.9027332579e+03", "1.9328576806e+03", "1.9363357347e+03"]
    if REFERENCE.exists():
        ref = json.loads(REFERENCE.read_text())
        assert ref["input"]["iseed"] == 86658
        assert [float(s) for s in sums] == ref["trajectory"]["grsource_sum"]
        assert float(f"{h:.14e}") == ref["trajectory"]["action_start"]["h"]
    assert rng.node_uniform() == 0.04078167676925659


def test_milc_2009_f211_numbers_old_variant():
    rng = MilcRNG(4563421, dims=DIMS, variant="old")
    h = momentum_action(rng.ranmom(), DIMS)
    sums = [float(f"{np.sum(np.abs(x) ** 2):.10e}") for x in rng.grsource(5)]
    assert f"{h:.14e}" == "9.94856713096055e+01"
    assert sums == [1918.3886593, 1956.4847478, 1956.9753777, 1936.9167365, 1975.4057608]
    if REFERENCE_F211.exists():
        assert sums == json.loads(REFERENCE_F211.read_text())["trajectory"]["grsource_sum"]


def test_grsource_draws_on_even_sites_only():
    rng = MilcRNG(5, dims=(4, 4, 4, 4))
    before = rng.sites.r.copy()
    rng.grsource(1)
    ev, od = even_sites((4, 4, 4, 4)), odd_sites((4, 4, 4, 4))
    assert len(ev) == len(od) == 128
    assert np.array_equal(rng.sites.r[:, od], before[:, od])
    assert not np.any(np.all(rng.sites.r[:, ev] == before[:, ev], axis=0))
    x, y, z, t = site_coords(ev, (4, 4, 4, 4))
    assert np.all((x + y + z + t) % 2 == 0)
    assert np.array_equal(site_index(x, y, z, t, (4, 4, 4, 4)), ev)
    with pytest.raises(ValueError):
        MilcRNG(5, 256).grsource(1)                  # the parity needs dims
    with pytest.raises(ValueError):
        rng.uniform([3, 3])


def test_statistics():
    rng = MilcRNG(271828, dims=(8, 8, 8, 8))
    n = rng.volume
    u = np.concatenate([rng.uniform() for _ in range(20)])
    assert abs(u.mean() - 0.5) < 5 * math.sqrt(1 / 12 / u.size)
    assert abs(u.var() - 1 / 12) < 5 * math.sqrt(1 / 180 / u.size)
    z = np.concatenate([rng.complex_gaussian() for _ in range(10)])
    m = z.size
    assert abs(np.mean(np.abs(z) ** 2) - 1) < 5 / math.sqrt(m)                # density exp(-|z|^2)
    assert abs(np.mean(z.real ** 2) - 0.5) < 5 * math.sqrt(0.5 / m)
    assert abs(np.mean(z.real * z.imag)) < 5 * math.sqrt(0.25 / m)
    assert abs(np.mean(z.real ** 4) - 0.75) < 5 * math.sqrt((105 / 16 - 9 / 16) / m)
    g = rng.gaussian()
    assert abs(np.mean(g ** 2) - 0.5) < 5 * math.sqrt(0.5 / n)
    P = rng.ranmom()
    k = P.shape[0] * 4
    off = P[..., 0, 1].ravel()
    assert abs(np.mean(np.abs(off) ** 2) - 1) < 5 / math.sqrt(k)              # MILC: <|m01|^2> = 1
    d0 = P[..., 0, 0].imag.ravel()
    assert abs(np.mean(d0 ** 2) - 2 / 3) < 5 * math.sqrt(2 * (2 / 3) ** 2 / k)
    kin = 0.5 * np.einsum("...ij,...ij->...", P.conj(), P).real
    assert np.allclose(kin, ahmat_mag_sq(P), rtol=1e-14)
    assert abs(kin.mean() - 4) < 5 * math.sqrt(4 / k)                        # 8 generators x 1/2
    assert abs(momentum_action(P)) < 5 * math.sqrt(4 * k)
    # Im(P_00 - P_11) = 2 r3 with <r3^2> = 1/2 (P = (i/sqrt2) sum_a w_a lambda_a, w ~ N(0, 1))
    assert abs(np.mean((P[..., 0, 0] - P[..., 1, 1]).imag ** 2) - 2) < 5 * math.sqrt(8 / k)


def test_ahmat_and_arguments():
    P = ahmat(0.5, 0.25, 1 + 2j, 3j, -1)
    assert P.shape == (3, 3) and np.allclose(P, -P.conj().T)
    with pytest.raises(ValueError):
        MilcRNG(1, dims=(4, 4, 4))
    with pytest.raises(ValueError):
        MilcRNG(1, 10, dims=(2, 2, 2, 2))
    with pytest.raises(ValueError):
        PRNArray(1, [0], variant="new")
    with pytest.raises(ValueError):
        MilcRNG(-1, 16)
