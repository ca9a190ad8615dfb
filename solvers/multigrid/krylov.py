"""Krylov pieces of the multigrid: the GCR smoother and flexible GCR (outer solver and K-cycle).

* :func:`gcr_smooth`: ``steps`` iterations of GCR in its communication-avoiding form (QUDA's CA-GCR smoother):
  the Krylov basis r, A r, ..., A^(s-1) r is built first (s operator applications), then the residual is
  minimized over it with one batched reduction (the Gram matrix of the A p_i and their products with r) and a
  small least-squares solve. One global reduction per smoothing, whatever ``steps``.
* :func:`fgcr`: flexible GCR (right preconditioning that may change between iterations, as a K-cycle does) with
  restarts every ``nkrylov`` directions. The new direction's image is orthogonalized against the kept ones by
  classical Gram-Schmidt in one reduction; |q|^2 and <q, r> come from a second one, and |r|^2 follows from them
  (|r - alpha q|^2 = |r|^2 - |<q, r>|^2/|q|^2). With ``true_residual`` the residual is recomputed from x at each
  restart and before stopping.

Both keep every scalar in the array module (:class:`GCRRun`, :func:`device_sums`, :func:`small_lstsq`): on one GPU a
smoothing reads nothing back and a GCR iteration reads (|r|^2, |q|^2) once, for the stop test, so that the steps of
the deepest K-cycle GCR can be CUDA-graph replays (:mod:`.graph`; docs/multigrid.md "Device-resident coarse
levels"). On NumPy the results are bitwise those of the host-driven steps (tests/solvers/test_multigrid_graph.py).
"""
from __future__ import annotations

import math

import numpy as np

from lattice import cuda_source
from lattice.placement import switch_on

from .lattice import global_sums


def _vdot_local(xp, a, b):
    """sum conj(a) b on this rank. An element-wise product and a sum rather than BLAS zdotc: on a CPU shared with
    other jobs a threaded BLAS reduction of a lattice field waits for its threads (measured 3 ms against 0.03 ms on
    8^4 fields on a loaded 2-core machine)."""
    return (a.conj() * b).sum()


#: the launch shape of kernels/multi_dot.cu: threads a block (DOT_THREADS there), the most blocks, and its limits
DOT_THREADS, DOT_BLOCKS, DOT_FIELDS, DOT_PAIRS = 128, 256, 9, 15


def local_dots(geom, pairs):
    """[sum conj(a) b for (a, b) in ``pairs``] on this rank, one array. On a GPU (the multigrid kernels on, fields of
    one dtype, complex128 or complex64, contiguous) two launches of kernels/multi_dot.cu per at most
    :data:`DOT_PAIRS` pairs over at most :data:`DOT_FIELDS` fields, summed in double, complex128 out (one chain of
    product, sum and copy per pair before: the smoother's 14 products were 56 graph nodes); elsewhere each
    :func:`_vdot_local`, :func:`gather`-ed."""
    xp = geom.xp
    fields = [f for ab in pairs for f in ab]
    if not (switch_on("mg_kernels", geom.config) and geom.backend.is_gpu
            and len({np.dtype(f.dtype) for f in fields}) == 1 and np.dtype(fields[0].dtype) in _DOT_KERNEL
            and all(f.flags.c_contiguous and f.size == fields[0].size for f in fields)):
        return gather(xp, [_vdot_local(xp, a, b) for a, b in pairs])
    out = xp.empty(len(pairs), dtype=np.complex128)
    n = int(fields[0].size)
    blocks = int(min(DOT_BLOCKS, max(1, -(-n // DOT_THREADS))))
    partial = xp.empty((blocks, DOT_PAIRS), dtype=np.complex128)
    be = geom.backend
    k_dot = cuda_source.function(be, "solvers.multigrid", "multi_dot.cu", _DOT_KERNEL[np.dtype(fields[0].dtype)])
    k_sum = cuda_source.function(be, "solvers.multigrid", "multi_dot.cu", "mg_multi_dot_finish")
    for start, chunk, vecs in _dot_chunks(pairs):
        a = sum(vecs.index(id(x)) << (4 * p) for p, (x, _) in enumerate(chunk))
        b = sum(vecs.index(id(y)) << (4 * p) for p, (_, y) in enumerate(chunk))
        by_id = {id(f): f for ab in chunk for f in ab}
        args = [by_id[i] for i in vecs] + [by_id[vecs[0]]] * (DOT_FIELDS - len(vecs))
        k_dot((blocks,), (DOT_THREADS,), (*args, np.int64(a), np.int64(b), np.int32(len(chunk)), np.int64(n),
                                          np.int32(blocks), partial))
        k_sum((1,), (DOT_PAIRS,), (partial, np.int32(blocks), np.int32(len(chunk)), out[start:start + len(chunk)]))
    return out


_DOT_KERNEL = {np.dtype(np.complex128): "mg_multi_dot_double", np.dtype(np.complex64): "mg_multi_dot_float"}


def _dot_chunks(pairs):
    """(first index, pairs, distinct field ids) of consecutive runs of ``pairs`` that one launch takes: at most
    :data:`DOT_PAIRS` pairs over at most :data:`DOT_FIELDS` distinct fields."""
    out, start, chunk, vecs = [], 0, [], []
    for i, (x, y) in enumerate(pairs):
        new = [f for f in dict.fromkeys((id(x), id(y))) if f not in vecs]
        if chunk and (len(chunk) == DOT_PAIRS or len(vecs) + len(new) > DOT_FIELDS):
            out.append((start, chunk, vecs))
            start, chunk, vecs, new = i, [], [], list(dict.fromkeys((id(x), id(y))))
        chunk.append((x, y))
        vecs += new
    if chunk:
        out.append((start, chunk, vecs))
    return out


def dots(geom, Q, v):
    """[<q, v> for q in Q] with one global reduction (NumPy complex array)."""
    xp = geom.xp
    if not Q:
        return np.zeros(0, dtype=complex)
    loc = xp.stack([xp.asarray(_vdot_local(xp, q, v)) for q in Q])
    return np.asarray(global_sums(geom, loc), dtype=complex).reshape(len(Q))


def norm2(geom, v) -> float:
    return float(dots(geom, [v], v)[0].real)


def gather(xp, vals):
    """The partial sums ``vals`` (0-d arrays or scalars) as one array, each written into place: no host copy, where
    ``xp.stack`` of many device arrays may copy a table of their addresses from the host (which a CUDA graph
    capture would bake in). The same values as the stack."""
    out = xp.empty(len(vals), dtype=vals[0].dtype)
    for i, v in enumerate(vals):
        out[i] = v
    return out


def on_device(geom) -> bool:
    """Whether the Krylov scalars stay on the device: one GPU (several ranks reduce through the host, MPI)."""
    return geom.backend.is_gpu and geom.grid.active_comm.size == 1


def device_sums(geom, loc):
    """Global sums of the per-rank partial sums ``loc`` as complex128: on one GPU summed where they are, a device
    array (no host round trip: the device-resident steps); otherwise a NumPy array through
    :func:`.lattice.global_sums` (the host reduction, charged to the level clock), as before."""
    if on_device(geom):
        return loc.astype(np.complex128)
    return np.asarray(global_sums(geom, loc), dtype=complex)


def _coef(a):
    """A coefficient as it multiplies fields: a device array stays one (nothing read back); a host value becomes a
    Python scalar, which the array module rounds to the fields' precision."""
    return complex(a) if isinstance(a, (np.ndarray, np.generic)) else a


#: rcond of the smoother's least-squares solve (numpy.linalg.lstsq's cutoff, relative to the largest singular value)
LSTSQ_RCOND = 1e-13
LSTSQ_MAX = 8          # LSQ_MAX of kernels/small_lstsq.cu: the most smoother steps the device solve takes


def small_lstsq(geom, sums, s: int):
    """The smoother's coefficients alpha (s,) complex128 from ``sums`` (complex128: the upper triangle of the Gram
    matrix G_ij = <A p_i, A p_j> row by row, then c_i = <A p_i, r>): the least-squares solution of G alpha = c on
    the unit-diagonal scaling of G (numpy.linalg.lstsq, rcond :data:`LSTSQ_RCOND`). NumPy: lstsq itself; CuPy: the
    one-thread kernel of kernels/small_lstsq.cu (Jacobi eigenvalues, the same cutoff), on the device and stream, so
    that a smoothing needs no host round trip (and can be captured in a CUDA graph: :mod:`.graph`); more than
    :data:`LSTSQ_MAX` steps go through the host. Host ``sums`` (NumPy: several ranks) give host coefficients."""
    xp = geom.xp
    if isinstance(sums, np.ndarray):
        return _lstsq_host(sums, s)
    if s > LSTSQ_MAX:
        return xp.asarray(_lstsq_host(geom.backend.to_numpy(sums), s))
    return _lstsq_kernel(geom, sums, s)


def _lstsq_kernel(geom, sums, s: int):
    xp = geom.xp
    out = xp.empty(s, dtype=np.complex128)
    fn = cuda_source.function(geom.backend, "solvers.multigrid", "small_lstsq.cu", "mg_small_lstsq")
    fn((1,), (1,), (xp.ascontiguousarray(sums), out, np.int32(s), np.float64(LSTSQ_RCOND)))
    return out


def _lstsq_host(sums, s: int):
    G = np.zeros((s, s), dtype=complex)
    k = 0
    for i in range(s):
        for j in range(i, s):
            G[i, j] = sums[k]
            G[j, i] = np.conj(sums[k])
            k += 1
    c = sums[k:]
    scale = np.sqrt(np.abs(np.diag(G)).clip(min=1e-300))
    Gs = G / np.outer(scale, scale)
    return np.linalg.lstsq(Gs, c / scale, rcond=LSTSQ_RCOND)[0] / scale


def gcr_smooth(op, f, x=None, steps: int = 2):
    """x + sum_i alpha_i A^i r minimizing |f - A x'| (r = f - A x; x = 0 when not given). Returns x'. The Gram
    matrix, the least-squares solve and the update stay in the array module (on one GPU: no host round trip,
    :func:`device_sums`, :func:`small_lstsq`); alpha is rounded to the fields' precision before it multiplies them,
    as a Python scalar is."""
    geom, xp = op.geom, op.xp
    if steps <= 0:
        return xp.zeros_like(f) if x is None else x
    r = f if x is None else f - op.apply(x)
    P, Q = [r], []
    for i in range(steps):
        q = op.apply(P[-1])
        Q.append(q)
        if i < steps - 1:
            P.append(q)
    s = len(Q)
    pairs = [(Q[i], Q[j]) for i in range(s) for j in range(i, s)] + [(Q[i], r) for i in range(s)]
    sums = device_sums(geom, local_dots(geom, pairs))
    alpha = small_lstsq(geom, sums, s).astype(f.dtype)
    out = xp.zeros_like(f) if x is None else x.copy()
    for i, p in enumerate(P):
        out += _coef(alpha[i]) * p
    return out


# The recurrence |r - alpha q|^2 = |r|^2 - |<q, r>|^2/|q|^2 subtracts numbers of the size of |r|^2 at the cycle's
# start: its rounding error is ~1e-16 of that, so the estimate stalls near 1e-8 relative residual (measured: 1.85e-8
# on 8^4 while the iterated r reached 2e-16; the solve then ran to the next restart). Below this fraction of the
# cycle's starting |r|^2 it is measured instead (one reduction).
_RECOMPUTE = 1e-10


class FGCRResult:
    __slots__ = ("iters", "residual", "restarts", "converged")

    def __init__(self):
        self.iters, self.residual, self.restarts, self.converged = 0, 1.0, 0, False


class GCRRun:
    """The iterate of one flexible GCR solve (x, r, the directions Z, their images Q, |q_j|^2 in ``QQ``) and its
    step (:meth:`step`), every scalar kept in the array module: ``scal`` holds (|r|^2, |q|^2) of the last step, the
    one thing the host reads per iteration (its stop test: :func:`fgcr`). ``persistent``: x, r, Z and Q live in
    buffers allocated once, so that a step can be captured in a CUDA graph and replayed by later solves of the same
    level (:mod:`.graph`); otherwise the directions are the step's own arrays. ``device`` (one GPU): the rounding
    floor's re-measurement of |r|^2 is selected on the device too (else the host does it, only when needed)."""

    def __init__(self, apply, precondition, geom, like, nkrylov: int, persistent: bool = False):
        xp = geom.xp
        self.apply, self.precondition, self.geom, self.xp = apply, precondition, geom, xp
        self.device = on_device(geom)
        self.sx = sx = xp if self.device else np            # where the scalars live: where the sums arrive
        self.persistent = bool(persistent)
        self.scal = sx.zeros(2, dtype=np.float64)           # |r|^2, |q|^2
        self.rrs = sx.zeros(1, dtype=np.float64)            # |r|^2 at the Krylov cycle's start
        self.QQ = sx.zeros(max(int(nkrylov), 1), dtype=np.float64)
        n = len(self.QQ)
        if self.persistent:
            self.x, self.r = xp.zeros_like(like), xp.zeros_like(like)
            self.Z = [xp.zeros_like(like) for _ in range(n)]
            self.Q = [xp.zeros_like(like) for _ in range(n)]
        else:
            self.x = self.r = None
            self.Z, self.Q = [None] * n, [None] * n
        self.stepper = None          # (run, j) -> None: runs step j (a CUDA graph's replay); None: self.step

    def buffers(self) -> list:
        """Every persistent array a step writes."""
        return [self.x, self.r, self.scal, self.rrs, self.QQ] + self.Z + self.Q

    def _set(self, name, value):
        if self.persistent:
            getattr(self, name)[...] = value
        else:
            setattr(self, name, value)

    def start(self, b, x, bb: float) -> float:
        """x = x0 (or 0), r = b - A x; returns |r|^2 (``bb`` = |b|^2 when x0 is None)."""
        xp = self.xp
        if x is None:
            self._set("x", xp.zeros_like(b))
            self._set("r", b.copy())
            rr = bb
        else:
            self._set("x", x.copy())
            self._set("r", b - self.apply(self.x))
            rr = norm2(self.geom, self.r)
        self.scal[0] = rr
        return rr

    def true_residual(self, b) -> float:
        self._set("r", b - self.apply(self.x))
        return self.measure()

    def measure(self) -> float:
        """|r|^2 measured (one reduction), also into ``scal``."""
        rr = norm2(self.geom, self.r)
        self.scal[0] = rr
        return rr

    def restart(self, rr: float) -> None:
        self.rrs[0] = rr

    def run_step(self, j: int) -> None:
        (self.step if self.stepper is None else lambda j: self.stepper(self, j))(j)

    def _keep(self, lst, j, v):
        if self.persistent:
            lst[j][...] = v
            return lst[j]
        lst[j] = v
        return v

    def step(self, j: int) -> None:
        """Direction j of the Krylov cycle: z = K r, q = A z, both orthogonalized against the j kept ones by classical
        Gram-Schmidt (one reduction), then (|q|^2, <q, r>) (one reduction), x += alpha z, r -= alpha q with
        alpha = <q, r>/|q|^2 and |r|^2 -= |<q, r>|^2/|q|^2 - all on the array module, nothing read by the host. The
        coefficients are rounded to the fields' precision before they multiply them, as Python scalars are. A
        breakdown (|q|^2 not > 0 or not finite) leaves alpha 0 and |r|^2 as it was (the host stops on it)."""
        xp, sx, geom = self.xp, self.sx, self.geom
        z = self.precondition(self.r)
        if z is self.r and not self.persistent:
            z = z.copy()
        z = self._keep(self.Z, j, z)
        q = self._keep(self.Q, j, self.apply(z))
        if j:
            loc = local_dots(geom, [(self.Q[i], q) for i in range(j)])
            c = (device_sums(geom, loc) / self.QQ[:j]).astype(q.dtype)
            for i in range(j):
                cf = _coef(c[i])
                q -= cf * self.Q[i]
                z -= cf * self.Z[i]
        s = device_sums(geom, local_dots(geom, [(q, q), (q, self.r)]))
        qq = s[0].real
        ok = (qq > 0) & sx.isfinite(qq)
        safe = sx.where(ok, qq, 1.0)
        alpha = sx.where(ok, s[1] / safe, 0.0)
        self.x += _coef(alpha.astype(self.x.dtype)) * z
        self.r -= _coef(alpha.astype(self.r.dtype)) * q
        a = sx.abs(s[1])
        rr = sx.where(ok, sx.maximum(self.scal[0] - a * a / safe, 0.0), self.scal[0])
        if self.device:                 # below the recurrence's rounding floor: |r|^2 measured, chosen here
            meas = device_sums(geom, local_dots(geom, [(self.r, self.r)]))[0].real
            rr = xp.where(rr < _RECOMPUTE * self.rrs[0], meas, rr)
        self.scal[0] = rr
        self.scal[1] = qq
        self.QQ[j] = qq

    def read(self):
        """(|r|^2, |q|^2) of the last step on the host (the one synchronization of an iteration)."""
        v = self.scal if self.sx is np else self.geom.backend.to_numpy(self.scal)
        return float(v[0]), float(v[1])

    def result(self):
        return self.x.copy() if self.persistent else self.x


def fgcr(apply, precondition, geom, b, tol: float, maxiter: int, nkrylov: int = 16, x=None,
         true_residual: bool = False, on_iteration=None, run: GCRRun | None = None):
    """Flexible GCR for A x = b (``apply``: v -> A v, ``precondition``: r -> approximately A^-1 r).

    Stops when |r| <= tol |b| (iterated residual) or after ``maxiter`` preconditioned directions. With
    ``true_residual`` the residual is recomputed as b - A x at every restart and before stopping; the solve goes on
    while it is above the tolerance. The iterations are :meth:`GCRRun.step` (``run``: a persistent one whose steps
    may be CUDA-graph replays, :mod:`.graph`); the host reads |r|^2 once per iteration. Returns (x, FGCRResult)."""
    xp = geom.xp
    res = FGCRResult()
    bb = norm2(geom, b)
    if bb == 0.0:
        res.residual, res.converged = 0.0, True
        return xp.zeros_like(b), res
    stop = tol * tol * bb
    if run is None:
        run = GCRRun(apply, precondition, geom, b, nkrylov)
    rr = run.start(b, x, bb)
    j = 0
    rr_start = rr
    run.restart(rr)
    while True:
        if rr <= stop or res.iters >= maxiter or j >= nkrylov:
            if true_residual and res.iters > 0:
                rr = run.true_residual(b)
            if rr <= stop or res.iters >= maxiter:
                break
            if j:
                res.restarts += 1
            j = 0
            rr_start = rr
            run.restart(rr)
        run.run_step(j)
        rr_new, qq = run.read()
        if not qq > 0 or not math.isfinite(qq):
            break
        rr = rr_new
        if not run.device and rr < _RECOMPUTE * rr_start:
            rr = run.measure()                         # below the recurrence's rounding floor: measure |r|^2
        j += 1
        res.iters += 1
        if on_iteration is not None:
            on_iteration(res.iters, math.sqrt(rr / bb))
    res.residual = math.sqrt(rr / bb)
    res.converged = rr <= stop
    return run.result(), res
