"""Fused CUDA kernels for the link update U <- exp(dt P) U (NumPy twins: ``su3.expm_su3(dt * P) @ U`` and, for
MILC's 8th-order series, ``su3.expm_taylor(dt * P) @ U``) and MILC's reunitarization (twin: ``su3.reunitarize``).

The exponential is the Cayley-Hamilton form of :func:`lattice.su3.expm_su3` (Morningstar & Peardon,
PRD 69 054501), evaluated per link in registers: one read of P and U, one write of U. Kernel files:
lattice/kernels/su3_exp.cu, su3_taylor.cu and su3_reunit.cu (compiled through :mod:`lattice.cuda_source`).
"""
from __future__ import annotations

import numpy as np

from . import cuda_source


def taylor_update(backend, p, links, dt: float, order: int = 8):
    """links <- expm_taylor(dt p, order) links, in place, on the GPU (twin: ``su3.expm_taylor(dt * p) @ links``)."""
    kern = cuda_source.function(backend, "lattice", "su3_taylor.cu", "taylor_update")
    n = links.size // 9
    block = 128
    kern(((n + block - 1) // block,), (block,), (p, links, np.float64(dt), np.int32(order), np.int64(n)))
    return links


def exp_update(backend, p, links, dt: float):
    """links <- exp(dt p) links, in place, on the GPU."""
    kern = cuda_source.function(backend, "lattice", "su3_exp.cu", "exp_update")
    n = links.size // 9
    block = 128
    kern(((n + block - 1) // block,), (block,), (p, links, np.float64(dt), np.int64(n)))
    return links


def reunitarize(backend, links):
    """MILC's reunit_su3 of every link, one read and one write a link (the twin's array operations made 9 passes and
    a stack: 4.2 ms at 32^4 on the H200, 18 calls a production trajectory); a new array."""
    kern = cuda_source.function(backend, "lattice", "su3_reunit.cu", "reunitarize_links")
    out = backend.xp.empty_like(links)
    n = links.size // 9
    block = 128
    kern(((n + block - 1) // block,), (block,), (backend.xp.ascontiguousarray(links), out, np.int64(n)))
    return out
