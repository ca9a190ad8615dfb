"""RHMC: the fermion monomial's force against the derivative of its MD action, reversibility and dH scaling of full
RHMC trajectories, decks and run files with [fermions], and MILC's su3_rhmc_hisq trajectories reproduced
(docs/conventions.md 3, 5)."""
import json

import numpy as np
import pytest

from force.gauge_action import SymanzikAction
from hmc import deck as deckmod
from hmc.cli import main
from hmc.integrators import Level, build_schedule
from hmc.monomials import GaugeMonomial
from hmc.momenta import random_momenta
from hmc.rational_file import read_rationals
from hmc.rhmc import FermionMonomial, PseudofermionTerm
from hmc.rngs import MilcStreams, pseudofermion_sources
from hmc.run import init_run
from hmc.runfile import load
from hmc.trajectory import hamiltonian, molecular_dynamics, reversibility_check
from lattice import CounterRNG, GaugeField, Geometry, su3
from tests.conftest import ROOT, fixture_path
from tests.hmc.hisq211_decks import LIGHT, cgresid_triples, hisq211_deck

TIGHT = 1e-12
REFS = ROOT / "runs" / "references"


def smooth_field(geom, rng, spread=0.3):
    return GaugeField(geom, su3.expm_su3(spread * random_momenta(geom, rng, "smooth")) @ GaugeField.unit(geom).links)


def f211_rationals():
    """MILC's 2+1+1 rational functions: 0 = light (2 flavours, 0.01) and strange (0.05) over the 0.2 Hasenbusch
    mass, 1-3 = 0.2 (1/4 each), 4 = charm 0.5 with Naik epsilon -0.16875."""
    return read_rationals(fixture_path("rationals.sample.su3_rhmc_hisq_f211"))


def monomial(pfs, which, tol=TIGHT, **kw):
    return FermionMonomial([PseudofermionTerm(pfs[i], tol, tol, tol, 10000) for i in which], **kw)


def directional_derivative(f, h=1e-3):
    """d/dtau f(tau) at 0, fourth-order central difference."""
    return (8 * (f(h) - f(-h)) - (f(2 * h) - f(-2 * h))) / (12 * h)


@pytest.mark.parametrize("kind,which,action", [
    ("light", [0], "hisq"),
    ("strange", [1], "hisq"),
    ("charm", [4], "hisq"),                 # Naik epsilon -0.16875 alone
    ("light+charm", [0, 4], "hisq"),        # two epsilon groups through one chain rule
    ("asqtad", [0, 1], "asqtad"),
])
def test_force_is_the_derivative_of_the_md_action(kind, which, action):
    geom = Geometry((4, 4, 4, 4))
    rng = CounterRNG(11)
    u = smooth_field(geom, rng)
    m = monomial(f211_rationals(), which, action=action, u0=0.9 if action == "asqtad" else None)
    m.refresh(u, rng)
    omega = random_momenta(geom, rng, "direction")
    pdot = m.force(u)
    predicted = float(np.sum(su3.trace(pdot @ omega).real))     # dS/dtau = sum Tr(Pdot Omega)

    def s_md(tau):
        return m.md_action(GaugeField(geom, su3.expm_su3(tau * omega) @ u.links))

    measured = directional_derivative(s_md)
    assert abs(measured - predicted) <= 1e-7 * abs(predicted), (kind, predicted, measured)


def test_links_are_built_once_per_configuration():
    geom = Geometry((4, 4, 4, 4))
    rng = CounterRNG(3)
    u = smooth_field(geom, rng)
    m = monomial(f211_rationals(), [0, 4])
    m.refresh(u, rng)
    m.action(u)
    m.force(u)
    assert m.stats.link_builds == 1
    u.links[0, 0, 0, 0, 0] *= np.exp(0.1j)          # an in-place change is noticed
    m.action(u)
    assert m.stats.link_builds == 2
    assert [r.phase for r in m.stats.solves] == ["GR", "GR", "FA", "FA", "MD", "MD", "FA", "FA"]
    t = m.stats.totals()
    assert t["solves_md"] == 2 and t["cg_md"] == sum(r.stats.milc_iters for r in m.stats.records("MD"))
    assert t["time_fermion_links"] > 0 and t["time_fermion_force_chain"] > 0


def test_operators_are_kept_across_link_updates():
    """A new configuration gives the same operators new links (set_links: the solvers' CUDA graphs then replay over
    them, solvers.krylov_graph), with the action a monomial made afresh on that configuration gives."""
    geom = Geometry((4, 4, 4, 4))
    rng = CounterRNG(3)
    u = smooth_field(geom, rng)
    m = monomial(f211_rationals(), [0, 4])
    m.refresh(u, rng)
    ops = dict(m.links(u).ops)
    v = smooth_field(geom, CounterRNG(4))
    kept = m.links(v).ops
    assert set(kept) == set(ops) == {0.0, -0.16875}
    assert all(kept[e][0] is ops[e][0] and kept[e][1] is ops[e][1] for e in ops)
    fresh = monomial(f211_rationals(), [0, 4])
    fresh.phi = m.phi
    assert m.action(v) == fresh.action(v)


def test_stopped_shifts_keep_the_force_and_the_action():
    """``stop_converged_shifts`` (the deck's key; QUDA's rule): the MD solves stop their heavy shifts early (fewer
    shift updates, the same base iterations) and the force and action move by no more than the solves' tolerance."""
    geom = Geometry((4, 4, 4, 4))
    u = smooth_field(geom, CounterRNG(11))
    out = {}
    for stop in (False, True):
        rng = CounterRNG(12)
        m = monomial(f211_rationals(), [0, 4], tol=1e-8, stop_converged_shifts=stop)
        m.refresh(u, rng)
        out[stop] = m.force(u), m.action(u), m.stats.records("MD")
    (f0, a0, md0), (f1, a1, md1) = out[False], out[True]
    assert [r.stats.iters for r in md1] == [r.stats.iters for r in md0]
    saved = [len(r.stats.shifts) * r.stats.iters - r.stats.extra["shift_updates"] for r in md1]
    assert min(saved) >= 0 and max(saved) > 0                       # (the charm solve's heavy shifts stop)
    assert np.abs(f1 - f0).max() <= 1e-6 * np.abs(f0).max() and abs(a1 - a0) <= 1e-8 * abs(a0)


def test_the_deck_key_reaches_the_monomial(tmp_path):
    from hmc.assemble import make_fermion_monomial

    rat = fixture_path("rationals.sample.su3_rhmc_hisq_f211")
    for value in (False, True):
        d = deckmod.loads(small_deck(rat, extra=f"stop_converged_shifts = {str(value).lower()}"))
        assert make_fermion_monomial(d, read_rationals(rat)).stop_converged_shifts is value


def test_philox_pseudofermion_sources():
    geom = Geometry((4, 4, 4, 4))
    g = pseudofermion_sources(geom, CounterRNG(5), 3)
    odd = geom.parity() == 1
    for gk in g:
        assert np.all(gk[odd] == 0)
    # density exp(-|g|^2) per complex component: <|g|^2> = 1, so sum |g|^2 ~ 3 V/2 per pseudofermion
    sums = [float(np.sum(np.abs(gk) ** 2)) for gk in g]
    n = 3 * geom.volume // 2
    assert all(abs(s - n) < 5 * np.sqrt(n) for s in sums)


def _rhmc_setup(steps=4, tau=0.5, **kw):
    geom = Geometry((4, 4, 4, 4))
    rng = CounterRNG(11)
    u = smooth_field(geom, rng)
    f = monomial(f211_rationals(), [0, 4], tol=1e-10, **kw)
    g = GaugeMonomial(SymanzikAction(6.7, 0.89, 4, "hisq"))
    f.refresh(u, rng)
    p = random_momenta(geom, rng)
    return u, p, [g, f]


def _schedule(steps, tau=0.5):
    return build_schedule([Level("3g1f", steps, ["fermion"]), Level("leapfrog", 1, ["gauge"])], tau)


@pytest.mark.parametrize("stop", [False, True])
def test_rhmc_trajectory_is_reversible(stop):
    """Forward and back to the start; also with the converged shifts stopped (stop_converged_shifts)."""
    u, p, mons = _rhmc_setup(stop_converged_shifts=stop)
    rev = reversibility_check(u, p, mons, _schedule(4))
    assert rev["links"] < 1e-10 and rev["momenta"] < 1e-10
    assert abs(rev["dH"]) < 1e-8


def test_rhmc_energy_violation_scales_as_eps_squared():
    u, p, mons = _rhmc_setup()
    h0 = hamiltonian(u, p, mons).total
    dh = []
    for steps in (4, 8):
        v, q = u.copy(), p.copy()
        molecular_dynamics(v, q, _schedule(steps), mons)
        dh.append(hamiltonian(v, q, mons).total - h0)
    assert abs(dh[0]) > 1e-3                          # well above the solver's noise
    assert 4 * 0.8 < dh[0] / dh[1] < 4 * 1.2, dh


# -- decks and run files -------------------------------------------------------------------------------------------

def small_deck(rationals, rng="milc", extra=""):
    return hisq211_deck(LIGHT, {
        "run": {"seed": "86658", "rng": f'"{rng}"', "start": None},
        "fermions": {"rationals": f'"{rationals}"', "cgresid_md_fa_gr": cgresid_triples("1e-6")},
    }, extra={"fermions": extra})


def test_deck_checks_the_rational_functions(tmp_path, capsys):
    rat = fixture_path("rationals.sample.su3_rhmc_hisq_f211")
    bad = small_deck(rat).replace("[0.01, 0.05, 0.5]", "[0.01, 0.06, 0.5]")
    (tmp_path / "bad.toml").write_text(bad)
    assert main(["init", str(tmp_path / "bad.toml"), "-o", str(tmp_path / "b.h5")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "0.06" in err and "0.05" in err and "rationals" in err
    few = small_deck(rat).replace(", [1e-6, 1e-6, 1e-6]]", "]")
    (tmp_path / "few.toml").write_text(few)
    assert main(["init", str(tmp_path / "few.toml"), "-o", str(tmp_path / "c.h5")]) == 2
    assert "cgresid_md_fa_gr has 4" in capsys.readouterr().err
    with pytest.raises(deckmod.DeckError, match="nf = 3"):
        deckmod.loads(small_deck(rat).replace("nf = 4", "nf = 3"))
    with pytest.raises(deckmod.DeckError, match="32-bit"):
        deckmod.loads(small_deck(rat).replace("seed = 86658", "seed = 5000000000"))
    with pytest.raises(deckmod.DeckError, match="dyn_flavors"):
        deckmod.loads(small_deck(rat).replace("[2, 1, 1]", "[2, 1]"))
    # relative paths are taken from the deck's folder; the run file keeps its own copy
    (tmp_path / "r.txt").write_text(rat.read_text())
    (tmp_path / "rel.toml").write_text(small_deck("r.txt"))
    st = init_run(str(tmp_path / "rel.toml"), str(tmp_path / "rel.h5"), log=lambda *a: None)
    assert st.files["rationals"] == rat.read_text()
    assert load(str(tmp_path / "rel.h5")).files == st.files


@pytest.mark.parametrize("kind", ["milc", "philox"])
def test_rhmc_run_resumes_exactly(tmp_path, capsys, kind):
    """A cold 4^4 RHMC run: two trajectories in one go equal one plus one resumed (MILC's generator state or the
    Philox counters in /rng); MILC's lines are printed and the history has the fermion columns."""
    rat = fixture_path("rationals.sample.su3_rhmc_hisq_f211")
    deck = tmp_path / "d.toml"
    deck.write_text(small_deck(rat, kind))
    a, b = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    for out in (a, b):
        assert main(["init", str(deck), "-o", out]) == 0
    assert main(["run", a, "--trajectories", "1", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert text.count("GRSOURCE: sum = ") == 5 and text.count("ACTION: g,h,f = ") == 2
    assert text.count(" OK converged ") == 5 + 5 + 2 * 5 + 5          # GR, FA, 2 force evaluations, FA
    assert "ACCEPT: delta S = " in text or "REJECT: delta S = " in text
    assert main(["run", a, "--no-progress"]) == 0
    assert main(["run", b, "--no-progress"]) == 0
    sa, sb = load(a), load(b)

    def physics(history):     # a resumed run builds the links of its first configuration once more
        return [{k: v for k, v in r.items() if not k.startswith("time_") and k != "fermion_link_builds"}
                for r in history]

    assert physics(sa.history) == physics(sb.history)
    assert np.array_equal(sa.links, sb.links)
    row = sa.history[-1]
    for key in ("f_start", "f_end", "cg_gr", "cg_fa", "cg_md", "time_fermion_links", "time_fermion_solver_MD",
                "time_force_fermion", "time_force_gauge"):
        assert key in row
    assert row["cg_md"] > 0 and row["solves_md"] == 10
    if kind == "milc":
        assert "milc" in sa.rng


# -- MILC's test trajectories --------------------------------------------------------------------------------------

def milc_trajectory(twin):
    """(the last history row, the printed lines) of a MILC twin deck's run (tests/hmc/conftest.py: run once per
    session in the background, from MILC's lattice with MILC's rational functions)."""
    return load(twin.path).history[-1], twin.lines


def _parse(lines):
    actions = [[float(v) for v in l.split("=", 1)[1].split()] for l in lines if l.startswith("ACTION:")]
    grs = [l.split("=", 1)[1].strip() for l in lines if l.startswith("GRSOURCE:")]
    iters = [int(l.rsplit("iters=", 1)[1]) for l in lines if "OK converged" in l]
    return actions, grs, iters


def test_milc_su3_rhmc_hisq_2(twin_su3_rhmc_hisq):
    """su3_rhmc_hisq.2: GRSOURCE sums, every CG iteration count, ACTION lines and delta S, PLAQ and P_LOOP."""
    ref = json.loads((REFS / "su3_rhmc_hisq.2.json").read_text())["trajectory"]
    meas = json.loads((REFS / "su3_rhmc_hisq.2.json").read_text())["measurements"]
    row, lines = milc_trajectory(twin_su3_rhmc_hisq)
    actions, grs, iters = _parse(lines)
    assert grs == [f"{s:.10e}" for s in ref["grsource_sum"]]
    want_iters = [c["iters"] for c in ref["heatbath_cg"] + ref["action_start_cg"]]
    want_iters += [c["iters"] for ev in ref["force_cg"] for c in ev] + [c["iters"] for c in ref["action_end_cg"]]
    assert iters == want_iters
    for got, key in zip(actions, ("action_start", "action_end")):
        want = ref[key]
        assert np.allclose(got, [want["g"], want["h"], want["f"], want["total"]], rtol=0, atol=1e-6), (got, want)
    assert abs(row["dH"] - ref["delta_S"]) < 1e-6 and row["accepted"] == 1
    assert abs(row["plaq_ss"] - meas["PLAQ"][0]) < 1e-10 and abs(row["plaq_st"] - meas["PLAQ"][1]) < 1e-10
    assert f"P_LOOP:\t{meas['P_LOOP'][0]:e}\t{meas['P_LOOP'][1]:e}" in lines


def test_milc_su3_rhmc_hisq_f211_2(twin_su3_rhmc_hisq_f211):
    """su3_rhmc_hisq.f211.2 (2+1+1, charm with Naik epsilon; MILC's sample output of May 2009): GRSOURCE sums, g and
    h exactly, the start fermion action to 5e-7 (measured 1.9e-7), PLAQ to MILC's printed digits and to 1e-8 of the
    full-precision PLAQ of MILC's own 2009-09 rerun (measured 1.2e-9); delta S within MILC's errtol 4e-4 (measured
    1.4e-4). Momenta changed in their last bits (1e-15) move delta S with a standard deviation of 2.6e-5
    (tools/milc_f211_spread.py); the rest of the offset is common to MILC's 2009 builds and not identified."""
    ref = json.loads((REFS / "su3_rhmc_hisq.f211.2.json").read_text())
    rerun = json.loads((REFS / "su3_rhmc_hisq.f211.2.test-2009-09.json").read_text())["measurements"]
    traj, meas = ref["trajectory"], ref["measurements"]
    row, lines = milc_trajectory(twin_su3_rhmc_hisq_f211)
    actions, grs, _ = _parse(lines)
    assert grs == [f"{s:.10e}" for s in traj["grsource_sum"]]
    start = traj["action_start"]
    assert np.allclose(actions[0][:2], [start["g"], start["h"]], rtol=0, atol=1e-9)
    assert abs(actions[0][2] - start["f"]) < 5e-7
    assert abs(row["dH"] - traj["delta_S"]) < 4e-4 and row["accepted"] == 1
    assert abs(row["plaq_ss"] - meas["PLAQ"][0]) < 5e-7 and abs(row["plaq_st"] - meas["PLAQ"][1]) < 5e-7
    assert abs(row["plaq_ss"] - rerun["PLAQ"][0]) < 1e-8 and abs(row["plaq_st"] - rerun["PLAQ"][1]) < 1e-8


def test_milc_streams_state_round_trip():
    geom = Geometry((4, 4, 4, 4))
    a = MilcStreams(86658, geom.dims)
    a.momenta(geom)
    b = a.copy()
    assert np.array_equal(a.momenta(geom), b.momenta(geom))
    assert np.array_equal(a.pseudofermion_sources(geom, 2)[1], b.pseudofermion_sources(geom, 2)[1])
    assert a.global_uniform() == b.global_uniform()
