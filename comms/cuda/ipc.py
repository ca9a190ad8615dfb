"""Legacy CUDA IPC buffers for peer access: cuMemAlloc + cuIpcGetMemHandle, opened by the peers with
cuIpcOpenMemHandle (CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS). The fallback where VMM is missing or a VMM allocation
cannot be exported as a POSIX file descriptor, or where ``HMC_P2P_ALLOC=legacy`` asks for it (the decision:
comms/cuda/alloc.py). It mirrors comms/cuda/vmm.py and uses its registry:

* :class:`IpcAllocation`: this rank's memory (cuMemAlloc, ``size`` rounded up to 2 MiB like the VMM granularity);
  :meth:`IpcAllocation.export` gives the 64-byte IPC handle as bytes, which travel between the ranks of a node by
  MPI (an allgather on the node communicator; no file descriptor, no socket).
* :class:`IpcMapping`: a peer's allocation opened here (cuIpcOpenMemHandle); ``free`` closes it
  (cuIpcCloseMemHandle). The owner frees its allocation (cuMemFree) only after every peer closed its mapping: the
  engine puts a node barrier between the two, as for VMM (freeing an exported region that a peer still has open is
  undefined behaviour).
* :func:`try_open`: the reachability probe's import: (IpcMapping, None), or (None, reason) for the codes that mean
  "unreachable" (docs/halo-protocol.md: NOT_PERMITTED, NOT_SUPPORTED, INVALID_VALUE; here also PEER_ACCESS_UNSUPPORTED).

Every allocation and mapping is entered in ``vmm.REGISTRY`` under its owner and removed when freed, so the engine's
teardown leak check (``vmm.leaked``) sees them.

Driver rules that shape this: a process cannot open its own handle (the engine maps itself directly); a handle is
opened at most once per context (a second open only counts a reference), so each peer's segment is opened once;
cuIpcGetMemHandle needs the base address of a cuMemAlloc allocation (never a sub-allocation of a pool).

NOT YET RUN ON A GPU (written without device time; CPU tests cover the decision in comms/cuda/alloc.py and this
module's bookkeeping against a stand-in driver): tests/comms/test_gpu_transports.py::test_legacy_ipc_allocation
is its device test (``hmc bench suite transports --steps 'legacy*,pytest legacy'``).
"""
from __future__ import annotations

import ctypes

from cuda.bindings import driver as drv

from . import vmm
from .cu import UNREACHABLE, CudaError, call, try_call

HANDLE_BYTES = 64
ALIGN = 1 << 21
LAZY = int(drv.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
UNREACHABLE_IPC = UNREACHABLE + (drv.CUresult.CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,)


def handle_bytes(handle) -> bytes:
    """The 64 bytes of a CUipcMemHandle (read through its address: some cuda-bindings releases expose no
    ``reserved`` field)."""
    data = getattr(handle, "reserved", None)
    if data is not None:
        return bytes(data)[:HANDLE_BYTES]
    return ctypes.string_at(int(handle.getPtr()), HANDLE_BYTES)


def handle_from_bytes(data: bytes):
    """A CUipcMemHandle holding ``data`` (64 bytes)."""
    data = bytes(data)
    if len(data) != HANDLE_BYTES:
        raise ValueError(f"a CUDA IPC memory handle has {HANDLE_BYTES} bytes, not {len(data)}")
    h = drv.CUipcMemHandle()
    ctypes.memmove(int(h.getPtr()), data, HANDLE_BYTES)
    return h


def round_up(n: int) -> int:
    return max((int(n) + ALIGN - 1) // ALIGN * ALIGN, ALIGN)


class IpcAllocation:
    """This rank's device memory for peer access through legacy CUDA IPC (``size`` rounded up to 2 MiB)."""

    kind = "legacy"

    def __init__(self, size: int, ordinal: int, owner=None, what: str = "buffer"):
        self.ordinal = ordinal
        self.size = round_up(size)
        self.ptr = int(call(drv.cuMemAlloc, self.size, detail=f"{what}, {self.size} B"))
        self.handle = True
        self.key = vmm.register(owner, f"{what}: own cuMemAlloc allocation {self.size} B at {self.ptr:#x} "
                                       "(legacy CUDA IPC)")

    def export(self) -> bytes:
        """The IPC handle of this allocation, as 64 bytes (any number of peers may open it)."""
        return handle_bytes(call(drv.cuIpcGetMemHandle, self.ptr))

    def free(self):
        if self.handle is None:
            return
        try_call(drv.cuMemFree, self.ptr)
        self.handle = None
        vmm.unregister(self.key)


class IpcMapping:
    """A peer's allocation, opened from its 64-byte IPC handle (cuIpcOpenMemHandle with lazy peer access)."""

    def __init__(self, data: bytes, size: int, owner=None, what: str = "peer buffer"):
        self.size = int(size)
        self.ptr = int(call(drv.cuIpcOpenMemHandle, handle_from_bytes(data), LAZY, detail=what))
        self.handle = True
        self.key = vmm.register(owner, f"{what}: IPC mapping of {self.size} B at {self.ptr:#x}")

    def free(self):
        if self.handle is None:
            return
        try_call(drv.cuIpcCloseMemHandle, self.ptr)
        self.handle = None
        vmm.unregister(self.key)


def try_open(data: bytes, size: int, owner=None, what: str = "probe"):
    """(IpcMapping, None) or (None, reason) when cuIpcOpenMemHandle fails with an 'unreachable' code; others raise."""
    try:
        return IpcMapping(data, size, owner, what), None
    except CudaError as e:
        if e.code in UNREACHABLE_IPC:
            return None, f"{e.call}: {e.name}"
        raise
