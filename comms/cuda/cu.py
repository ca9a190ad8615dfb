"""Checked CUDA driver calls through cuda-bindings, the current device and the device facts the transports need.

Every driver call goes through :func:`call`, which raises :class:`CudaError` (a CommsError) naming the call and the
driver's error code. The transports use CuPy's device and primary context: :func:`device` makes CuPy's runtime
initialise the context, retains the same primary context through the driver API and makes it current.
"""
from __future__ import annotations


from cuda.bindings import driver as drv

from ..base import CommsError

R = drv.CUresult
SUCCESS = R.CUDA_SUCCESS
# an import that fails with one of these means: this peer is unreachable (docs/halo-protocol.md, reachability)
UNREACHABLE = (R.CUDA_ERROR_NOT_PERMITTED, R.CUDA_ERROR_NOT_SUPPORTED, R.CUDA_ERROR_INVALID_VALUE)

WAIT_GEQ = drv.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
WAIT_EQ = drv.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_EQ
WAIT_FLUSH = drv.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_FLUSH
WRITE_DEFAULT = drv.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
A = drv.CUdevice_attribute


class CudaError(CommsError):
    """A driver call failed: ``code`` is the CUresult, ``name`` its name (CUDA_ERROR_...)."""

    def __init__(self, call_name: str, code, detail: str = ""):
        self.call = call_name
        self.code = code
        self.name = getattr(code, "name", str(code))
        super().__init__(f"{call_name} failed: {self.name}" + (f" ({detail})" if detail else ""))


def call(fn, *args, detail: str = ""):
    """``fn(*args)`` of cuda.bindings.driver, checked: returns the outputs (None, one value, or a tuple)."""
    res = fn(*args)
    err = res[0]
    if err != SUCCESS:
        raise CudaError(fn.__name__, err, detail)
    if len(res) == 1:
        return None
    return res[1] if len(res) == 2 else res[1:]


def try_call(fn, *args):
    """(error or None, outputs) without raising."""
    res = fn(*args)
    err = res[0]
    out = None if len(res) == 1 else (res[1] if len(res) == 2 else res[1:])
    return (None if err == SUCCESS else err), out


class Device:
    """The CUDA device of this rank (CuPy's current device), its primary context made current for the driver."""

    def __init__(self, ordinal: int):
        import cupy

        self.ordinal = int(ordinal)
        cupy.cuda.Device(self.ordinal).use()
        cupy.cuda.runtime.free(0)                           # the runtime creates (or binds) the primary context
        call(drv.cuInit, 0)
        self.dev = call(drv.cuDeviceGet, self.ordinal)
        self.ctx = call(drv.cuDevicePrimaryCtxRetain, self.dev)
        call(drv.cuCtxSetCurrent, self.ctx)
        self.name = call(drv.cuDeviceGetName, 256, self.dev).split(b"\0")[0].decode(errors="replace")
        self.memops64 = self.attribute("CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS")
        self.flush_remote = self.attribute("CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES")
        self.vmm = self.attribute("CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED")
        self.posix_fd = self.attribute("CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED")
        self.fabric = self.attribute("CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED")
        self._released = False

    def attribute(self, name: str) -> int:
        attr = getattr(A, name, None)
        if attr is None:
            return 0
        err, v = try_call(drv.cuDeviceGetAttribute, attr, self.dev)
        return 0 if err is not None else int(v)

    def facts(self) -> dict:
        return {"name": self.name, "ordinal": self.ordinal, "memops64": self.memops64,
                "flush_remote_writes": self.flush_remote, "vmm": self.vmm, "posix_fd": self.posix_fd,
                "fabric": self.fabric}

    def release(self):
        if not self._released:
            self._released = True
            try_call(drv.cuDevicePrimaryCtxRelease, self.dev)


_DEVICE = None


def device(node_rank: int = 0, cuda_device: int | None = None) -> Device:
    """This process's Device (created once): ``cuda_device`` (the configuration's, HMC_CUDA_DEVICE) when given, else
    the GPU ``node_rank % count`` when several are visible, else GPU 0."""
    global _DEVICE
    if _DEVICE is None:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
        if cuda_device is not None:
            ordinal = int(cuda_device)
        elif n > 1:
            ordinal = node_rank % n
        else:
            ordinal = 0
        _DEVICE = Device(ordinal)
    return _DEVICE


def wait_op(addr: int, value: int, flags=None):
    """One 64-bit wait of a batch of memory operations: until the word at ``addr`` is ``value`` (``flags``: EQ
    unless given, e.g. GEQ for a monotonic counter)."""
    op = drv.CUstreamBatchMemOpParams()
    op.waitValue.operation = drv.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_64
    op.waitValue.address = addr
    op.waitValue.value64 = value
    op.waitValue.flags = WAIT_EQ if flags is None else flags
    return op


def write_op(addr: int, value: int):
    """One 64-bit write of a batch of memory operations (default flags: ordered after the stream's earlier work)."""
    op = drv.CUstreamBatchMemOpParams()
    op.writeValue.operation = drv.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_64
    op.writeValue.address = addr
    op.writeValue.value64 = value
    op.writeValue.flags = WRITE_DEFAULT
    return op


def batch(stream_ptr: int, ops: list) -> None:
    """Enqueue ``ops`` as ONE ``cuStreamBatchMemOp`` (one graph node when captured), run in array order; nothing
    when ``ops`` is empty."""
    if ops:
        call(drv.cuStreamBatchMemOp, stream_ptr, len(ops), list(ops), 0)


def wait_and_reset(stream_ptr: int, addr: int, value: int = 1):
    """Enqueue, as ONE batch of memory operations (one graph node when captured), a wait until the 64-bit word at
    ``addr`` equals ``value`` and then its reset to 0: the two steps of a binary flag (docs/halo-protocol.md "CUDA
    graphs", option 1). cuStreamBatchMemOp runs the operations in array order, so the reset follows the wait."""
    batch(stream_ptr, [wait_op(addr, value), write_op(addr, 0)])


def stream_ptr(stream) -> int:
    """The CUstream handle (int) of a CuPy stream or of an int."""
    return int(getattr(stream, "ptr", stream))
