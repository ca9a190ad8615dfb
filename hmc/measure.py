"""``hmc measure``: what MILC prints about a stored configuration, and its gauge action."""
from __future__ import annotations

from lattice import link_trace, plaquette, polyakov_loop
from lattice.io import read_gauge

from .assemble import make_gauge_action


def measure(path: str, args) -> dict:
    """CHECK PLAQ and LINKTR as stored (MILC prints them before re-unitarizing), then the Polyakov loop,
    plaquette and, with --beta, the gauge action S_g on the re-unitarized links (CONVENTIONS.md 1.1, 2)."""
    u, info = read_gauge(path, backend=args.backend, ignore_checksum=args.ignore_checksum)
    ss, st = plaquette(u)
    out = {"file": path, "format": info.get("format"), "dims": list(u.geom.dims),
           "checksums": info.get("checksums"),
           "check_plaq_ss": ss, "check_plaq_st": st, "link_trace": link_trace(u)}
    u.reunitarize()
    ss, st = plaquette(u)
    pl = polyakov_loop(u)
    out.update({"plaq_ss": ss, "plaq_st": st, "plaquette": (ss + st) / 6.0,
                "polyakov_re": pl.real, "polyakov_im": pl.imag})
    if args.beta is not None:
        g = {"action": args.gauge_action, "beta": args.beta, "u0": args.u0, "nf": args.nf,
             "quark_loops": args.quark_loops}
        act = make_gauge_action(g)
        out["gauge_action"] = {**g, "S_g": act.action(u), "coefficients": act.describe()}
    return out
