"""HISQ 2+1+1 RHMC decks for the tests (imported as ``tests.hmc.hisq211_decks``).

:func:`hisq211_deck` writes a deck from the sections of :data:`BASE` (the production masses and rational functions
of runs/hisq211_16.toml on 4^4, 3G1F, cold start) with per-test changes; the values are TOML text, so a test that
edits the text (``.replace``) sees exactly what it wrote. :data:`LIGHT` is the lighter 4^4 set (beta 6.7,
masses 0.01 / 0.05 / 0.5) of the RHMC and multigrid-RHMC tests. :func:`short_hisq211_deck` is the deck the multi-rank
tests run on 1, 2 and 4 ranks."""
from tests.conftest import ROOT

RATIONALS = ROOT / "runs" / "rationals" / "rationals.hisq211_b580"

BASE = {
    "run": {"trajectories": "2", "start": '"cold"'},
    "lattice": {"dims": "[4, 4, 4, 4]"},
    "gauge": {"action": '"symanzik"', "beta": "5.8", "u0": "0.85535", "quark_loops": '"hisq"', "nf": "4"},
    "fermions": {"rationals": f'"{RATIONALS}"', "dyn_mass": "[0.013, 0.065, 0.838]", "dyn_flavors": "[2, 1, 1]"},
    "integrator": {"scheme": '"3g1f"', "steps": "2", "tau": "0.1"},
}

LIGHT = {
    "gauge": {"beta": "6.7", "u0": "0.89"},
    "fermions": {"dyn_mass": "[0.01, 0.05, 0.5]"},
    "integrator": {"link_exponential": '"taylor8"', "reunitarize": '"cycle"'},
}


def cgresid_triples(md: str, fa: str | None = None, gr: str | None = None, n: int = 5) -> str:
    """The deck's cgresid_md_fa_gr: the same [md, fa, gr] triple for each of the ``n`` pseudofermions."""
    triple = f"[{md}, {fa or md}, {gr or fa or md}]"
    return "[" + ", ".join([triple] * n) + "]"


def hisq211_deck(*changes: dict, extra: dict | None = None) -> str:
    """The deck's TOML text: :data:`BASE` updated by each of ``changes`` in turn ({section: {key: TOML value}};
    a value None drops the key); ``extra`` {section: text} appends raw lines to a section (or a new section)."""
    sections = {name: dict(keys) for name, keys in BASE.items()}
    for change in changes:
        for name, keys in change.items():
            sections.setdefault(name, {}).update(keys)
    extra = extra or {}
    out = []
    for name in list(sections) + [n for n in extra if n not in sections]:
        out.append(f"[{name}]")
        out += [f"{k} = {v}" for k, v in sections.get(name, {}).items() if v is not None]
        if extra.get(name):
            out.append(extra[name])
    return "\n" + "\n".join(out) + "\n"


def short_hisq211_deck(name: str, seed: int, dims=(4, 4, 4, 4), warmups: int | None = None) -> str:
    """Two trajectories of two 3G1F steps of tau 0.5, tight FA/GR solves, Philox random numbers; ``warmups``
    trajectories skip the Metropolis test (none when None)."""
    return hisq211_deck({
        "run": {"name": f'"{name}"', "seed": str(seed),
                "warmups": None if warmups is None else str(warmups), "rng": '"philox"'},
        "lattice": {"dims": "[" + ", ".join(map(str, dims)) + "]"},
        "fermions": {"cgresid_md_fa_gr": cgresid_triples("1e-8", "1e-10")},
        "integrator": {"tau": "0.5", "link_exponential": '"taylor8"', "reunitarize": '"cycle"'},
    })
