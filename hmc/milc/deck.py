"""MILC's ks_imp_rhmc input decks, read as MILC reads them, and their translation into the project's deck.

MILC reads its input as a fixed sequence of ``key value ...`` words (``ks_imp_rhmc/setup.c``: ``initial_set`` then
``readin``; ``generic/io_helpers.c`` for the starting and ending lattice), skipping ``#`` comments. The sequence
depends on earlier values and on the build (:mod:`hmc.milc.builds`):

    prompt nx ny nz nt iseed n_pseudo load_rhmc_params beta n_dyn_masses dyn_mass[n] dyn_flavors[n] u0
    warms trajecs traj_between_meas microcanonical_time_step steps_per_trajectory
    n_pseudo x { cgresid_md_fa_gr[3] max_multicg_md_fa_gr[3] cgprec_md_fa_gr[3] }
    prec_ff
    number_of_pbp_masses [ max_cg_prop max_cg_prop_restarts npbp_reps prec_pbp
        number_of_pbp_masses x { mass [naik_term_epsilon: HISQ builds] error_for_propagator
        rel_error_for_propagator } ]
    (su3_spectrum_hisq instead: error_for_propagator max_cg_prop max_cg_prop_restarts spectrum_request
        source_start source_inc n_sources)
    fresh | continue | reload_ascii F | reload_serial F | reload_parallel F
    forget | save_... F

A word where another key is due is a one-line error naming it, its line and the key MILC reads there. The
translation (:func:`project_deck`) refuses, with the key and its line, what the project does not do: prompts,
saving a lattice, a second input set, PBP masses with a Naik epsilon or a relative residual, different iteration
limits per phase. su3_spectrum_hisq's block becomes PBP at the sea masses (one source each,
``error_for_propagator``) after MILC's Coulomb gauge fixing, with its ``spectrum_request`` in ``[milc]``
(:mod:`hmc.milc.spectrum`). ``steps_per_trajectory 0`` is a trajectory without molecular dynamics
(``[integrator] steps = 0``: the action measured twice, dH = 0). MILC's ``cgprec_md_fa_gr`` (1 single, 2 double, per
phase and pseudofermion) becomes the project's ``[fermions] cgprec_md_fa_gr``: a 1 runs that phase's multishift in
single precision, every shift refined to the double-precision tolerance (MILC's QOP/QDP builds choose the precision
by it, ``generic_ks/ks_multicg_offset_qop.c``; its plain C multishift takes none). ``prec_ff`` and ``prec_pbp``
(single-precision fermion force and PBP solves) are read and ignored: the force and the PBP solves are double.
``max_cg_prop`` x (``max_cg_prop_restarts`` + 1) bounds the PBP solves (MILC's restarted CG). The rational
functions are MILC's file as MILC reads it: approximations as coarse as the file states are allowed
(``max_rational_error``), each still checked against its own stated error.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

from .. import deck as deckmod
from ..deck import SPECTRUM_REQUESTS, DeckError
from .builds import Build, build_for


class MilcDeckError(DeckError):
    pass


KEYS = ("prompt", "nx", "ny", "nz", "nt", "iseed", "n_pseudo", "load_rhmc_params", "beta", "n_dyn_masses",
        "dyn_mass", "dyn_flavors", "u0", "warms", "trajecs", "traj_between_meas", "microcanonical_time_step",
        "steps_per_trajectory", "cgresid_md_fa_gr", "max_multicg_md_fa_gr", "cgprec_md_fa_gr", "prec_ff",
        "number_of_pbp_masses", "max_cg_prop", "max_cg_prop_restarts", "npbp_reps", "prec_pbp", "mass",
        "naik_term_epsilon", "error_for_propagator", "rel_error_for_propagator", "spectrum_request", "source_start",
        "source_inc", "n_sources")
STARTS = ("fresh", "continue", "reload_ascii", "reload_serial", "reload_parallel")
SAVES = ("forget", "save_ascii", "save_serial", "save_parallel", "save_checkpoint", "save_serial_fm",
         "save_serial_scidac", "save_parallel_scidac", "save_multifile_scidac", "save_partfile_scidac",
         "save_serial_archive", "save_serial_ildg", "save_parallel_ildg", "save_partfile_ildg", "save_multifile_ildg")


@dataclass
class Entry:
    key: str
    value: object
    line: int


@dataclass
class MilcDeck:
    """A MILC deck as read: its entries in order (repeated keys repeat), grouped per pseudofermion and PBP mass."""

    build: Build
    source: str
    base_dir: str
    entries: list = field(default_factory=list)
    pseudofermions: list = field(default_factory=list)     # [{key: Entry}] per pseudofermion
    pbp: list = field(default_factory=list)                # [{key: Entry}] per PBP mass
    start: Entry | None = None                             # key fresh/reload_serial/..., value the file or None
    save: Entry | None = None

    def entry(self, key: str) -> Entry:
        return next(e for e in self.entries if e.key == key)

    def __getitem__(self, key: str):
        return self.entry(key).value

    def error(self, e: Entry, why: str) -> MilcDeckError:
        return MilcDeckError(f"{self.source}: line {e.line}: {e.key} {_show(e.value)}: {why}")


def _show(v) -> str:
    if isinstance(v, list):
        return " ".join(map(str, v))
    return "" if v is None else str(v)


def tokens(text: str) -> list[tuple[str, int]]:
    """The words of a deck with their line numbers; a word starting with ``#`` comments out the rest of its line."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for w in line.split():
            if w.startswith("#"):
                break
            out.append((w, n))
    return out


class _Reader:
    def __init__(self, text: str, deck: MilcDeck):
        self.words, self.pos, self.deck = tokens(text), 0, deck

    def _next_word(self, wanted: str) -> tuple[str, int]:
        if self.pos >= len(self.words):
            last = self.words[-1][1] if self.words else 0
            raise MilcDeckError(f"{self.deck.source}: the deck ends after line {last}, where MILC's "
                                f"{self.deck.build.name} reads {wanted}")
        w = self.words[self.pos]
        self.pos += 1
        return w

    def key(self, key: str, kind=int, n: int | None = None) -> Entry:
        """``key`` and its value (``n`` values: a list), recorded in order."""
        word, line = self._next_word(f"'{key}'")
        if word != key:
            known = word in KEYS or word in STARTS or word in SAVES
            raise MilcDeckError(f"{self.deck.source}: line {line}: {'key' if known else 'unknown key'} {word!r} "
                                f"{'out of place' if known else ''}{': ' if known else ' '}MILC's "
                                f"{self.deck.build.name} reads {key!r} here")
        vals = [self._value(key, kind, line) for _ in range(1 if n is None else n)]
        e = Entry(key, vals[0] if n is None else vals, line)
        self.deck.entries.append(e)
        return e

    def _value(self, key, kind, line):
        word, vline = self._next_word(f"the value of {key!r} (line {line})")
        if kind is str:
            return word
        try:
            return kind(word)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise MilcDeckError(f"{self.deck.source}: line {vline}: {key} {word!r} is not {what}") from None

    def choice(self, options, what: str) -> Entry:
        word, line = self._next_word(what)
        if word not in options:
            raise MilcDeckError(f"{self.deck.source}: line {line}: unknown key {word!r}: MILC reads {what} here "
                                f"({', '.join(options)})")
        value = None if word in ("fresh", "continue", "forget") else self._value(word, str, line)
        e = Entry(word, value, line)
        self.deck.entries.append(e)
        return e

    def rest(self):
        if self.pos < len(self.words):
            word, line = self.words[self.pos]
            raise MilcDeckError(f"{self.deck.source}: line {line}: {word!r} starts a second input set: hmc milc "
                                "runs one (split the deck into one deck per set)")


def parse(text: str, build: Build, source: str = "<deck>", base_dir: str | None = None) -> MilcDeck:
    """Read a deck in MILC's order for ``build``; any misplaced or unknown word is a one-line MilcDeckError."""
    d = MilcDeck(build, source, base_dir or os.getcwd())
    r = _Reader(text, d)
    for k in ("prompt", "nx", "ny", "nz", "nt", "iseed", "n_pseudo"):
        r.key(k)
    r.key("load_rhmc_params", str)
    r.key("beta", float)
    n = r.key("n_dyn_masses").value
    r.key("dyn_mass", float, n)
    r.key("dyn_flavors", int, n)
    r.key("u0", float)
    for k, kind in (("warms", int), ("trajecs", int), ("traj_between_meas", int),
                    ("microcanonical_time_step", float), ("steps_per_trajectory", int)):
        r.key(k, kind)
    for _ in range(max(d["n_pseudo"], 0)):
        d.pseudofermions.append({k: r.key(k, kind, 3) for k, kind in (
            ("cgresid_md_fa_gr", float), ("max_multicg_md_fa_gr", int), ("cgprec_md_fa_gr", int))})
    r.key("prec_ff")
    if build.spectrum:
        r.key("error_for_propagator", float)
        r.key("max_cg_prop")
        r.key("max_cg_prop_restarts")
        r.key("spectrum_request", str)
        for k in ("source_start", "source_inc", "n_sources"):
            r.key(k)
    elif r.key("number_of_pbp_masses").value > 0:
        for k in ("max_cg_prop", "max_cg_prop_restarts", "npbp_reps", "prec_pbp"):
            r.key(k)
        for _ in range(d["number_of_pbp_masses"]):
            keys = ("mass", "naik_term_epsilon") if build.naik else ("mass",)
            keys += ("error_for_propagator", "rel_error_for_propagator")
            d.pbp.append({k: r.key(k, float) for k in keys})
    d.start = r.choice(STARTS, "the starting lattice")
    d.save = r.choice(SAVES, "what to do with the lattice at the end")
    r.rest()
    return d


def resolve(d: MilcDeck, e: Entry, search=()) -> str:
    """A file the deck names: as given (relative to the deck's folder), else by file name in the ``search``
    folders (MILC's test decks name ../../binary_samples/FILE)."""
    path = os.path.expanduser(str(e.value))
    first = path if os.path.isabs(path) else os.path.join(d.base_dir, path)
    if os.path.isfile(first):
        return os.path.abspath(first)
    for folder in search:
        cand = os.path.join(folder, os.path.basename(path))
        if os.path.isfile(cand):
            return os.path.abspath(cand)
    where = f"the --search folders {', '.join(search)}" if search else "no --search folder (give one with --search)"
    raise d.error(e, f"file not found relative to the deck ({d.base_dir}), nor by name in {where}")


def _check(d: MilcDeck, e: Entry, ok: bool, why: str):
    if not ok:
        raise d.error(e, why)


def _pbp_section(d: MilcDeck) -> dict:
    """[fermions] PBP keys from the per-mass blocks."""
    if not d.pbp:
        return {}
    for block in d.pbp:
        if "naik_term_epsilon" in block:
            _check(d, block["naik_term_epsilon"], block["naik_term_epsilon"].value == 0.0,
                   "PBP masses with a Naik epsilon are not supported (hmc measures PBP with epsilon 0)")
        _check(d, block["rel_error_for_propagator"], block["rel_error_for_propagator"].value == 0.0,
               "a relative residual is not supported: use 0 (error_for_propagator sets the residual)")
        _check(d, block["mass"], block["mass"].value > 0, "a PBP mass must be positive")
    restarts = d["max_cg_prop_restarts"]
    return {"pbp_masses": [b["mass"].value for b in d.pbp], "npbp_reps": d["npbp_reps"],
            "pbp_error": [b["error_for_propagator"].value for b in d.pbp],
            "pbp_maxiter": d["max_cg_prop"] * (max(restarts, 0) + 1)}


def parse_requests(text: str, where: str) -> list[str]:
    """su3_spectrum_hisq's requests: the names in MILC's comma-separated ``spectrum_request`` word (MILC matches
    ``,name,`` in it); an unknown one is a one-line error naming it."""
    names = [w for w in text.split(",") if w]
    bad = [w for w in names if w not in SPECTRUM_REQUESTS]
    if bad or not names:
        raise MilcDeckError(f"{where}: spectrum_request {text}: unknown request {', '.join(bad) or '(none given)'}: "
                            f"MILC's su3_spectrum_hisq knows {', '.join(SPECTRUM_REQUESTS)}")
    return names


def _spectrum_pbp(d: MilcDeck) -> dict:
    """[fermions] PBP keys of su3_spectrum_hisq: every sea mass, one source, ``error_for_propagator``."""
    e = d.entry("error_for_propagator")
    _check(d, e, e.value > 0, "must be a positive residual")
    return {"pbp_masses": list(d["dyn_mass"]), "npbp_reps": 1, "pbp_error": [e.value] * len(d["dyn_mass"]),
            "pbp_maxiter": d["max_cg_prop"] * (max(d["max_cg_prop_restarts"], 0) + 1)}


def _stated_error(d: MilcDeck, path: str) -> float:
    """The largest error MILC's rational-function file states for its approximations (0 if none). MILC takes the file
    as it is: the translation allows approximations as coarse as the file says (hmc init still checks each one
    against its own stated error, :func:`hmc.rational.check_error_bounds`)."""
    from ..rational import RationalsError
    from ..rational_file import read_rationals

    try:
        pfs = read_rationals(path)
    except RationalsError as e:
        raise d.error(d.entry("load_rhmc_params"), str(e)) from None
    return max((ap.error for pf in pfs for ap in pf.approximations if ap.error is not None), default=0.0)


def project_deck(d: MilcDeck, search=(), precision: int = 2) -> dict:
    """The project's deck (a dict of TOML sections, to be validated by :func:`hmc.deck.validate`) for a MILC deck;
    the rational functions and the starting lattice are resolved to absolute paths. ``precision``: MILC's build
    precision, whose output formats the run prints."""
    b = d.build
    _check(d, d.entry("prompt"), d["prompt"] == 0, "only 0 (no prompts) is supported")
    _check(d, d.save, d.save.key == "forget", "saving the lattice is not supported: use 'forget' (the run file "
           "keeps the configuration)")
    _check(d, d.start, d.start.key != "continue", "'continue' needs a lattice in memory: use fresh or reload_serial")
    steps, warms, trajecs = d.entry("steps_per_trajectory"), d.entry("warms"), d.entry("trajecs")
    _check(d, steps, steps.value >= 0, "must be >= 0 (0: a trajectory without molecular dynamics)")
    _check(d, warms, warms.value >= 0, "must be >= 0")
    _check(d, trajecs, trajecs.value >= 0 and warms.value + trajecs.value >= 1, "warms + trajecs must be >= 1")
    _check(d, d.entry("traj_between_meas"), d["traj_between_meas"] >= 1, "must be >= 1")
    limits = {n for pf in d.pseudofermions for n in pf["max_multicg_md_fa_gr"].value}
    if len(limits) > 1:
        raise d.error(d.pseudofermions[0]["max_multicg_md_fa_gr"], "hmc takes one multishift iteration limit for "
                      f"all phases and pseudofermions, but the deck gives {sorted(limits)}")
    for pf in d.pseudofermions:
        e = pf["cgprec_md_fa_gr"]
        _check(d, e, all(p in (1, 2) for p in e.value), "each of MD, FA, GR must be 1 (single precision, refined "
               "to the double-precision tolerance) or 2 (double)")
    start = "cold" if d.start.key == "fresh" else resolve(d, d.start, search)
    spectrum = {}
    if b.spectrum:
        e = d.entry("spectrum_request")
        spectrum["spectrum_request"] = parse_requests(e.value, f"{d.source}: line {e.line}")
    eps = d["microcanonical_time_step"]
    fermions = {"action": b.fermion, "rationals": resolve(d, d.entry("load_rhmc_params"), search),
                "dyn_mass": d["dyn_mass"], "dyn_flavors": d["dyn_flavors"],
                "cgresid_md_fa_gr": [pf["cgresid_md_fa_gr"].value for pf in d.pseudofermions],
                "cgprec_md_fa_gr": [pf["cgprec_md_fa_gr"].value for pf in d.pseudofermions],
                "max_multicg": limits.pop() if limits else 2500, **(_spectrum_pbp(d) if b.spectrum else
                                                                     _pbp_section(d))}
    stated = _stated_error(d, fermions["rationals"])
    if stated > deckmod.SCHEMA["fermions"]["max_rational_error"].default:
        fermions["max_rational_error"] = stated
    if b.fermion == "asqtad":
        fermions["u0"] = d["u0"]
    if b.unitarization_group is not None:
        fermions["unitarization_group"] = b.unitarization_group
    name = os.path.basename(d.source)
    return {
        "run": {"name": f"MILC {b.name}: {name}", "seed": d["iseed"], "trajectories": warms.value + trajecs.value,
                "rng": b.rng, "metropolis": b.metropolis, "start": start},
        "lattice": {"dims": [d["nx"], d["ny"], d["nz"], d["nt"]]},
        "gauge": {"action": "symanzik", "beta": d["beta"], "u0": d["u0"], "quark_loops": b.quark_loops,
                  "nf": sum(d["dyn_flavors"])},
        "fermions": fermions,
        "integrator": {"scheme": b.scheme, "steps": steps.value, **({"tau": steps.value * eps} if steps.value else {}),
                       "link_exponential": "taylor8", "reunitarize": "cycle"},
        "milc": {"build": b.name, "warms": warms.value, "traj_between_meas": d["traj_between_meas"],
                 "precision": precision, **spectrum},
    }


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)           # a TOML basic string: JSON's escapes are TOML's
    return "[" + ", ".join(_toml_value(x) for x in v) + "]"


def deck_toml(deck: dict, comment: str = "") -> str:
    """TOML text of a deck dict (sections of scalars and lists)."""
    out = [f"# {line}" for line in comment.splitlines()]
    for section, keys in deck.items():
        out.append(f"\n[{section}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in keys.items()]
    return "\n".join(out).lstrip("\n") + "\n"


def read_text(path: str) -> str:
    """The text of the deck at ``path`` (``-``: standard input, which an MPI launcher gives rank 0 only: rank 0
    reads it and hands it to the others)."""
    if path == "-":
        from comms import world

        w = world()
        return w.bcast(sys.stdin.read() if w.rank == 0 else None)
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise MilcDeckError(f"MILC deck {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise MilcDeckError(f"cannot read MILC deck {path}: {e}") from None


def read(path: str, build: str | None = None, search=(), text: str | None = None,
         precision: int = 2) -> tuple[MilcDeck, str, str]:
    """(MilcDeck, the project's deck as TOML text, the MILC deck's text) for the deck at ``path`` (``-``: standard
    input, relative files then resolve from the working directory), or of ``text`` said to come from there."""
    text = read_text(path) if text is None else text
    if path == "-":
        source, base = "<stdin>", os.getcwd()
    else:
        source, base = path, os.path.dirname(os.path.abspath(path))
    d = parse(text, build_for(build, None if path == "-" else path), source, base)
    toml = deck_toml(project_deck(d, search, precision), f"translated by hmc milc from the MILC deck {source} "
                                               f"(build {d.build.name})")
    return d, toml, text
