"""Run decks (TOML): the schema, defaults and validation.

Every key is declared here with its type and check, so that an unknown key or a bad value is a one-line error
naming the key and the fix, before anything is written.
"""
from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from importlib import resources


class DeckError(ValueError):
    """A deck that cannot be used; ``key`` = (section, name) of the offending key where there is one, so that
    :func:`loads` can add its line."""

    def __init__(self, message: str, key: tuple[str, str] | None = None):
        super().__init__(message)
        self.key = key


def _positive(x):
    return math.isfinite(x) and x > 0


def _nonneg(x):
    return math.isfinite(x) and x >= 0


def _number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _dims(x):
    return isinstance(x, list) and len(x) == 4 and all(isinstance(n, int) and n >= 2 and n % 2 == 0 for n in x)


@dataclass(frozen=True)
class Key:
    type: type | tuple
    default: object
    check: object = None
    help: str = ""
    choices: tuple = ()


# the spectrum requests of MILC's su3_spectrum_hisq (ks_imp_rhmc/control.c); hmc.milc.spectrum says what is done
SPECTRUM_REQUESTS = ("spectrum", "spectrum_point", "nl_spectrum", "spectrum_mom", "spectrum_nlpi2", "spectrum_nd",
                     "spectrum_singlets", "spectrum_hybrids", "hvy_pot")

SCHEMA = {
    "run": {
        "name": Key(str, "hmc run"),
        "seed": Key(int, 1, lambda s: 0 <= s < 2**63, "an integer in [0, 2^63)"),
        "trajectories": Key(int, 10, _positive, "a positive number of trajectories"),
        "start": Key(str, "cold", None, "cold, hot, or the path of a lattice file"),
        "rng": Key(str, "philox", None, "", ("philox", "milc", "milc_old")),
        "backend": Key(str, "numpy", None, "", ("numpy", "cupy", "auto")),
        "checkpoint_every": Key(int, 1, _positive, "a positive number of trajectories"),
        "save_every": Key(int, 0, _nonneg, "0 (the run file keeps only the latest configuration) or N > 0: also keep "
                          "every N-th trajectory's configuration as RUN.traj<N>.ildg beside the run file"),
        "metropolis": Key(bool, True, None, "true for RHMC (the Metropolis test after each trajectory), false for "
                          "RHMD (every trajectory kept, MILC's builds without -DHMC; MILC prints CHECK: delta S)"),
        "warmups": Key(int, 0, _nonneg, "a number >= 0 of leading trajectories run without the Metropolis test "
                       "(thermalization, as MILC's rhmd; marked in the history and left out of statistics)"),
    },
    "lattice": {
        "dims": Key(list, None, _dims, "four even integers >= 2: nx ny nz nt"),
        "grid": Key(list, [1, 1, 1, 1], lambda g: len(g) == 4 and all(isinstance(p, int) and p >= 1 for p in g),
                    "four positive integers: px py pz pt"),
    },
    "gauge": {
        "action": Key(str, "wilson", None, "", ("wilson", "symanzik")),
        "beta": Key((int, float), None, _positive, "a positive finite number"),
        "u0": Key((int, float), 1.0, _positive, "a positive finite tadpole factor (1 for none)"),
        "quark_loops": Key(str, "none", None, "", ("none", "asqtad", "asqtad_nf", "hisq")),
        "nf": Key(int, 0, _nonneg, "the number of dynamical flavours, >= 0"),
    },
    "integrator": {
        "scheme": Key(str, "omelyan", None, "", ("leapfrog", "omelyan", "3g1f", "milc_leapfrog", "milc_omelyan")),
        "steps": Key(int, 10, _nonneg, "an integer >= 0 (even for omelyan, milc_omelyan and 3g1f; 0: trajectories "
                     "without molecular dynamics, MILC's steps_per_trajectory 0, tau unused)"),
        "tau": Key((int, float), 1.0, _positive, "a positive finite trajectory length"),
        "inner_scheme": Key(str, "", None, "", ("", "leapfrog", "omelyan")),
        "inner_steps": Key(int, 1, _positive, "a positive integer"),
        "link_exponential": Key(str, "exact", None, "", ("exact", "taylor8")),
        "reunitarize": Key((bool, str), True, lambda v: v in (True, False, "cycle"),
                           "true (after each trajectory), false, or \"cycle\" (after every cycle of the outer "
                           "integrator level, as MILC's update_rhmc.c)"),
        "reversibility_check": Key(bool, False),
    },
    # optional: present for dynamical fermions (RHMC, hmc/rhmc.py), MILC's ks_imp_rhmc input parameters
    "fermions": {
        "action": Key(str, "hisq", None, "", ("hisq", "asqtad")),
        "u0": Key((int, float), 1.0, _positive, "a positive tadpole factor (asqtad only)"),
        "rationals": Key(str, None, lambda s: bool(s.strip()),
                         "the path of a MILC rational-function file (relative paths: from the deck's folder)"),
        "dyn_mass": Key(list, None, lambda v: bool(v) and all(_number(m) and m > 0 for m in v),
                        "a list of positive quark masses, e.g. [0.0018, 0.018]"),
        "dyn_flavors": Key(list, None, lambda v: bool(v) and all(isinstance(n, int) and not isinstance(n, bool)
                                                                  and n > 0 for n in v),
                           "a list of positive flavour numbers, one per mass, e.g. [2, 1]"),
        "cgresid_md_fa_gr": Key(list, None, lambda v: bool(v) and all(
            isinstance(t, list) and len(t) == 3 and all(_number(r) and r > 0 for r in t) for t in v),
            "a list of [MD, FA, GR] solver tolerances, one triple per pseudofermion in file order, e.g. "
            "[[5e-4, 1e-4, 1e-4], [5e-6, 1e-6, 1e-6]]"),
        # MILC's cgprec_md_fa_gr: 1 = the multishift in single precision, refined to the double-precision tolerance
        # (solvers.multishift.mixed_multishift_cg), 2 = double precision; one triple per pseudofermion, or none
        "cgprec_md_fa_gr": Key(list, [], lambda v: all(
            isinstance(t, list) and len(t) == 3 and all(p in (1, 2) and not isinstance(p, bool) for p in t)
            for t in v),
            "a list of [MD, FA, GR] solver precisions (1 single, 2 double), one triple per pseudofermion in file "
            "order, e.g. [[1, 2, 2], [1, 2, 2]]; [] for double everywhere"),
        # what a precision 1 above stores its links in (comms.config's dslash_half_links, which this states for the
        # run; solvers.half_links): "off" single, "naik" the Naik links in 16 bits, "all" every link in 16 bits
        "half_links": Key(str, "naik", None, "", ("off", "naik", "all")),
        "max_multicg": Key(int, 2500, _positive, "a positive maximum number of multishift iterations"),
        "max_rational_error": Key((int, float), 1e-5, lambda v: 0 < v < 1,
                                  "a relative error in (0, 1): the bound on max |r(x)/f(x) - 1| of every approximation "
                                  "whose file states no error of its own (checked at hmc init)"),
        "time_bc": Key(str, "antiperiodic", None, "", ("antiperiodic", "periodic")),
        # MILC's KS_MULTICG: "plain" (ks_multicg_offset) or "hybrid" (multishift on the first Naik group's links,
        # then a single-mass CG refinement of every shift; hmc/rhmc.py, solvers.multishift.hybrid_multishift_cg)
        "multishift": Key(str, "plain", None, "", ("plain", "hybrid")),
        # QUDA's rule: a shift of a multishift solve stops once its residual is 0.1 x the tolerance (MILC 7 updates
        # every shift until the base one converges: false, its decks' default; solvers.multishift.multishift_cg)
        "stop_converged_shifts": Key(bool, False),
        # HISQ: the group of the projection between the smearing levels, MILC's hisq_u3_action.h ("u3") or
        # hisq_su3_action.h ("su3", the su3_rhmc_hisq_su3 build: W = Y det(Y)^(-1/3), force.hisq_links)
        "unitarization_group": Key(str, "u3", None, "", ("u3", "su3")),
        "pbp_masses": Key(list, [], lambda v: all(_number(m) and m > 0 for m in v),
                          "a list of positive valence masses for the PBP measurement after each trajectory, e.g. "
                          "[0.0018, 0.018] ([] for none)"),
        "npbp_reps": Key(int, 1, _positive, "a positive number of PBP sources per mass"),
        "pbp_error": Key((int, float, list), 1e-6, lambda v: all(_number(r) and 0 < r < 1 for r in
                                                                  (v if isinstance(v, list) else [v])),
                         "the PBP solves' residual (MILC's error_for_propagator) in (0, 1), or a list of them, one "
                         "per mass"),
        "pbp_maxiter": Key(int, 10000, _positive, "a positive iteration limit of each PBP solve"),
    },
    # optional: MILC's ks_imp_rhmc run (hmc milc, hmc.milc): hmc run prints MILC's output lines and measurements
    "milc": {
        "build": Key(str, "su3_rhmc_hisq", None, "the MILC executable the deck was written for (hmc.milc.builds)"),
        "warms": Key(int, 0, _nonneg, "a number >= 0 of leading trajectories before MILC's WARMUPS COMPLETED "
                     "(not measured)"),
        "traj_between_meas": Key(int, 1, _positive, "a positive number: measure (G_LOOP, PBP) every so many "
                                 "trajectories after the warms"),
        # MILC's PRECISION 1 build prints PLAQ with %f and the G_LOOP averages with %e; the arithmetic here stays double
        "precision": Key(int, 2, None, "", (1, 2)),
        # su3_spectrum_hisq (hmc.milc.spectrum): Coulomb gauge fixing before the PBP measurements
        "spectrum_request": Key(list, [], lambda v: all(r in SPECTRUM_REQUESTS for r in v),
                                "a list of MILC's spectrum requests: "
                                + ", ".join(f'"{r}"' for r in SPECTRUM_REQUESTS)),
    },
    # optional: Kahler-Dirac multigrid (solvers.multigrid) for the light pseudofermion's smallest shifts
    "multigrid": {
        "levels": Key(int, 3, lambda n: n >= 3, "at least 3 (fine, Kahler-Dirac, one aggregation)"),
        "blocks": Key(list, [], lambda v: all(isinstance(b, list) and len(b) == 4 and all(
            isinstance(n, int) and not isinstance(n, bool) for n in b) for b in v),
            "a list of [bx, by, bz, bt] aggregation blocks, one per aggregation level (levels - 2), e.g. "
            "[[4, 4, 4, 4]]; [] for the defaults"),
        "nv": Key((int, list), 48, lambda v: all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                                 for n in (v if isinstance(v, list) else [v])),
                  "a positive number of near-null vectors, or one per aggregation level"),
        "setup_iters": Key((int, list), 50, lambda v: all(isinstance(n, int) and n >= 0
                                                           for n in (v if isinstance(v, list) else [v])),
                           "a number >= 0 of set-up iterations, or one per aggregation level"),
        "refresh_iters": Key(int, 10, _nonneg, "a number >= 0 of iterations refreshing the near-null vectors after "
                             "a gauge update"),
        "refresh_every": Key(int, 1, _nonneg, "a number >= 0 of trajectories between refreshes of the light "
                             "solves' near-null vectors (1: every trajectory; 0: never, only the coarse operators "
                             "are rebuilt for new links)"),
        "smoother_steps": Key(list, [0, 4], lambda v: bool(v) and all(isinstance(n, int) and n >= 0 for n in v),
                              "a list of GCR smoother steps per level, e.g. [0, 4]"),
        "coarsest": Key(str, "auto", None, "", ("auto", "lu", "gcr")),
        "precision": Key(str, "double", None, "", ("double", "single", "half")),
        "pbp": Key(bool, False, None, "true to solve the PBP measurements ([fermions] pbp_masses) by multigrid"),
        "light_shifts": Key(int, 0, _nonneg, "a number >= 0 of the smallest shifts of the light pseudofermion's "
                            "heat-bath and action solves to solve by multigrid (0: all multishift CG)"),
    },
}
OPTIONAL_SECTIONS = ("fermions", "multigrid", "milc")


def _validate_value(section, name, key: Key, value):
    where, at = f"[{section}] {name}", (section, name)
    types = key.type if isinstance(key.type, tuple) else (key.type,)
    if isinstance(value, bool) and bool not in types:
        raise DeckError(f"{where} = {value!r} has the wrong type: expected {' or '.join(t.__name__ for t in types)}",
                        at)
    if not isinstance(value, types):
        raise DeckError(f"{where} = {value!r} has the wrong type: expected {' or '.join(t.__name__ for t in types)}",
                        at)
    if key.choices and value not in key.choices:
        raise DeckError(f"{where} = {value!r} is not allowed: use one of {', '.join(map(repr, key.choices))}", at)
    if key.check is not None and not key.check(value):
        raise DeckError(f"{where} = {value!r} is invalid: it must be {key.help}", at)
    return float(value) if float in types and isinstance(value, int) else value


def validate(raw: dict) -> dict:
    """Fill defaults and check every key; raise DeckError with one line naming the problem."""
    out = {}
    for section in raw:
        if section not in SCHEMA:
            raise DeckError(f"unknown section [{section}] in the deck: known sections are "
                            f"{', '.join('[' + s + ']' for s in SCHEMA)}")
        if not isinstance(raw[section], dict):
            raise DeckError(f"[{section}] must be a table of keys")
    for section, keys in SCHEMA.items():
        if section in OPTIONAL_SECTIONS and section not in raw:
            continue
        given = raw.get(section, {})
        for name in given:
            if name not in keys:
                raise DeckError(f"unknown key {name!r} in [{section}]: known keys are {', '.join(keys)}",
                                (section, name))
        out[section] = {}
        for name, key in keys.items():
            if name in given:
                out[section][name] = _validate_value(section, name, key, given[name])
            elif key.default is None:
                raise DeckError(f"[{section}] {name} is missing: it must be {key.help}")
            else:
                out[section][name] = key.default
    _cross_checks(out)
    return out


def _cross_checks(d):
    integ = d["integrator"]
    if integ["scheme"] in ("omelyan", "3g1f", "milc_omelyan") and integ["steps"] % 2:
        raise DeckError(f"[integrator] steps = {integ['steps']}: {integ['scheme']} integrates two steps per cycle, "
                        "so steps must be even", ("integrator", "steps"))
    dims, grid = d["lattice"]["dims"], d["lattice"]["grid"]
    for mu, (n, p) in enumerate(zip(dims, grid)):
        if n % p or (n // p) % 2:
            raise DeckError(f"[lattice] dims {dims} cannot be split over grid {grid}: extent {n} in direction "
                            f"{'xyzt'[mu]} must divide into {p} even pieces; change dims or grid", ("lattice", "dims"))
    g = d["gauge"]
    if g["action"] == "wilson" and (g["quark_loops"] != "none" or g["u0"] != 1.0):
        raise DeckError("[gauge] u0 and quark_loops apply to the symanzik action only: remove them or set "
                        "action = \"symanzik\"")
    if d["run"]["rng"] != "philox" and not d["run"]["seed"] < 2**32:
        raise DeckError(f"[run] seed = {d['run']['seed']}: MILC's generator (rng = \"{d['run']['rng']}\") takes a "
                        "32-bit seed (iseed), below 2^32", ("run", "seed"))
    f = d.get("fermions")
    if f is not None:
        if len(f["dyn_flavors"]) != len(f["dyn_mass"]):
            raise DeckError(f"[fermions] dyn_mass has {len(f['dyn_mass'])} masses but dyn_flavors "
                            f"{len(f['dyn_flavors'])} numbers: give one flavour number per mass")
        nf = sum(f["dyn_flavors"])
        if g["quark_loops"] != "none" and g["nf"] != nf:
            raise DeckError(f"[gauge] nf = {g['nf']} but [fermions] dyn_flavors add up to {nf}: the quark-loop terms "
                            "of the gauge action take the total number of dynamical flavours (MILC's "
                            "total_dyn_flavors)")
        if f["action"] != "hisq" and f["unitarization_group"] != "u3":
            raise DeckError("[fermions] unitarization_group applies to the HISQ action only (asqtad links are not "
                            "unitarized): remove it or set action = \"hisq\"")
        if isinstance(f["pbp_error"], list) and len(f["pbp_error"]) != len(f["pbp_masses"]):
            raise DeckError(f"[fermions] pbp_error has {len(f['pbp_error'])} residuals but pbp_masses "
                            f"{len(f['pbp_masses'])} masses: give one residual, or one per mass")
        if f["action"] == "hisq" and f["u0"] != 1.0:
            raise DeckError("[fermions] u0 applies to the asqtad action only (HISQ has no tadpole factor): remove it "
                            "or set action = \"asqtad\"")
    if "multigrid" in d:
        _check_multigrid(d)


def multigrid_options(mg: dict) -> dict:
    """The :func:`solvers.multigrid.multigrid` keyword arguments of a validated [multigrid] section."""
    return {"levels": mg["levels"], "blocks": [tuple(b) for b in mg["blocks"]], "nv": mg["nv"],
            "setup_iters": mg["setup_iters"], "refresh_iters": mg["refresh_iters"],
            "smoother_steps": tuple(mg["smoother_steps"]), "coarsest": mg["coarsest"],
            "precision": mg["precision"]}


def _check_multigrid(d):
    """[multigrid] blocks against the local volume (dims / grid): whole hypercubes, tiling, at least 3 wide (both
    staggered actions here have the Naik term)."""
    from solvers.multigrid.lattice import MultigridError, check_blocks

    mg = d["multigrid"]
    nagg = mg["levels"] - 2
    blocks = mg["blocks"] or [[4, 4, 4, 4]] + [[2, 2, 2, 2]] * (nagg - 1)
    if len(blocks) != nagg:
        raise DeckError(f"[multigrid] blocks: {len(blocks)} given for levels = {mg['levels']}, which need {nagg} "
                        "(one per aggregation level)")
    local = tuple(n // p for n, p in zip(d["lattice"]["dims"], d["lattice"]["grid"]))
    try:
        for i, b in enumerate(blocks):
            check_blocks(local, b, naik=True, first=(i == 0), level=i + 2)
            local = tuple(n // k for n, k in zip(local, b))
    except MultigridError as e:
        raise DeckError(f"[multigrid] blocks: {e}") from None
    if mg["light_shifts"] and "fermions" not in d:
        raise DeckError("[multigrid] light_shifts needs dynamical fermions: add a [fermions] section or remove it")


def key_line(text: str, section: str, name: str) -> int | None:
    """The line (from 1) of ``name = ...`` in table ``[section]`` of a TOML text (or of ``section.name = ...``
    before any table), or None."""
    current = ""
    key = re.compile(r"\s*(?:\"([^\"]*)\"|'([^']*)'|([A-Za-z0-9_.-]+))\s*=")
    for n, line in enumerate(text.splitlines(), 1):
        head = re.match(r"\s*\[\s*([A-Za-z0-9_-]+)\s*\]", line)
        if head:
            current = head.group(1)
            continue
        m = key.match(line)
        if m:
            k = next(g for g in m.groups() if g is not None)
            if (current, k) == (section, name) or (current == "" and k == f"{section}.{name}"):
                return n
    return None


def loads(text: str) -> dict:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise DeckError(f"the deck is not valid TOML: {e}") from None
    try:
        return validate(raw)
    except DeckError as e:
        line = key_line(text, *e.key) if e.key else None
        if line is None:
            raise
        raise DeckError(f"line {line}: {e}", e.key) from None


def load(path) -> tuple[dict, str]:
    """(validated deck, its TOML text) from a file."""
    try:
        text = open(path, encoding="utf-8").read()
    except FileNotFoundError:
        raise DeckError(f"deck {path} does not exist: give the path of a TOML deck (see runs/)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DeckError(f"cannot read deck {path}: {e}") from None
    try:
        return loads(text), text
    except DeckError as e:
        raise DeckError(f"{path}: {e}", e.key) from None


def default_deck_text() -> str:
    """The embedded quick deck (a 4^4 Wilson run), used when ``hmc init`` gets no deck."""
    return resources.files("hmc").joinpath("decks/quick4.toml").read_text(encoding="utf-8")
