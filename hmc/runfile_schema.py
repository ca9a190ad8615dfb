"""What the run file says about itself (docs/runfile.md): the attributes that describe ``/gauge/links`` and every
dataset, and the dtype, units and description of every ``/history`` column.

A column's dtype is fixed here, not taken from its first value (``f_start`` is 0, an integer, in a pure-gauge run,
and still a float64 column). Columns whose names carry a monomial, a phase or a mass index are matched by pattern.
"""
from __future__ import annotations

import re

import numpy as np

#: the attributes of /gauge/links: its layout, and what a link is
LINKS_ATTRS = {
    "axis_order": "t,z,y,x,mu,row,col",
    "direction_order": "x,y,z,t",
    "dims_order": "x,y,z,t",
    "boundary_conditions": "periodic,periodic,periodic,periodic",
    "units": "1 (dimensionless SU(3) matrices)",
    "description": "the gauge configuration: links[t, z, y, x, mu] is the SU(3) matrix U_mu(x) on the link from site "
                   "x to x + mu-hat (mu = 0, 1, 2, 3 for x, y, z, t), indexed [row, col]; MILC's site-major file "
                   "order, no staggered phases or boundary signs folded in (the fermions' time boundary condition "
                   "is the deck's [fermions] time_bc)",
}

GAUGE_ATTRS_DESCRIPTION = (
    "the configuration after attribute 'trajectory' trajectories; 'plaquette' is <ReTr P>/3 over all sites and the "
    "six planes (1 on unit links), 'plaquette_ss' and 'plaquette_st' MILC's PLAQ (<ReTr P> over the three "
    "space-space and the three space-time planes, 3 on unit links); 'sha256' the digest of the links' bytes "
    "(complex128, little-endian, C order)")

DATASET_DESCRIPTIONS = {
    "params/deck_toml": ("the run deck's TOML text as given to hmc init (validated, defaults filled, in the "
                         "attribute deck_json of /params)"),
    "params/files": "a text the run needs besides the deck, copied in at hmc init (e.g. the RHMC rational functions)",
    "rng": "the generator state: seed and per-stream draw counters of the counter-based generator; /rng/milc holds "
           "MILC's per-site generators when the deck's [run] rng is milc or milc_old",
    "rng/milc": "a dataset of MILC's generator state (hmc/rngs.py)",
}

#: the action terms recorded at the start and the end of each trajectory (columns g_start ... f_end):
#: term -> (what it is, MILC's name for it), and when -> at what point
_ACTION_TERMS = {"g": ("gauge action", "MILC's ACTION g"),
                 "h": ("momentum term sum_{x,mu} [Tr(P^dag P)/2 - 4]", "MILC's ACTION h, hmom_action"),
                 "f": ("pseudofermion action", "MILC's ACTION f; 0 without fermions")}
_ACTION_TIMES = {"start": "at the start of the trajectory", "end": "at the end of the molecular dynamics"}

#: name -> (dtype, units, description) of the fixed columns, in row order
_FIXED = {
    "traj": ("i8", "1", "trajectory number, 1 for the first trajectory of the run"),
    "warmup": ("i8", "1", "1 for a warm-up trajectory (no Metropolis test, left out of statistics), else 0"),
    "accepted": ("i8", "1", "1 if the trajectory's end configuration was kept (always 1 for warm-ups), else 0"),
    "dH": ("f8", "1 (action, hbar = 1)", "H(end) - H(start): MILC's delta S"),
    "exp_mdH": ("f8", "1", "exp(-dH), whose average is 1 in equilibrium (Creutz's equality)"),
    "xrandom": ("f8", "1", "the uniform random number of the Metropolis test, accepted if exp(-dH) >= xrandom"),
    **{f"{term}_{when}": ("f8", "1 (action)", f"{what} {at} ({milc})")
       for when, at in _ACTION_TIMES.items() for term, (what, milc) in _ACTION_TERMS.items()},
    "plaq_ss": ("f8", "1", "MILC's PLAQ space-space: <ReTr P> over the xy, xz, yz planes (3 on unit links), of the "
                           "configuration kept after the trajectory"),
    "plaq_st": ("f8", "1", "MILC's PLAQ space-time: <ReTr P> over the xt, yt, zt planes (3 on unit links)"),
    "ploop_re": ("f8", "1", "MILC's P_LOOP, real part: the spatial average of Tr prod_t U_t (not divided by 3)"),
    "ploop_im": ("f8", "1", "MILC's P_LOOP, imaginary part"),
    "link_trace": ("f8", "1", "MILC's LINKTR: <ReTr U>/3 over all links (1 on unit links)"),
}

_PHASES = {"gr": "heat-bath (GR)", "fa": "action (FA)", "md": "force (MD)"}
_PBP = {"re_even": "Re <psi-bar psi> on even sites", "re_odd": "Re <psi-bar psi> on odd sites",
        "im_even": "Im <psi-bar psi> on even sites", "im_odd": "Im <psi-bar psi> on odd sites",
        "faction": "MILC's FACTION", "iters": "CG iterations of the PBP solves, all sources"}

_MG = {"mg_solves": "multigrid solves of the light heat-bath and action poles, refinements included",
       "mg_outer": "outer GCR iterations of those multigrid solves",
       "mg_fine_applies": "applications of the fine operator M by those multigrid solves",
       "mg_built": "near-null spaces made from random vectors (once per hmc run process)",
       "mg_refreshed": "near-null vector refreshes (refresh_iters iterations from the kept vectors)",
       "mg_updated": "thin updates: coarse operators rebuilt on the kept near-null vectors for new links",
       "mg_rebuilt": "per-pole hierarchies (X^-1, coarse operators) built on the same links and vectors",
       "mg_setup_fine_applies": "fine-operator vector applications of the multigrid set-up work"}


_OUTSIDE_MD = {"time_momenta": "momentum draw", "time_refresh": "pseudofermion heat baths (their GR solves and link "
                "smearing included)", "time_actions": "start and end action measurements (their FA solves included)",
               "time_reunitarize": "re-unitarization after the molecular dynamics",
               "time_monitor": "action measurements inside the molecular dynamics (the integrator's monitors)"}


_GRAPHS = {"graph_captures": ("i8", "1", "CUDA graphs the device-resident solvers captured in the trajectory "
                                        "(solvers/krylov_graph.py; 0 off the GPU)"),
           "graph_replays": ("i8", "1", "launches of the device-resident solvers' CUDA graphs in the trajectory"),
           "time_fermion_graph_capture": ("f8", "s", "host seconds of those captures (part of the solver times)")}


def history_column(name: str) -> tuple[str, str, str]:
    """(dtype, units, description) of a history column; an unknown name gets float64 and says it is undescribed."""
    if name in _FIXED:
        return _FIXED[name]
    if name == "time_total":
        return "f8", "s", "wall-clock seconds of the whole trajectory"
    if name in _OUTSIDE_MD:
        return "f8", "s", f"wall-clock seconds of the trajectory's {_OUTSIDE_MD[name]}"
    if name == "time_links":
        return "f8", "s", "wall-clock seconds of the link updates (and re-unitarizations) of the molecular dynamics"
    if m := re.fullmatch(r"time_fermion_(\w+)", name):
        return "f8", "s", f"wall-clock seconds of the fermion monomial's {m.group(1)} work, summed over phases"
    if m := re.fullmatch(r"time_force_(\w+)", name):
        return "f8", "s", f"wall-clock seconds of the force evaluations of monomial {m.group(1)!r}"
    if m := re.fullmatch(r"(cg|solves)_(gr|fa|md)", name):
        what = "multishift CG iterations (MILC's count)" if m.group(1) == "cg" else "solves"
        return "i8", "1", f"{what} of the {_PHASES[m.group(2)]} phase, all pseudofermions"
    if name == "fermion_link_builds":
        return "i8", "1", "HISQ/asqtad link smearings computed in the trajectory"
    if name == "shift_slots_md":
        return "i8", "1", "shifts x iterations of the trajectory's MD multishift solves"
    if name == "shift_updates_md":
        return "i8", "1", ("shift updates the MD multishift solves made (shift_slots_md unless converged shifts stop: "
                           "[fermions] stop_converged_shifts)")
    if name in _GRAPHS:
        return _GRAPHS[name]
    if name in _MG:
        return "i8", "1", _MG[name] + " in the trajectory ([multigrid] light_shifts, docs/multigrid.md 7)"
    if m := re.fullmatch(r"pbp(\d+)_(\w+)", name):
        if m.group(2) in _PBP:
            dtype = "i8" if m.group(2) == "iters" else "f8"
            return dtype, "1", (f"{_PBP[m.group(2)]}, valence mass number {m.group(1)} of [fermions] pbp_masses, "
                                "averaged over the sources")
    return "f8", "1", "a column not described in hmc/runfile_schema.py"


def history_columns(rows: list[dict]) -> dict[str, np.ndarray]:
    """The rows as one array per column, each of its schema dtype. The columns are every row's, in first-seen order:
    a row without a column (written by a version of hmc that did not record it, before a resume) holds
    :func:`missing_value` there."""
    names = list(dict.fromkeys(n for r in rows for n in r))
    return {n: np.array([r.get(n, missing_value(n)) for r in rows], dtype=history_column(n)[0]) for n in names}


def missing_value(name: str):
    """What a history column holds for a trajectory that did not record it: NaN for floats, -1 for counts."""
    return -1 if history_column(name)[0] == "i8" else float("nan")
