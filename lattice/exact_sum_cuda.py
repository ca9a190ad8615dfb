"""Exact, decomposition-independent reductions on the device (lattice/kernels/exact_sum.cu): the driver.

The solvers' "exact" reduction mode (solvers/operator.py) sums the per-element products |a_i|^2 and
Re(conj(a_i) b_i) so that every iterate is bitwise the same for any decomposition. Here each rank sums them on the
device into an exact fixed-point record (comms/superacc.py: 67 limbs of 32-bit digits from 2**-1074 up, then the
non-finite flags: WIDTH = 68 int64), the ranks exchange the records (integers: their sum does not depend on the
order), and every rank rounds the total once (docs/reductions.md). No host synchronisation: every result stays in
device memory, where the next kernel reads it (alpha and beta of a CG).

* :meth:`ExactReducer.norm2` / :meth:`ExactReducer.norm2_redot`: one pass over one or two complex fields
  (complex128 or complex64, C-contiguous, n = a.size < 2**31 elements) into ``out`` ((1, WIDTH) or (2, WIDTH)
  int64, normalised records, overwritten), and, when ``result`` ((1,) or (2,) float64) is given, their rounded
  values as well (one rank: no second launch).
* :meth:`ExactReducer.sum`: the same for the elements of a real float64 array; :func:`device_parts` gives a CuPy
  float64 or complex128 array's exact parts (comms.reduce.local_parts) from it, so that ``Geometry.sum`` of a device
  array moves 68 integers to the host instead of the array (the same correctly rounded sum, bitwise).
* :func:`gather_words`: the k ranks' partials, wherever they are (a device table of k addresses), into one
  contiguous (k, ...) buffer in rank order (the one-step rank sums of comms/cuda/peersum.py).
* :func:`pair_sum`: the k ranks' fast (|a|^2, Re<a, b>) pairs, wherever they are, added left to right in rank order.
* :func:`round_records`: ``accs`` (k, nq, WIDTH) int64, the k ranks' records in one buffer, nq <= 4, into ``result``
  (nq,) float64, and optionally their normalised sum into ``total`` (nq, WIDTH) int64.

The products are formed as the NumPy "exact" mode forms them, in the field's precision (a.real * a.real + a.imag *
a.imag, a.real * b.real + a.imag * b.imag; the file is compiled with --fmad=false), so a kernel's record equals
:func:`twin_records` bitwise and its rounded value equals ``geom.sum`` of the same products (comms.reduce), except
where that raises OverflowError: here +-inf.

Launch configuration: the reduction runs THREADS = 256 threads per block (a multiple of 32: a warp merges its
threads' register windows by shuffles) and min(ceil(n / (256 * ITEMS)), BLOCKS_PER_SM x SMs) blocks, grid-stride;
the rounding kernel one block of ROUND_THREADS = 128. An :class:`ExactReducer` owns a scratch record pair and a
block counter that are zeroed at allocation and left zero by every launch (its last block reads and clears them),
so launches need no memset and can be captured in a CUDA graph; one reducer serves one stream at a time. The
warp reductions (``__reduce_max_sync``) need compute capability 8.0 or later.
"""
from __future__ import annotations

import numpy as np

from comms import superacc
from lattice import cuda_source

WIDTH = superacc.WIDTH
THREADS = 256            # reduction block size, a multiple of 32
ITEMS = 8                # complex elements per thread before the grid is capped
BLOCKS_PER_SM = 3       # nvcc 13.0 for sm_90: 72 registers a thread (pair), so 3 blocks of 256 are resident per SM
ROUND_THREADS = 128
MAX_QUANTITIES = 4       # EXS_QMAX of exact_sum.cu
MAX_ELEMENTS = 2 ** 31   # a limb takes 2**31 digits before it can overflow

_SUFFIX = {np.dtype(np.complex128): "f64", np.dtype(np.complex64): "f32", np.dtype(np.float64): "f64"}
_NULL = np.uintp(0)


def twin_records(a, b=None) -> np.ndarray:
    """The NumPy twin of a reduction kernel: the (1, WIDTH) record of |a|^2, or the (2, WIDTH) records of |a|^2 and
    Re<a, b>, with the products of solvers/operator.py's exact mode."""
    a = np.asarray(a)
    recs = [superacc.accumulate(a.real * a.real + a.imag * a.imag)]
    if b is not None:
        b = np.asarray(b)
        recs.append(superacc.accumulate(a.real * b.real + a.imag * b.imag))
    return np.stack(recs)


def accumulator(xp, nq: int = 1):
    """A (nq, WIDTH) int64 buffer for a reduction's records."""
    return xp.zeros((nq, WIDTH), dtype=np.int64)


def _check_field(a, what: str, real: bool = False):
    if real != (np.dtype(a.dtype) == np.float64) or np.dtype(a.dtype) not in _SUFFIX:
        raise TypeError(f"exact device sum: {what} is {a.dtype}; give "
                        f"{'a float64 array' if real else 'a complex128 or complex64 field'}")
    if not a.flags.c_contiguous:
        raise ValueError(f"exact device sum: {what} is not C-contiguous; pass xp.ascontiguousarray({what})")
    if a.size >= MAX_ELEMENTS:
        raise ValueError(f"exact device sum: {what} has {a.size} elements, at most 2**31 - 1 per launch; reduce it "
                         "in parts and add their records with round_records")


def _check_buffer(buf, shape, dtype, what: str):
    if buf is None:
        return
    if tuple(buf.shape) != shape or np.dtype(buf.dtype) != np.dtype(dtype) or not buf.flags.c_contiguous:
        raise ValueError(f"exact device sum: {what} must be a C-contiguous {np.dtype(dtype)} array of shape {shape}, "
                         f"not {buf.dtype} {tuple(buf.shape)} (make it with exact_sum_cuda.accumulator)")


class ExactReducer:
    """The exact reduction kernels on one backend (CuPy), with their scratch record pair and block counter."""

    def __init__(self, backend):
        xp = backend.xp
        self.backend, self.xp = backend, xp
        self.scratch = xp.zeros((2, WIDTH), dtype=np.uint64)
        self.counter = xp.zeros(1, dtype=np.uint32)
        sms = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)["multiProcessorCount"]
        self.max_blocks = BLOCKS_PER_SM * int(sms)

    def blocks(self, n: int) -> int:
        return max(1, min(-(-n // (THREADS * ITEMS)), self.max_blocks))

    def _launch(self, name: str, fields: tuple, out, result, nq: int):
        a = fields[0]
        for f, what in zip(fields, ("a", "b")):
            _check_field(f, what, real=name == "exact_sum")
        if len(fields) == 2 and (fields[1].dtype != a.dtype or fields[1].size != a.size):
            raise ValueError(f"exact device sum: b is {fields[1].dtype} of {fields[1].size} elements, a "
                             f"{a.dtype} of {a.size}; give fields of one precision and size")
        _check_buffer(out, (nq, WIDTH), np.int64, "out")
        _check_buffer(result, (nq,), np.float64, "result")
        kernel = cuda_source.function(self.backend, "lattice", "exact_sum.cu", f"{name}_{_SUFFIX[np.dtype(a.dtype)]}")
        n = int(a.size)
        kernel((self.blocks(n),), (THREADS,), fields + (np.int64(n), self.scratch, self.counter, out,
                                                        _NULL if result is None else result))
        return out

    def norm2(self, a, out, result=None):
        """out[0] = the exact record of |a|^2 (sum of a.real**2 + a.imag**2); result[0] its rounded value."""
        return self._launch("exact_norm2", (a,), out, result, 1)

    def sum(self, a, out, result=None):
        """out[0] = the exact record of the sum of the elements of the real float64 array ``a``; result[0] its
        rounded value."""
        return self._launch("exact_sum", (a,), out, result, 1)

    def norm2_redot(self, a, b, out, result=None):
        """out[0], out[1] = the exact records of |a|^2 and Re<a, b>, one pass (the Chronopoulos-Gear pair);
        result[0], result[1] their rounded values."""
        return self._launch("exact_norm2_redot", (a, b), out, result, 2)


def round_records(backend, accs, result, total=None):
    """result[q] = the correctly rounded double of sum_r accs[r, q] (k ranks' normalised records, in one (k, nq,
    WIDTH) int64 buffer, nq <= 4); total[q] (optional, (nq, WIDTH) int64) = their normalised sum."""
    if accs.ndim != 3 or accs.shape[2] != WIDTH or np.dtype(accs.dtype) != np.int64 or not accs.flags.c_contiguous:
        raise ValueError(f"round_records: accs must be a C-contiguous int64 (k, nq, {WIDTH}) array of the ranks' "
                         f"records, not {accs.dtype} {tuple(accs.shape)}")
    k, nq = int(accs.shape[0]), int(accs.shape[1])
    if not 1 <= nq <= MAX_QUANTITIES or k < 1:
        raise ValueError(f"round_records: {k} records of {nq} quantities; give k >= 1 and 1 <= nq <= "
                         f"{MAX_QUANTITIES}")
    if result is None:
        raise ValueError("round_records: give result, a (nq,) float64 device array for the rounded sums")
    _check_buffer(result, (nq,), np.float64, "result")
    _check_buffer(total, (nq, WIDTH), np.int64, "total")
    kernel = cuda_source.function(backend, "lattice", "exact_sum.cu", "exact_round")
    kernel((1,), (ROUND_THREADS,), (accs, np.int32(k), np.int32(nq), result, _NULL if total is None else total))
    return result


def device_parts(backend, a) -> tuple:
    """comms.reduce.local_parts(a) of a CuPy float64 or complex128 array, summed exactly on the device: ((N, e0) of
    the real part, (N, e0) of the imaginary part or None), or ('nonfinite', IEEE sum) where non-finite values are."""
    xp = backend.xp
    reducer = backend.kernel(("exact_sum_cuda", "reducer"), lambda: ExactReducer(backend))
    out = accumulator(xp, 1)
    comps = (a.real, a.imag) if xp.iscomplexobj(a) else (a,)
    parts = []
    for c in comps:
        flat = xp.ascontiguousarray(c).ravel()
        records = []
        for start in range(0, max(flat.size, 1), MAX_ELEMENTS - 1):
            reducer.sum(flat[start:start + MAX_ELEMENTS - 1], out)
            records.append(backend.to_numpy(out)[0].copy())
        parts.append(superacc.to_parts(superacc.add(*records)))
    return parts[0], (parts[1] if len(parts) == 2 else None)


GATHER_THREADS = 128


def gather_words(backend, table, out) -> None:
    """out[r] = the ``out[r].nbytes`` bytes at device address table[r], for r in range(k) (``table``: (k,) uint64
    device array; ``out``: a C-contiguous (k, ...) device array of 8-byte words, any dtype); one launch."""
    k = int(table.shape[0])
    if not out.flags.c_contiguous or out.shape[0] != k or out.dtype.itemsize != 8:
        raise ValueError(f"gather_words: out must be a C-contiguous (k={k}, ...) array of 8-byte elements, not "
                         f"{out.dtype} {tuple(out.shape)}")
    words = out.size // k
    kernel = cuda_source.function(backend, "lattice", "exact_sum.cu", "gather_u64")
    n = k * words
    kernel(((n + GATHER_THREADS - 1) // GATHER_THREADS,), (GATHER_THREADS,), (table, np.int32(k), np.int64(words), out))


def pair_sum(backend, table, result) -> None:
    """result[0:2] = sum over r, left to right, of the (2,) float64 pair at device address table[r] (``table``:
    (k,) uint64 device array; one thread: the additions of ``rank_sum`` in solvers/kernels/fused_blas.cu)."""
    kernel = cuda_source.function(backend, "lattice", "exact_sum.cu", "peer_pair_sum")
    kernel((1,), (1,), (table, np.int32(table.shape[0]), result))
