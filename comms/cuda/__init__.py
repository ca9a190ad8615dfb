"""GPU halo transports (docs/halo-protocol.md): ``event`` and ``stream_gated`` over CUDA VMM buffers shared between the ranks of a
node, with the symmetric reachability probe, MPS helpers and the GPU halo benchmark.

Nothing here is imported by the CPU code paths unless a GPU transport is asked for (``HMC_P2P_TRANSPORT`` or
``--transport event|stream_gated``): the CPU build and its tests need neither CuPy nor cuda-bindings.

Modules: ``cu`` (checked driver calls, device facts), ``vmm`` (VMM allocations and mappings, the registry and leak
check, fabric-then-POSIX-fd handle choice, the Unix-socket descriptor broker), ``ipc`` (legacy CUDA IPC allocations
and mappings: cuMemAlloc + cuIpcGetMemHandle / cuIpcOpenMemHandle, in the same registry; not yet run on a GPU),
``alloc`` (the per-node choice fabric / posix_fd / legacy: pure functions, tested on the CPU), ``transports``
(GpuHaloEngine: the per-link table, streams, sends, graph mode), ``segment`` (its header layout, allocation kind,
probe, peer mappings), ``exchange`` (its receives), ``mps`` (start/stop MPS). The transports' own steps are in
comms/transport/event.py and comms/transport/stream_gated.py.
The multi-rank checks are tests/comms/cuda_checks.py, the GPU halo benchmark bench/halo_cuda.py; on the device
machine ``hmc bench suite transports`` runs the checks, the tests and the benchmarks in one call.

How it plugs in: ``ProcessGrid(transport="stream_gated")`` (or HMC_P2P_TRANSPORT / --transport) makes
``grid.halo`` a GpuHaloEngine (comms/grid.py hook); ``start({(dim, dir): face})`` takes CuPy faces (device to
device) or NumPy faces (staged), ``finish()`` returns faces of the same kind. A contiguous CuPy face is read by the
copy engine directly: do not overwrite it before ``finish()``. Geometry on the cupy backend works through it
(Geometry.shift still converts faces to NumPy on the GPU backend). The HISQ hop on a partitioned CuPy geometry does
not go through Geometry: solvers.staggered_dist_cuda packs its faces with one kernel into device buffers and
exchanges them device to device (and captures the stream-gated exchange in CUDA graphs).

Environment, besides HMC_P2P_TRANSPORT / HMC_P2P_MASK / HMC_P2P_FAKE_CLIQUE / HMC_COMMS_TIMEOUT:

| variable | meaning |
| --- | --- |
| HMC_P2P_DATA=copy_engine or remote_write | data policy (remote_write: the pack kernel stores into the peer) |
| HMC_P2P_FORCE_FLUSH=1 | ask the driver for a FLUSH wait where CAN_FLUSH_REMOTE_WRITES is 0; one line: its answer |
| HMC_P2P_ALLOC=auto, vmm or legacy | segment allocation: the best every rank of the node can use (default: VMM with a fabric handle, else with POSIX file descriptors, else legacy CUDA IPC), VMM only (else a one-line error), or legacy CUDA IPC |
| HMC_P2P_FABRIC=0 | do not try fabric handles |
| HMC_P2P_PARALLEL_RECV=0 | stream_gated receive chains one after the other on the compute stream (default: one stream per link, joined by events) |
| HMC_CUDA_DEVICE=i | the GPU of this rank (default: node rank modulo the device count) |
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
