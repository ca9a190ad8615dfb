"""``hmc measure``: what MILC prints about a stored configuration, and its gauge action."""
from __future__ import annotations

from lattice import link_trace, plaquette, polyakov_loop
from .assemble import make_gauge_action
from .lattice_source import read_lattice
from .progress import command_progress


def measure(path: str, args) -> dict:
    """CHECK PLAQ and LINKTR as stored (MILC prints them before re-unitarizing), then the Polyakov loop,
    plaquette and, with --beta, the gauge action S_g on the re-unitarized links (docs/conventions.md 1.1, 2). ``path``: a
    gauge file or a run file (``RUN.h5``, ``RUN.h5:N``)."""
    with command_progress(3 + (args.beta is not None), "hmc measure", not getattr(args, "no_progress", False)) as bar:
        bar.update(0, f"reading {path}")
        u, info = read_lattice(path, backend=args.backend, ignore_checksum=args.ignore_checksum,
                               config=getattr(args, "run_config", None), check_links=True,
                               force_reunitarize=getattr(args, "force_reunitarize", False))
        bar.step("plaquette and link trace as stored")
        out = _loops(path, u, info, bar)
        if args.beta is not None:
            bar.step("gauge action")
            g = {"action": args.gauge_action, "beta": args.beta, "u0": args.u0, "nf": args.nf,
                 "quark_loops": args.quark_loops}
            act = make_gauge_action(g)
            out["gauge_action"] = {**g, "S_g": act.action(u), "coefficients": act.describe()}
        bar.update(bar.total, "done")
    return out


# which links each number of the result is of: a file's own plaquette (NERSC's PLAQUETTE, usqcdInfo's plaq,
# openQCD's header) is of the stored links, so it compares with check_plaquette, not with plaquette
LINKS_MEASURED = {
    "check_plaq_ss, check_plaq_st, check_plaquette, link_trace":
        "the links as stored (MILC's CHECK PLAQ and LINKTR; a file's own PLAQUETTE or plaq record is of these)",
    "plaq_ss, plaq_st, plaquette, polyakov_re, polyakov_im, gauge_action":
        "the links after re-unitarization onto SU(3) (docs/conventions.md 1.1), as every command uses them",
}


def _loops(path, u, info, bar) -> dict:
    """CHECK PLAQ and LINKTR of the links as read, then (re-unitarized) the plaquette and the Polyakov loop."""
    ss, st = plaquette(u)
    out = {"file": path, "format": info.get("format"), "dims": list(u.geom.dims),
           "checksums": info.get("checksums"), "links": LINKS_MEASURED,
           "check_plaq_ss": ss, "check_plaq_st": st, "check_plaquette": (ss + st) / 6.0, "link_trace": link_trace(u)}
    bar.step("re-unitarized plaquette and Polyakov loop")
    u.reunitarize()
    ss, st = plaquette(u)
    pl = polyakov_loop(u)
    out.update({"plaq_ss": ss, "plaq_st": st, "plaquette": (ss + st) / 6.0,
                "polyakov_re": pl.real, "polyakov_im": pl.imag})
    return out


# ------------------------------------------------------------------------------------------------ PBP
def pbp_source(geom, rng):
    """One PBP source: 3 complex Gaussians per site on all sites, density exp(-|g|^2) per component. With MILC's
    generators (``[run] rng = "milc"``) MILC's draws after the trajectory (``grsource_plain``, every site in MILC's
    order, docs/conventions.md 3.3); with Philox the stream "pbp" (one draw counter per source)."""
    import math

    import numpy as np

    if hasattr(rng, "milc"):
        g = rng.milc.grsource(1, np.arange(geom.volume))[0]                  # (volume, 3), MILC's site order
        return rng._global_to_local(geom, g)
    w = rng.gaussian("pbp", geom.site_ids(), 6).reshape(geom.shape + (3, 2))
    return geom.xp.ascontiguousarray((w[..., 0] + 1j * w[..., 1]) / math.sqrt(2.0))


def invert_uml(D, mass: float, g, tol: float, maxiter: int = 10000):
    """M^-1 g as MILC's ``mat_invert_uml``: the even solve (4m^2 - D_eo D_oe) x_e = (M^dag g)_e by CG, the odd
    sites reconstructed, x_o = (g_o - D_oe x_e)/(2m), then polished by the odd solve from that guess. Returns
    (x, [even stats, odd stats])."""
    from solvers import cg, project

    eo0, eo1 = D.even_odd(mass, 0), D.even_odd(mass, 1)
    xe, s0 = cg(tol, maxiter, raise_on_fail=False)(eo0.normal).solve(eo0.prepare(g))
    x = eo0.reconstruct(xe, g)
    xo, s1 = cg(tol, maxiter, raise_on_fail=False)(eo1.normal).solve(eo1.prepare(g), project(x, D.geom, 1))
    return project(xe, D.geom, 0) + project(xo, D.geom, 1), [s0, s1]


def pbp(D, mass: float, g, tol: float = 1e-6, inverse=None, maxiter: int = 10000) -> dict:
    """The stochastic chiral condensate of MILC's ``f_meas_imp``: pbp_p = (2/V) sum_{x of parity p} g^dag M^-1 g
    (M = 2m + D), and FACTION = (1/V) sum_even Re (M^dag g)^dag (M^-1 g). ``inverse``: a multigrid inverse of
    M(mass) (``solvers.multigrid``, x = M^-1 g on the full lattice to ``tol``), else MILC's two CG solves
    (:func:`invert_uml`). Returns re_even, re_odd, im_even, im_odd, faction, iters (per solve), solver."""
    geom = D.geom
    if inverse is None:
        x, stats = invert_uml(D, mass, g, tol, maxiter)
        iters, solver, ok = [s.milc_iters for s in stats], "cg", all(s.converged for s in stats)
    else:
        x, st = inverse.solve(g)
        iters, solver, ok, stats = [st.iters], "mg", bool(st.converged), [st]
    par = geom.parity()
    V = geom.volume
    dots = (g.conj() * x).sum(axis=-1)
    pe = complex(geom.sum(dots * (par == 0))) * (2.0 / V)
    po = complex(geom.sum(dots * (par == 1))) * (2.0 / V)
    mdg = D.matrix(mass).adjoint()(g)
    fa = float(geom.sum(((mdg.conj() * x).sum(axis=-1) * (par == 0)).real)) / V
    return {"mass": float(mass), "re_even": pe.real, "re_odd": po.real, "im_even": pe.imag, "im_odd": po.imag,
            "faction": fa, "iters": iters, "solver": solver, "converged": ok,
            "solver_lines": [s.milc_line() for s in stats]}


def pbp_lines(results: list, reps: int = 1) -> list[str]:
    """MILC's lines (``results`` in the order measured, ``reps`` sources per mass): per source its solves' lines,
    ``PBP:`` and ``FACTION:``."""
    out = []
    for i, r in enumerate(results):
        out += r.get("solver_lines", [])
        out.append(f"PBP: mass {r['mass']:e}     {r['re_even']:e}  {r['re_odd']:e}  {r['im_even']:e}  "
                   f"{r['im_odd']:e} ( {i % reps + 1} of {reps} )")
        out.append(f"FACTION: mass = {r['mass']:e},  {r['faction']:e} ( {i % reps + 1} of {reps} )")
    return out


class PBPMeasurement:
    """The PBP measurements of ``hmc run`` after each trajectory (deck ``[fermions] pbp_masses``, ``npbp_reps``,
    ``pbp_error``; ``[multigrid] pbp = true`` solves them by multigrid, keeping the near-null vectors across
    masses and trajectories and refreshing them after each gauge update). Light quarks: HISQ links with Naik
    epsilon 0, the fermions' time boundary condition. With ``[milc] spectrum_request`` (su3_spectrum_hisq) the
    links are first fixed to Coulomb gauge as MILC's spectrum build does (:mod:`hmc.milc.spectrum`), and the
    measurement prints its GFIX line, MILC's hvy_pot after each mass and a note for the correlators it does not
    compute."""

    def __init__(self, deck: dict):
        f = deck["fermions"]
        self.masses = [float(m) for m in f["pbp_masses"]]
        self.reps = int(f["npbp_reps"])
        tol = f["pbp_error"]
        self.tols = [float(t) for t in tol] if isinstance(tol, list) else [float(tol)] * len(self.masses)
        self.maxiter = int(f.get("pbp_maxiter", 10000))
        self.action, self.u0, self.time_bc = f["action"], float(f["u0"]), f["time_bc"]
        self.group = f["unitarization_group"]
        self.spectrum = tuple(deck.get("milc", {}).get("spectrum_request", ()))
        mg = deck.get("multigrid")
        self.mg = None
        if mg and mg.get("pbp"):
            from .deck import multigrid_options

            self.mg = multigrid_options(mg)
        self._inverses = {}
        self._subspace = None

    def _dslash(self, u):
        from force.hisq_links import asqtad_links, hisq_links
        from solvers import StaggeredDslash

        links = hisq_links(u, eps=0.0, time_bc=self.time_bc, group=self.group) if self.action == "hisq" else \
            asqtad_links(u, self.u0, self.time_bc)
        return StaggeredDslash(u.geom, links.fat, links.long)

    def _inverse(self, D, mass):
        """The multigrid inverse of M(mass) on D, on the kept near-null vectors (refreshed for new links)."""
        from solvers.multigrid import multigrid

        key = (id(D), mass)
        if key not in self._inverses:
            inv = multigrid(self.tols[self.masses.index(mass)], 500, subspace=self._subspace,
                            **self.mg)(D.matrix(mass))
            self._subspace = inv.subspace
            self._inverses = {k: v for k, v in self._inverses.items() if k[0] == id(D)}
            self._inverses[key] = inv
        return self._inverses[key]

    def empty_row(self) -> dict:
        """The history columns of :meth:`measure` for a trajectory not measured: NaN (iterations 0)."""
        row = {}
        for i in range(len(self.masses)):
            for key in ("re_even", "re_odd", "im_even", "im_odd", "faction"):
                row[f"pbp{i}_{key}"] = float("nan")
            row[f"pbp{i}_iters"] = 0
        return row

    def measure(self, u, rng) -> tuple[dict, list[str]]:
        """(history columns pbp{i}_re_even, ... per mass i (averaged over the sources), MILC's lines)."""
        lines, per_mass, tail = [], [], []
        if self.spectrum:
            from .milc.spectrum import spectrum_measurement

            u, lines, per_mass, tail = spectrum_measurement(u, self.spectrum)
        D = self._dslash(u)
        row = {}
        for i, m in enumerate(self.masses):
            rs = []
            for _ in range(self.reps):
                g = pbp_source(u.geom, rng)
                rs.append(pbp(D, m, g, self.tols[i], self._inverse(D, m) if self.mg is not None else None,
                              self.maxiter))
            lines += pbp_lines(rs, self.reps) + per_mass
            for key in ("re_even", "re_odd", "im_even", "im_odd", "faction"):
                row[f"pbp{i}_{key}"] = sum(r[key] for r in rs) / len(rs)
            row[f"pbp{i}_iters"] = sum(sum(r["iters"]) for r in rs)
        return row, lines + tail
