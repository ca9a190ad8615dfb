"""MILC input decks (hmc.milc.deck): MILC's order of keys, the translation into the project's deck, one-line errors
naming the key and its line; every sample deck of MILC's ks_imp_rhmc test folder."""
import tomllib

import pytest

from fixture_paths import FIXTURES, ROOT
from hmc import deck as deckmod
from hmc.milc.builds import BUILDS, build_for
from hmc.milc.deck import MilcDeckError, parse, project_deck, read
from milc_folders import rationals_into

MILC_TEST = FIXTURES / "ks_imp_rhmc"
SEARCH = [str(FIXTURES)]

DECK = """prompt 0
nx 6
ny 6
nz 6
nt 6
iseed 86658
n_pseudo 2
load_rhmc_params rationals.test
beta 7.4
n_dyn_masses 2
dyn_mass .0018 .018
dyn_flavors 2 1
u0  0.890
# a comment line
warms 0
trajecs 1
traj_between_meas 1
microcanonical_time_step .02
steps_per_trajectory 10
cgresid_md_fa_gr .0005 .0001 .0001
max_multicg_md_fa_gr  2500  2500  2500
cgprec_md_fa_gr  2 2 2
cgresid_md_fa_gr .000005 1e-6 1e-6   # a comment after values
max_multicg_md_fa_gr  2500  2500  2500
cgprec_md_fa_gr  2 2 2
prec_ff 2
number_of_pbp_masses 2
max_cg_prop 500
max_cg_prop_restarts 5
npbp_reps 1
prec_pbp 1
mass 0.0018
naik_term_epsilon 0
error_for_propagator 1e-6
rel_error_for_propagator 0
mass 0.018
naik_term_epsilon 0
error_for_propagator 1e-8
rel_error_for_propagator 0
reload_serial ../lattices/lat.test
forget
"""


@pytest.fixture
def files(tmp_path):
    """A deck folder with a rational-function file beside the deck and the lattice in a separate search folder."""
    (tmp_path / "decks").mkdir()
    rationals_into(tmp_path / "decks", "rationals.test")
    (tmp_path / "lats").mkdir()
    (tmp_path / "lats" / "lat.test").write_text("x")
    return tmp_path


def translate(text, files, build="su3_rhmc_hisq", search=None):
    d = parse(text, BUILDS[build], "test.in", str(files / "decks"))
    return project_deck(d, [str(files / "lats")] if search is None else search)


def test_translation_and_file_resolution(files):
    raw = translate(DECK, files)
    assert raw["run"] == {"name": "MILC su3_rhmc_hisq: test.in", "seed": 86658, "trajectories": 1, "rng": "milc",
                          "metropolis": True, "start": str(files / "lats" / "lat.test")}
    f = raw["fermions"]
    assert f["rationals"] == str(files / "decks" / "rationals.test")       # relative to the deck
    assert f["cgresid_md_fa_gr"] == [[5e-4, 1e-4, 1e-4], [5e-6, 1e-6, 1e-6]]
    assert f["cgprec_md_fa_gr"] == [[2, 2, 2], [2, 2, 2]]
    assert f["pbp_masses"] == [0.0018, 0.018] and f["pbp_error"] == [1e-6, 1e-8] and f["pbp_maxiter"] == 3000
    assert raw["integrator"]["steps"] == 10 and raw["integrator"]["tau"] == pytest.approx(0.2, abs=1e-16)
    assert raw["gauge"]["nf"] == 3
    assert raw["milc"] == {"build": "su3_rhmc_hisq", "warms": 0, "traj_between_meas": 1, "precision": 2}
    rhmd = translate(DECK, files, "su3_rhmd_hisq")
    assert rhmd["run"]["metropolis"] is False and rhmd["integrator"]["scheme"] == "3g1f"


def test_cgprec_is_the_decks_solver_precision(files):
    """MILC's cgprec_md_fa_gr (1 single, 2 double) is the project's: su3_leapfrog.2 asks for 1 2 2 and runs its MD
    multishift solves in single precision, refined in double (tests/hmc/test_milc_cases.py)."""
    mixed = DECK.replace("cgprec_md_fa_gr  2 2 2\nprec_ff", "cgprec_md_fa_gr  1 2 2\nprec_ff")
    assert translate(mixed, files)["fermions"]["cgprec_md_fa_gr"] == [[2, 2, 2], [1, 2, 2]]
    one_line_error(DECK.replace("cgprec_md_fa_gr  2 2 2\nprec_ff", "cgprec_md_fa_gr  3 2 2\nprec_ff"), files,
                   "line 25: cgprec_md_fa_gr 3 2 2: each of MD, FA, GR must be 1")


def one_line_error(text, files, match, build="su3_rhmc_hisq", search=None):
    with pytest.raises(MilcDeckError) as e:
        translate(text, files, build, search)
    msg = str(e.value)
    assert "\n" not in msg
    assert match in msg, msg
    return msg


def test_unknown_and_misplaced_keys(files):
    msg = one_line_error(DECK.replace("beta 7.4", "betta 7.4"), files, "line 9")
    assert "unknown key 'betta'" in msg and "'beta'" in msg
    msg = one_line_error(DECK.replace("warms 0\ntrajecs 1", "trajecs 1\nwarms 0"), files, "line 15")
    assert "'trajecs' out of place" in msg and "'warms'" in msg
    one_line_error(DECK.replace("nx 6", "nx six"), files, "line 2: nx 'six' is not an integer")
    one_line_error(DECK.replace("forget\n", ""), files, "the deck ends after line 40")
    one_line_error(DECK + "warms 0\n", files, "line 42: 'warms' starts a second input set")
    # asqtad builds read no naik_term_epsilon: the HISQ deck's one is a misplaced key
    one_line_error(DECK, files, "line 33: key 'naik_term_epsilon' out of place", build="su3_leapfrog")


def test_unsupported_values(files):
    one_line_error(DECK.replace("prompt 0", "prompt 1"), files, "line 1: prompt 1: only 0")
    one_line_error(DECK.replace("forget", "save_serial out.lat"), files, "line 41: save_serial out.lat: saving")
    one_line_error(DECK.replace("rel_error_for_propagator 0\nmass 0.018", "rel_error_for_propagator 0.1\nmass 0.018"),
                   files, "line 35: rel_error_for_propagator 0.1")
    one_line_error(DECK.replace("naik_term_epsilon 0\nerror_for_propagator 1e-8",
                                "naik_term_epsilon -0.1\nerror_for_propagator 1e-8"), files, "line 37")
    one_line_error(DECK.replace("steps_per_trajectory 10", "steps_per_trajectory -1"), files, "line 19")
    one_line_error(DECK.replace("cgprec_md_fa_gr  2 2 2\nprec_ff", "cgprec_md_fa_gr  2 2 2\nprec_ff").replace(
        "max_multicg_md_fa_gr  2500  2500  2500\ncgprec_md_fa_gr  2 2 2\nprec_ff",
        "max_multicg_md_fa_gr  2500  1000  2500\ncgprec_md_fa_gr  2 2 2\nprec_ff"), files, "one multishift")
    msg = one_line_error(DECK, files, "line 40: reload_serial ../lattices/lat.test: file not found", search=[])
    assert "--search" in msg
    one_line_error(DECK.replace("load_rhmc_params rationals.test", "load_rhmc_params none.test"), files,
                   "line 8: load_rhmc_params none.test")
    one_line_error(DECK.replace("reload_serial ../lattices/lat.test", "restore ../lattices/lat.test"), files,
                   "line 40: unknown key 'restore'")


def test_rationals_file_as_milc_reads_it(files):
    """A MILC file whose approximations state errors above the default bound is taken as MILC takes it."""
    text = (ROOT / "runs" / "rationals" / "rationals.su3_rhmc_hisq").read_text()
    assert "error = " in text
    (files / "decks" / "rationals.test").write_text(text.replace("error = 7.142803e-07", "error = 7.142803e-05"))
    assert translate(DECK, files)["fermions"]["max_rational_error"] == 7.142803e-05
    (files / "decks" / "rationals.test").write_text(text)
    assert "max_rational_error" not in translate(DECK, files)["fermions"]
    (files / "decks" / "rationals.test").write_text("not a rational function file\n")
    one_line_error(DECK, files, "line 8: load_rhmc_params rationals.test")


def test_build_from_file_name():
    assert build_for(None, "x/su3_rhmc_hisq_su3.f2111.1.sample-in").name == "su3_rhmc_hisq_su3"
    assert build_for(None, "su3_rhmd_hisq.2.sample-in").name == "su3_rhmd_hisq"
    assert build_for(None, "mydeck.in").name == "su3_rhmc_hisq"
    with pytest.raises(deckmod.DeckError, match="unknown MILC build"):
        build_for("su3_rhmc_hiss")


def test_stdin_text(files, monkeypatch):
    monkeypatch.chdir(files / "decks")
    d, toml, text = read("-", search=[str(files / "lats")], text=DECK)
    assert d.source == "<stdin>" and text == DECK
    assert deckmod.loads(toml)["fermions"]["rationals"] == str(files / "decks" / "rationals.test")


def sample_decks():
    return sorted(MILC_TEST.glob("*.sample-in")) if MILC_TEST.exists() else []


@pytest.mark.skipif(not MILC_TEST.exists(), reason=f"MILC's test folder {MILC_TEST} is absent (../shared/fixtures)")
@pytest.mark.parametrize("path", sample_decks(), ids=lambda p: p.name)
def test_every_sample_deck(path):
    """Every sample deck reads in MILC's order; its translation validates where the build's physics is in the
    schema (an integrator or fermion variant still missing fails validation naming the key); su3_spectrum_hisq's
    requests land in [milc] with PBP at its sea masses."""
    build = build_for(None, path.name)
    d, toml, _ = read(str(path), search=SEARCH)
    if build.spectrum:
        ours = deckmod.loads(toml)
        assert ours["milc"]["spectrum_request"] == ["spectrum", "nl_spectrum", "spectrum_mom", "spectrum_nlpi2",
                                                    "hvy_pot"]
        assert ours["fermions"]["pbp_masses"] == d["dyn_mass"] and ours["fermions"]["npbp_reps"] == 1
        assert ours["integrator"]["steps"] == 0 and ours["run"]["metropolis"] is False
    raw = tomllib.loads(toml)
    assert raw["run"]["seed"] == d["iseed"] and raw["fermions"]["action"] == build.fermion
    assert len(raw["fermions"]["cgresid_md_fa_gr"]) == d["n_pseudo"] == len(d.pseudofermions)
    assert raw["integrator"]["scheme"] == build.scheme
    if build.unitarization_group is not None:
        assert raw["fermions"]["unitarization_group"] == build.unitarization_group
    else:
        deckmod.loads(toml)            # validates (the SU(3) build's key comes with its physics)


@pytest.mark.skipif(not MILC_TEST.exists(), reason=f"MILC's test folder {MILC_TEST} is absent (../shared/fixtures)")
def test_sample_deck_matches_hand_written_twin():
    """su3_rhmc_hisq.2's translation has the physics of runs/milc_su3_rhmc_hisq.toml, which reproduces MILC."""
    d, toml, _ = read(str(MILC_TEST / "su3_rhmc_hisq.2.sample-in"), search=SEARCH)
    ours = deckmod.loads(toml)
    twin, _ = deckmod.load(ROOT / "runs" / "milc_su3_rhmc_hisq.toml")
    for section in ("lattice", "gauge", "integrator"):
        assert ours[section] == twin[section], section
    for key in ("seed", "trajectories", "rng"):
        assert ours["run"][key] == twin["run"][key]
    for key in ("action", "dyn_mass", "dyn_flavors", "cgresid_md_fa_gr", "max_multicg", "multishift"):
        assert ours["fermions"][key] == twin["fermions"][key]
    assert ours["run"]["start"].endswith("lat.sample.l6666.hisq")


SPECTRUM_BLOCK = """prec_ff 2
error_for_propagator 1e-8
max_cg_prop 500
max_cg_prop_restarts 5
spectrum_request spectrum,hvy_pot
source_start 0
source_inc 2
n_sources 1
reload_serial ../lattices/lat.test
forget
"""


def spectrum_deck(requests="spectrum,hvy_pot", steps=0):
    head = DECK[: DECK.index("prec_ff 2")].replace("steps_per_trajectory 10", f"steps_per_trajectory {steps}")
    return head + SPECTRUM_BLOCK.replace("spectrum,hvy_pot", requests)


def test_spectrum_deck_translation(files):
    """su3_spectrum_hisq: steps_per_trajectory 0 is a trajectory without MD (no tau), RHMD; PBP at every sea mass
    with error_for_propagator and MILC's restarted-CG bound; the requests in [milc]."""
    raw = translate(spectrum_deck(), files, "su3_spectrum_hisq")
    assert raw["integrator"]["steps"] == 0 and "tau" not in raw["integrator"]
    assert raw["run"]["metropolis"] is False and raw["run"]["rng"] == "milc_old"
    f = raw["fermions"]
    assert f["pbp_masses"] == [0.0018, 0.018] and f["pbp_error"] == [1e-8, 1e-8] and f["npbp_reps"] == 1
    assert f["pbp_maxiter"] == 3000
    assert raw["milc"]["spectrum_request"] == ["spectrum", "hvy_pot"]
    ours = deckmod.validate(raw)
    assert ours["integrator"]["steps"] == 0
    assert translate(spectrum_deck(steps=4), files, "su3_spectrum_hisq")["integrator"]["tau"] == pytest.approx(0.08)


def test_spectrum_deck_errors(files):
    msg = one_line_error(spectrum_deck("spectrum,glueballs"), files, "line 30: spectrum_request spectrum,glueballs",
                         build="su3_spectrum_hisq")
    assert "unknown request glueballs" in msg and "hvy_pot" in msg
    one_line_error(spectrum_deck(","), files, "(none given)", build="su3_spectrum_hisq")
    with pytest.raises(deckmod.DeckError, match="spectrum_request"):
        deckmod.validate({**translate(spectrum_deck(), files, "su3_spectrum_hisq"),
                          "milc": {"spectrum_request": ["glueballs"]}})
