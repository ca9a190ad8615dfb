"""``hmc bench smear``: one HISQ fat-link build, the per-direction staple kernels (:func:`force.hisq_cuda.fat_link`,
48 launches a level) against the staged kernels (:func:`force.hisq_staged.fat_link`, 3 launches), on the same
smooth links of one L^4 lattice on one GPU: median times, the staged result's largest relative difference from the
old one, and the staged kernels' bytes (their model: :data:`force.hisq_staged.BYTES_PER_SITE`) per second as a
fraction of the measured copy bandwidth. ``--twin`` adds the NumPy twin on the device (slow at 32^4)."""
from __future__ import annotations

from hmc.cli import count

#: the path tables --coeffs names (force.smearing)
COEFFS = ("asqtad", "fat7", "level2")


def coefficients(name: str):
    from force import smearing as sm

    return {"fat7": sm.FAT7, "level2": sm.HISQ_LEVEL2, "asqtad": sm.asqtad_coefficients(0.87)}[name]


def add_arguments(b) -> None:
    b.add_argument("--lattice", type=int, nargs=4, default=[32, 32, 32, 32], metavar=("NX", "NY", "NZ", "NT"))
    b.add_argument("--coeffs", choices=COEFFS, default="level2", help="path table (default: HISQ level 2)")
    b.add_argument("--repeat", type=count(1), default=5)
    b.add_argument("--twin", action="store_true", help="also time the NumPy twin (array code) on the device")
    b.add_argument("--json", action="store_true")


def smooth_links(geom, seed: int = 7):
    """exp(0.3 P) for Gaussian algebra P: links far from the unit gauge, as in ``hmc bench gauge``."""
    from hmc.momenta import random_momenta
    from lattice import CounterRNG, GaugeField, su3

    p = random_momenta(geom, CounterRNG(seed))
    return geom.xp.ascontiguousarray(su3.expm_su3(0.3 * p) @ GaugeField.unit(geom).links)


def time_fat_link(geom, links, c, repeat: int, twin: bool = False) -> dict:
    """Median seconds of one build by each path and the staged one's max |staged - old| / max |old|."""
    from force import hisq_cuda, hisq_staged, smearing as sm

    from .gauge import _timed

    be = geom.backend
    out = {"old_s": _timed(be, lambda: hisq_cuda.fat_link(geom, links, c), repeat),
           "staged_s": _timed(be, lambda: hisq_staged.fat_link(geom, links, c), repeat)}
    if twin:
        out["twin_s"] = _timed(be, lambda: sm._fat_link_array(geom, links, c), max(1, repeat // 2))
    old, new = hisq_cuda.fat_link(geom, links, c), hisq_staged.fat_link(geom, links, c)
    out["staged_rel_diff"] = float(abs(new - old).max() / abs(old).max())
    return out


def bench_smear(args) -> dict:
    from force import hisq_staged
    from lattice import Geometry, get_backend

    from .gauge import copy_bandwidth

    backend = get_backend(args.backend or "auto")
    if not backend.is_gpu:
        raise SystemExit("hmc bench smear times CUDA kernels: run it with --backend cupy on a GPU")
    geom = Geometry(tuple(args.lattice), backend)
    links = smooth_links(geom)
    out = {"backend": backend.name, "lattice": list(args.lattice), "coeffs": args.coeffs,
           **time_fat_link(geom, links, coefficients(args.coeffs), args.repeat, args.twin)}
    bw = copy_bandwidth(backend)
    moved = hisq_staged.BYTES_PER_SITE * geom.volume
    out.update(staged_bytes=moved, staged_GBps=moved / out["staged_s"] / 1e9, copy_GBps=bw / 1e9,
               staged_fraction_of_copy_bandwidth=moved / out["staged_s"] / bw,
               speedup=out["old_s"] / out["staged_s"])
    if not args.json:
        print(f"bench smear {args.coeffs} {'x'.join(map(str, args.lattice))} on {backend.name}:")
        print(f"  per-direction staples (48 launches) {out['old_s'] * 1e3:9.3f} ms")
        print(f"  staged (3 launches)                 {out['staged_s'] * 1e3:9.3f} ms  x{out['speedup']:.2f}, "
              f"{out['staged_GBps']:.0f} GB/s = {100 * out['staged_fraction_of_copy_bandwidth']:.1f}% of copy "
              f"{out['copy_GBps']:.0f} GB/s; rel. diff {out['staged_rel_diff']:.2e}")
        if args.twin:
            print(f"  NumPy twin on the device            {out['twin_s'] * 1e3:9.3f} ms")
    return out
