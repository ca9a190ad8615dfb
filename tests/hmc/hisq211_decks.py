"""The short HISQ 2+1+1 RHMC deck that the multi-rank tests run on 1, 2 and 4 ranks (imported as
``tests.hmc.hisq211_decks``): the production masses and rational functions of runs/hisq211_16.toml, 3G1F with two
steps of tau 0.5, tight FA/GR solves, Philox random numbers and a cold start."""
from tests.conftest import ROOT

RATIONALS = ROOT / "runs" / "rationals" / "rationals.hisq211_b580"


def short_hisq211_deck(name: str, seed: int, dims=(4, 4, 4, 4), warmups: int | None = None) -> str:
    """The deck's TOML text; ``warmups`` trajectories skip the Metropolis test (none when None)."""
    warm = f"warmups = {warmups}\n" if warmups is not None else ""
    return f"""
[run]
name = "{name}"
seed = {seed}
trajectories = 2
{warm}start = "cold"
rng = "philox"
[lattice]
dims = [{", ".join(map(str, dims))}]
[gauge]
action = "symanzik"
beta = 5.8
u0 = 0.85535
quark_loops = "hisq"
nf = 4
[fermions]
rationals = "{RATIONALS}"
dyn_mass = [0.013, 0.065, 0.838]
dyn_flavors = [2, 1, 1]
cgresid_md_fa_gr = [[1e-8, 1e-10, 1e-10], [1e-8, 1e-10, 1e-10], [1e-8, 1e-10, 1e-10], [1e-8, 1e-10, 1e-10],
                    [1e-8, 1e-10, 1e-10]]
[integrator]
scheme = "3g1f"
steps = 2
tau = 0.5
link_exponential = "taylor8"
reunitarize = "cycle"
"""
