"""``hmc bench fat-vjp``: one evaluation of the HISQ fat-link chain rule D_U = F'[U; c]^T D_F
(:func:`force.smearing_derivative.fat_link_vjp`) timed for each implementation that serves the lattice: on one GPU
the per-direction kernels (:func:`force.hisq_cuda.fat_link_vjp`, 24 launches per direction) and the staged ones
(:mod:`force.hisq_staged_vjp`, five launches), and the staged ones reusing the intermediates of a staged build of
the same links (``staged_kept``, three launches: the force's case, :attr:`force.hisq_links.FermionLinks.kept`),
their results compared, and each time set against the staged floor model (:data:`force.hisq_staged_vjp.BYTES_PER_SITE` bytes a site at the measured copy bandwidth,
:func:`bench.gauge.copy_bandwidth`). On the CPU the array twin alone runs."""
from __future__ import annotations

import numpy as np

from force import hisq_staged_vjp as staged, smearing as sm, smearing_derivative as sd
from lattice import CounterRNG, GaugeField, Geometry, get_backend, su3
from lattice.placement import choose

from hmc.momenta import random_momenta

from .gauge import _timed, copy_bandwidth

COEFFS = {"level2": sm.HISQ_LEVEL2, "fat7": sm.FAT7, "asqtad": sm.asqtad_coefficients(1.0)}


def _inputs(geom):
    """Smooth links (far from the unit gauge) and a random complex D_F, on the geometry's backend."""
    rng = CounterRNG(7)
    u = su3.expm_su3(0.3 * random_momenta(geom, rng)) @ GaugeField.unit(geom).links
    g = np.random.default_rng(7)
    shape = (4,) + tuple(geom.shape) + (3, 3)
    d = geom.xp.asarray(g.normal(size=shape) + 1j * g.normal(size=shape))
    return geom.xp.ascontiguousarray(u), d


def _variants(backend) -> dict:
    """(staged switch, intermediates kept) per timed variant: the kernels on a GPU, the twin on the CPU."""
    if not backend.is_gpu:
        return {"array": (False, False)}
    return {"per_direction": (False, False), "staged": (True, False), "staged_kept": (True, True)}


def bench_fat_vjp(args) -> dict:
    backend = get_backend(args.backend or "auto")
    geom = Geometry(tuple(args.lattice), backend)
    c = COEFFS[args.coeffs]
    u, d = _inputs(geom)
    floor_s = staged.BYTES_PER_SITE * geom.volume / copy_bandwidth(backend)
    out = {"backend": backend.name, "lattice": list(args.lattice), "coeffs": args.coeffs, "floor_s": floor_s,
           "bytes_per_site": staged.BYTES_PER_SITE, "variants": {}}
    results = {}
    old = staged.set_enabled(None)
    try:
        for name, (on, keep) in _variants(backend).items():
            staged.set_enabled(on)
            kept = {}
            if keep:
                sm.fat_link(geom, u, c, kept)      # a staged build of the same links leaves its intermediates
            impl = choose("hisq.fat_link_vjp", geom, c=c).fn.__qualname__ + (", kept" if kept else "")
            t = _timed(backend, lambda kept=kept: sd.fat_link_vjp(geom, u, c, d, kept), args.repeat)
            results[name] = sd.fat_link_vjp(geom, u, c, d, kept)
            out["variants"][name] = {"implementation": impl, "s": t, "fraction_of_floor": floor_s / t}
    finally:
        staged.set_enabled(old)
    if "per_direction" in results:
        ref = backend.to_numpy(results["per_direction"])
        out["staged_vs_per_direction_rel"] = float(np.abs(backend.to_numpy(results["staged"]) - ref).max()
                                                   / np.abs(ref).max())
        out["kept_equals_staged"] = bool((results["staged_kept"] == results["staged"]).all())
    if not args.json:
        _print(out)
    return out


def _print(out):
    print(f"bench fat-vjp {out['coeffs']} {'x'.join(map(str, out['lattice']))} on {out['backend']}: floor "
          f"{out['floor_s'] * 1e3:.3f} ms ({out['bytes_per_site']} B/site at the measured copy bandwidth)")
    for name, v in out["variants"].items():
        print(f"  {name:14s} {v['s'] * 1e3:10.3f} ms  {100 * v['fraction_of_floor']:6.1f}% of floor  "
              f"({v['implementation']})")
    if "staged_vs_per_direction_rel" in out:
        print(f"  max |staged - per-direction| / max |per-direction| = {out['staged_vs_per_direction_rel']:.2e}; "
              f"staged_kept {'==' if out['kept_equals_staged'] else '!='} staged bit for bit")
