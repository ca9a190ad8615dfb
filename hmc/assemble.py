"""From a validated deck to the objects a run needs: geometry, actions, monomials, integrator schedule."""
from __future__ import annotations

import os
import tomllib

from force.gauge_action import SymanzikAction, WilsonAction
from lattice import Geometry, get_backend
from comms import ProcessGrid
from comms.config import RunConfig

from .deck import DeckError
from .integrators import MILC_SCHEMES, Level, build_schedule
from .monomials import GaugeMonomial


def run_config(deck_text: str, settings: dict | None = None) -> RunConfig:
    """The run configuration of a run of the deck ``deck_text`` (its TOML): per setting the command line's
    ``settings`` (e.g. {"backend": "cupy", "grid": None, "transport": "shm"}), else what the deck states, else the
    environment, else the default (comms.config). A key the deck leaves out lets the environment through."""
    return RunConfig.resolve(cli=settings, deck=tomllib.loads(deck_text))


def make_geometry(deck: dict, backend_name: str | None = None, config: RunConfig | None = None) -> Geometry:
    """The geometry of a validated deck on the configuration's backend and grid (``config``: :func:`run_config`).
    Without one (library callers) the validated deck's backend and grid count as stated, ``backend_name`` first."""
    if config is None:
        config = RunConfig.resolve(cli={"backend": backend_name}, deck=deck)
    return Geometry(tuple(deck["lattice"]["dims"]), get_backend(None, config),
                    ProcessGrid(lattice=tuple(deck["lattice"]["dims"]), config=config))


def make_gauge_action(g: dict):
    if g["action"] == "wilson":
        return WilsonAction(g["beta"])
    return SymanzikAction(g["beta"], g["u0"], g["nf"], g["quark_loops"])


def rationals_path(deck: dict, base_dir: str | None = None, override: str | None = None) -> str:
    """The rational-function file of ``[fermions]``: ``override`` (relative to the working directory) or the deck's
    ``rationals``, a relative path being taken from ``base_dir`` (the deck's folder)."""
    if override:
        return os.path.abspath(override)
    path = os.path.expanduser(deck["fermions"]["rationals"])
    if not os.path.isabs(path) and base_dir is not None:
        path = os.path.join(base_dir, path)
    return os.path.abspath(path)


def load_rationals(deck: dict, text: str | None = None, path: str | None = None) -> list:
    """The pseudofermions' rational functions, from ``text`` (as stored in the run file) or read from ``path``,
    checked against ``[fermions]``: the masses and flavour numbers (dyn_mass, dyn_flavors), the number of
    tolerance triples, and every approximation's error against its bound (the file's stated error, else
    max_rational_error; :func:`hmc.rational.check_error_bounds`). A mismatch is a one-line DeckError naming both
    sides."""
    from .rational import RationalsError, check_error_bounds, check_masses
    from .rational_file import parse_rationals, read_rationals

    f = deck["fermions"]
    where = path or "the run file's rational functions"
    try:
        pfs = parse_rationals(text, where) if text is not None else read_rationals(path)
        check_masses(pfs, f["dyn_mass"], f["dyn_flavors"], where=where)
        check_error_bounds(pfs, f["max_rational_error"], where=where)
    except RationalsError as e:
        raise DeckError(f"[fermions] {e}") from None
    if len(f["cgresid_md_fa_gr"]) != len(pfs):
        raise DeckError(f"[fermions] cgresid_md_fa_gr has {len(f['cgresid_md_fa_gr'])} [MD, FA, GR] triples but "
                        f"{where} has {len(pfs)} pseudofermions: give one triple per pseudofermion")
    if f["cgprec_md_fa_gr"] and len(f["cgprec_md_fa_gr"]) != len(pfs):
        raise DeckError(f"[fermions] cgprec_md_fa_gr has {len(f['cgprec_md_fa_gr'])} [MD, FA, GR] triples but "
                        f"{where} has {len(pfs)} pseudofermions: give one triple per pseudofermion, or none")
    return pfs


def make_fermion_monomial(deck: dict, pfs: list):
    from .rhmc import FermionMonomial, PseudofermionTerm

    f = deck["fermions"]
    precisions = f["cgprec_md_fa_gr"] or [[2, 2, 2]] * len(pfs)
    terms = [PseudofermionTerm(pf, float(md), float(fa), float(gr), f["max_multicg"], tuple(prec))
             for pf, (md, fa, gr), prec in zip(pfs, f["cgresid_md_fa_gr"], precisions)]
    mono = FermionMonomial(terms, f["action"], float(f["u0"]) if f["action"] == "asqtad" else None, f["time_bc"],
                           multishift=f["multishift"], unitarization_group=f["unitarization_group"],
                           stop_converged_shifts=f["stop_converged_shifts"])
    mg = deck.get("multigrid")
    if mg and mg["light_shifts"]:                 # [multigrid] light_shifts: the smallest light shifts by multigrid
        from solvers.multigrid.shifts import MultigridShifts

        from .deck import multigrid_options

        mono.use_multigrid(MultigridShifts(mg["light_shifts"], refresh_every=mg["refresh_every"],
                                           **multigrid_options(mg)))
    return mono


def make_monomials(deck: dict, files: dict | None = None, base_dir: str | None = None) -> list:
    """The gauge monomial, and the RHMC fermion monomial when the deck has ``[fermions]``: its rational functions
    come from ``files["rationals"]`` (the run file's copy) or else from the deck's path (relative to ``base_dir``)."""
    monomials = [GaugeMonomial(make_gauge_action(deck["gauge"]))]
    if deck.get("fermions") is not None:
        if files and "rationals" in files:
            pfs = load_rationals(deck, text=files["rationals"])
        else:
            pfs = load_rationals(deck, path=rationals_path(deck, base_dir))
        monomials.append(make_fermion_monomial(deck, pfs))
    return monomials


def make_schedule(deck: dict, monomials: list) -> list:
    """Gauge monomials on the innermost level; fermion monomials (when present) on the outer one; MILC's
    single-level builds (``milc_leapfrog``, ``milc_omelyan``) kick the gauge monomials first, then the fermions.
    ``reunitarize = "cycle"`` re-unitarizes after every outer cycle, as MILC."""
    integ = deck["integrator"]
    gauge = [m.name for m in monomials if m.kind == "gauge"]
    fermion = [m.name for m in monomials if m.kind != "gauge"]
    if integ["scheme"] == "3g1f":
        levels = [Level("3g1f", integ["steps"], fermion), Level("leapfrog", 1, gauge)]
    elif integ["inner_scheme"] and fermion:
        levels = [Level(integ["scheme"], integ["steps"], fermion),
                  Level(integ["inner_scheme"], integ["inner_steps"], gauge)]
    elif integ["scheme"] in MILC_SCHEMES:          # update_h_rhmc: the gauge force, then the fermion force
        levels = [Level(integ["scheme"], integ["steps"], gauge + fermion)]
    else:
        levels = [Level(integ["scheme"], integ["steps"], fermion + gauge)]
    return build_schedule(levels, integ["tau"], reunitarize=integ["reunitarize"] == "cycle")
