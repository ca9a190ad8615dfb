"""MILC's 2+1+1 test su3_rhmc_hisq.f211.2 and its KS_MULTICG=HYBRID solver (solvers.multishift.hybrid_multishift_cg,
[fermions] multishift = "hybrid").

Two MILC outputs of the same input exist: the May 2009 sample output (runs/references/su3_rhmc_hisq.f211.2.json, the
deck runs/milc_su3_rhmc_hisq_f211.toml) and MILC's September 2009 rerun (su3_rhmc_hisq.f211.2.test-2009-09.json,
runs/milc_su3_rhmc_hisq_f211_hybrid.toml). Their start fermion actions differ by 1.1e-4; the plain multishift solver
reproduces the May one and the hybrid solver (multishift on the Naik-epsilon-0 links, refinement on the charm's own)
the September one, each to 2e-7.
"""
import json

import numpy as np
import pytest

from hmc import deck as deckmod
from hmc.assemble import make_geometry, make_monomials
from hmc.momenta import random_momenta
from hmc.rational_file import read_rationals
from hmc.rhmc import FermionMonomial, PseudofermionTerm
from hmc.rngs import draw_momenta, rng_from_state
from hmc.run import init_run, run
from hmc import runfile
from lattice import CounterRNG, GaugeField, Geometry, su3
from solvers import StaggeredDslash, multishift_cg, norm2
from solvers.multishift import hybrid_multishift_cg
from force.hisq_links import hisq_links_multi
from tests.conftest import ROOT, fixture_path

REFS = ROOT / "runs" / "references"
LATTICE = "lat.sample.hisq.f211b670.l6666"
RATIONALS = "rationals.sample.su3_rhmc_hisq_f211"
EPS_C = -0.16875


def _normal_ops(eps_list, spread=0.3, seed=5):
    geom = Geometry((4, 4, 4, 4))
    rng = CounterRNG(seed)
    u = GaugeField(geom, su3.expm_su3(spread * random_momenta(geom, rng, "smooth")) @ GaugeField.unit(geom).links)
    ops = [StaggeredDslash(geom, l.fat, l.long).even_odd(0.0).normal for l in hisq_links_multi(u, eps_list)]
    g = np.random.default_rng(seed)
    b = np.zeros(geom.shape + (3,), dtype=np.complex128)
    even = np.indices(geom.shape).sum(0) % 2 == 0
    b[even] = g.normal(size=(int(even.sum()), 3)) + 1j * g.normal(size=(int(even.sum()), 3))
    return geom, ops, b


def _true_residual(op, s, x, b):
    r = b - op(x) - s * x
    return float(np.sqrt(norm2(op.geom, r) / norm2(op.geom, b)))


def test_hybrid_on_one_operator_only_checks_the_true_residuals():
    """MILC's 2009 HYBRID: the refinement CG starts from a multishift solution that already meets the tolerance, so it
    costs one product per shift (the true-residual check) and returns it unchanged."""
    geom, (a,), b = _normal_ops([0.0])
    shifts, tol = [0.02, 0.1, 0.5, 2.0], 1e-6
    xs, st = multishift_cg(shifts, tol, 1000)(a).solve(b)
    ys, hst = hybrid_multishift_cg(shifts, tol, 1000)(a, a).solve(b)
    assert hst.converged and hst.iters == st.iters
    assert [r.milc_iters for r in hst.extra["refine"]] == [1] * len(shifts)
    for x, y in zip(xs, ys):
        assert np.array_equal(x, y)


def test_hybrid_refines_with_the_right_naik_epsilon():
    """MILC's later HYBRID: the multishift on the epsilon-0 operator, refinement on the charm's: every shift then
    meets the tolerance on the charm operator, which the epsilon-0 solutions alone do not."""
    geom, (a0, ac), b = _normal_ops([0.0, EPS_C])
    shifts, tol = [1.1, 1.8, 3.8, 9.3], 1e-8
    xs0 = multishift_cg(shifts, tol, 1000)(a0)(b)
    assert max(_true_residual(ac, s, x, b) for s, x in zip(shifts, xs0)) > 1e3 * tol
    ys, st = hybrid_multishift_cg(shifts, tol, 1000, refine_maxiter=200)(a0, ac).solve(b)
    assert st.converged and st.extra["refine_milc_iters"] > 2 * len(shifts)
    for s, y in zip(shifts, ys):
        assert _true_residual(ac, s, y, b) <= tol
    xs = multishift_cg(shifts, tol, 1000)(ac)(b)
    for x, y in zip(xs, ys):
        assert float(np.sqrt(norm2(geom, x - y) / norm2(geom, x))) < 1e3 * tol


def test_hybrid_monomial_force_is_still_the_derivative():
    """The solver changes only how the solutions are reached: with tight tolerances the hybrid monomial's force is
    the plain one's."""
    geom = Geometry((4, 4, 4, 4))
    pfs = read_rationals(fixture_path(RATIONALS))
    rng = CounterRNG(7)
    u = GaugeField(geom, su3.expm_su3(0.3 * random_momenta(geom, rng, "smooth")) @ GaugeField.unit(geom).links)
    forces = []
    for kind in ("plain", "hybrid"):
        m = FermionMonomial([PseudofermionTerm(pfs[i], 1e-12, 1e-12, 1e-12, 10000) for i in (0, 4)],
                            multishift=kind)
        m.refresh(u, CounterRNG(3))
        forces.append(m.force(u))
    assert np.allclose(forces[0], forces[1], rtol=0, atol=1e-8 * float(np.abs(forces[0]).max()))


def test_deck_multishift_option():
    text = (ROOT / "runs" / "milc_su3_rhmc_hisq_f211.toml").read_text()
    assert deckmod.loads(text)["fermions"]["multishift"] == "plain"
    assert deckmod.loads((ROOT / "runs" / "milc_su3_rhmc_hisq_f211_hybrid.toml").read_text())["fermions"][
        "multishift"] == "hybrid"
    with pytest.raises(deckmod.DeckError, match="multishift"):
        deckmod.loads(text.replace('multishift = "plain"', 'multishift = "offset"'))
    with pytest.raises(ValueError, match="multishift"):
        FermionMonomial([PseudofermionTerm(read_rationals(fixture_path(RATIONALS))[0], 1e-6, 1e-6, 1e-6)],
                        multishift="reverse")


def _start_action(tmp_path, deck_name):
    """(GRSOURCE sums, h, f) at the start of the deck's first trajectory: MILC's momenta, heat bath and action."""
    out = str(tmp_path / f"{deck_name}.h5")
    init_run(str(ROOT / "runs" / deck_name), out, str(fixture_path(LATTICE)), log=lambda *a: None,
             rationals=str(fixture_path(RATIONALS)))
    state = runfile.load(out)
    d = state.deck
    geom = make_geometry(d, None)
    (fermion,) = [m for m in make_monomials(d, state.files) if m.kind == "fermion"]
    rng = rng_from_state(d["run"]["rng"], state.rng, geom.dims)
    u = GaugeField.from_site_major(geom, geom.local_part(state.links))
    draw_momenta(geom, rng)
    grs = fermion.refresh(u, rng)["grsource"]
    return grs, fermion.action(u)


@pytest.mark.parametrize("deck_name,ref,other", [
    ("milc_su3_rhmc_hisq_f211.toml", "su3_rhmc_hisq.f211.2.json", "su3_rhmc_hisq.f211.2.test-2009-09.json"),
    ("milc_su3_rhmc_hisq_f211_hybrid.toml", "su3_rhmc_hisq.f211.2.test-2009-09.json", "su3_rhmc_hisq.f211.2.json"),
])
def test_start_fermion_action_identifies_milcs_solver(tmp_path, deck_name, ref, other):
    """The start fermion action (heat bath and action solves on MILC's lattice and random numbers) tells MILC's two
    2009 builds apart: each deck's solver gives its output's value to 2e-7 and misses the other's by 1.1e-4."""
    want = json.loads((REFS / ref).read_text())["trajectory"]
    not_want = json.loads((REFS / other).read_text())["trajectory"]
    grs, f = _start_action(tmp_path, deck_name)
    assert [f"{s:.10e}" for s in grs] == [f"{s:.10e}" for s in want["grsource_sum"]]
    assert abs(f - want["action_start"]["f"]) < 5e-7, (f, want["action_start"]["f"])
    assert abs(f - not_want["action_start"]["f"]) > 1e-4


def _trajectory(tmp_path, deck_name):
    out = str(tmp_path / "t.h5")
    init_run(str(ROOT / "runs" / deck_name), out, str(fixture_path(LATTICE)), log=lambda *a: None,
             rationals=str(fixture_path(RATIONALS)))
    lines = []
    state = run(out, show_progress=False, log=lines.append)
    return state.history[-1], lines


@pytest.mark.slow
def test_hybrid_deck_matches_milcs_september_2009_output(tmp_path):
    """The hybrid deck's trajectory (about 40 s) against MILC's 2009-09 output: the start action to 5e-7 (measured
    1.9e-7), PLAQ to 1e-8 (measured 4e-9); delta S within MILC's errtol 4e-4 (measured 1.45e-4 with MILC's rationals
    file, 1.0e-4 with the deck's: the offset the plain deck shows against the May 2009 output)."""
    ref = json.loads((REFS / "su3_rhmc_hisq.f211.2.test-2009-09.json").read_text())
    row, lines = _trajectory(tmp_path, "milc_su3_rhmc_hisq_f211_hybrid.toml")
    assert abs(row["f_start"] - ref["trajectory"]["action_start"]["f"]) < 5e-7
    assert abs(row["plaq_ss"] - ref["measurements"]["PLAQ"][0]) < 1e-8
    assert abs(row["plaq_st"] - ref["measurements"]["PLAQ"][1]) < 1e-8
    assert abs(row["dH"] - ref["trajectory"]["delta_S"]) < 4e-4


def test_force_variant_tool_is_the_production_force_when_unchanged():
    """tools/milc_f211_force_variants.py (the diagnostic behind the f211 deck's statement that the charm's Naik-epsilon
    force is not the delta S offset): its level-2 chain rule with every epsilon term kept equals
    force.hisq_force.hisq_level2_vjp bit for bit, dropping the one-link term changes it, and each variant's patches
    are undone after the run."""
    import importlib.util
    from contextlib import ExitStack

    import force.gauge_action as gauge_action
    import force.hisq_force as hisq_force
    import hmc.rhmc as rhmc

    spec = importlib.util.spec_from_file_location("milc_f211_force_variants",
                                                  ROOT / "tools" / "milc_f211_force_variants.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    geom = Geometry((4, 4, 4, 4))
    w = su3.expm_su3(0.3 * random_momenta(geom, CounterRNG(3), "smooth")) @ GaugeField.unit(geom).links
    g = np.random.default_rng(1)
    fat, long = ({eps: g.normal(size=w.shape) + 1j * g.normal(size=w.shape) for eps in (0.0, EPS_C)} for _ in "fl")
    want = hisq_force.hisq_level2_vjp(geom, w, fat, long)
    assert np.array_equal(tool.level2_variant()(geom, w, fat, long), want)
    assert not np.allclose(tool.level2_variant(onelink=0.0)(geom, w, fat, long), want)
    saved = [(hisq_force, n, getattr(hisq_force, n)) for n in ("hisq_level2_vjp", "u3_unitarize_vjp", "fat_link_vjp")]
    saved += [(rhmc.FermionMonomial, n, getattr(rhmc.FermionMonomial, n)) for n in ("outer_products", "force")]
    saved += [(gauge_action.GaugeAction, "force_reference", gauge_action.GaugeAction.force_reference)]
    for spec_ in ("base", "onelink=0+naik=0.5", "level=V", "level=U", "yeps0", "gauge=1e-6+rect=1e-5",
                  "fermion=1e-4+lastfermion=0.01"):
        with ExitStack() as stack:
            tool.apply_variant(stack, spec_)
        assert all(getattr(obj, name) is old for obj, name, old in saved), spec_
    with pytest.raises(SystemExit, match="unknown variant"):
        tool.apply_variant(ExitStack(), "eps=2")
