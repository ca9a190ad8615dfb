"""GPU halo transports (COMMS.md): ``event`` and ``stream_gated`` over CUDA VMM buffers shared between the ranks of a
node, with the symmetric reachability probe, MPS helpers and the GPU halo benchmark.

Nothing here is imported by the CPU code paths unless a GPU transport is asked for (``HMC_P2P_TRANSPORT`` or
``--transport event|stream_gated``): the CPU build and its tests need neither CuPy nor cuda-bindings.
"""
from __future__ import annotations

import importlib.util

_AVAILABLE = None


def available() -> bool:
    """True when CuPy and cuda-bindings import and a CUDA device is visible (no context is created)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        ok = all(importlib.util.find_spec(m) is not None for m in ("cupy", "cuda"))
        if ok:
            try:
                from cuda.bindings import driver  # noqa: F401 - importable
                import cupy

                ok = cupy.cuda.runtime.getDeviceCount() > 0
            except Exception:  # noqa: BLE001 - any failure means: no GPU transports here
                ok = False
        _AVAILABLE = ok
    return _AVAILABLE
